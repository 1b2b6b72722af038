"""Typed graphs from numpy arrays on disk (IGBH's and MAG240M's layouts): ``.npy`` files memory-mapped, a
relation's CSC built from an edge list a chunk at a time (a counting sort: ``indptr`` and ``indices`` are the
only arrays of the graph's size it allocates), class ids read a chunk at a time. The result equals
``Relation.from_edges`` of the same edges (sources ascending, repeated edges kept)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit, prange

from neutronorch.data.arrays import class_labels
from neutronorch.data.csc import INT32_LIMIT
from neutronorch.data.dtypes import as_int64, id_outside
from neutronorch.data.files import REFETCH, Progress, open_npy, present, read_error
from neutronorch.data.relation import Relation, RelationType, relation_array, relation_label
from neutronorch.errors import DataError

CHUNK = 1 << 22  # edges or rows read from a memory map at a time
NPY_MAGIC = b"\x93NUMPY"


def is_npy(path: Path) -> bool:
    """Whether ``path`` starts as numpy's ``.npy`` format does (IGB's large and full arrays are raw bytes)."""
    try:
        with open(path, "rb") as file:
            return file.read(len(NPY_MAGIC)) == NPY_MAGIC
    except OSError as exc:
        raise read_error(path, exc, f"{path}: cannot be read ({exc}). {REFETCH}") from None


def open_raw(path: Path, dtype, width: int, what: str) -> np.ndarray:
    """A headerless file of ``dtype`` values, ``width`` per row (0: one value per row), memory-mapped."""
    present(path, what)
    itemsize = np.dtype(dtype).itemsize * max(width, 1)
    size = path.stat().st_size
    if size % itemsize or not size:
        raise DataError(f"{path}: {size} bytes, not a whole number of rows of {max(width, 1)} {np.dtype(dtype)} "
                        f"values ({what}); the file is truncated or empty. Fetch the dataset again.")
    rows = size // itemsize
    return np.memmap(path, dtype=dtype, mode="r", shape=(rows, width) if width else (rows,))


def check_rows(array: np.ndarray, rows: int, path: Path, counted: str, what: str) -> None:
    """``array`` has ``rows`` rows (``counted``: where that count comes from), else a ``DataError``."""
    if array.ndim < 1 or array.shape[0] != rows:
        raise DataError(f"{path}: {what} of shape {array.shape}, but {counted}, a row each. The files come from "
                        f"different versions of the dataset; fetch it again.")


def edge_files(processed: Path, keys, joiner: str) -> dict[RelationType, Path]:
    """Each relation's ``processed/<src><joiner><name><joiner><dst>/edge_index.npy``, each there: what is
    missing is said before any large file is read."""
    return {key: present(processed / joiner.join(key) / "edge_index.npy", _edges_role(key)) for key in keys}


def read_relations(paths: dict[RelationType, Path], num_nodes: dict[str, int], counted: dict[str, str],
                   pairs_per_row: bool, files: dict[str, str], progress: Progress | None = None) -> dict:
    """Each relation of ``paths`` (``edge_files``) built by ``relation_from_edge_index``; ``files`` records the
    file each CSC came from (``validate``'s names)."""
    relations = {}
    for key, path in paths.items():
        files[relation_array(key, "indptr")] = files[relation_array(key, "indices")] = str(path)
        relations[key] = relation_from_edge_index(open_npy(path, _edges_role(key)), key, num_nodes, path, counted,
                                                  pairs_per_row, progress)
    return relations


def _edges_role(key: RelationType) -> str:
    return f"relation {relation_label(key)}'s edges"


def relation_from_edge_index(edges: np.ndarray, key: RelationType, num_nodes: dict[str, int], path: Path,
                             counted: dict[str, str], pairs_per_row: bool,
                             progress: Progress | None = None) -> Relation:
    """The relation ``key`` from ``edges``: (E, 2) ``src, dst`` rows (``pairs_per_row``) or (2, E) rows. Ids
    are checked chunk by chunk; ``counted[type]`` says where a type's count comes from, for the error."""
    label = relation_label(key)
    expected = "(E, 2): a src,dst pair per row" if pairs_per_row else "(2, E): a row of sources, one of destinations"
    if edges.ndim != 2 or edges.shape[1 if pairs_per_row else 0] != 2 or edges.dtype.kind not in "iuf":
        raise DataError(f"{path}: relation {label}: edges of shape {edges.shape} ({edges.dtype}), expected "
                        f"{expected} of integer ids. {REFETCH}")
    num_src, num_dst = num_nodes[key[0]], num_nodes[key[2]]
    num_edges = int(edges.shape[0 if pairs_per_row else 1])
    total = 2 * int(edges.nbytes)
    report = (lambda done: progress(f"{path.parent.name}/{path.name}", done, total)) if progress else None

    def chunks():
        for start in range(0, num_edges, CHUNK):
            stop = min(num_edges, start + CHUNK)
            part = edges[start:stop] if pairs_per_row else edges[:, start:stop]
            src, dst = (part[:, 0], part[:, 1]) if pairs_per_row else (part[0], part[1])
            yield stop, [_ids(ids, path, label, end, node_type, count, counted)
                         for ids, end, node_type, count in ((src, "source", key[0], num_src),
                                                            (dst, "destination", key[2], num_dst))]

    counts = np.zeros(num_dst + 1, np.int64)
    for stop, (_, dst) in chunks():
        _count_into(dst, counts[1:])
        if report:
            report(total // 2 * stop // max(num_edges, 1))
    indptr = np.cumsum(counts, out=counts)
    indices = np.empty(num_edges, np.int32 if num_src <= INT32_LIMIT else np.int64)
    fill = indptr[:-1].copy()
    for stop, (src, dst) in chunks():
        _place(src, dst, fill, indices)
        if report:
            report(total // 2 + total // 2 * stop // max(num_edges, 1))
    del fill
    _sort_columns(indptr, indices)
    return Relation(indptr, indices)


def _ids(ids: np.ndarray, path: Path, label: str, end: str, node_type: str, count: int,
         counted: dict[str, str]) -> np.ndarray:
    ids = np.ascontiguousarray(as_int64(ids, str(path), f"relation {label}'s {end} ids"))
    if (bad := id_outside(ids, count)) is not None:
        raise DataError(f"{path}: relation {label} holds {end} id {bad}, outside 0..{count - 1}: {counted[node_type]}. "
                        f"The files come from different versions of the dataset; fetch it again.")
    return ids


@njit(cache=True, nogil=True)
def _count_into(dst, counts):
    for d in dst:
        counts[d] += 1


@njit(cache=True, nogil=True)
def _place(src, dst, fill, indices):
    for i in range(src.shape[0]):
        d = dst[i]
        indices[fill[d]] = src[i]
        fill[d] += 1


@njit(cache=True, nogil=True, parallel=True)
def _sort_columns(indptr, indices):
    for v in prange(indptr.shape[0] - 1):
        column = indices[indptr[v]:indptr[v + 1]]
        column.sort()


def class_ids(values: np.ndarray, rows: int, path: Path, counted: str,
              progress: Progress | None) -> np.ndarray:
    """int64 class ids (-1 where a float label is NaN: none) of the 1-D label array ``values`` of ``rows``
    labels (``check_rows``), converted a chunk at a time (a whole label must be a whole number)."""
    check_rows(values, rows, path, counted, "labels")
    if values.ndim != 1:
        raise DataError(f"{path}: labels of shape {values.shape}, expected one class per vertex. {REFETCH}")
    out = np.empty(values.shape[0], np.int64)
    for start in range(0, values.shape[0], CHUNK):
        part = np.asarray(values[start:start + CHUNK])
        out[start:start + part.shape[0]] = class_labels(part, part.shape[0], str(path))
        if progress is not None:
            progress(f"{path.parent.name}/{path.name}", (start + part.shape[0]) * values.itemsize, values.nbytes)
    return out
