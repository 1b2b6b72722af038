"""GAT's attention-weighted sum over a block: ``attention_aggregate``.

On CPU numba kernels compute it without materialising anything edge-wide (forward and the coefficients'
gradient over destinations, the rows' gradient over the sources of the transposed block: no atomics), a
head's columns read through a slice of the row so that they vectorise; torch ops elsewhere; a test proves
both equal. Timings: docs/performance.md, "GAT's weighted sum on the CPU".
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from neutronorch.data.csc import transpose_edges
from neutronorch.nn.aggregation import CHUNK, edge_destinations
from neutronorch.prefetch import AHEAD, prefetch_row
from neutronorch.sampling.block import Block


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _attention_forward(indptr, indices, z, alpha, dst_offset, heads, out):
    """``attention_aggregate``'s rows, one destination after another (self loops: ``alpha``'s last rows)."""
    width = z.shape[1]
    part = width // heads
    rows = out.shape[0]
    loops = indices.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        last = indptr[min(rows, (c + 1) * CHUNK)]
        for d in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            o = out[d]
            own = z[dst_offset + d]
            for h in range(heads):
                a = alpha[loops + d, h]
                o_h, own_h = o[h * part:(h + 1) * part], own[h * part:(h + 1) * part]
                for j in range(part):
                    o_h[j] = a * own_h[j]
            for e in range(indptr[d], indptr[d + 1]):
                if e + AHEAD < last:
                    prefetch_row(z, indices[e + AHEAD])
                row = z[indices[e]]
                for h in range(heads):
                    a = alpha[e, h]
                    o_h, row_h = o[h * part:(h + 1) * part], row[h * part:(h + 1) * part]
                    for j in range(part):
                        o_h[j] += a * row_h[j]


@njit(inline="always", fastmath=True, cache=True, nogil=True)
def head_dots(row, att, out):
    """out[h] = <row[h], att[h]> for each head (``row``, ``att``: heads x head width)."""
    for h in range(row.shape[0]):
        part, weights = row[h], att[h]
        acc = np.float32(0.0)
        for j in range(part.shape[0]):
            acc += part[j] * weights[j]
        out[h] = acc


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _attention_alpha_grad(indptr, indices, z, grad, dst_offset, heads, grad_alpha):
    """grad_alpha[e, h] = <grad[d, h-part], z[u_e, h-part]> for every edge and self loop."""
    rows = grad.shape[0]
    loops = indices.shape[0]
    part = z.shape[1] // heads
    z_heads, grad_heads = z.reshape(z.shape[0], heads, part), grad.reshape(rows, heads, part)
    for c in prange((rows + CHUNK - 1) // CHUNK):
        last = indptr[min(rows, (c + 1) * CHUNK)]
        for d in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            g = grad_heads[d]
            head_dots(g, z_heads[dst_offset + d], grad_alpha[loops + d])
            for e in range(indptr[d], indptr[d + 1]):
                if e + AHEAD < last:
                    prefetch_row(z, indices[e + AHEAD])
                head_dots(g, z_heads[indices[e]], grad_alpha[e])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _attention_z_grad(src_ptr, edges, edge_dst, alpha, grad, dst_offset, heads, grad_z):
    """The adjoint of ``_attention_forward`` in ``z``, one source row at a time over the transposed block."""
    width = grad_z.shape[1]
    part = width // heads
    num_dst = grad.shape[0]
    loops = edges.shape[0]
    rows = grad_z.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        last = src_ptr[min(rows, (c + 1) * CHUNK)]
        for u in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            acc = grad_z[u]
            own = u - dst_offset
            if 0 <= own < num_dst:
                g = grad[own]
                for h in range(heads):
                    a = alpha[loops + own, h]
                    acc_h, g_h = acc[h * part:(h + 1) * part], g[h * part:(h + 1) * part]
                    for j in range(part):
                        acc_h[j] = a * g_h[j]
            else:
                acc[:] = 0.0
            for t in range(src_ptr[u], src_ptr[u + 1]):
                e = edges[t]
                if t + AHEAD < last:
                    prefetch_row(grad, edge_dst[edges[t + AHEAD]])
                g = grad[edge_dst[e]]
                for h in range(heads):
                    a = alpha[e, h]
                    acc_h, g_h = acc[h * part:(h + 1) * part], g[h * part:(h + 1) * part]
                    for j in range(part):
                        acc_h[j] += a * g_h[j]


class _NumbaAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, alpha, block, heads):
        z, alpha = z.detach().contiguous(), alpha.detach().contiguous()
        out = torch.empty((block.num_dst, z.shape[1]), dtype=torch.float32)
        _attention_forward(block.indptr.numpy(), block.indices.numpy(), z.numpy(), alpha.numpy(), block.dst_offset,
                           heads, out.numpy())
        ctx.save_for_backward(z, alpha)
        ctx.block, ctx.heads = block, heads
        return out

    @staticmethod
    def backward(ctx, grad_out):
        z, alpha = ctx.saved_tensors
        block, heads = ctx.block, ctx.heads
        grad = grad_out.float().contiguous()
        grad_z = grad_alpha = None
        indptr, indices = block.indptr.numpy(), block.indices.numpy()
        if ctx.needs_input_grad[1]:
            grad_alpha = torch.empty(alpha.shape, dtype=torch.float32)
            _attention_alpha_grad(indptr, indices, z.numpy(), grad.numpy(), block.dst_offset, heads,
                                  grad_alpha.numpy())
        if ctx.needs_input_grad[0]:
            src_ptr, edges, edge_dst = transpose_edges(indptr, indices, block.num_src)
            grad_z = torch.empty(z.shape, dtype=torch.float32)
            _attention_z_grad(src_ptr, edges, edge_dst, alpha.numpy(), grad.numpy(), block.dst_offset, heads,
                              grad_z.numpy())
        return grad_z, grad_alpha, None, None


def attention_edges(block: Block) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, destination) of every edge GAT attends over: the block's edges in its order, then one self
    loop per destination (so no destination is left without inputs)."""
    self_loops = torch.arange(block.num_dst, device=block.indices.device)
    return (torch.cat([block.indices.long(), self_loops + block.dst_offset]),
            torch.cat([edge_destinations(block), self_loops]))


def attention_aggregate(block: Block, z: torch.Tensor, alpha: torch.Tensor, heads: int,
                        edges: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """GAT's weighted sum: row d, head h = sum over d's sampled in-edges e of alpha[e, h] z[u_e] (head h's
    columns), plus alpha[E + d, h] z_d (its self loop). ``z``: float32 source rows, heads' columns one after
    another; ``alpha``: (E + num_dst, heads), over ``attention_edges`` (or ``edges``)."""
    if z.device.type == "cpu" and z.dtype == torch.float32 and alpha.dtype == torch.float32:
        return _NumbaAttention.apply(z, alpha, block, heads)
    return attention_aggregate_torch(block, z, alpha, heads, edges)


def attention_aggregate_torch(block: Block, z: torch.Tensor, alpha: torch.Tensor, heads: int,
                              edges: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    src, dst = edges if edges is not None else attention_edges(block)
    zh = z.view(z.shape[0], heads, -1)
    out = torch.zeros((block.num_dst, heads, zh.shape[2]), dtype=z.dtype, device=z.device)
    return out.index_add(0, dst, zh[src] * alpha.unsqueeze(-1)).reshape(block.num_dst, -1)
