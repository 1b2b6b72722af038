"""Triton kernels of the device sampler: one hop in four kernels and two scans, no host reads.

A hop works on padded buffers whose sizes the host knows without reading the device: a destination
frontier of at most ``bound`` rows (its true size ``n_dst`` lives in device memory), ``fanout`` slots per
row. Row ``r``'s sampled neighbour ``s`` sits in slot ``r * fanout + s``; the slots past a row's ``take``
(its degree, capped by the fanout) and the rows past ``n_dst`` are unused. Slot order is the order of the
compact layout, so "first appearance" means the same in both.

Relabelling uses a vertex -> code map over the whole graph (int64, one per vertex) that is never reset:
a code is ``(GEN_TOP - generation) << 32 | position``, and every hop takes a new generation, so a code of
this hop is smaller than any code an earlier hop left behind, and ``atomic_min`` finds each vertex's first
position without clearing the map first. Destinations take positions ``0 .. n_dst - 1`` and slot ``e``
position ``bound + e``.

Per hop: ``sample_kernel`` (Floyd's draw, bit for bit the numba and torch samplers', the neighbour reads,
each row's ``take``, and with ``RELABEL`` the ``atomic_min`` of every code; with ``EDGES`` each drawn
edge's position too), ``first_kernel`` (flags of first appearances), scans of the flags and of ``take``
(the block's ``indptr``), ``rank_kernel`` (the new frontier and its size) and ``local_kernel`` (every slot's
local id, compact, and the edge count). The sizes go to a small device buffer the caller reads once, after
the last hop.
"""

from __future__ import annotations

import triton
import triton.language as tl

# Bits of the counter-based stream (``kernels.GOLDEN`` and ``kernels.mix``'s constants).
_GOLDEN = tl.constexpr(0x9E3779B97F4A7C15)
_MIX1 = tl.constexpr(0xBF58476D1CE4E5B9)
_MIX2 = tl.constexpr(0x94D049BB133111EB)

GEN_TOP = (1 << 31) - 1  # the first generation's high bits; codes stay positive int64
ROWS = 64  # destination rows per program of sample_kernel
SLOTS = 1024  # slots per program of the other kernels


@triton.jit
def _mix(z):
    z = (z ^ (z >> 30)) * _MIX1
    z = (z ^ (z >> 27)) * _MIX2
    return z ^ (z >> 31)


@triton.jit(do_not_specialize=["key", "code_high", "bound", "n_dst_at"])
def sample_kernel(indptr, indices, dst, sizes, n_dst_at, key, code_high, node_map, nbrs, take_out, bound, edges,
                  FANOUT: tl.constexpr, FANOUT_PAD: tl.constexpr, ROWS: tl.constexpr, RELABEL: tl.constexpr,
                  EDGES: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * ROWS + tl.arange(0, ROWS)
    n_dst = tl.load(sizes + n_dst_at)
    live = rows < n_dst
    in_bound = rows < bound
    v = tl.load(dst + rows, mask=live, other=0).to(tl.int64)
    start = tl.load(indptr + v, mask=live, other=0).to(tl.int64)
    deg = tl.load(indptr + v + 1, mask=live, other=0).to(tl.int64) - start
    take = tl.minimum(deg, FANOUT)
    take = tl.where(live, take, 0)
    tl.store(take_out + rows, take, mask=in_bound)
    high = code_high.to(tl.int64) << 32
    if RELABEL:  # else the draws alone (``TritonNeighborSampler.draw``): no map, which is then not read
        tl.atomic_min(node_map + v, high | rows.to(tl.int64), mask=live)

    # Floyd's algorithm over all rows at once: step i draws t in [0, j], j = deg - FANOUT + i, and keeps t,
    # or j when t was kept already. Rows with deg <= FANOUT take every neighbour in order instead.
    stream = _mix(v.to(tl.uint64) + _GOLDEN)
    stream = key.to(tl.int64).to(tl.uint64) * _GOLDEN + stream
    stream = _mix(stream)
    cols = tl.arange(0, FANOUT_PAD)
    picks = tl.zeros((ROWS, FANOUT_PAD), dtype=tl.int64)
    state = stream
    for i in tl.static_range(FANOUT):
        j = tl.maximum(deg - FANOUT + i, 0)
        state = state + _GOLDEN
        r = _mix(state) >> 32  # 32 random bits
        t = ((r * (j + 1).to(tl.uint64)) >> 32).to(tl.int64)  # uniform in [0, j]
        seen = tl.max(tl.where((cols[None, :] < i) & (picks == t[:, None]), 1, 0), axis=1) > 0
        t = tl.where(seen, j, t)
        picks = tl.where(cols[None, :] == i, t[:, None], picks)
    offset = tl.where(deg[:, None] > FANOUT, picks, cols[None, :].to(tl.int64))
    used = live[:, None] & (cols[None, :] < take[:, None])
    position = start[:, None] + offset
    nbr = tl.load(indices + position, mask=used, other=0).to(tl.int64)
    slot = rows[:, None].to(tl.int64) * FANOUT + cols[None, :]
    tl.store(nbrs + slot, nbr, mask=used)
    if EDGES:  # each drawn edge's position in ``indices``, what a typed relation's edge features are read by
        tl.store(edges + slot, position, mask=used)
    if RELABEL:
        tl.atomic_min(node_map + nbr, high | (bound + slot), mask=used)


@triton.jit(do_not_specialize=["code_high", "bound"])
def first_kernel(nbrs, take, node_map, code_high, flags, bound, FANOUT: tl.constexpr, SLOTS: tl.constexpr):
    slot = tl.program_id(0).to(tl.int64) * SLOTS + tl.arange(0, SLOTS)
    row = slot // FANOUT
    in_bound = row < bound
    used = in_bound & ((slot - row * FANOUT) < tl.load(take + row, mask=in_bound, other=0))
    nbr = tl.load(nbrs + slot, mask=used, other=0)
    code = tl.load(node_map + nbr, mask=used, other=0)
    first = used & (code == ((code_high.to(tl.int64) << 32) | (bound + slot)))
    tl.store(flags + slot, first.to(tl.int32), mask=in_bound)


@triton.jit(do_not_specialize=["code_high", "bound", "n_dst_at"])
def rank_kernel(dst, nbrs, flags, ranks, node_map, code_high, frontier, sizes, n_dst_at, bound,
                FANOUT: tl.constexpr, SLOTS: tl.constexpr):
    pid = tl.program_id(0)
    slot = pid.to(tl.int64) * SLOTS + tl.arange(0, SLOTS)
    n_dst = tl.load(sizes + n_dst_at)
    total = bound * FANOUT
    here = slot < total
    # The destinations lead the new frontier (their codes already hold their positions).
    lead = slot < n_dst
    tl.store(frontier + slot, tl.load(dst + slot, mask=lead, other=0), mask=lead)
    first = tl.load(flags + slot, mask=here, other=0) != 0
    position = n_dst + tl.load(ranks + slot, mask=first, other=1) - 1  # ranks: inclusive scan of flags
    nbr = tl.load(nbrs + slot, mask=first, other=0)
    tl.store(frontier + position, nbr, mask=first)
    tl.store(node_map + nbr, (code_high.to(tl.int64) << 32) | position, mask=first)
    if pid == 0:
        tl.store(sizes + n_dst_at + 2, n_dst + tl.load(ranks + total - 1))


@triton.jit(do_not_specialize=["bound", "n_dst_at"])
def local_kernel(nbrs, take, indptr, node_map, local, sizes, n_dst_at, bound, FANOUT: tl.constexpr,
                 SLOTS: tl.constexpr):
    pid = tl.program_id(0)
    slot = pid.to(tl.int64) * SLOTS + tl.arange(0, SLOTS)
    row = slot // FANOUT
    in_bound = row < bound
    s = slot - row * FANOUT
    used = in_bound & (s < tl.load(take + row, mask=in_bound, other=0))
    nbr = tl.load(nbrs + slot, mask=used, other=0)
    code = tl.load(node_map + nbr, mask=used, other=0)
    out = tl.load(indptr + row, mask=used, other=0) + s
    tl.store(local + out, code & 0xFFFFFFFF, mask=used)
    if pid == 0:
        tl.store(sizes + n_dst_at + 1, tl.load(indptr + bound))
