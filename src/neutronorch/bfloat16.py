"""bfloat16 in numba kernels and numpy arrays, which have no such type.

A bfloat16 value is the upper half of a float32's bits, so numpy holds bfloat16 tensors as ``uint16``
arrays (``numpy_view``) and the kernels read and write them through two functions that compile to a few
integer instructions:

- ``load(value)``: a float32 from a float32, or from a bfloat16's ``uint16`` bits (shifted into place);
- ``store(row, j, value)``: ``row[j] = value``, rounded to the nearest bfloat16 (ties to even) when ``row``
  holds bfloat16 bits, NaN kept a NaN; a ``uint16`` value is taken as bfloat16 bits (copied, or widened).

A kernel written with them compiles once per combination of array types, so one source serves float32 and
bfloat16 tensors alike, and every sum inside it is a float32 sum.
"""

from __future__ import annotations

import numpy as np
import torch
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload


@intrinsic
def _float_from_bits(typingctx, bits):
    """The float32 whose bits are the low 32 of unsigned ``bits`` (numba widens shifts to 64 bits)."""
    if not isinstance(bits, types.Integer) or bits.signed or bits.bitwidth < 32:
        return None

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def _bits_from_float(typingctx, value):
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(types.float32), codegen


def load(value):
    """float32 of a float32 or of bfloat16 bits (``uint16``); in numba kernels only."""
    raise NotImplementedError("bfloat16.load runs inside numba kernels")


def store(row, j, value):
    """``row[j] = value`` as ``row``'s element type (float32, or bfloat16 bits); in numba kernels only."""
    raise NotImplementedError("bfloat16.store runs inside numba kernels")


@overload(load, inline="always")
def _load(value):
    if value == types.uint16:
        return lambda value: _float_from_bits(np.uint32(value) << np.uint32(16))  # exact: the low half is 0
    if isinstance(value, types.Float):
        return lambda value: np.float32(value)
    return None


@njit(inline="always")
def encode(value):
    """The bfloat16 bits nearest to float32 ``value`` (ties to even; NaN stays a quiet NaN)."""
    bits = _bits_from_float(np.float32(value))
    rounded = np.uint32(bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x40)
    # Masks, not a branch: loops storing bfloat16 stay vectorised (and numba's inliner stays quiet).
    nan = np.uint32(0) - np.uint32(np.int32(bits & np.uint32(0x7FFFFFFF)) > np.int32(0x7F800000))
    return np.uint16((quiet & nan) | (rounded & ~nan))


@overload(store, inline="always")
def _store(row, j, value):
    if not isinstance(row, types.Array):
        return None
    if value == types.uint16:  # bfloat16 bits: copied into a bfloat16 row, widened into a float32 one
        if row.dtype == types.uint16:
            def copy(row, j, value):
                row[j] = value
            return copy

        def widen(row, j, value):
            row[j] = load(value)
        return widen
    if row.dtype == types.uint16:
        def impl(row, j, value):
            row[j] = encode(value)
        return impl

    def impl(row, j, value):
        row[j] = value
    return impl


def accumulator(row, start, width, scratch):
    """Where a kernel sums ``row[start:start + width]``: that slice itself for a float32 row, else the
    float32 ``scratch``; ``finish`` then scales the sums into the row. In numba kernels only."""
    raise NotImplementedError("bfloat16.accumulator runs inside numba kernels")


def finish(row, start, acc, scale):
    """``row[start:start + len(acc)] = acc * scale``, after ``accumulator``. In numba kernels only."""
    raise NotImplementedError("bfloat16.finish runs inside numba kernels")


def flush(row, start, acc):
    """``finish`` without a scale: nothing to do for a float32 row (the sums are already in it)."""
    raise NotImplementedError("bfloat16.flush runs inside numba kernels")


@overload(accumulator, inline="always")
def _accumulator(row, start, width, scratch):
    if row.dtype == types.uint16:
        return lambda row, start, width, scratch: scratch
    return lambda row, start, width, scratch: row[start:start + width]


@overload(finish, inline="always")
def _finish(row, start, acc, scale):
    if row.dtype == types.uint16:
        def impl(row, start, acc, scale):
            for j in range(acc.shape[0]):
                row[start + j] = encode(acc[j] * scale)
        return impl

    def impl(row, start, acc, scale):  # acc is the row's own slice
        for j in range(acc.shape[0]):
            acc[j] *= scale
    return impl


@overload(flush, inline="always")
def _flush(row, start, acc):
    if row.dtype == types.uint16:
        def impl(row, start, acc):
            for j in range(acc.shape[0]):
                row[start + j] = encode(acc[j])
        return impl
    return lambda row, start, acc: None


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's numpy view; bfloat16 as its ``uint16`` bits (numpy has no bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def supported(dtype: torch.dtype) -> bool:
    """Whether the numba kernels take tensors of ``dtype``."""
    return dtype in (torch.float32, torch.bfloat16)
