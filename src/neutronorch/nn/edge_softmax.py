"""Attention's scores and per-edge softmax: ``head_scores`` and ``edge_softmax``.

``alpha[e, h] = softmax over the edges of e's destination of LeakyReLU(score_src[u_e, h] + score_dst[d_e, h]
[+ edge_logits[e, h]])``, the coefficients GAT and R-GAT weigh their sums with. On CPU numba kernels, torch
ops elsewhere, tests prove both equal (docs/performance.md, "Attention's scores and softmax on the CPU").
The result has ``E + num_dst`` rows in ``attention.attention_edges``' order: the block's edges, then one
self loop per destination (0 without ``self_loops``).

Sums are float32 and in a fixed order: a destination's terms in edge order, its self loop last; a source's
gradient likewise. That is ``index_add``'s order, so the result is the same bits whatever the thread count
(``nn/rows.py``). ``NEUTRONORCH_EDGE_SOFTMAX=torch`` (or ``kernels = False`` here) runs the torch ops on
CPU too, for comparisons.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from numba import njit, prange
from torch.nn import functional as F

from neutronorch.nn.aggregation import CHUNK, edge_destinations
from neutronorch.nn.attention import attention_edges, head_dots
from neutronorch.nn.rows import take_rows
from neutronorch.sampling.block import Block

# Whether CPU float tensors take the kernels (False: the torch ops everywhere).
kernels = os.environ.get("NEUTRONORCH_EDGE_SOFTMAX", "kernels") != "torch"


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _softmax_forward(indptr, indices, score_src, score_dst, edge_logits, dst_offset, self_loops, slope,
                     raw, alpha):
    """``raw``: every edge's logit before the LeakyReLU (what its derivative reads); ``alpha``: the
    coefficients. ``edge_logits`` has E rows, or none. Infinities are never formed (fastmath assumes there
    are none): a destination's maximum starts from its first logit."""
    heads = alpha.shape[1]
    rows = score_dst.shape[0]
    loops = indices.shape[0]
    with_edges = edge_logits.shape[0] > 0
    for c in prange((rows + CHUNK - 1) // CHUNK):
        peak = np.empty(heads, np.float32)
        total = np.empty(heads, np.float32)
        for d in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            start, end = indptr[d], indptr[d + 1]
            own = score_dst[d]
            for e in range(start, end):
                row = score_src[indices[e]]
                r, a = raw[e], alpha[e]
                for h in range(heads):
                    x = row[h] + own[h]
                    if with_edges:
                        x += edge_logits[e, h]
                    r[h] = x
                    a[h] = x if x > 0 else x * slope
            loop_raw, loop_alpha = raw[loops + d], alpha[loops + d]
            if self_loops:
                first = score_src[dst_offset + d]
                for h in range(heads):
                    x = first[h] + own[h]
                    loop_raw[h] = x
                    loop_alpha[h] = x if x > 0 else x * slope
                peak[:] = loop_alpha
            else:
                loop_raw[:] = 0.0
                loop_alpha[:] = 0.0
                if end == start:
                    continue
                peak[:] = alpha[start]
            for e in range(start, end):
                a = alpha[e]
                for h in range(heads):
                    peak[h] = max(peak[h], a[h])
            total[:] = 0.0
            for e in range(start, end):
                a = alpha[e]
                for h in range(heads):
                    a[h] = np.exp(a[h] - peak[h])
                    total[h] += a[h]
            if self_loops:
                for h in range(heads):
                    loop_alpha[h] = np.exp(loop_alpha[h] - peak[h])
                    total[h] += loop_alpha[h]
                for h in range(heads):
                    loop_alpha[h] /= total[h]
            for e in range(start, end):
                a = alpha[e]
                for h in range(heads):
                    a[h] /= total[h]


@njit(inline="always")
def _logit_grad(a, g, r, dot, slope, out, own):
    """One edge's ``out[h] = alpha (grad - dot)`` through the LeakyReLU's slope at ``r``, added into ``own``."""
    for h in range(a.shape[0]):
        v = a[h] * (g[h] - dot[h])
        v = v if r[h] > 0 else v * slope
        out[h] = v
        own[h] += v


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _softmax_backward(indptr, indices, raw, alpha, grad_alpha, dst_offset, self_loops, slope, grad_logits,
                      grad_dst, grad_src):
    """The adjoint of ``_softmax_forward``. Per destination (in parallel): ``g = alpha (grad - <alpha,
    grad>)`` over its edges and self loop, times the LeakyReLU's slope at ``raw``, into ``grad_logits``
    and summed into ``grad_dst``. Then the sources' sums in edge order, in one serial pass."""
    heads = alpha.shape[1]
    rows = grad_dst.shape[0]
    loops = indices.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        dot = np.empty(heads, np.float32)
        for d in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            start, end = indptr[d], indptr[d + 1]
            dot[:] = 0.0
            for e in range(start, end):
                a, g = alpha[e], grad_alpha[e]
                for h in range(heads):
                    dot[h] += a[h] * g[h]
            if self_loops:
                a, g = alpha[loops + d], grad_alpha[loops + d]
                for h in range(heads):
                    dot[h] += a[h] * g[h]
            own = grad_dst[d]
            own[:] = 0.0
            for e in range(start, end):
                _logit_grad(alpha[e], grad_alpha[e], raw[e], dot, slope, grad_logits[e], own)
            if self_loops:
                e = loops + d
                _logit_grad(alpha[e], grad_alpha[e], raw[e], dot, slope, grad_logits[e], own)
            else:
                grad_logits[loops + d][:] = 0.0
    if grad_src.shape[0] == 0:
        return
    grad_src[:] = 0.0
    for e in range(loops):
        target, g = grad_src[indices[e]], grad_logits[e]
        for h in range(heads):
            target[h] += g[h]
    if self_loops:
        for d in range(rows):
            target, g = grad_src[dst_offset + d], grad_logits[loops + d]
            for h in range(heads):
                target[h] += g[h]


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _scores_forward(z, att_src, att_dst, dst_offset, score_src, score_dst):
    """score_src[u, h] = <z[u, h], att_src[h]> for every row; score_dst[d, h] = <z[dst_offset + d, h],
    att_dst[h]> for the destination rows. One pass over ``z`` (rows, heads, width)."""
    rows = z.shape[0]
    num_dst = score_dst.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        for u in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            own = u - dst_offset
            head_dots(z[u], att_src, score_src[u])
            if 0 <= own < num_dst:
                head_dots(z[u], att_dst, score_dst[own])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _scores_backward(z, att_src, att_dst, grad_src, grad_dst, dst_offset, grad_z, grad_att_src, grad_att_dst):
    """The adjoint of ``_scores_forward``: ``grad_z`` in one pass over ``z``; the weights' gradients summed
    per chunk (in a chunk's own array: a shared one kept the loops from vectorising), then over the chunks
    in order (the same sums whatever the thread count)."""
    rows, heads, width = z.shape
    num_dst = grad_dst.shape[0]
    chunks = (rows + CHUNK - 1) // CHUNK
    part_src = np.empty((chunks, heads, width), np.float32)
    part_dst = np.empty((chunks, heads, width), np.float32)
    for c in prange(chunks):
        sums_src = np.zeros((heads, width), np.float32)
        sums_dst = np.zeros((heads, width), np.float32)
        for u in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            row, out, own = z[u], grad_z[u], u - dst_offset
            for h in range(heads):
                part, o, att, acc = row[h], out[h], att_src[h], sums_src[h]
                g = grad_src[u, h]
                for j in range(width):
                    o[j] = g * att[j]
                for j in range(width):
                    acc[j] += g * part[j]
            if 0 <= own < num_dst:
                for h in range(heads):
                    part, o, att, acc = row[h], out[h], att_dst[h], sums_dst[h]
                    g = grad_dst[own, h]
                    for j in range(width):
                        o[j] += g * att[j]
                    for j in range(width):
                        acc[j] += g * part[j]
        part_src[c] = sums_src
        part_dst[c] = sums_dst
    # Explicit loops: an array expression here would become a parallel region per chunk.
    for h in range(heads):
        for j in range(width):
            total_src = np.float32(0.0)
            total_dst = np.float32(0.0)
            for c in range(chunks):
                total_src += part_src[c, h, j]
                total_dst += part_dst[c, h, j]
            grad_att_src[h, j] = total_src
            grad_att_dst[h, j] = total_dst


class _EdgeSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, score_src, score_dst, edge_logits, block, slope, self_loops):
        score_src, score_dst = score_src.detach().contiguous(), score_dst.detach().contiguous()
        heads = score_dst.shape[1]
        rows = block.num_edges + block.num_dst
        logits = (edge_logits.detach().contiguous() if edge_logits is not None
                  else torch.empty((0, heads), dtype=torch.float32))
        raw = torch.empty((rows, heads), dtype=torch.float32)
        alpha = torch.empty((rows, heads), dtype=torch.float32)
        _softmax_forward(block.indptr.numpy(), block.indices.numpy(), score_src.numpy(), score_dst.numpy(),
                         logits.numpy(), block.dst_offset, self_loops, np.float32(slope), raw.numpy(), alpha.numpy())
        ctx.save_for_backward(raw, alpha)
        ctx.block, ctx.slope, ctx.self_loops, ctx.num_src = block, slope, self_loops, score_src.shape[0]
        return alpha

    @staticmethod
    def backward(ctx, grad_alpha):
        raw, alpha = ctx.saved_tensors
        block, heads = ctx.block, alpha.shape[1]
        grad_logits = torch.empty(alpha.shape, dtype=torch.float32)
        grad_dst = torch.empty((block.num_dst, heads), dtype=torch.float32)
        grad_src = torch.empty((ctx.num_src if ctx.needs_input_grad[0] else 0, heads), dtype=torch.float32)
        _softmax_backward(block.indptr.numpy(), block.indices.numpy(), raw.numpy(), alpha.numpy(),
                          grad_alpha.float().contiguous().numpy(), block.dst_offset, ctx.self_loops,
                          np.float32(ctx.slope), grad_logits.numpy(), grad_dst.numpy(), grad_src.numpy())
        return (grad_src if ctx.needs_input_grad[0] else None, grad_dst if ctx.needs_input_grad[1] else None,
                grad_logits[:block.num_edges] if ctx.needs_input_grad[2] else None, None, None, None)


class _HeadScores(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, att_src, att_dst, dst_offset, num_dst):
        z, att_src, att_dst = z.detach().contiguous(), att_src.detach().contiguous(), att_dst.detach().contiguous()
        score_src = torch.empty(z.shape[:2], dtype=torch.float32)
        score_dst = torch.empty((num_dst, z.shape[1]), dtype=torch.float32)
        _scores_forward(z.numpy(), att_src.numpy(), att_dst.numpy(), dst_offset, score_src.numpy(), score_dst.numpy())
        ctx.save_for_backward(z, att_src, att_dst)
        ctx.dst_offset = dst_offset
        return score_src, score_dst

    @staticmethod
    def backward(ctx, grad_src, grad_dst):
        z, att_src, att_dst = ctx.saved_tensors
        grad_src = (torch.zeros(z.shape[:2], dtype=torch.float32) if grad_src is None
                    else grad_src.float().contiguous())
        grad_dst = (torch.zeros((0, z.shape[1]), dtype=torch.float32) if grad_dst is None  # no destinations
                    else grad_dst.float().contiguous())
        grad_z, grad_att_src, grad_att_dst = torch.empty_like(z), torch.empty_like(att_src), torch.empty_like(att_dst)
        _scores_backward(z.numpy(), att_src.numpy(), att_dst.numpy(), grad_src.numpy(), grad_dst.numpy(),
                         ctx.dst_offset, grad_z.numpy(), grad_att_src.numpy(), grad_att_dst.numpy())
        return grad_z, grad_att_src, grad_att_dst, None, None


def head_scores(z: torch.Tensor, att_src: torch.Tensor, att_dst: torch.Tensor | None = None, dst_offset: int = 0,
                num_dst: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention's per-vertex scores: ``(z * att_src).sum(-1)`` for every row of ``z`` (rows, heads, width),
    and with ``att_dst`` ``(z[dst_offset:dst_offset + num_dst] * att_dst).sum(-1)`` (else None); the
    weights (heads, width), or any shape of that many values (PyG's (1, heads, width))."""
    heads, width = z.shape[1:]
    if att_dst is not None and dst_offset + num_dst > z.shape[0]:
        raise ValueError(f"destination rows {dst_offset}:{dst_offset + num_dst} beyond z's {z.shape[0]} rows")
    if kernels and z.device.type == "cpu" and all(t.dtype == torch.float32 for t in (z, att_src, att_dst)
                                                  if t is not None):
        both = att_dst is not None
        unused = torch.zeros((heads, width), dtype=torch.float32)
        score_src, score_dst = _HeadScores.apply(z, att_src.reshape(heads, width),
                                                 att_dst.reshape(heads, width) if both else unused,
                                                 dst_offset, num_dst if both else 0)
        return score_src, (score_dst if both else None)
    score_src = (z * att_src).sum(-1)
    if att_dst is None:
        return score_src, None
    return score_src, (z[dst_offset:dst_offset + num_dst] * att_dst).sum(-1)


def edge_softmax(block: Block, score_src: torch.Tensor, score_dst: torch.Tensor,
                 edge_logits: torch.Tensor | None = None, negative_slope: float = 0.2, self_loops: bool = False,
                 edges: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Attention coefficients, ``(E + num_dst, heads)``, as the module docstring says. ``score_src``:
    (num_src, heads); ``score_dst``: (num_dst, heads); ``edge_logits``: (E, heads). ``edges``:
    ``attention_edges(block)`` (with ``self_loops``) or the block's (sources, destinations), when the caller
    has them for the torch ops. Float32 on CPU; the scores' dtype elsewhere."""
    tensors = [score_src, score_dst] + ([edge_logits] if edge_logits is not None else [])
    if kernels and all(t.device.type == "cpu" and t.dtype in (torch.float32, torch.bfloat16, torch.float16)
                       for t in tensors):
        widen = [t.float() for t in tensors] + [None] * (3 - len(tensors))
        return _EdgeSoftmax.apply(*widen, block, negative_slope, self_loops)
    if edges is None:
        edges = attention_edges(block) if self_loops else (block.indices.long(), edge_destinations(block))
    src, dst = edges
    # Per edge: take_rows sums the gradients of a vertex's many edges in a fixed order (nn/rows.py).
    logits = take_rows(score_src, src) + take_rows(score_dst, dst)
    if edge_logits is not None:
        logits = logits + (F.pad(edge_logits, (0, 0, 0, block.num_dst)) if self_loops else edge_logits)
    logits = F.leaky_relu(logits, negative_slope)
    peak = torch.full(score_dst.shape, float("-inf"), dtype=logits.dtype, device=logits.device)
    peak = peak.scatter_reduce(0, dst.unsqueeze(1).expand_as(logits), logits.detach(), reduce="amax")
    weights = torch.exp(logits - take_rows(peak, dst))
    total = torch.zeros_like(peak).index_add(0, dst, weights)
    alpha = weights / take_rows(total, dst)
    return alpha if self_loops else torch.cat([alpha, alpha.new_zeros(block.num_dst, alpha.shape[1])])
