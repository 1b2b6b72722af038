"""The dtypes a graph's features may be stored as: float32, float16 and bfloat16.

numpy has no bfloat16 of its own; ``ml_dtypes.bfloat16`` (a dependency) is a real numpy dtype, so such
arrays index, convert (``astype(np.float32)``) and check (``np.isfinite``) like any other. It is imported only
where bfloat16 features are written or read, and this module imports no torch (the data layer loads
without it).
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
