"""Splice: assemble a layer's output from rows computed here and rows computed elsewhere.

NeutronOrch computes the bottom layer of hot vertices once per super-batch (on the host) and reuses the
rows in every mini-batch: ``out[cold_pos] = y_cold`` (computed by the device) and ``out[hot_pos] =
table[hot_rows]``. Backward, the cold rows' gradient flows on to the device layer; the hot rows' is dropped
or added into ``grad_acc`` (a row per hot vertex), which the host turns into the bottom layer's weight
gradient once per super-batch.

On CPU the splice is fused with the ReLU and dropout that follow (one pass each way), with exactly the masks
``relu_dropout`` draws (both write a row through ``activation.relu_dropout_row``); elsewhere torch's
indexing ops. A table of another dtype is read as it is, only the rows used converted. What it costs:
docs/performance.md, "NeutronOrch's spliced step against the plain step".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from numba import njit, prange

from neutronorch.bfloat16 import load, numpy_view, store, supported
from neutronorch.nn.activation import draw_key, dropout_constants, relu_dropout, relu_dropout_row, row_ids
from neutronorch.prefetch import AHEAD, prefetch_row


@dataclass
class SpliceIndex:
    """Where each row of a spliced output comes from. Positions cover ``range(num_rows)`` exactly once;
    ``origin[i]`` is ``k`` for ``y_cold[k]`` and ``-1 - r`` for ``table[r]``; ``table_pos[i]`` is ``r`` for
    ``table[r]`` and 0 for a cold row (what the torch path gathers; made with the index, by its producer)."""

    num_rows: int
    cold_pos: torch.Tensor
    hot_pos: torch.Tensor
    hot_rows: torch.Tensor
    origin: torch.Tensor
    table_pos: torch.Tensor | None = None

    def __post_init__(self):
        if self.table_pos is None:
            self.table_pos = torch.clamp(-1 - self.origin, min=0)

    @classmethod
    def build(cls, num_rows: int, cold_pos: np.ndarray, hot_pos: np.ndarray, hot_rows: np.ndarray) -> "SpliceIndex":
        origin = np.empty(num_rows, np.int64)
        origin[cold_pos] = np.arange(cold_pos.shape[0])
        origin[hot_pos] = -1 - hot_rows
        return cls(num_rows, torch.from_numpy(cold_pos), torch.from_numpy(hot_pos), torch.from_numpy(hot_rows),
                   torch.from_numpy(origin))

    def to(self, device: torch.device, non_blocking: bool = False) -> "SpliceIndex":
        return SpliceIndex(self.num_rows, *(t.to(device, non_blocking=non_blocking) for t in self.tensors()))

    def tensors(self) -> list[torch.Tensor]:
        return [self.cold_pos, self.hot_pos, self.hot_rows, self.origin, self.table_pos]


@njit(inline="always")
def _copy_row(src, r, out, i):
    """``out[i] = src[r]``, either of float32 or bfloat16 bits (converted where they differ)."""
    source, target = src[r], out[i]
    for j in range(target.shape[0]):
        store(target, j, source[j])


@njit(parallel=True, cache=True, nogil=True)
def _splice_forward(y_cold, table, origin, out):
    n = origin.shape[0]
    for i in prange(n):
        if i + AHEAD < n and origin[i + AHEAD] < 0:
            prefetch_row(table, -1 - origin[i + AHEAD])
        o = origin[i]
        if o >= 0:
            _copy_row(y_cold, o, out, i)
        else:
            _copy_row(table, -1 - o, out, i)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _splice_act_forward(y_cold, table, origin, threshold, scale, key, ids, out, keep):
    n = origin.shape[0]
    for i in prange(n):
        # The table's rows come in random order: asked for ahead, they no longer stall the loop (a step's
        # 53k rows of 256 float32 from a 115k-row table, one thread: 12.6 -> 8.2 ms).
        if i + AHEAD < n and origin[i + AHEAD] < 0:
            prefetch_row(table, -1 - origin[i + AHEAD])
        o = origin[i]
        # One call per source array, not one on a source chosen at run time (that ran as slowly as a row view;
        # see relu_dropout_row).
        if o >= 0:
            relu_dropout_row(y_cold, o, out, keep, i, threshold, scale, key, ids[i])
        else:
            relu_dropout_row(table, -1 - o, out, keep, i, threshold, scale, key, ids[i])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _splice_backward(grad, keep, scale, cold_pos, hot_pos, hot_rows, grad_cold, grad_acc, masked, accumulate):
    """grad_cold[k] = grad[cold_pos[k]] and, if ``accumulate``, grad_acc[hot_rows[k]] += grad[hot_pos[k]];
    with ``masked``, gradients pass only where ``keep`` is set, times ``scale``. A hot vertex occurs at most
    once among a mini-batch's destinations, so every accumulator row is written by one iteration. (No
    prefetch here: it made this bandwidth-bound loop slower on two threads.)"""
    width = grad.shape[1]
    for k in prange(cold_pos.shape[0]):
        i = cold_pos[k]
        for j in range(width):
            if masked:
                result = load(grad[i, j]) * scale if keep[i, j] else np.float32(0.0)
                store(grad_cold, (k, j), result)
            else:
                grad_cold[k, j] = grad[i, j]  # the same dtype: a copy
    if accumulate:
        for k in prange(hot_pos.shape[0]):
            i = hot_pos[k]
            acc = grad_acc[hot_rows[k]]
            for j in range(width):
                if not masked:
                    acc[j] += load(grad[i, j])
                elif keep[i, j]:
                    acc[j] += load(grad[i, j]) * scale


def _numba_ok(y_cold, table, grad_acc) -> bool:
    """The kernels take float32 or bfloat16 rows (the table's dtype may differ from ``y_cold``'s) and a
    float32 accumulator."""
    return (all(t.device.type == "cpu" and t.is_contiguous() and supported(t.dtype) for t in (y_cold, table))
            and (grad_acc is None or (grad_acc.device.type == "cpu" and grad_acc.dtype == torch.float32)))


def _torch_forward(y: torch.Tensor, table: torch.Tensor, index: SpliceIndex) -> torch.Tensor:
    """Two ops (CUDA): every row gathered from the table (row 0 where the row is cold), the cold rows copied
    over them; no temporary, and only the gathered rows converted when the table has another dtype."""
    if index.hot_pos.shape[0] == 0:
        return y.new_empty((index.num_rows, y.shape[1])).index_copy_(0, index.cold_pos, y)
    out = table.index_select(0, index.table_pos)
    return (out if out.dtype == y.dtype else out.to(y.dtype)).index_copy_(0, index.cold_pos, y)


class _Splice(torch.autograd.Function):
    """The splice, fused with ReLU + dropout when ``p`` is not None, in ``y_cold``'s dtype (the kernels:
    torch's ``index_copy_`` took 50 ms for a 100k x 256 splice on two cores)."""

    @staticmethod
    def forward(ctx, y_cold, table, index, p, grad_acc, ids):
        y, t = y_cold.detach().contiguous(), table.detach().contiguous()
        keep, scale = None, np.float32(1.0)
        ctx.numba = _numba_ok(y, t, grad_acc)
        out = _torch_forward(y, t, index) if not ctx.numba else y.new_empty((index.num_rows, t.shape[1]))
        if ctx.numba and p is None:
            _splice_forward(numpy_view(y), numpy_view(t), index.origin.numpy(), numpy_view(out))
        elif ctx.numba:
            threshold, scale = dropout_constants(p)
            keep = torch.empty(out.shape, dtype=torch.uint8)
            _splice_act_forward(numpy_view(y), numpy_view(t), index.origin.numpy(), threshold, scale, draw_key(),
                                row_ids(ids, index.num_rows).numpy(), numpy_view(out), keep.numpy())
        ctx.index, ctx.grad_acc, ctx.keep, ctx.scale = index, grad_acc, keep, scale
        ctx.cold_shape = y_cold.shape
        return out

    @staticmethod
    def backward(ctx, grad):
        index = ctx.index
        accumulate = ctx.grad_acc is not None and index.hot_pos.shape[0] > 0
        grad = grad.contiguous()
        if not ctx.numba:
            if accumulate:
                ctx.grad_acc.index_add_(0, index.hot_rows, grad.index_select(0, index.hot_pos).to(ctx.grad_acc.dtype))
            return grad.index_select(0, index.cold_pos), None, None, None, None, None
        grad_cold = grad.new_empty(ctx.cold_shape)
        masked = ctx.keep is not None
        keep = ctx.keep.numpy() if masked else np.empty((0, 0), np.uint8)
        acc = ctx.grad_acc.numpy() if accumulate else np.empty((0, grad.shape[1]), np.float32)
        _splice_backward(numpy_view(grad), keep, ctx.scale, index.cold_pos.numpy(), index.hot_pos.numpy(),
                         index.hot_rows.numpy(), numpy_view(grad_cold), acc, masked, accumulate)
        return grad_cold, None, None, None, None, None


def splice(y_cold: torch.Tensor, table: torch.Tensor, index: SpliceIndex,
           grad_acc: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``index.cold_pos`` from ``y_cold`` (in order), rows ``index.hot_pos`` from
    ``table[index.hot_rows]``. Hot-row gradients are added into ``grad_acc`` if given, else dropped."""
    return _Splice.apply(y_cold, table, index, None, grad_acc, None)


def splice_relu_dropout(y_cold: torch.Tensor, table: torch.Tensor, index: SpliceIndex, p: float,
                        training: bool, grad_acc: torch.Tensor | None = None,
                        ids: torch.Tensor | None = None) -> torch.Tensor:
    """``relu_dropout(splice(...), p, training, ids)``, fused into one pass on CPU."""
    if training and p > 0 and _numba_ok(y_cold, table, grad_acc):
        return _Splice.apply(y_cold, table, index, p, grad_acc, ids)
    return relu_dropout(splice(y_cold, table, index, grad_acc), p, training, ids)


@dataclass
class HotRows:
    """A mini-batch's bottom-layer rows computed elsewhere (NeutronOrch's hot rows), for ``splice``."""

    table: torch.Tensor
    index: SpliceIndex
    grad_acc: torch.Tensor | None = None
