"""CPU kernels of the temporal neighbour sampler (numba; docs/temporal.md, "A temporal hop").

A frontier entry is a (vertex, time) pair; times are carried as ranks into the batch's distinct seed times
(``cuts``), so an entry's time is ``cuts[rank]``. An entry's valid edges are the prefix of its vertex's
in-edges (ascending by time) with time at most its time (below it when ``strict``), found by binary search;
it draws from that prefix as ``kernels.sample_neighbors`` draws from a whole column: all of it when it holds
at most ``fanout`` edges, else Floyd's keyed subset (``uniform``) or the newest ``fanout`` (``last``). The
draw is keyed by (layer key, vertex) alone, so it depends on no batch, thread or rank, and an entry whose
prefix is the whole column draws exactly what the plain sampler draws for its vertex.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

import neutronorch.jit  # noqa: F401 - says when these kernels are compiled (a cold cache)
from neutronorch.prefetch import prefetch_row
from neutronorch.sampling.kernels import DRAW_AHEAD, GOLDEN, _draw_offsets, as_rows, mix


@njit(cache=True, nogil=True, inline="always")
def valid_end(edge_time, start, end, cut, strict):
    """The end of the prefix of ``edge_time[start:end]`` (ascending) at most ``cut`` (below it if ``strict``):
    the whole column at one read when its newest edge is valid, else a binary search."""
    if end == start:
        return start
    newest = edge_time[end - 1]
    if newest < cut or (not strict and newest == cut):
        return end
    lo, hi = start, end - 1  # the newest edge is not valid
    while lo < hi:
        mid = (lo + hi) >> 1
        t = edge_time[mid]
        if t < cut or (not strict and t == cut):
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(parallel=True, cache=True, nogil=True)
def sample_temporal(indptr, indices, edge_time, dst_nodes, dst_rank, cuts, fanout, key, strict, last):
    """Up to ``fanout`` valid in-edges of each entry (``dst_nodes[i]`` at time ``cuts[dst_rank[i]]``).

    Returns (ptr, nbrs, edges): ``nbrs[ptr[i]:ptr[i+1]]`` the sampled global ids of entry ``i`` (a whole
    prefix or ``last``'s newest in ascending time, a uniform subset in the order Floyd's algorithm draws it,
    as the plain sampler's), and ``edges`` their positions in ``indices`` (int64: what indexes the edge times
    and features). ``fanout`` < 0 takes every valid edge; ``last`` the newest instead of a uniform subset.
    Both passes ask for the memory they will read ``DRAW_AHEAD`` entries ahead, as the plain sampler's draws
    do: the row pointers, then each column's newest time, then the first of its neighbours drawn from.
    """
    n = dst_nodes.shape[0]
    counts = np.empty(n + 1, np.int64)
    valid = np.empty(n, np.int64)  # each entry's prefix, searched once
    starts = np.empty(n, np.int64)  # and its column's start, read once
    counts[0] = 0
    pointer_rows, time_rows, index_rows = as_rows(indptr), as_rows(edge_time), as_rows(indices)
    for i in prange(n):
        ahead = np.int64(i) + 2 * DRAW_AHEAD
        if ahead < n:
            prefetch_row(pointer_rows, dst_nodes[ahead])
        ahead = np.int64(i) + DRAW_AHEAD
        if ahead < n:
            u = dst_nodes[ahead]
            if indptr[u + 1] > indptr[u]:
                prefetch_row(time_rows, indptr[u + 1] - 1)
        v = dst_nodes[i]
        start = indptr[v]
        m = valid_end(edge_time, start, indptr[v + 1], cuts[dst_rank[i]], strict) - start
        valid[i], starts[i] = m, start
        counts[i + 1] = m if (fanout < 0 or m <= fanout) else fanout
    ptr = np.cumsum(counts)
    nbrs = np.empty(ptr[n], indices.dtype)
    edges = np.empty(ptr[n], np.int64)
    for i in prange(n):
        ahead = np.int64(i) + DRAW_AHEAD
        if ahead < n and valid[ahead] > 0:
            prefetch_row(index_rows, starts[ahead] + (valid[ahead] - 1 if last else 0))
        v = dst_nodes[i]
        start, m = starts[i], valid[i]
        chosen, out = edges[ptr[i]:ptr[i + 1]], nbrs[ptr[i]:ptr[i + 1]]
        k = chosen.shape[0]
        if k == m or last:
            for j in range(k):
                chosen[j] = m - k + j
        else:
            _draw_offsets(chosen, m, key, v)
        for j in range(k):
            chosen[j] += start
            out[j] = indices[chosen[j]]
    return ptr, nbrs, edges


@njit(cache=True, nogil=True, inline="always")
def _slot(ids, ranks, table, u, r):
    """The table slot holding entry (``u``, ``r``), or the empty slot where it belongs (linear probing)."""
    mask = table.shape[0] - 1
    h = np.int64(mix(np.uint64(u) * GOLDEN + np.uint64(r)) & np.uint64(mask))
    while True:
        q = table[h]
        if q < 0 or (ids[q] == u and ranks[q] == r):
            return h
        h = (h + 1) & mask


def new_table(entries: int) -> np.ndarray:
    """An empty entry table for up to ``entries`` (vertex, rank) pairs (at most half full)."""
    return np.full(1 << max(4, int(2 * max(entries, 1) - 1).bit_length()), -1, np.int64)


@njit(cache=True, nogil=True)
def enter(table, ids, ranks, count):
    """Put the (distinct) entries ``0..count-1`` of (``ids``, ``ranks``) in ``table``."""
    for p in range(count):
        table[_slot(ids, ranks, table, ids[p], ranks[p])] = p


@njit(cache=True, nogil=True)
def relabel_timed(table, ids, ranks, size, ptr, dst_rank, nbrs):
    """Each of ``nbrs`` (row ``i``'s ``nbrs[ptr[i]:ptr[i+1]]``, at row ``i``'s time ``dst_rank[i]``) as its
    entry's position in the frontier (``ids``, ``ranks``) of ``size`` entries, new entries appended in order
    of first appearance (room for ``len(nbrs)`` more). Returns (local ids, new size)."""
    local = np.empty(nbrs.shape[0], np.int64)
    for i in range(ptr.shape[0] - 1):
        r = dst_rank[i]
        for e in range(ptr[i], ptr[i + 1]):
            u = nbrs[e]
            h = _slot(ids, ranks, table, u, r)
            q = table[h]
            if q < 0:
                q = size
                table[h] = q
                ids[q], ranks[q] = u, r
                size += 1
            local[e] = q
    return local, size
