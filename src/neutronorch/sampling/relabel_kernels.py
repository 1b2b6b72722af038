"""The relabel of a hop on every thread (numba): ``kernels.relabel``'s result, bit for bit, on any number of threads.

``kernels.relabel`` walks the sampled ids once, in order, on one thread: the first vertex to appear gets the
next position. Here the ids are first split by vertex range (``parts`` ranges of ``1 << shift`` vertices, a
stable counting sort), so that each thread marks the first appearances of its own ranges' vertices in the vertex
map without another thread writing there; then each thread walks its own span of the ids in order again and
numbers the first appearances from the count of those before its span. Every id is read a handful of times, in
streams, and the vertex map twice per vertex: more work than the walk on one thread, spread over all of them.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

CHUNK = 1 << 14  # sampled ids per span of the in-order passes
RANGE_BYTES = 256 << 10  # bytes of the vertex map per range: one thread's writes stay within its cache


def range_shift(num_nodes: int) -> int:
    """``shift`` for a vertex map of ``num_nodes`` int64 entries: ranges of about ``RANGE_BYTES``, at most 4,096."""
    shift = max(0, (RANGE_BYTES // 8).bit_length() - 1)
    while (num_nodes >> shift) >= 4096:
        shift += 1
    return shift


@njit(parallel=True, cache=True, nogil=True)
def relabel_parallel(frontier, num_frontier, nbrs, node_map, shift, scratch):
    """``kernels.relabel(frontier, num_frontier, nbrs, node_map)`` (the same local ids, frontier and vertex map)
    on all threads. ``scratch``: int64, at least ``3 * len(nbrs)`` entries, overwritten."""
    m = nbrs.shape[0]
    parts = ((node_map.shape[0] - 1) >> shift) + 1
    chunks = max(1, (m + CHUNK - 1) // CHUNK)
    ids, seen, position = scratch[:m], scratch[m:2 * m], scratch[2 * m:3 * m]
    # Where each span's ids of each range go in the range-major order (``at[c, p]``).
    at = np.zeros((chunks + 1, parts), np.int64)
    for c in prange(chunks):
        for e in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
            at[c, nbrs[e] >> shift] += 1
    total = 0
    for p in range(parts):
        for c in range(chunks + 1):
            here = at[c, p]
            at[c, p] = total
            total += here
    for c in prange(chunks):
        put = at[c].copy()
        for e in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
            u = nbrs[e]
            ids[put[u >> shift]] = u
            put[u >> shift] += 1
    # Per range, in order: what the map held (``seen``); a first appearance marks the map with -2 - its slot.
    firsts = np.zeros((chunks, parts), np.int64)
    for p in prange(parts):
        for c in range(chunks):
            count = 0
            for i in range(at[c, p], at[c + 1, p]):
                u = ids[i]
                x = node_map[u]
                node_map[u] = -2 - i if x == -1 else x  # no branch: see kernels.relabel_range
                count += np.int64(x == -1)
                seen[i] = x
            firsts[c, p] = count
    start = np.empty(chunks + 1, np.int64)
    start[0] = num_frontier
    for c in range(chunks):
        start[c + 1] = start[c] + firsts[c].sum()
    # Per span, in order: positions of the first appearances; -2 - slot of the first for a repeat.
    local = np.empty(m, np.int64)
    for c in prange(chunks):
        take = at[c].copy()
        pos = start[c]
        for e in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
            u = nbrs[e]
            i = take[u >> shift]
            take[u >> shift] = i + 1
            x = seen[i]
            new = x == -1
            position[i] = pos  # read only where the slot is a first appearance
            local[e] = pos if new else x
            if new:
                frontier[pos] = u  # only then: the next slot may be the next span's, another thread's
            pos += np.int64(new)
    for c in prange(chunks):
        for e in range(c * CHUNK, min(m, (c + 1) * CHUNK)):
            if local[e] < -1:
                local[e] = position[-2 - local[e]]
    for p in prange(parts):
        for i in range(at[0, p], at[chunks, p]):
            if seen[i] == -1:
                node_map[ids[i]] = position[i]
    return local, start[chunks]


# ``relabel_parallel`` does about 5.6 times the work of the walk on one thread (docs/performance.md, "The host
# sampler on more threads"): on fewer threads the walk, overlapped with the draws (``hop_pipeline.py``), is
# faster, so it runs from 8 threads on, and only on hops large enough to split.
PARALLEL_FROM_THREADS = 8
PARALLEL_FROM_IDS = 4 * CHUNK


class RelabelScratch:
    """One sampler's reused scratch for ``relabel_parallel`` (never handed out, so reused at once), and its range
    size for a vertex map of ``num_nodes`` entries."""

    def __init__(self, num_nodes: int):
        self.shift = range_shift(num_nodes)
        self._array = np.empty(0, np.int64)

    def take(self, n: int) -> np.ndarray:
        if self._array.shape[0] < n:
            self._array = np.empty(n + n // 4, np.int64)
        return self._array[:n]
