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


def _on_entry(make):
    """An intrinsic's code generator that hands ``make(context, builder, signature, args, pointer)`` the
    pointer to ``array[index]`` (the intrinsic's first two arguments)."""
    def codegen(context, builder, signature, args):
        pointer = _entry(context, builder, signature.args[0], args[0], args[1], signature.args[1])
        return make(context, builder, signature, args, pointer)
    return codegen


@intrinsic
def fetch_add(typingctx, array, index, value):
    """``array[index] += value`` as one atomic step (sequentially consistent); the value before it."""
    if not _int64_array(array):
        return None
    return types.int64(array, index, value), _on_entry(lambda context, builder, signature, args, pointer: (
        builder.atomic_rmw("add", pointer, context.cast(builder, args[2], signature.args[2], types.int64),
                           "seq_cst")))


@intrinsic
def load_acquire(typingctx, array, index):
    """``array[index]``, read after every write its writer made before ``store_release`` of it."""
    if not _int64_array(array):
        return None
    return types.int64(array, index), _on_entry(lambda context, builder, signature, args, pointer: (
        builder.load_atomic(pointer, "acquire", 8)))


@intrinsic
def store_release(typingctx, array, index, value):
    """``array[index] = value``, seen by ``load_acquire`` only after this thread's earlier writes."""
    if not _int64_array(array):
        return None

    def store(context, builder, signature, args, pointer):
        builder.store_atomic(context.cast(builder, args[2], signature.args[2], types.int64), pointer, "release", 8)
        return context.get_dummy_value()
    return types.void(array, index, value), _on_entry(store)
