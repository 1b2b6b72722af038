"""Times on a graph (docs/temporal.md): an edge time per stored edge, in CSC order, each destination's
in-edges ascending by time (stable: edges of equal time keep their order), so that the edges a vertex had
at a time are a prefix of its column; and a vertex time per vertex. Times are int64 (years, seconds) or
float64; NaN and infinities are no time. Imports no torch."""

from __future__ import annotations

import numpy as np
from numba import njit

from neutronorch.errors import DataError
from neutronorch.jit import read_only

TIME_DTYPES = ("int64", "float64")
_CHUNK = 1 << 24  # times checked at a time (arrays may be memory maps larger than RAM)


def time_array(value, count: int, what: str, source: str) -> np.ndarray:
    """``value`` (an array, a tensor or a list) as times: int64 for integers, float64 for real numbers, one
    per item of ``count``; else a ``DataError`` naming ``source`` and ``what`` (``edge times``)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{source}: {what} cannot be read as an array ({exc}); give one number per item.") from None
    if array.dtype == np.bool_ or array.dtype.kind not in "iuf":
        raise DataError(f"{source}: {what} have dtype {array.dtype}, expected numbers (int64 such as years or "
                        f"seconds, or float64); convert them first (for dates: seconds since 1970).")
    if array.ndim != 1 or array.shape[0] != count:
        raise DataError(f"{source}: {what} have shape {array.shape}, expected ({count},): one time per "
                        f"{'edge' if 'edge' in what else 'vertex'}.")
    if array.dtype.kind == "u" and array.size and int(array.max()) > np.iinfo(np.int64).max:
        raise DataError(f"{source}: {what} hold {int(array.max())}, beyond int64; give smaller times.")
    array = array.astype(np.float64 if array.dtype.kind == "f" else np.int64, copy=False)
    check_finite(array, what, source)
    return array


def check_finite(times: np.ndarray, what: str, source: str) -> None:
    """No NaN or infinity among float ``times`` (read in chunks)."""
    if times.dtype.kind != "f":
        return
    for start in range(0, times.shape[0], _CHUNK):
        chunk = np.asarray(times[start:start + _CHUNK])
        if not np.isfinite(chunk).all():
            bad = start + int(np.flatnonzero(~np.isfinite(chunk))[0])
            raise DataError(f"{source}: {what} hold {chunk[bad - start]} at position {bad}, which is no time; "
                            f"give every item a finite time (or drop the items without one).")


def check_times(times, count: int, what: str, source: str, indptr=None) -> None:
    """``times`` as a graph holds them: a 1-D int64 or float64 numpy array of ``count`` finite times; with
    ``indptr`` (edge times in CSC order), each column ascending."""
    if not isinstance(times, np.ndarray):
        raise DataError(f"{source}: {what} are a {type(times).__name__}, expected a numpy array; build the graph "
                        f"with Graph.from_arrays(..., edge_time=..., node_time=...), which converts them.")
    if times.ndim != 1 or times.dtype.name not in TIME_DTYPES:
        raise DataError(f"{source}: {what} must be a 1-D int64 or float64 array, got {times.dtype} {times.shape}; "
                        f"convert with .astype(np.int64) or .astype(np.float64).")
    if times.shape[0] != count:
        raise DataError(f"{source}: {what} hold {times.shape[0]} times for {count} "
                        f"{'edges' if indptr is not None else 'vertices'}; give one per item (an edge time per "
                        f"stored edge, in the CSC's order).")
    check_finite(times, what, source)
    if indptr is not None and (bad := unsorted_column(read_only(np.asarray(indptr)), read_only(times))) >= 0:
        raise DataError(f"{source}: {what} of vertex {bad}'s in-edges are not ascending; a temporal graph keeps "
                        f"each vertex's in-edges sorted by time. Build it with Graph.from_arrays(..., "
                        f"edge_time=...) or Relation.from_edges(..., edge_time=...), which sort them.")


@njit(cache=True, nogil=True)
def unsorted_column(indptr, times):
    """The first destination whose in-edges' ``times`` fall somewhere, else -1."""
    for v in range(indptr.shape[0] - 1):
        for k in range(indptr[v] + 1, indptr[v + 1]):
            if times[k] < times[k - 1]:
                return v
    return -1


def timed_order(src: np.ndarray, dst: np.ndarray, times: np.ndarray, deduplicate: bool) -> np.ndarray:
    """The edges' positions in a temporal CSC's order: by destination, then time, then source (stable: equal
    edges keep their order); with ``deduplicate``, an edge repeated at the same time kept once (the first)."""
    order = np.lexsort((src, times, dst))
    if deduplicate and order.size:
        s, d, t = src[order], dst[order], times[order]
        keep = np.empty(order.shape[0], dtype=bool)
        keep[0] = True
        keep[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1]) | (t[1:] != t[:-1])
        order = order[keep]
    return order


def has_vertex_times(graph) -> bool:
    """Whether ``graph`` (either kind, or None) has vertex times (a typed graph's: of any type)."""
    node_time = getattr(graph, "node_time", None)
    return bool(node_time) if isinstance(node_time, dict) else node_time is not None


def times_from_vertices(indptr: np.ndarray, indices: np.ndarray, node_time: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Edge times made of vertex times: each edge at its source's time (a neighbour exists from the time it
    appeared, PyG's reading of a vertex-level ``time_attr``), each column re-sorted by them (stable).
    Returns (``indices`` in the new order, ``edge_time``, the order: old edge positions); builds in memory,
    16 bytes an edge and a sort."""
    indices = np.asarray(indices)
    times = np.asarray(node_time)[indices]
    dst = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(np.asarray(indptr)))
    order = np.lexsort((times, dst))
    return indices[order], times[order], order


def check_time_dtype(name, meta_path) -> None:
    """A time array's dtype in a dataset's ``meta_path`` is absent (no times) or one of ``TIME_DTYPES``."""
    if name is not None and name not in TIME_DTYPES:
        raise DataError(f"{meta_path}: a time dtype is {name!r}; times are stored as {' or '.join(TIME_DTYPES)} "
                        f"(docs/temporal.md). Write the dataset again.")


def time_info(times: np.ndarray, indptr: np.ndarray | None = None) -> dict:
    """``info``'s account of ``times``: dtype, range and (edge times, ``indptr`` given) whether every
    vertex's in-edges are ascending by time."""
    info = {"dtype": times.dtype.name, "min": times.min().item() if times.size else None,
            "max": times.max().item() if times.size else None}
    if indptr is not None:
        info["in_edges_sorted"] = bool(unsorted_column(read_only(np.asarray(indptr)), read_only(times)) < 0)
    return info


def describe_times(times: np.ndarray | None, what: str) -> str | None:
    """One line for ``info``: the range and dtype of ``times`` (None when there are none)."""
    if times is None:
        return None
    if times.shape[0] == 0:
        return f"{what} none ({times.dtype})"
    low, high = times.min(), times.max()
    return f"{what} {low}..{high} ({times.dtype})"
