"""CPU kernels of the neighbour sampler (numba); their counter-based randomness: ``neighbor_sampler.py``.

These kernels allocate their outputs; they never touch O(num_nodes) memory except the caller's
``node_map``, whose touched entries are reset before returning.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from neutronorch.bfloat16 import numpy_view, store
from neutronorch.data.dtypes import is_bfloat16
from neutronorch.jit import read_only  # importing it also says when these kernels are compiled (a cold cache)
from neutronorch.prefetch import AHEAD, prefetch_row

# Vertices ahead whose adjacency the draws ask for (their row pointer twice as far ahead): the draws wait on one
# random read after another otherwise (a hop of the 1M-vertex benchmark graph took half the time with them).
DRAW_AHEAD = 8
RELABEL_AHEAD = 16  # sampled ids ahead whose vertex-map entry the relabel asks for

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@njit(inline="always")
def mix(z):
    """splitmix64's finaliser: a bijection of 64-bit words whose every output bit depends on every input bit."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


@njit(inline="always", cache=True)
def splitmix_key(a, b):
    """Combine a 64-bit key and a vertex id into one well-mixed 64-bit key. The one definition of key
    mixing: ``neighbor_sampler.mix_key`` calls it from Python (``cache=True`` spares that call a compile
    per process; the kernels inline it)."""
    return mix(np.uint64(a) * GOLDEN + mix(np.uint64(b) + GOLDEN))


# The same functions in torch's int64 ops, on any device (torch has no unsigned 64-bit arithmetic: products
# wrap modulo 2**64 either way, constants are given as signed values and right shifts are made logical).
def _signed(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


T_GOLDEN = _signed(int(GOLDEN))
_T_MIX1, _T_MIX2 = _signed(int(_MIX1)), _signed(int(_MIX2))


def torch_shr(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 words."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def torch_mix(z: torch.Tensor) -> torch.Tensor:
    """``mix`` of int64 words (bit for bit)."""
    z = (z ^ torch_shr(z, 30)) * _T_MIX1
    z = (z ^ torch_shr(z, 27)) * _T_MIX2
    return z ^ torch_shr(z, 31)


def torch_splitmix_key(key: int | torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``splitmix_key(key, id)`` of every id (int64 words, bit for bit), on ``ids``' device; ``key`` is one
    key or a tensor of them, one per id."""
    scaled = (key.to(torch.int64) * T_GOLDEN if isinstance(key, torch.Tensor)
              else _signed(int(key) * int(GOLDEN)))  # Python ints do not wrap: reduce modulo 2**64
    return torch_mix(scaled + torch_mix(ids.to(torch.int64) + T_GOLDEN))


@njit(inline="always")
def _below(state, bound):
    """Next value of the stream and a draw uniform in [0, bound) (Lemire's multiply-shift, bias < 2^-32)."""
    state = state + GOLDEN
    r = mix(state) >> np.uint64(32)
    return state, np.int64((r * np.uint64(bound)) >> np.uint64(32))


@njit(inline="always")
def _draw_offsets(chosen, deg, key, v):
    """A uniform ``len(chosen)``-subset of ``range(deg)`` into ``chosen``, keyed by (``key``, ``v``): Floyd's
    algorithm, ``len(chosen)`` draws. Offsets are kept in the output slots, membership checked by a linear
    scan (``len(chosen)`` is a small fanout)."""
    k = chosen.shape[0]
    state = splitmix_key(key, v)
    filled = 0
    for top in range(deg - k, deg):
        state, t = _below(state, top + 1)
        seen = False
        for q in range(filled):
            if chosen[q] == t:
                seen = True
                break
        chosen[filled] = top if seen else t
        filled += 1


@njit(inline="always")
def as_rows(array):
    """A 1-D array as a column (a view, no copy): ``prefetch_row`` of it asks for one element's cache line."""
    return array.reshape((array.shape[0], 1))


@njit(inline="always")
def ask_ahead(indptr, pointer_rows, index_rows, dst_nodes, order, step, n):
    """Prefetch for the draws ``DRAW_AHEAD`` steps ahead of ``step``: the row pointer of the vertex twice as
    far ahead, the first neighbours of the one that far ahead (its row pointer asked for earlier).
    ``pointer_rows``, ``index_rows``: ``indptr`` and ``indices`` as ``as_rows``."""
    ahead = np.int64(step) + 2 * DRAW_AHEAD
    if ahead < n:
        prefetch_row(pointer_rows, dst_nodes[order[ahead] if order.shape[0] > 0 else ahead])
    ahead = np.int64(step) + DRAW_AHEAD
    if ahead < n:
        prefetch_row(index_rows, indptr[dst_nodes[order[ahead] if order.shape[0] > 0 else ahead]])


@njit(parallel=True, cache=True, nogil=True)
def drawn_ptr(indptr, dst_nodes, fanout, order):
    """The row pointer of a draw: ``ptr[i + 1] - ptr[i]`` neighbours drawn for ``dst_nodes[i]``, all of them
    when the degree is at most ``fanout`` or ``fanout`` < 0."""
    n = dst_nodes.shape[0]
    ordered = order.shape[0] > 0
    counts = np.empty(n + 1, np.int64)
    counts[0] = 0
    rows = as_rows(indptr)
    for step in prange(n):
        if step + DRAW_AHEAD < n:
            prefetch_row(rows, dst_nodes[order[step + DRAW_AHEAD] if ordered else step + DRAW_AHEAD])
        i = order[step] if ordered else np.int64(step)  # one integer type whatever prange's index is
        v = dst_nodes[i]
        deg = indptr[v + 1] - indptr[v]
        counts[i + 1] = deg if (fanout < 0 or deg <= fanout) else fanout
    return np.cumsum(counts)


@njit(parallel=True, cache=True, nogil=True)
def sample_neighbors(indptr, indices, dst_nodes, fanout, key, order):
    """Uniform sampling without replacement of up to ``fanout`` in-neighbours of each vertex.

    Returns (ptr, nbrs): ``nbrs[ptr[i]:ptr[i+1]]`` are the sampled global ids of ``dst_nodes[i]``; all
    neighbours when the degree is at most ``fanout`` (or ``fanout`` < 0). Vertices are visited in the order
    of ``order`` (``region_order`` of ``dst_nodes``: ``indptr`` and ``indices`` read front to back), or in
    their own order when it is empty; each vertex's draws are keyed by the vertex, so the order changes
    nothing but the reads.
    """
    n = dst_nodes.shape[0]
    ordered = order.shape[0] > 0
    ptr = drawn_ptr(indptr, dst_nodes, fanout, order)
    nbrs = np.empty(ptr[n], indices.dtype)
    pointer_rows, index_rows = as_rows(indptr), as_rows(indices)
    for step in prange(n):
        ask_ahead(indptr, pointer_rows, index_rows, dst_nodes, order, step, n)
        draw_row(indptr, indices, dst_nodes, key, ptr, nbrs, order[step] if ordered else np.int64(step))
    return ptr, nbrs


@njit(inline="always")
def draw_row(indptr, indices, dst_nodes, key, ptr, nbrs, i):
    """``sample_neighbors``' draws of ``dst_nodes[i]`` into ``nbrs[ptr[i]:ptr[i + 1]]``."""
    v = dst_nodes[i]
    # Slices, not nbrs[out + j]: an offset index is checked for wrap-around (see bfloat16's note).
    draw_keyed(indptr, indices, v, v, key, nbrs[ptr[i]:ptr[i + 1]])


@njit(inline="always")
def draw_keyed(indptr, indices, row, v, key, chosen):
    """The draws of row ``row`` of a CSC keyed by vertex ``v`` (the same vertex, on the whole graph; its global
    id, on a part that holds it at another row) into ``chosen``: all of the row where it has no more."""
    start = indptr[row]
    deg = indptr[row + 1] - start
    neighbours = indices[start:start + deg]
    if chosen.shape[0] == deg:
        chosen[:] = neighbours
        return
    _draw_offsets(chosen, deg, key, v)
    for j in range(chosen.shape[0]):
        chosen[j] = neighbours[chosen[j]]


@njit(parallel=True, cache=True, nogil=True)
def sample_neighbor_edges(indptr, indices, dst_nodes, fanout, key, order):
    """``sample_neighbors`` that also says which edges it drew: (ptr, nbrs, edges), ``edges[e]`` the position
    in ``indices`` (int64) of the edge that brought ``nbrs[e]``, what indexes a relation's edge features.
    The draws are ``sample_neighbors``' to the vertex (the same keyed offsets), so a sampler may take either
    kernel without changing its sample; this one writes 8 more bytes per sampled edge. A separate kernel:
    a flag in ``sample_neighbors`` slowed the host sampler (docs/results/one-engine-2026-12-06-round-four.md)."""
    n = dst_nodes.shape[0]
    ordered = order.shape[0] > 0
    ptr = drawn_ptr(indptr, dst_nodes, fanout, order)
    nbrs = np.empty(ptr[n], indices.dtype)
    edges = np.empty(ptr[n], np.int64)
    pointer_rows, index_rows = as_rows(indptr), as_rows(indices)
    for step in prange(n):
        ask_ahead(indptr, pointer_rows, index_rows, dst_nodes, order, step, n)
        i = order[step] if ordered else np.int64(step)
        v = dst_nodes[i]
        start = indptr[v]
        deg = indptr[v + 1] - start
        chosen, out = edges[ptr[i]:ptr[i + 1]], nbrs[ptr[i]:ptr[i + 1]]
        if chosen.shape[0] == deg:
            for j in range(deg):
                chosen[j] = j
        else:
            _draw_offsets(chosen, deg, key, v)
        for j in range(chosen.shape[0]):
            chosen[j] += start
            out[j] = indices[chosen[j]]
    return ptr, nbrs, edges


@njit(cache=True, nogil=True)
def relabel(frontier, num_frontier, nbrs, node_map):
    """Map sampled global ids to local positions, appending unseen vertices to ``frontier`` in order of first
    appearance. ``frontier[:num_frontier]`` holds the destinations, at those positions in ``node_map``, and
    has room for ``len(nbrs)`` more. Returns (local ids of nbrs, new frontier size)."""
    local = np.empty(nbrs.shape[0], np.int64)
    return local, relabel_range(frontier, num_frontier, nbrs, node_map, local, 0, nbrs.shape[0])


@njit(inline="always")
def relabel_range(frontier, size, nbrs, node_map, local, lo, hi):
    """``relabel``'s walk over ``nbrs[lo:hi]`` into ``local[lo:hi]``, the frontier ``size`` long before it;
    returns its size after. Without a branch on whether a vertex is new (about half are, unpredictably: the
    mispredictions took 40% of the walk): every step writes the map and the frontier's next slot, which only a
    new vertex then keeps (the slot is in the frontier's room, below ``size + hi - e``)."""
    entries = as_rows(node_map)
    for e in range(lo, hi):
        if e + RELABEL_AHEAD < hi:
            prefetch_row(entries, nbrs[e + RELABEL_AHEAD])
        u = nbrs[e]
        pos = node_map[u]
        new = pos < 0
        pos = size if new else pos
        node_map[u] = pos
        frontier[size] = u
        size += np.int64(new)
        local[e] = pos
    return size


@njit(parallel=True, cache=True, nogil=True)
def map_nodes(nodes, node_map):
    """``node_map[nodes[i]] = i``; ``nodes`` distinct (so no two threads write one entry)."""
    for i in prange(nodes.shape[0]):
        node_map[nodes[i]] = i


@njit(parallel=True, cache=True, nogil=True)
def reset_map(nodes, node_map):
    """``node_map[nodes[i]] = -1``; ``nodes`` distinct."""
    for i in prange(nodes.shape[0]):
        node_map[nodes[i]] = -1


@njit(parallel=True, cache=True, nogil=True)
def in_degrees(indptr, nodes):
    """The in-degree (float32) of each of ``nodes`` in the CSC graph of ``indptr``."""
    out = np.empty(nodes.shape[0], np.float32)
    for i in prange(nodes.shape[0]):
        v = nodes[i]
        out[i] = indptr[v + 1] - indptr[v]
    return out


# Rows per parallel task of the gathers: each task prefetches ``AHEAD`` rows ahead within its range.
GATHER_CHUNK = 256


NO_ORDER = np.empty(0, np.int64)  # ``order`` of the gathers and the sampler: positions in their own order
# Bytes of a region of ``region_order``: about twice the kernel's default readahead window.
REGION_BYTES = 256 << 10


@njit(cache=True, nogil=True)
def region_order(rows, rows_per_region, num_rows):
    """A permutation of the positions of ``rows`` that visits them region by region of the source (regions of
    ``rows_per_region`` consecutive rows, ascending; positions within a region in their own order): a
    counting sort, linear in the rows and the regions. A gather in this order reads a memory-mapped file
    front to back, so the kernel's readahead brings pages just before they are used, not pages evicted
    again before use. (``split_order`` with no hits: the rows are all non-negative.)"""
    return split_order(rows, rows_per_region, num_rows)[0]


@njit(cache=True, nogil=True)
def split_order(where, rows_per_region, num_rows):
    """For rows looked up in a host cache (``where[i]`` < 0: cache slot ``-1 - where[i]``; otherwise row
    ``where[i]`` of a source of ``num_rows`` rows): (the positions of the hits, then those of the misses
    region by region of the source as in ``region_order``; the number of hits). Pass ``rows_per_region`` =
    ``num_rows`` (or more) to keep the misses in their own order."""
    regions = (num_rows + rows_per_region - 1) // rows_per_region
    fill = np.zeros(regions + 2, np.int64)  # bucket 0: hits; bucket r + 1: misses in region r
    for i in range(where.shape[0]):
        w = where[i]
        fill[(0 if w < 0 else w // rows_per_region + 1) + 1] += 1
    for r in range(regions + 1):
        fill[r + 1] += fill[r]
    hits = fill[1]
    order = np.empty(where.shape[0], np.int64)
    for i in range(where.shape[0]):
        w = where[i]
        r = 0 if w < 0 else w // rows_per_region + 1
        order[fill[r]] = i
        fill[r] += 1
    return order, hits


# numba has no float16 type: half-precision rows are read as their bit patterns and decoded through a
# table of all 65,536 values (256 KiB, cache-resident).
HALF_TO_FLOAT = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
# The same values as bfloat16 bits, rounded as torch rounds them (128 KiB): float16 storage is read into
# bfloat16 rows by one lookup, without a rounding per value.
HALF_TO_BF16 = torch.from_numpy(HALF_TO_FLOAT).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


@njit(parallel=True, cache=True, nogil=True)
def _gather(source, rows, order, table, out):
    """``gather_stored``'s kernel, float16 storage (as uint16) decoded through ``table``, other storage read
    with none. Each thread takes a contiguous share of the order."""
    ordered = order.shape[0] > 0
    n = order.shape[0] if ordered else rows.shape[0]
    for c in prange((n + GATHER_CHUNK - 1) // GATHER_CHUNK):
        end = min(n, (c + 1) * GATHER_CHUNK)
        for k in range(c * GATHER_CHUNK, end):
            if k + AHEAD < end:
                prefetch_row(source, rows[order[k + AHEAD] if ordered else k + AHEAD])
            i = order[k] if ordered else k
            row, o = source[rows[i]], out[i]
            for j in range(row.shape[0]):
                value = row[j] if table is None else table[row[j]]  # pruned as it compiles: no test per value
                store(o, j, value)


def gather_stored(source: np.ndarray, rows: np.ndarray, order: np.ndarray, out: torch.Tensor) -> None:
    """out[i] = source[rows[i]] for the positions of ``order`` (every one when it is empty; ``region_order``:
    the source read front to back; a part of the positions: ``split_order``), ``source`` as it is stored
    (float32, float16 or bfloat16; any other numeric dtype converted as numpy's ``astype`` would) into
    float32 or bfloat16 rows: float16 decoded through a table, bfloat16 bits copied or widened."""
    source = read_only(source)
    if source.dtype == np.float16:
        table = HALF_TO_BF16 if out.dtype == torch.bfloat16 else HALF_TO_FLOAT
        _gather(source.view(np.uint16), rows, order, table, numpy_view(out))
    else:
        _gather(source.view(np.uint16) if is_bfloat16(source) else source, rows, order, None, numpy_view(out))
