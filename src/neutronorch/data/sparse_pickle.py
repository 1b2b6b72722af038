"""Pickled scipy sparse matrices read without scipy: ``load_pickle`` maps the scipy classes to
``SparseMatrix``, which keeps the pickled state, and refuses every class outside a short allow-list (an
unrestricted pickle can run arbitrary code)."""

from __future__ import annotations

import codecs
import collections
import pickle
from typing import IO

import numpy as np

from neutronorch.data.dtypes import id_outside
from neutronorch.errors import DataError


class SparseMatrix:
    """What a pickled ``scipy.sparse`` matrix unpickles to: its state, readable without scipy."""

    format = ""

    def __setstate__(self, state: dict) -> None:
        self.state = state

    @property
    def shape(self) -> tuple[int, int]:
        shape = self.state.get("_shape", self.state.get("shape"))
        return int(shape[0]), int(shape[1])

    def to_coo(self, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(row, col, data)`` of the stored entries; ``DataError`` naming ``source`` for inconsistent pieces
        or an index outside the shape."""
        try:
            row, col, data = self._coordinates()
            num_rows, num_cols = self.shape
        except (AttributeError, KeyError, ValueError, TypeError, IndexError) as exc:
            raise DataError(f"{source}: the {self.format.upper()} sparse matrix is malformed "
                            f"({type(exc).__name__}: {exc}). The file is corrupt; fetch it again.") from None
        if not row.shape == col.shape == data.shape:
            raise DataError(f"{source}: the {self.format.upper()} sparse matrix stores {row.shape[0]:,} row ids, "
                            f"{col.shape[0]:,} column ids and {data.shape[0]:,} values. The file is corrupt or "
                            f"truncated; fetch it again.")
        for axis, ids, size in (("row", row, num_rows), ("column", col, num_cols)):
            if (bad := id_outside(ids, size)) is not None:
                raise DataError(f"{source}: {axis} id {bad} of the sparse matrix is out of range "
                                f"for its shape {self.shape}. The file is corrupt; fetch it again.")
        return row, col, data

    def toarray(self, source: str, dtype: np.dtype = np.float32) -> np.ndarray:
        row, col, data = self.to_coo(source)
        dense = np.zeros(self.shape, dtype=dtype)
        # add.at rather than assignment: a non-canonical matrix may store an entry twice, meaning their sum.
        np.add.at(dense, (row, col), data.astype(dtype, copy=False))
        return dense

    def _coordinates(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        state = self.state
        if self.format in ("csr", "csc"):
            indptr = np.asarray(state["indptr"], dtype=np.int64)
            major = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
            minor = np.asarray(state["indices"], dtype=np.int64)
            row, col = (major, minor) if self.format == "csr" else (minor, major)
            return row, col, np.asarray(state["data"])
        if self.format == "coo":
            # scipy >= 1.13 keeps COO indices in a ``coords`` tuple; older versions in ``row``/``col``.
            row, col = state["coords"] if "coords" in state else (state["row"], state["col"])
            return np.asarray(row, dtype=np.int64), np.asarray(col, dtype=np.int64), np.asarray(state["data"])
        # LIL: an object array of Python lists per row, for both column ids and values.
        lengths = np.fromiter((len(r) for r in state["rows"]), dtype=np.int64, count=len(state["rows"]))
        row = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), lengths)
        col = np.fromiter((c for r in state["rows"] for c in r), dtype=np.int64, count=int(lengths.sum()))
        data = np.array([v for r in state["data"] for v in r])
        return row, col, data


def dense_features(matrix, source: str) -> np.ndarray:
    """A matrix of features (or one-hot labels), a pickled sparse one or a 2-D array of numbers, as dense
    float32 rows."""
    if isinstance(matrix, SparseMatrix):
        return matrix.toarray(source)
    if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or matrix.dtype.kind not in "fiub":
        found = f"{matrix.dtype} {matrix.shape}" if isinstance(matrix, np.ndarray) else type(matrix).__name__
        raise DataError(f"{source}: expected a 2-D numeric matrix (a row per vertex), found {found}. The "
                        f"file does not follow its layout; fetch it again.")
    return matrix.astype(np.float32)


def csr_matrix(data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, shape) -> SparseMatrix:
    """A CSR ``SparseMatrix`` from its three arrays, for files that store them unpickled."""
    matrix = _FORMATS["csr"]()
    matrix.__setstate__({"data": data, "indices": indices, "indptr": indptr, "_shape": tuple(shape)})
    return matrix


_FORMATS = {fmt: type(f"_{fmt.upper()}", (SparseMatrix,), {"format": fmt}) for fmt in ("csr", "csc", "coo", "lil")}
_STAND_INS = {f"{fmt}_{kind}": cls for fmt, cls in _FORMATS.items() for kind in ("matrix", "array")}

# The numpy functions array pickles call, taken from numpy itself so the mapping holds across versions
# (numpy 2 moved them from numpy.core to numpy._core; old pickles name the former).
_NUMPY_FUNCTIONS = {
    "_reconstruct": np.empty(0).__reduce__()[0],
    "scalar": np.float64(0).__reduce__()[0],
    "_frombuffer": np.arange(2).__reduce_ex__(5)[0],
}

_ALLOWED = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
            ("collections", "defaultdict"): collections.defaultdict,
            ("collections", "OrderedDict"): collections.OrderedDict,
            # Python 3 writes bytes into protocol-2 pickles as _codecs.encode(text, "latin1").
            ("_codecs", "encode"): codecs.encode,
            **{(module, kind.__name__): kind for module in ("__builtin__", "builtins")
               for kind in (list, dict, set)}}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], source: str):
        super().__init__(file, encoding="latin1")
        self.source = source

    def find_class(self, module: str, name: str):
        if module == "scipy.sparse" or module.startswith("scipy.sparse."):
            if name in _STAND_INS:
                return _STAND_INS[name]
        elif module.startswith(("numpy.core.", "numpy._core.")) and name in _NUMPY_FUNCTIONS:
            return _NUMPY_FUNCTIONS[name]
        elif (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        raise DataError(f"{self.source}: the pickle refers to {module}.{name}, which is not part of a graph "
                        f"dataset (only numpy arrays, scipy sparse matrices and lists/dicts are read). "
                        f"The file is not what its name says; fetch the dataset again.")


def load_pickle(file: IO[bytes], source: str):
    """Unpickle one object from ``file``; ``source`` names the file in error messages."""
    try:
        return _Unpickler(file, source).load()
    except DataError:
        raise
    except Exception as exc:  # a damaged pickle can fail in any way; all of them mean the same to the user
        raise DataError(f"{source}: cannot be unpickled ({type(exc).__name__}: {exc}). The file is truncated or "
                        f"not a pickle; fetch the dataset again.") from None
