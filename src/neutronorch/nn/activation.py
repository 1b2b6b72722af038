"""ReLU followed by dropout, fused into one pass on CPU.

On CPU, ``F.dropout`` draws a Bernoulli variable per element with torch's generator, which costs more
than the matrix products of a GraphSAGE layer. The fused kernel hashes (key, element index) into 8 random
bytes per 64-bit draw (dropout probability resolved to 1/256), and stores one byte per element that
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
from neutronorch.sampling.kernels import splitmix_key


@njit(inline="always")
def relu_dropout_row(src, r, out, keep, i, threshold, scale, key):
    """Row ``i`` of the fused ReLU + dropout from row ``r`` of ``src``: ``out[i, j]`` is ``src[r, j] * scale``
    where kept and positive, else 0, and ``keep[i, j]`` is 1 there, else 0. Element ``(i, j)``'s random
    byte is byte ``j % 8`` of ``splitmix_key(key, i * width + j - j % 8)``: the mask depends only on the
    key and the position in ``out``, whichever kernel writes the row. ``src`` may be ``out`` (in place);
    both hold float32 or bfloat16 bits.

    The source comes as a 2-d array and a row index, not as a row view: with a view (``src[r]``) numba's
    code ran 1.4-1.6 times slower on a 100k x 256 tensor (two threads)."""
    width = out.shape[1]
    for j0 in range(0, width, 8):
        bits = splitmix_key(key, i * width + j0)
        for j in range(j0, min(width, j0 + 8)):
            byte = (bits >> np.uint64(8 * (j - j0))) & np.uint64(255)
            value = load(src[r, j])
            if byte >= threshold and value > 0:
                store(out, (i, j), value * scale)
                keep[i, j] = 1
            else:
                store(out, (i, j), 0.0)
                keep[i, j] = 0


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _forward(y, threshold, scale, key, out, keep):
    for i in prange(y.shape[0]):
        relu_dropout_row(y, i, out, keep, i, threshold, scale, key)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def _backward(grad_out, keep, scale, grad_in):
    rows, width = grad_out.shape
    for i in prange(rows):
        for j in range(width):
            store(grad_in, (i, j), load(grad_out[i, j]) * scale if keep[i, j] else np.float32(0.0))


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
        _forward(values, threshold, scale, key, values, keep.numpy())
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
