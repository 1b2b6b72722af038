"""ReLU followed by dropout, fused into one kernel on CPU, and dropout alone keyed the same way
(``keyed_dropout``: the graph blocks' dropouts, by vertex; GAT's attention dropout, by ``edge_ids``).

On CPU, ``F.dropout`` draws a Bernoulli variable per element, which costs more than the matrix products of a
GraphSAGE layer. The kernel draws 8 random bytes per 64-bit word of a counter-based stream keyed by (key,
vertex) (dropout probability resolved to 1/256) and stores one byte per element that combines "kept" and
"positive before ReLU", all the backward pass needs. The key comes from torch's generator, so
``torch.manual_seed`` governs it.

A row's mask is keyed by the global id of its vertex (``ids``; its position when none are given), so data
parallel ranks that split a batch draw exactly the masks one process draws for the whole batch. Other
devices compute the same bytes with torch's integer ops (``keyed_keep``); without ids they use the torch ops.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import torch
from numba import njit, prange
from torch.nn import functional as F

from neutronorch.bfloat16 import load, numpy_view, store, supported
from neutronorch.sampling.kernels import GOLDEN, T_GOLDEN, mix, splitmix_key, torch_mix, torch_splitmix_key


@njit(inline="always")
def dropout_bytes(keep, i, key, vertex):
    """``keep[i]`` = row ``i``'s random bytes: element ``j``'s is byte ``j % 8`` of word ``j // 8`` of the
    splitmix64 stream that starts at ``splitmix_key(key, vertex)``."""
    width = keep.shape[1]
    stream = splitmix_key(key, vertex)
    mask = keep[i]
    for w in range(width // 8):  # whole words apart from the tail: the byte loop unrolls
        bits = mix(stream + np.uint64(w) * GOLDEN)
        for b in range(8):
            mask[8 * w + b] = np.uint8((bits >> np.uint64(8 * b)) & np.uint64(255))
    if width % 8:
        bits = mix(stream + np.uint64(width // 8) * GOLDEN)
        for j in range(width - width % 8, width):
            mask[j] = np.uint8((bits >> np.uint64(8 * (j % 8))) & np.uint64(255))


@njit(inline="always")
def relu_dropout_row(src, r, out, keep, i, threshold, scale, key, vertex, relu=True):
    """Row ``i`` (of vertex ``vertex``) of the fused ReLU + dropout from row ``r`` of ``src``: ``out[i, j]``
    is ``src[r, j] * scale`` where kept (random byte at least ``threshold``) and positive (without ``relu``:
    kept), else 0, and ``keep[i, j]`` is 1 there, else 0. ``src`` may be ``out``; both hold float32 or
    bfloat16 bits. Two vectorised passes: the bytes, then a branch-free select (docs/performance.md,
    "Kernels in bfloat16")."""
    dropout_bytes(keep, i, key, vertex)
    source, target, mask = src[r], out[i], keep[i]
    for j in range(target.shape[0]):
        value = load(source[j])
        kept = (mask[j] >= threshold) & ((value > 0) | (not relu))
        result = value * scale if kept else np.float32(0.0)  # a name, not inline in the call: bfloat16.store
        store(target, j, result)
        mask[j] = np.uint8(kept)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _relu_forward(y, threshold, scale, key, ids, keep):
    # In place, one array: given it twice (as input and output), numba compiled this loop 3.4 times slower
    # (docs/results/one-engine-2026-12-06-round-four.md).
    for i in prange(y.shape[0]):
        relu_dropout_row(y, i, y, keep, i, threshold, scale, key, ids[i])


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _dropout_forward(x, threshold, scale, key, ids, out, keep):
    for i in prange(x.shape[0]):
        relu_dropout_row(x, i, out, keep, i, threshold, scale, key, ids[i], False)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _backward(grad_out, keep, scale, grad_in):
    rows, width = grad_out.shape
    for i in prange(rows):
        for j in range(width):
            result = load(grad_out[i, j]) * scale if keep[i, j] else np.float32(0.0)
            store(grad_in, (i, j), result)


def dropout_constants(p: float) -> tuple[np.uint64, np.float32]:
    """(byte threshold, scale) of dropout probability ``p`` resolved to 1/256."""
    threshold = np.uint64(min(255, round(p * 256)))
    return threshold, np.float32(256.0 / (256 - int(threshold)))


_streams = threading.local()


@contextmanager
def dropout_keys(key: int) -> Iterator[None]:
    """Within this block, on this thread, dropout keys are the counter stream ``splitmix_key(key, i)``,
    i = 0, 1, ..., not torch's generator's draws: a thread other than the trainer's (NeutronOrch's host
    producer) must neither depend on the trainer's draws nor disturb them."""
    before = getattr(_streams, "stream", None)
    _streams.stream = [np.uint64(key & 0xFFFFFFFFFFFFFFFF), 0]
    try:
        yield
    finally:
        _streams.stream = before


def draw_key() -> np.uint64:
    """A dropout key: from torch's generator (so ``torch.manual_seed`` governs the masks), or the next of
    this thread's ``dropout_keys`` stream."""
    stream = getattr(_streams, "stream", None)
    if stream is None:
        return np.uint64(int(torch.randint(0, 2**62, (1,))))
    stream[1] += 1
    return np.uint64(splitmix_key(stream[0], np.uint64(stream[1] - 1)))


class _Dropout(torch.autograd.Function):
    """Keyed dropout, after a ReLU with ``relu``. The ReLU's runs in place: a layer's pre-activation output is
    needed by nothing else (autograd's version counter would raise if it were), and skipping a fresh output
    saves its page faults."""

    @staticmethod
    def forward(ctx, x, p, ids, relu):
        threshold, scale = dropout_constants(p)
        key = draw_key()
        keep = torch.empty(x.shape, dtype=torch.uint8)
        out = x if relu else torch.empty_like(x)
        values, rows = numpy_view(x.detach()), row_ids(ids, x.shape[0]).numpy()
        if relu:  # a constant ``relu`` in each kernel: it vectorises
            _relu_forward(values, threshold, scale, key, rows, keep.numpy())
            ctx.mark_dirty(x)
        else:
            _dropout_forward(values, threshold, scale, key, rows, numpy_view(out), keep.numpy())
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        (keep,) = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_in = torch.empty_like(grad_out)
        _backward(numpy_view(grad_out), keep.numpy(), ctx.scale, numpy_view(grad_in))
        return grad_in, None, None, None


def row_ids(ids: torch.Tensor | None, rows: int) -> torch.Tensor:
    """The vertex ids that key each row's mask (the row positions without ``ids``), int64 on CPU."""
    if ids is None:
        return torch.arange(rows, dtype=torch.int64)
    if ids.shape != (rows,):
        raise ValueError(f"dropout ids: {tuple(ids.shape)} for {rows} rows")
    return ids.to("cpu", torch.int64).contiguous()


def keyed_keep(key: np.uint64, ids: torch.Tensor, width: int, threshold: np.uint64) -> torch.Tensor:
    """Torch's ``dropout_bytes`` >= ``threshold``, on ``ids``' device: the CPU kernels' kept elements."""
    stream = torch_splitmix_key(int(key), ids)
    words = torch.arange(-(-width // 8), dtype=torch.int64, device=ids.device) * T_GOLDEN
    bits = torch_mix(stream[:, None] + words[None, :])  # rows x words
    # Byte b of every word compared at once (boolean results: no rows x width int64 intermediate).
    kept = torch.stack([((bits >> (8 * b)) & 255) >= int(threshold) for b in range(8)], dim=2)
    return kept.reshape(ids.shape[0], -1)[:, :width]


def keyed_dropout(x: torch.Tensor, p: float, training: bool, ids: torch.Tensor | None) -> torch.Tensor:
    """``dropout(x, p)`` with row ``i``'s mask keyed by ``ids[i]`` (a vertex, or an edge's
    ``edge_ids``); torch's own dropout without ids."""
    if not training or p == 0:
        return x
    if ids is None or x.dim() != 2:
        return F.dropout(x, p, training)
    if x.device.type == "cpu" and supported(x.dtype) and x.is_contiguous():
        return _Dropout.apply(x, p, ids, False)
    threshold, scale = dropout_constants(p)
    kept = keyed_keep(draw_key(), ids.to(x.device), x.shape[1], threshold)
    return torch.where(kept, x * float(scale), torch.zeros((), dtype=x.dtype, device=x.device))


def edge_ids(dst_ids: torch.Tensor, src_ids: torch.Tensor) -> torch.Tensor:
    """One 64-bit id per (destination, source) pair of vertex ids: what keys an edge's dropout mask."""
    return torch_splitmix_key(dst_ids, src_ids)


def relu_dropout(y: torch.Tensor, p: float, training: bool, ids: torch.Tensor | None = None) -> torch.Tensor:
    """``dropout(relu(y), p)`` (an identity dropout outside training), row ``i``'s mask keyed by vertex
    ``ids[i]`` (by its position without ``ids``). On CPU in training this overwrites ``y``, which must be an
    intermediate result (autograd refuses a leaf that requires grad)."""
    if not training or p == 0:
        return F.relu(y)
    if y.device.type == "cpu" and supported(y.dtype) and y.dim() == 2 and y.is_contiguous():
        return _Dropout.apply(y, p, ids, True)
    return keyed_dropout(F.relu(y), p, training, ids)
