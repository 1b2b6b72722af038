"""ReLU followed by dropout, fused into one kernel on CPU.

On CPU, ``F.dropout`` draws a Bernoulli variable per element with torch's generator, which costs more
than the matrix products of a GraphSAGE layer. The fused kernel draws 8 random bytes per 64-bit word of a
counter-based stream keyed by (key, row) (dropout probability resolved to 1/256), and stores one byte per element that
already combines "kept by dropout" and "positive before ReLU", so the backward pass needs nothing else.
Randomness comes from a key drawn from torch's generator, so ``torch.manual_seed`` governs it.
Other devices use the torch ops.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange
from torch.nn import functional as F

from neutronorch.bfloat16 import load, numpy_view, store, supported
from neutronorch.sampling.kernels import GOLDEN, mix, splitmix_key


@njit(inline="always")
def dropout_bytes(keep, i, key):
    """``keep[i]`` = row ``i``'s random bytes: element ``j``'s is byte ``j % 8`` of word ``j // 8`` of the
    splitmix64 stream that starts at ``splitmix_key(key, i)``. So a mask depends only on the key and the
    position in the output, whichever kernel writes the row."""
    width = keep.shape[1]
    stream = splitmix_key(key, i)
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
def relu_dropout_row(src, r, out, keep, i, threshold, scale, key):
    """Row ``i`` of the fused ReLU + dropout from row ``r`` of ``src``: ``out[i, j]`` is ``src[r, j] * scale``
    where kept (random byte at least ``threshold``, see ``dropout_bytes``) and positive, else 0, and
    ``keep[i, j]`` is 1 there, else 0. ``src`` may be ``out`` (in place); both hold float32 or bfloat16 bits.

    Two passes over the row, each a loop the compiler vectorises: the random bytes, then a branch-free select
    through row views. One pass that branched per element ran 2-4 (float32) and 6-10 (bfloat16) times slower
    on a 102k x 256 tensor (one thread); in place, the same select indexing the 2-d arrays ran scalar (the
    compiler's overlap check failed), 2-8 times slower than through the row views."""
    dropout_bytes(keep, i, key)
    source, target, mask = src[r], out[i], keep[i]
    for j in range(target.shape[0]):
        value = load(source[j])
        kept = (mask[j] >= threshold) & (value > 0)
        result = value * scale if kept else np.float32(0.0)  # a name, not inline in the call: bfloat16.store
        store(target, j, result)
        mask[j] = np.uint8(kept)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _forward(y, threshold, scale, key, keep):
    for i in prange(y.shape[0]):
        relu_dropout_row(y, i, y, keep, i, threshold, scale, key)


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


def draw_key() -> np.uint64:
    """A dropout key from torch's generator (so ``torch.manual_seed`` governs the masks)."""
    return np.uint64(int(torch.randint(0, 2**62, (1,))))


class _ReluDropout(torch.autograd.Function):
    """In place: a layer's pre-activation output is needed by nothing else (autograd's version counter
    would raise if it were), and skipping a fresh output saves its page faults."""

    @staticmethod
    def forward(ctx, y, p):
        threshold, scale = dropout_constants(p)
        key = draw_key()
        keep = torch.empty(y.shape, dtype=torch.uint8)
        values = numpy_view(y.detach())
        _forward(values, threshold, scale, key, keep.numpy())
        ctx.mark_dirty(y)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad_out):
        (keep,) = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        grad_in = torch.empty_like(grad_out)
        _backward(numpy_view(grad_out), keep.numpy(), ctx.scale, numpy_view(grad_in))
        return grad_in, None


def relu_dropout(y: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``dropout(relu(y), p)`` (an identity dropout outside training). On CPU in training this overwrites
    ``y``, which must be an intermediate result (autograd refuses a leaf that requires grad)."""
    if not training or p == 0:
        return F.relu(y)
    if y.device.type == "cpu" and supported(y.dtype) and y.dim() == 2 and y.is_contiguous():
        return _ReluDropout.apply(y, p)
    return F.dropout(F.relu(y), p, training)
