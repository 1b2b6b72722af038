"""Matrix products whose row count is rounded up to a few sizes, for bfloat16 on the CPU.

oneDNN builds (and keeps) a kernel and its buffers for every new shape of a bfloat16 product, and row counts
differ from batch to batch: rounding them up to one of 32 sizes per power of two (zero rows) bounds the
shapes, and so the memory (docs/performance.md, "bfloat16 products on the CPU: a bounded set of shapes").
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn import sparse_input
from neutronorch.nn.precision import compute_dtype

# Sizes per power of two: the padding is at most 1/BUCKETS of the rows (or 63 rows, for small products).
BUCKETS = 32
SMALLEST = 64  # below 2,048 rows: multiples of 64


def _step(rows: int) -> int:
    """The spacing of the bucket sizes around ``rows``."""
    return max(SMALLEST, 1 << max(0, rows.bit_length() - BUCKETS.bit_length()))


def padded_rows(rows: int) -> int:
    """``rows`` rounded up to the next bucket size."""
    step = _step(rows)
    return -(-rows // step) * step


def head_rows(rows: int) -> int:
    """The largest bucket size not above ``rows`` (0 below the smallest): the head a product can run over
    unpadded, the rest padded to ``padded_rows(rows)``."""
    step = _step(rows)
    return rows // step * step


def needs_buckets(x: torch.Tensor, dtype: torch.dtype | None = None) -> bool:
    """Whether a product of ``x`` (in ``dtype``, default what autocast or ``x`` makes it) runs in bfloat16
    on the CPU."""
    return x.device.type == "cpu" and (dtype or compute_dtype(x)) == torch.bfloat16


def project(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` over bucketed rows where that matters (see the module docstring), or
    through ``x``'s nonzeros when it is mostly zeros (``nn/sparse_input.py``)."""
    if sparse_input.dense_equivalent(x) < 1.0:
        return sparse_input.project(x, weight, bias)
    rows = x.shape[0]
    if x.dim() != 2 or not needs_buckets(x) or padded_rows(rows) == rows:
        return F.linear(x, weight, bias)
    return F.linear(F.pad(x, (0, 0, 0, padded_rows(rows) - rows)), weight, bias)[:rows]


def leading_rows(matrix: torch.Tensor, rows: int) -> torch.Tensor:
    """The first ``rows`` rows of the contiguous ``matrix``, a tensor of its own over the same memory (not a
    view: a custom autograd function may return it, and later ops may change it in place)."""
    out = torch.empty(0, dtype=matrix.dtype, device=matrix.device)
    return out.set_(matrix.untyped_storage(), matrix.storage_offset(), (rows,) + tuple(matrix.shape[1:]),
                    matrix.stride())


def linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``module(x)`` through ``project``."""
    return project(x, module.weight, module.bias)
