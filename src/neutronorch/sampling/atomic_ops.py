"""Atomic operations on int64 array entries for numba kernels whose threads hand work to each other
(``hop_pipeline.py``): numba has none of its own on the CPU. Each is one LLVM atomic instruction."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _entry(context, builder, arrty, array, index, indexty):
    arr = context.make_array(arrty)(context, builder, array)
    at = [context.cast(builder, index, indexty, types.intp)]
    return cgutils.get_item_pointer2(context, builder, arr.data, cgutils.unpack_tuple(builder, arr.shape),
                                     cgutils.unpack_tuple(builder, arr.strides), arrty.layout, at,
                                     wraparound=False, boundscheck=False)


def _int64_array(array) -> bool:
    return isinstance(array, types.Array) and array.ndim == 1 and array.dtype == types.int64


@intrinsic
def fetch_add(typingctx, array, index, value):
    """``array[index] += value`` as one atomic step (sequentially consistent); the value before it."""
    if not _int64_array(array):
        return None

    def codegen(context, builder, signature, args):
        ptr = _entry(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        add = context.cast(builder, args[2], signature.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, add, "seq_cst")

    return types.int64(array, index, value), codegen


@intrinsic
def load_acquire(typingctx, array, index):
    """``array[index]``, read after every write its writer made before ``store_release`` of it."""
    if not _int64_array(array):
        return None

    def codegen(context, builder, signature, args):
        ptr = _entry(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(array, index), codegen


@intrinsic
def store_release(typingctx, array, index, value):
    """``array[index] = value``, seen by ``load_acquire`` only after this thread's earlier writes."""
    if not _int64_array(array):
        return None

    def codegen(context, builder, signature, args):
        ptr = _entry(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        builder.store_atomic(context.cast(builder, args[2], signature.args[2], types.int64), ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen
