"""The parameter-free neighbourhood aggregations every path that computes a layer calls (the training device,
NeutronOrch's host, full-neighbour inference), so their results agree by construction: the mean
(``mean_aggregate``) and GCN's symmetric normalisation (``symmetric_aggregate``).

On CPU, for float32 and bfloat16, numba kernels parallel over destinations forward and over the sources of
the transposed block backward (no atomics); torch ops elsewhere; tests prove both equal.
``fused_mean_linear`` evaluates a whole separable layer (aggregation and weight) in one autograd node on CPU.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange
from torch.nn import functional as F

from neutronorch.bfloat16 import accumulator, finish, flush, load, numpy_view, store, supported
from neutronorch.data.csc import transpose_edges
from neutronorch.nn.bucket import head_rows, leading_rows, needs_buckets, padded_rows
from neutronorch.nn.precision import compute_dtype, sum_dtype
from neutronorch.nn.rows import take_rows
from neutronorch.prefetch import AHEAD, prefetch_part, prefetch_row
from neutronorch.sampling.block import Block


# Destinations per parallel task: each task owns one float32 scratch row (bfloat16 outputs sum there).
CHUNK = 64


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _layer_input_forward(indptr, indices, x, dst_offset, self_columns, include_self, out):
    """out[:, :k] = [x_dst | mean] when ``self_columns``, else the mean alone (k = 2 or 1 times the
    width); any further column of ``out`` is set to 1 (it carries a bias through the matrix product).
    ``x`` and ``out`` are float32 or bfloat16 bits, independently; sums are float32. Rows are read through
    1-D views: indexing the 2-D arrays directly kept LLVM from vectorising."""
    width = x.shape[1]
    offset = width if self_columns else 0
    rows = out.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        scratch = np.empty(width, np.float32)
        last = indptr[min(rows, (c + 1) * CHUNK)]  # the chunk's edges end here
        for d in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            o = out[d]
            acc = accumulator(o, offset, width, scratch)
            own = x[dst_offset + d]
            if include_self:
                for j in range(width):
                    acc[j] = load(own[j])
            else:
                acc[:] = 0.0
            if self_columns:
                for j in range(width):
                    store(o, j, own[j])  # bfloat16 bits copied as they are
            for j in range(offset + width, o.shape[0]):
                store(o, j, 1.0)
            start, end = indptr[d], indptr[d + 1]
            for e in range(start, end):
                if e + AHEAD < last:
                    prefetch_row(x, indices[e + AHEAD])
                row = x[indices[e]]
                for j in range(width):
                    acc[j] += load(row[j])
            count = end - start + (1 if include_self else 0)
            finish(o, offset, acc, np.float32(1.0) / np.float32(max(count, 1)))


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _layer_input_backward(indptr, src_ptr, readers, grad_h, dst_offset, self_columns, include_self, grad_x):
    """The adjoint of ``_layer_input_forward``, one source row at a time over the transposed block."""
    width = grad_x.shape[1]
    offset = width if self_columns else 0
    num_dst = grad_h.shape[0]
    rows = grad_x.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        scratch = np.empty(width, np.float32)
        last = src_ptr[min(rows, (c + 1) * CHUNK)]
        for u in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            acc = accumulator(grad_x[u], 0, width, scratch)
            acc[:] = 0.0
            own = u - dst_offset
            if 0 <= own < num_dst:
                g = grad_h[own]
                if self_columns:
                    for j in range(width):
                        acc[j] += load(g[j])
                if include_self:
                    inv = np.float32(1.0) / np.float32(indptr[own + 1] - indptr[own] + 1)
                    mean_part = g[offset:offset + width]  # a slice, not g[offset + j]: see bfloat16
                    for j in range(width):
                        acc[j] += load(mean_part[j]) * inv
            for t in range(src_ptr[u], src_ptr[u + 1]):
                if t + AHEAD < last:
                    prefetch_part(grad_h, readers[t + AHEAD], offset, offset + width)
                d = readers[t]
                inv = np.float32(1.0) / np.float32(indptr[d + 1] - indptr[d] + (1 if include_self else 0))
                mean_part = grad_h[d, offset:offset + width]
                for j in range(width):
                    acc[j] += load(mean_part[j]) * inv
            flush(grad_x[u], 0, acc)


def _input_grad(block, grad, width, dtype, kernel, *args):
    """The source rows' gradient by the adjoint ``kernel(indptr, src_ptr, readers, grad, dst_offset, *args,
    grad_x)``: ``readers[src_ptr[u]:src_ptr[u + 1]]`` the destinations that read source ``u``."""
    src_ptr, edges, dst = transpose_edges(block.indptr.numpy(), block.indices.numpy(), block.num_src)
    grad_x = torch.empty((block.num_src, width), dtype=dtype)
    kernel(block.indptr.numpy(), src_ptr, dst[edges], numpy_view(grad.contiguous()), block.dst_offset, *args,
           numpy_view(grad_x))
    return grad_x


def _numba_ok(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and supported(x.dtype)


class _NumbaAggregate(torch.autograd.Function):
    """A parameter-free aggregation by two kernels: ``forward(indptr, indices, x, dst_offset, *args, out)``
    over the destinations, and its adjoint (``_input_grad``) over the sources of the transposed block."""

    @staticmethod
    def forward(ctx, x_src, block, kernels, *args):
        x = x_src.detach().contiguous()
        out = torch.empty((block.num_dst, x.shape[1]), dtype=x.dtype)
        kernels[0](block.indptr.numpy(), block.indices.numpy(), numpy_view(x), block.dst_offset, *args,
                   numpy_view(out))
        ctx.block, ctx.backward_kernel, ctx.args, ctx.dtype = block, kernels[1], args, x.dtype
        return out

    @staticmethod
    def backward(ctx, grad_out):
        grad_x = None
        if ctx.needs_input_grad[0]:
            width = grad_out.shape[1]
            grad_x = _input_grad(ctx.block, grad_out, width, ctx.dtype, ctx.backward_kernel, *ctx.args)
        return grad_x, None, None, *[None] * len(ctx.args)


class _FusedMeanLinear(torch.autograd.Function):
    """``h @ weight.T`` with ``h`` = [x_dst | mean | 1] (SAGE) or [mean with self | 1] (GCN), built by one
    kernel, and ``weight`` = [W_self | W_neigh | bias] (or [W | bias]): the ones column folds the bias into
    the product (no broadcast copy forward, no column sum backward). ``h`` has ``weight``'s dtype."""

    @staticmethod
    def forward(ctx, x_src, weight, block, self_columns, include_self):
        x = x_src.detach().contiguous()
        rows = block.num_dst
        # bfloat16 on the CPU: rows rounded up to a bucket size, the extra rows zero (nn/bucket.py).
        padded = padded_rows(rows) if needs_buckets(x, weight.dtype) else rows
        h = torch.empty((padded, weight.shape[1]), dtype=weight.dtype)
        h[rows:] = 0
        _layer_input_forward(block.indptr.numpy(), block.indices.numpy(), numpy_view(x), block.dst_offset,
                             self_columns, include_self, numpy_view(h[:rows]))
        ctx.save_for_backward(h, weight)
        ctx.block, ctx.width, ctx.dtype, ctx.rows = block, x.shape[1], x.dtype, rows
        ctx.self_columns, ctx.include_self = self_columns, include_self
        y = h @ weight.t()
        return y if padded == rows else leading_rows(y, rows)

    @staticmethod
    def backward(ctx, grad_y):
        h, weight = ctx.saved_tensors
        rows, padded = ctx.rows, h.shape[0]
        # Padded rows: a bucket-sized head of grad_y as it is, the rest padded with zeros to the next bucket
        # (h's extra rows are zero), so only that remainder is copied (nn/bucket.py).
        if padded == rows:
            parts = [(grad_y, 0, rows)]
        else:
            head = head_rows(rows)
            parts = [(grad_y[:head], 0, head)] if head else []
            parts.append((F.pad(grad_y[head:], (0, 0, 0, padded - rows)), head, padded))
        grad_x = None
        if ctx.needs_input_grad[0]:
            inputs = ctx.width * (2 if ctx.self_columns else 1)
            grad_h = torch.empty((padded, inputs), dtype=grad_y.dtype)
            for g, start, stop in parts:
                torch.mm(g, weight[:, :inputs], out=grad_h[start:stop])
            grad_x = _input_grad(ctx.block, grad_h[:rows], ctx.width, ctx.dtype, _layer_input_backward,
                                 ctx.self_columns, ctx.include_self)
        grad_weight = None
        if ctx.needs_input_grad[1]:
            for g, start, stop in parts:
                part = g.t() @ h[start:stop]
                grad_weight = part if grad_weight is None else grad_weight + part
        return grad_x, grad_weight, None, None, None


def fused_mean_linear(block: Block, x_src: torch.Tensor, weights: list[torch.Tensor], bias: torch.Tensor,
                      self_columns: bool, include_self: bool) -> torch.Tensor | None:
    """The fused CPU evaluation of a separable layer, or None where it does not apply. ``weights`` is [W] or
    [W_self, W_neigh] with ``self_columns``; the product runs in ``compute_dtype(x_src)``."""
    dtype = compute_dtype(x_src)
    if not _numba_ok(x_src) or not supported(dtype) or bias.dtype != torch.float32:
        return None
    weight = torch.cat(weights + [bias.unsqueeze(1)], dim=1).to(dtype)
    return _FusedMeanLinear.apply(x_src, weight, block, self_columns, include_self)


def mean_aggregate(block: Block, x_src: torch.Tensor, include_self: bool = False,
                   edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """Row ``i`` = mean of ``x_src`` over destination ``i``'s sampled sources (and ``x_src[i]`` itself
    when ``include_self``); zero for a destination with nothing to average. Sums are float32; the result has
    ``x_src``'s dtype. ``edge_weight`` (one per edge, ``block.indices``' order) scales each message, the sum
    still divided by the count: ``sum_e w_e x_{u_e} / deg`` (torch ops)."""
    if edge_weight is None and _numba_ok(x_src):
        kernels = (_layer_input_forward, _layer_input_backward)
        return _NumbaAggregate.apply(x_src, block, kernels, False, include_self)
    return mean_aggregate_torch(block, x_src, include_self, edge_weight)


def mean_aggregate_torch(block: Block, x_src: torch.Tensor, include_self: bool = False,
                         edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """The same definition in plain torch ops (any device); autograd derives the backward pass."""
    if edge_weight is not None and edge_weight.numel() != block.num_edges:
        raise ValueError(f"{edge_weight.numel()} edge weights for {block.num_edges} edges")
    acc = sum_dtype(x_src)
    out = _edge_sum(block, x_src, edge_weight, acc)
    count = block.in_degrees().to(acc)
    if include_self:
        out = out + block.dst_rows(x_src)
        count = count + 1
    return (out / count.clamp(min=1).unsqueeze(1)).to(x_src.dtype)


def _edge_sum(block: Block, x_src: torch.Tensor, scale: torch.Tensor | None, acc: torch.dtype
              ) -> torch.Tensor:
    """Per destination, in ``acc``: the sum over its edges of their source rows, each times its ``scale``."""
    messages = take_rows(x_src, block.indices.long()).to(acc)
    if scale is not None:
        messages = messages * scale.reshape(-1, 1).to(acc)
    out = torch.zeros((block.num_dst, x_src.shape[1]), dtype=acc, device=x_src.device)
    return out.index_add(0, edge_destinations(block), messages)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _symmetric_forward(indptr, indices, x, dst_offset, degree, self_coef, neigh_coef, out):
    """out[d] = neigh_coef[d] * sum_e x[u_e] / sqrt(degree[u_e] + 1) + self_coef[d] * x[dst_offset + d], each
    source's weight computed where it is read (an in-place block over every vertex costs its edges alone)."""
    width = x.shape[1]
    rows = out.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        scratch = np.empty(width, np.float32)
        last = indptr[min(rows, (c + 1) * CHUNK)]
        for d in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            acc = accumulator(out[d], 0, width, scratch)
            acc[:] = 0.0
            for e in range(indptr[d], indptr[d + 1]):
                if e + AHEAD < last:
                    prefetch_row(x, indices[e + AHEAD])
                u = indices[e]
                row = x[u]
                w = np.float32(1.0) / np.sqrt(degree[u] + np.float32(1.0))
                for j in range(width):
                    acc[j] += w * load(row[j])
            a, b = neigh_coef[d], self_coef[d]
            own = x[dst_offset + d]
            for j in range(width):
                acc[j] = a * acc[j] + b * load(own[j])
            flush(out[d], 0, acc)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _symmetric_backward(indptr, src_ptr, readers, grad, dst_offset, degree, self_coef, neigh_coef, grad_x):
    """The adjoint of ``_symmetric_forward``, one source row at a time over the transposed block (``indptr``
    unused: ``_NumbaAggregate``'s adjoints take one form)."""
    width = grad_x.shape[1]
    num_dst = grad.shape[0]
    rows = grad_x.shape[0]
    for c in prange((rows + CHUNK - 1) // CHUNK):
        scratch = np.empty(width, np.float32)
        last = src_ptr[min(rows, (c + 1) * CHUNK)]
        for u in range(c * CHUNK, min(rows, (c + 1) * CHUNK)):
            acc = accumulator(grad_x[u], 0, width, scratch)
            acc[:] = 0.0
            for t in range(src_ptr[u], src_ptr[u + 1]):
                if t + AHEAD < last:
                    prefetch_row(grad, readers[t + AHEAD])
                d = readers[t]
                coef = neigh_coef[d]
                g = grad[d]
                for j in range(width):
                    acc[j] += coef * load(g[j])
            w = np.float32(1.0) / np.sqrt(degree[u] + np.float32(1.0))
            for j in range(width):
                acc[j] *= w
            own = u - dst_offset
            if 0 <= own < num_dst:
                coef = self_coef[own]
                g = grad[own]
                for j in range(width):
                    acc[j] += coef * load(g[j])
            flush(grad_x[u], 0, acc)


def symmetric_aggregate(block: Block, x_src: torch.Tensor) -> torch.Tensor:
    """GCN's symmetric normalisation with a self loop, by graph degrees (D = in-degree + 1):
    row v = x_v / D_v + (|N(v)| / |S(v)|) sum_{u in S(v)} x_u / sqrt(D_u D_v) over the sampled
    in-neighbours S(v): an unbiased estimate of the sum over all of N(v), and exactly it when S(v) = N(v).
    Only the destinations' and the edges' degrees are read, never all of ``src_degree``."""
    if block.src_degree is None:
        raise ValueError("symmetric normalisation needs the graph degrees of the block's sources: sample with "
                         "degrees=True")
    dst_degree = block.dst_rows(block.src_degree)
    own = (dst_degree + 1).rsqrt()
    sampled = block.in_degrees().to(own.dtype).clamp(min=1)
    self_coef, neigh_coef = own * own, own * dst_degree / sampled
    if _numba_ok(x_src):
        coefs = [t.float().contiguous().numpy() for t in (block.src_degree, self_coef, neigh_coef)]
        return _NumbaAggregate.apply(x_src, block, (_symmetric_forward, _symmetric_backward), *coefs)
    acc = sum_dtype(x_src)
    out = _edge_sum(block, x_src, (block.src_degree[block.indices.long()] + 1).rsqrt(), acc)
    return (out * neigh_coef.to(acc).unsqueeze(1)
            + block.dst_rows(x_src).to(acc) * self_coef.to(acc).unsqueeze(1)).to(x_src.dtype)


def gcn_aggregate(block: Block, x_src: torch.Tensor, norm: str) -> torch.Tensor:
    """GCN's aggregation with a self loop, normalised as ``norm`` says (``GCNConv``)."""
    return symmetric_aggregate(block, x_src) if norm == "symmetric" else mean_aggregate(block, x_src, True)


def edge_destinations(block: Block) -> torch.Tensor:
    """The destination of every edge of ``block`` (CSR rows expanded)."""
    return torch.repeat_interleave(torch.arange(block.num_dst, device=block.indptr.device),
                                   block.in_degrees(), output_size=block.num_edges)

