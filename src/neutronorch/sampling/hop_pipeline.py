"""One hop of the host sampler with its draws and its relabel at once (numba): ``kernels.sample_neighbors``
then ``kernels.relabel``, the same result bit for bit, in less time on two threads or more.

The relabel walks the sampled ids in order on one thread; run after the draws, it left the other threads idle
for a third of a hop. Here the destinations are cut into segments: one thread relabels segment after segment as
soon as each is drawn, and draws the next undrawn one itself while it waits; the others draw segments in
order as they claim them. Segments are handed over through atomics (``atomic_ops.py``). No thread waits
for a segment that no running thread holds, so it never stalls however many threads run.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from neutronorch.sampling.atomic_ops import fetch_add, load_acquire, store_release
from neutronorch.sampling.kernels import ask_ahead, as_rows, draw_row, relabel_range

SEGMENT_EDGES = 8192  # sampled edges per segment, about: small enough to keep the relabel close behind


def segments_for(num_dst: int, num_edges: int, threads: int) -> int:
    """How many segments a hop of ``num_dst`` destinations and ``num_edges`` sampled edges is cut into."""
    return max(1, min(num_dst, max(2 * threads, num_edges // SEGMENT_EDGES)))


@njit(inline="always")
def _draw_segment(indptr, indices, dst_nodes, key, ptr, nbrs, segment, segments, num_dst, pointer_rows,
                  index_rows, no_order):
    lo, hi = segment * num_dst // segments, (segment + 1) * num_dst // segments
    for i in range(lo, hi):
        ask_ahead(indptr, pointer_rows, index_rows, dst_nodes[lo:hi], no_order, i - lo, hi - lo)
        draw_row(indptr, indices, dst_nodes, key, ptr, nbrs, np.int64(i))


@njit(parallel=True, cache=True, nogil=True)
def draw_and_relabel(indptr, indices, grown, num_dst, key, ptr, node_map, segments, workers):
    """The hop of the destinations ``grown[:num_dst]`` (at those positions in ``node_map``) with the row
    pointer ``ptr`` (``kernels.drawn_ptr``): their sampled neighbours' local ids, and the frontier's size
    after it, ``grown`` holding the new vertices after the destinations (room for ``ptr[-1]`` more) and
    ``node_map`` their positions, as ``relabel`` of ``sample_neighbors``' draws leaves them. ``workers``:
    numba's thread count (not read here: a kernel that reads it cannot be cached)."""
    m = ptr[num_dst]
    nbrs = np.empty(m, indices.dtype)
    local = np.empty(m, np.int64)
    state = np.zeros(segments + 2, np.int64)  # per segment 1 once drawn; the next one to claim; the size
    pointer_rows, index_rows = as_rows(indptr), as_rows(indices)
    no_order = np.empty(0, np.int64)  # not kernels.NO_ORDER: a global array would keep this kernel from the cache
    for worker in prange(workers):
        if worker == 0:  # the relabelling thread
            size = num_dst
            for segment in range(segments):
                while load_acquire(state, segment) == 0:
                    claimed = fetch_add(state, segments, 1)
                    if claimed < segments:
                        _draw_segment(indptr, indices, grown, key, ptr, nbrs, claimed, segments, num_dst,
                                      pointer_rows, index_rows, no_order)
                        store_release(state, claimed, 1)
                lo, hi = ptr[segment * num_dst // segments], ptr[(segment + 1) * num_dst // segments]
                size = relabel_range(grown, size, nbrs, node_map, local, lo, hi)
            state[segments + 1] = size
        else:
            claimed = fetch_add(state, segments, 1)
            while claimed < segments:
                _draw_segment(indptr, indices, grown, key, ptr, nbrs, claimed, segments, num_dst, pointer_rows,
                              index_rows, no_order)
                store_release(state, claimed, 1)
                claimed = fetch_add(state, segments, 1)
    return local, state[segments + 1]
