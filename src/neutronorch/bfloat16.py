"""bfloat16 in numba kernels and numpy arrays, which have no such type: a bfloat16 value is the upper half
of a float32's bits, so numpy holds bfloat16 tensors as ``uint16`` arrays (``numpy_view``), and kernels read
and write them through ``load`` and ``store``, a few integer instructions each. A kernel compiles once per
combination of array types, so one source serves float32 and bfloat16 alike, every sum a float32 sum.

In a kernel's inner loop, index a slice of the row (``part = row[start:start + width]``, then ``part[j]``),
never ``row[start + j]``: numba cannot tell that ``start + j`` is not negative and checks every index for
wrap-around, which keeps the loop from being vectorised (summing 256 bfloat16 values a row over a million
rows: 251 ms with an offset, 22 ms through a slice; one thread).
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


def load(value):
    """float32 of a float32 or of bfloat16 bits (``uint16``, shifted into place); in numba kernels only."""
    raise NotImplementedError("bfloat16.load runs inside numba kernels")


def store(row, j, value):
    """``row[j] = value`` as ``row``'s element type: rounded to the nearest bfloat16 (ties to even, NaN kept
    a NaN) when ``row`` holds bfloat16 bits; a ``uint16`` value is taken as bfloat16 bits. In kernels only.

    Pass ``value`` as a name or a plain expression, never a conditional expression (``a if c else b``):
    inlined into a vectorised loop, ``store(out, (i, j), v * s if kept else 0.0)`` wrote 0 where ``kept``
    held (numba 0.68); assigning the conditional to a name first is correct."""
    raise NotImplementedError("bfloat16.store runs inside numba kernels")


@overload(load, inline="always")
def _load(value):
    if value == types.uint16:
        return lambda value: _float_from_bits(np.uint32(value) << np.uint32(16))  # exact: the low half is 0
    if isinstance(value, types.Float):
        return lambda value: np.float32(value)
    return None


@intrinsic
def _encode(typingctx, value):
    """The bfloat16 bits nearest to float32 ``value``, in 32-bit integer operations (numba's own integer
    arithmetic widens ``uint32`` to 64 bits, which halves the values per vector instruction)."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = builder.bitcast(args[0], i32)
        high = builder.lshr(bits, ir.Constant(i32, 16))
        rounded = builder.lshr(builder.add(builder.add(bits, ir.Constant(i32, 0x7FFF)),
                                           builder.and_(high, ir.Constant(i32, 1))), ir.Constant(i32, 16))
        quiet = builder.or_(high, ir.Constant(i32, 0x40))
        nan = builder.icmp_signed(">", builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF)), ir.Constant(i32, 0x7F800000))
        return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))

    return types.uint16(types.float32), codegen


@njit(inline="always")
def encode(value):
    """The bfloat16 bits nearest to float32 ``value`` (ties to even; NaN stays a quiet NaN)."""
    return _encode(np.float32(value))


@overload(store, inline="always")
def _store(row, j, value):
    if not isinstance(row, types.Array):
        return None
    bits_in, bits_out = value == types.uint16, row.dtype == types.uint16
    if bits_in and not bits_out:  # bfloat16 bits widened into a float32 row
        def widen(row, j, value):
            row[j] = load(value)
        return widen
    if bits_out and not bits_in:
        def impl(row, j, value):
            row[j] = encode(value)
        return impl

    def impl(row, j, value):  # bfloat16 bits copied into a bfloat16 row, a float into a float32 one
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
            out = row[start:start + acc.shape[0]]  # a slice: see the module's note on indices
            for j in range(acc.shape[0]):
                out[j] = encode(acc[j] * scale)
        return impl

    def impl(row, start, acc, scale):  # acc is the row's own slice
        for j in range(acc.shape[0]):
            acc[j] *= scale
    return impl


@overload(flush, inline="always")
def _flush(row, start, acc):
    if row.dtype == types.uint16:
        def impl(row, start, acc):
            out = row[start:start + acc.shape[0]]
            for j in range(acc.shape[0]):
                out[j] = encode(acc[j])
        return impl
    return lambda row, start, acc: None


def tensor_from_numpy(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy``, bfloat16 arrays (``data.dtypes``) included: zero-copy, the bits viewed as
    torch.bfloat16."""
    if array.dtype.name == "bfloat16":  # data.dtypes.is_bfloat16, not imported: data imports this module
        return torch.from_numpy(array.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def numpy_view(tensor: torch.Tensor) -> np.ndarray:
    """A CPU tensor's numpy view; bfloat16 as its ``uint16`` bits (numpy has no bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16)
    return tensor.numpy()


def supported(dtype: torch.dtype) -> bool:
    """Whether the numba kernels take tensors of ``dtype``."""
    return dtype in (torch.float32, torch.bfloat16)
