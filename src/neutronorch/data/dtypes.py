"""The dtypes a graph's features may be stored as: float32, float16 and bfloat16 (``ml_dtypes.bfloat16``, a
real numpy dtype, imported only where bfloat16 is written or read); and ``as_int64``, ids read without change.
"""

from __future__ import annotations

import numpy as np

from neutronorch.errors import DataError

BFLOAT16 = "bfloat16"
STORAGE_DTYPES = ("float32", "float16", BFLOAT16)


def bfloat16() -> np.dtype:
    """numpy's bfloat16 (``ml_dtypes.bfloat16``)."""
    try:
        import ml_dtypes
    except ImportError:
        raise DataError("bfloat16 features need the ml-dtypes package (a dependency of neutronorch that is "
                        "missing here): pip install ml-dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def is_bfloat16(array: np.ndarray) -> bool:
    """Whether ``array`` holds bfloat16 values (checked by name: ml_dtypes is not imported)."""
    return array.dtype.name == BFLOAT16


_NARROW_CHUNK = 1 << 22  # values converted at a time by ``narrowed``


def narrowed(rows: np.ndarray, dtype_name: str, source: str) -> np.ndarray:
    """``rows`` as ``dtype_name`` (float16 or bfloat16), converted a chunk at a time; ``DataError`` naming
    ``source`` for a NaN or infinity, or for values beyond the narrower type's range (never clamped)."""
    dtype = bfloat16() if dtype_name == BFLOAT16 else np.dtype(dtype_name)
    flat_rows = max(1, _NARROW_CHUNK // max(1, int(np.prod(rows.shape[1:]))))
    out = np.empty(rows.shape, dtype)
    over, largest = 0, 0.0
    for start in range(0, rows.shape[0], flat_rows):
        part = np.asarray(rows[start:start + flat_rows])
        finite = np.isfinite(part)
        if not finite.all():
            row = start + int(np.argwhere(~finite)[0][0])
            raise DataError(f"{source}: the features hold NaN or infinity (first at row {row}); no precision "
                            f"stores them as a number. Fix the source data before converting it.")
        with np.errstate(over="ignore"):  # counted and said below
            converted = part.astype(dtype)
        lost = ~np.isfinite(converted)
        if lost.any():
            over += int(lost.sum())
            largest = max(largest, float(np.abs(part[lost].astype(np.float64)).max()))
        out[start:start + flat_rows] = converted
    if over:
        other = "--bfloat16 (float32's range, fewer digits) or " if dtype_name != BFLOAT16 else ""
        raise DataError(f"{source}: {over:,} feature values lie beyond {dtype_name}'s range (largest finite "
                        f"{float(np.finfo(dtype).max):.6g}), the largest of magnitude {largest:.6g}; {dtype_name} "
                        f"would store them as infinity. Convert with {other}no narrower precision (float32 kept), "
                        f"or scale the features first.")
    return out


def id_outside(ids: np.ndarray, count: int) -> int | None:
    """The smallest of ``ids`` if it is negative, else the largest if it is ``count`` or more; None when every
    id lies in ``0..count-1``."""
    if not ids.size:
        return None
    low, high = int(ids.min()), int(ids.max())
    return low if low < 0 else high if high >= count else None


# Floats represent every whole number up to 2**53 exactly; beyond it a float "id" is already rounded.
_EXACT_FLOAT = 2.0 ** 53
_INT64_MAX = np.iinfo(np.int64).max


def as_int64(values, source: str, what: str = "ids") -> np.ndarray:
    """``values`` as int64 without changing any: floats must be whole and finite, unsigned integers fit in
    int64; anything else is refused with a ``DataError`` naming ``source`` and ``what`` (``astype`` would
    truncate 1.7, wrap 2**64-1 to -1, "no label", and turn NaN into an id, silently)."""
    array = np.asarray(values)
    kind = array.dtype.kind
    if kind == "i":
        return array.astype(np.int64, copy=False)
    if kind == "u":
        if array.dtype.itemsize >= 8 and array.size and int(array.max()) > _INT64_MAX:
            raise DataError(f"{source}: {what} hold {int(array.max())}, beyond the largest int64 "
                            f"({_INT64_MAX}); the values are corrupt. Store them as int64.")
        return array.astype(np.int64, copy=False)
    if kind == "f":
        finite = np.isfinite(array)
        if not finite.all():
            bad = array[~finite].reshape(-1)[0]
            raise DataError(f"{source}: {what} hold {bad}, which is not a whole number. Store whole numbers "
                            f"(as int64).")
        if array.size and float(np.abs(array).max()) > _EXACT_FLOAT:
            raise DataError(f"{source}: {what} hold {float(np.abs(array).max()):g}, too large to be stored "
                            f"exactly as a float. Store them as int64.")
        whole = array == np.floor(array)
        if not whole.all():
            raise DataError(f"{source}: {what} hold {array[~whole].reshape(-1)[0]}, which is not a whole "
                            f"number; they would be truncated. Store whole numbers (as int64).")
        return array.astype(np.int64)
    raise DataError(f"{source}: {what} have dtype {array.dtype}, expected integers. Store them as int64.")
