"""The parameter-free neighbourhood aggregation shared by every path that computes a layer.

``mean_aggregate(block, x_src, include_self)`` is the one definition of "mean over the sampled
in-neighbours (optionally together with the vertex itself)". The training device, the host producer of
NeutronOrch mode and full-neighbour inference all call it, so their results agree by construction.
Two implementations exist behind it: numba kernels for float32 CPU tensors (parallel over destinations in
the forward pass, over column stripes in the backward pass, so no atomics are needed) and plain torch ops
for every other device and dtype. A test proves both equal.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from numba import njit, prange

from neutronorch.sampling.block import Block


@njit(parallel=True, fastmath=True, cache=True)
def _mean_forward(indptr, indices, x, include_self, out):
    width = x.shape[1]
    for d in prange(out.shape[0]):
        start, end = indptr[d], indptr[d + 1]
        count = end - start + (1 if include_self else 0)
        for j in range(width):
            out[d, j] = x[d, j] if include_self else 0.0
        for e in range(start, end):
            u = indices[e]
            for j in range(width):
                out[d, j] += x[u, j]
        if count > 0:
            inv = np.float32(1.0) / np.float32(count)
            for j in range(width):
                out[d, j] *= inv


@njit(parallel=True, fastmath=True, cache=True)
def _mean_backward(indptr, indices, grad_out, include_self, stripe, grad_x):
    # Each task owns a stripe of columns for all rows: scatter-adds from different tasks never collide.
    width = grad_out.shape[1]
    num_stripes = (width + stripe - 1) // stripe
    for s in prange(num_stripes):
        lo = s * stripe
        hi = min(width, lo + stripe)
        for d in range(grad_out.shape[0]):
            start, end = indptr[d], indptr[d + 1]
            count = end - start + (1 if include_self else 0)
            if count == 0:
                continue
            inv = np.float32(1.0) / np.float32(count)
            if include_self:
                for j in range(lo, hi):
                    grad_x[d, j] += grad_out[d, j] * inv
            for e in range(start, end):
                u = indices[e]
                for j in range(lo, hi):
                    grad_x[u, j] += grad_out[d, j] * inv


class _NumbaMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_src, indptr, indices, num_dst, include_self):
        x = x_src.detach().contiguous()
        out = torch.empty((num_dst, x.shape[1]), dtype=x.dtype)
        _mean_forward(indptr.numpy(), indices.numpy(), x.numpy(), include_self, out.numpy())
        ctx.save_for_backward(indptr, indices)
        ctx.num_src = x.shape[0]
        ctx.include_self = include_self
        return out

    @staticmethod
    def backward(ctx, grad_out):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None
        indptr, indices = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_x = torch.zeros((ctx.num_src, grad_out.shape[1]), dtype=grad_out.dtype)
        stripes = max(1, numba.get_num_threads())
        stripe = max(16, -(-grad_out.shape[1] // stripes))
        _mean_backward(indptr.numpy(), indices.numpy(), grad_out.numpy(), ctx.include_self, stripe,
                       grad_x.numpy())
        return grad_x, None, None, None, None


def mean_aggregate(block: Block, x_src: torch.Tensor, include_self: bool = False) -> torch.Tensor:
    """Row ``i`` = mean of ``x_src`` over destination ``i``'s sampled sources (and ``x_src[i]`` itself
    when ``include_self``); zero for a destination with nothing to average."""
    if x_src.device.type == "cpu" and x_src.dtype == torch.float32:
        return _NumbaMean.apply(x_src, block.indptr, block.indices, block.num_dst, include_self)
    return mean_aggregate_torch(block, x_src, include_self)


def mean_aggregate_torch(block: Block, x_src: torch.Tensor, include_self: bool = False) -> torch.Tensor:
    """The same definition in plain torch ops (any device); autograd derives the backward pass."""
    degrees = block.in_degrees()
    dst = edge_destinations(block)
    out = torch.zeros((block.num_dst, x_src.shape[1]), dtype=x_src.dtype, device=x_src.device)
    out = out.index_add(0, dst, x_src[block.indices])
    count = degrees.to(x_src.dtype)
    if include_self:
        out = out + x_src[:block.num_dst]
        count = count + 1
    return out / count.clamp(min=1).unsqueeze(1)


def edge_destinations(block: Block) -> torch.Tensor:
    """The destination of every edge of ``block`` (CSR rows expanded)."""
    return torch.repeat_interleave(torch.arange(block.num_dst, device=block.indptr.device),
                                   block.in_degrees(), output_size=block.num_edges)
