"""Products of mostly-zero input rows (bag-of-words features) with a weight, at the cost of their nonzeros:
the rows are read once into a compressed form and multiplied through it; the weight's gradient is the same
sum, transposed. Measurements: docs/performance.md, "Mostly-zero feature rows".

``project`` equals ``F.linear`` up to float32 rounding, each output row written by one thread (the same
whatever the threads), where ``dense_equivalent(x)`` (a few rows sampled) is below 1.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from neutronorch.bfloat16 import load, numpy_view, supported
from neutronorch.data.csc import transpose_edges
from neutronorch.nn.precision import compute_dtype

MIN_WIDTH = 256  # narrower rows cost little densely, and the form's overhead is a larger share
# The most nonzeros (a share of the sampled entries) at which the compressed product is taken: it broke even
# near 12% (docs/performance.md, "Mostly-zero feature rows").
MAX_DENSITY = 0.08
PROBE_ROWS = 64  # rows sampled to estimate the density
# How much more a nonzero's multiply-add costs here than one of a dense (MKL) product: what a layer weighs
# when it decides whether to multiply before aggregating (``dense_equivalent``). Times MAX_DENSITY: below 1.
SPARSE_PENALTY = 6.0


@njit(cache=True, nogil=True)
def _sample_density(x, rows):
    """The share of nonzeros in ``rows`` evenly spaced rows of ``x``."""
    n, width = x.shape
    step = max(1, n // rows)
    seen = 0
    nonzero = 0
    for i in range(0, n, step):
        row = x[i]
        for j in range(width):
            if load(row[j]) != 0.0:
                nonzero += 1
        seen += width
    return nonzero / max(seen, 1)


@njit(parallel=True, cache=True, nogil=True)
def _compress(x):
    """``x``'s nonzeros row by row: ``indptr`` (rows + 1), their columns (int32) and values (float32)."""
    n, width = x.shape
    counts = np.zeros(n + 1, np.int64)
    for i in prange(n):
        row = x[i]
        c = 0
        for j in range(width):
            if load(row[j]) != 0.0:
                c += 1
        counts[i + 1] = c
    indptr = np.cumsum(counts)
    columns = np.empty(indptr[n], np.int32)
    values = np.empty(indptr[n], np.float32)
    for i in prange(n):
        row = x[i]
        at = indptr[i]
        for j in range(width):
            v = load(row[j])
            if v != 0.0:
                columns[at] = j
                values[at] = v
                at += 1
    return indptr, columns, values


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _compressed_times(ptr, index, values, dense, out):
    """``out[i] = sum_e values[e] * dense[index[e]]`` over ``e`` in ``ptr[i]:ptr[i+1]`` (``out`` zeroed): by
    rows, ``x @ weight.T``; by columns times the output's gradient, the weight's gradient, transposed."""
    width = out.shape[1]
    for i in prange(out.shape[0]):
        o = out[i]
        for e in range(ptr[i], ptr[i + 1]):
            v = values[e]
            row = dense[index[e]]
            for j in range(width):
                o[j] += v * row[j]


def dense_equivalent(x: torch.Tensor) -> float:
    """The share of a dense product's cost that a product of ``x`` costs: the share of nonzeros in
    ``PROBE_ROWS`` evenly spaced rows times ``SPARSE_PENALTY`` where that share is at most ``MAX_DENSITY``
    (so below 1), else 1; always 1 unless ``x`` is a float32 or bfloat16 CPU matrix, at least ``MIN_WIDTH``
    wide, with rows, that needs no gradient. Below 1, ``project`` multiplies ``x`` through its nonzeros."""
    if not (x.device.type == "cpu" and x.dim() == 2 and supported(x.dtype) and x.shape[1] >= MIN_WIDTH
            and x.shape[0] > 0 and not x.requires_grad):
        return 1.0
    share = float(_sample_density(numpy_view(x.contiguous()), PROBE_ROWS))
    return share * SPARSE_PENALTY if share <= MAX_DENSITY else 1.0


class _SparseRowsProduct(torch.autograd.Function):
    """``x @ [w_1; w_2; ...].T + bias`` over ``x``'s nonzeros (the weights' outputs side by side, ``bias``
    over all of them or None); ``x`` gets a gradient only when it asks for one."""

    @staticmethod
    def forward(ctx, x, bias, *weights):
        indptr, columns, values = _compress(numpy_view(x.contiguous()))
        widths = [w.shape[0] for w in weights]
        # The weights transposed side by side, written in one pass (no concatenation first).
        weight_t = torch.empty(x.shape[1], sum(widths), dtype=torch.float32)
        start = 0
        for w, width in zip(weights, widths):
            weight_t[:, start:start + width].copy_(w.detach().t())
            start += width
        out = torch.zeros(x.shape[0], weight_t.shape[1], dtype=torch.float32)
        _compressed_times(indptr, columns, values, weight_t.numpy(), out.numpy())
        if bias is not None:
            out += bias.detach().float()
        ctx.compressed = (indptr, columns, values)
        ctx.in_width = x.shape[1]
        ctx.widths = widths
        ctx.save_for_backward(*weights)
        return out

    @staticmethod
    def backward(ctx, grad):
        weights = ctx.saved_tensors
        grad = grad.float().contiguous()
        grad_x = grad_bias = None
        grad_weights = [None] * len(weights)
        if ctx.needs_input_grad[0]:
            grad_x = grad @ torch.cat([w.float() for w in weights])
        if ctx.needs_input_grad[1]:
            grad_bias = grad.sum(0)
        if any(ctx.needs_input_grad[2:]):
            indptr, columns, values = ctx.compressed
            colptr, order, rows = transpose_edges(indptr, columns, ctx.in_width)  # the nonzeros column by column
            grad_t = torch.zeros(ctx.in_width, grad.shape[1], dtype=torch.float32)
            _compressed_times(colptr, rows[order], values[order], grad.numpy(), grad_t.numpy())
            start = 0
            for i, (w, width) in enumerate(zip(weights, ctx.widths)):
                if ctx.needs_input_grad[2 + i]:
                    grad_weights[i] = grad_t[:, start:start + width].t().to(w.dtype)
                start += width
        return (grad_x, grad_bias, *grad_weights)


def project(x: torch.Tensor, weight: torch.Tensor | list[torch.Tensor], bias: torch.Tensor | None = None
            ) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` through ``x``'s nonzeros (where ``dense_equivalent(x) < 1``), in
    ``compute_dtype(x)``. A list of weights gives their outputs side by side; ``bias`` then spans them all."""
    weights = [weight] if isinstance(weight, torch.Tensor) else list(weight)
    dtype = compute_dtype(x)
    with torch.autocast("cpu", enabled=False):
        out = _SparseRowsProduct.apply(x, bias, *weights)
    return out if out.dtype == dtype else out.to(dtype)
