"""The checks ``TypedGraph.validate`` runs on a typed graph coming from outside.

Every message names the vertex type or the relation it is about, the problem and the fix. Arrays may be
memory maps larger than RAM, so topology, features and labels are read in chunks and never copied whole.
Each check's ``graph`` is the ``TypedGraph`` being checked; ``typed.py``, which runs them, imports this module,
so the checks read relations and their names from ``relation.py`` instead.
"""

from __future__ import annotations

import re

import numpy as np

from neutronorch.data.dtypes import STORAGE_DTYPES
from neutronorch.data.graph import _CHUNK, METRICS, _first_duplicate, check_kinds
from neutronorch.data.relation import Relation, node_array, relation_array, relation_label
from neutronorch.data.splits import split_overlap
from neutronorch.errors import DataError

# Type and relation names become folder names on disk (typed_native.py); "___" joins a relation's three.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SPLITS = ("train_idx", "val_idx", "test_idx")


class _Failure:
    """Raises the ``DataError`` for one array: named by its file when known, else by the source."""

    def __init__(self, source: str, files: dict[str, str]):
        self.source, self.files = source, files

    def __call__(self, key: str | None, what: str, fix: str) -> None:
        raise DataError(f"{self.files.get(key, self.source) if key else self.source}: {what}. {fix}")


def check_typed_graph(graph, source: str, files: dict[str, str]) -> None:
    fail = _Failure(source, files)
    check_names(graph, source)
    if graph.metric is not None and graph.metric not in METRICS:
        fail(None, f"metric {graph.metric!r} names no metric", f"Use one of {', '.join(METRICS)}, or none.")
    for key, relation in graph.relations.items():
        _check_relation(graph, key, relation, fail)
    for node_type, features in graph.features.items():
        _check_features(graph, node_type, features, fail)
    _check_target(graph, fail)


def check_names(graph, source: str) -> None:
    """Types and relations have names a folder can take, counts are whole numbers, and every relation
    joins two types the graph has: what writing a graph relies on, checked without reading an array."""
    fail = _Failure(source, {})
    _check_kinds(graph, fail)
    if not graph.num_nodes:
        fail(None, "the graph has no vertex types", "Give num_nodes a count per type.")
    for node_type, count in graph.num_nodes.items():
        _check_name(node_type, "vertex type", fail)
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
            fail(None, f"type {node_type}: count {count!r} is not a whole number >= 0", "Fix num_nodes.")
    for key in graph.relations:
        if not (isinstance(key, tuple) and len(key) == 3):
            fail(None, f"relation key {key!r} is not a (src_type, name, dst_type) triple",
                 "Key each relation by its source type, its name and its destination type.")
        _check_name(key[1], f"relation {relation_label(key)}: name", fail)
        for end, node_type in (("source", key[0]), ("destination", key[2])):
            if node_type not in graph.num_nodes:
                fail(None, f"relation {relation_label(key)} names {end} type {node_type!r}, which the graph does "
                     f"not have (types: {', '.join(graph.num_nodes)})",
                     f"Add {node_type!r} to num_nodes, or fix the relation's key.")
    for node_type in graph.features:
        if node_type not in graph.num_nodes:
            fail(None, f"features are given for type {node_type!r}, which the graph does not have",
                 "Add it to num_nodes, or fix the name.")
    if not isinstance(graph.target, str) or graph.target not in graph.num_nodes:
        fail(None, f"no target type: target is {graph.target!r}, not one of the types "
             f"({', '.join(graph.num_nodes)})", "Name the vertex type whose labels are predicted.")


def _check_kinds(graph, fail: _Failure) -> None:
    """Every part of the kind ``TypedGraph`` says (a graph built by hand may hold lists, tensors or tuples):
    dicts, ``Relation`` values, numpy arrays (``graph.check_kinds``) and a whole ``num_classes``."""
    say = lambda what, fix: fail(None, what, fix)  # noqa: E731
    for name in ("num_nodes", "relations", "features"):
        value = getattr(graph, name)
        if not isinstance(value, dict):
            say(f"{name} is a {type(value).__name__}, expected a dict",
                "Build the TypedGraph as its docstring says (or read it with load_typed_dataset).")
    for key, relation in graph.relations.items():
        if not isinstance(relation, Relation):
            say(f"relation {key!r} is a {type(relation).__name__}, expected a Relation",
                "Give Relation(indptr, indices) (neutronorch.data.typed.Relation).")
        check_kinds({f"relation {key!r}: {part}": getattr(relation, part)
                     for part in ("indptr", "indices", "edge_features")}, 0, say)
    arrays = {f"type {node_type}: features": array for node_type, array in graph.features.items()}
    check_kinds({**arrays, **{f"type {graph.target}: {part}": getattr(graph, part) for part in ("labels", *SPLITS)}},
                graph.num_classes, say)


def _check_name(name, what: str, fail: _Failure) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "___" in name:
        fail(None, f"{what} {name!r} is not a name a folder can take",
             "Use letters, digits, '_', '-' and '.', starting with a letter or digit, and no '___'.")


def _check_relation(graph, key, relation: Relation, fail: _Failure) -> None:
    label = relation_label(key)
    num_src, num_dst = int(graph.num_nodes[key[0]]), int(graph.num_nodes[key[2]])
    indptr, indices = relation.indptr, relation.indices
    where = relation_array(key, "indptr")
    for name, array in (("indptr", indptr), ("indices", indices)):
        if array.ndim != 1 or array.dtype not in (np.int32, np.int64):
            fail(relation_array(key, name), f"relation {label}: {name} must be a 1-D int32 or int64 array, got "
                 f"{array.dtype} {array.shape}", "Save it with .astype(np.int64).")
    if indptr.shape[0] != num_dst + 1:
        fail(where, f"relation {label}: indptr has {indptr.shape[0]} entries, expected {num_dst + 1} (one per "
             f"{key[2]} vertex, plus one)", f"Build the CSC over the destination type {key[2]}.")
    if int(indptr[0]) != 0 or int(indptr[-1]) != indices.shape[0]:
        fail(where, f"relation {label}: indptr must start at 0 and end at len(indices)={indices.shape[0]}, got "
             f"{int(indptr[0])}..{int(indptr[-1])}", "The file is truncated or indptr and indices do not belong "
             "together.")
    for start in range(0, indptr.shape[0], _CHUNK):
        chunk = np.asarray(indptr[start:start + _CHUNK + 1])
        if chunk.shape[0] > 1 and np.any(np.diff(chunk) < 0):
            fail(where, f"relation {label}: indptr is not non-decreasing",
                 "Rebuild the CSC offsets with a cumulative sum of in-degrees.")
    for start in range(0, indices.shape[0], _CHUNK):
        chunk = np.asarray(indices[start:start + _CHUNK])
        low, high = int(chunk.min()), int(chunk.max())
        if low < 0 or high >= num_src:
            fail(relation_array(key, "indices"), f"relation {label}: indices hold id {low if low < 0 else high}, "
                 f"out of range for the {num_src} vertices of source type {key[0]}",
                 f"Source ids are local to type {key[0]}: 0..{num_src - 1}.")
    if relation.edge_features is not None:
        _check_rows(relation.edge_features, indices.shape[0], f"relation {label}: edge_features",
                    "edge (one per entry of indices)", relation_array(key, "edge_features"), fail)


def _check_features(graph, node_type: str, features: np.ndarray, fail: _Failure) -> None:
    _check_rows(features, int(graph.num_nodes[node_type]), f"type {node_type}: features",
                f"{node_type} vertex", node_array(node_type, "features"), fail)


def _check_rows(array: np.ndarray, rows: int, what: str, row: str, key: str, fail: _Failure) -> None:
    """A 2-D float array with one row per ``row`` and no NaN or inf, read in chunks."""
    if array.ndim != 2 or array.shape[0] != rows:
        fail(key, f"{what} have shape {array.shape}, expected ({rows}, width)", f"Give one row per {row}.")
    if array.dtype.name not in STORAGE_DTYPES:
        fail(key, f"{what} have dtype {array.dtype}, expected float32, float16 or bfloat16",
             "Convert with .astype(np.float32).")
    step = max(1, _CHUNK // max(1, int(array.shape[1])))
    for start in range(0, rows, step):
        chunk = np.asarray(array[start:start + step])
        if not np.isfinite(chunk).all():
            bad = start + int(np.argwhere(~np.isfinite(chunk))[0][0])
            fail(key, f"{what} contain NaN or inf (first in row {bad})",
                 "Replace non-finite values (e.g. np.nan_to_num).")


def _check_target(graph, fail: _Failure) -> None:
    target, labels = graph.target, graph.labels
    n = int(graph.num_nodes[target])
    key = node_array(target, "labels")
    if labels is None:  # a graph to sample or embed, not to classify: no split either
        sizes = [int(np.asarray(getattr(graph, s)).shape[0]) for s in SPLITS]
        if not any(sizes):
            return
        fail(key, f"type {target}: the split ({'/'.join(map(str, sizes))} vertices) is on a type without labels",
             f"Give labels for the target type {target} (a class id per vertex, -1 for none).")
    if labels.shape not in ((n,), (n, graph.num_classes)):
        fail(key, f"type {target}: labels have shape {labels.shape}, expected ({n},) (a class per {target} "
             f"vertex) or ({n}, num_classes={graph.num_classes})", f"Give one label per {target} vertex.")
    if labels.dtype.kind not in "iu":
        fail(key, f"type {target}: labels have dtype {labels.dtype}, expected integers",
             "Convert with .astype(np.int64) (-1 marks a missing label).")
    low, high = _range(labels)
    top = 1 if labels.ndim == 2 else graph.num_classes - 1
    if graph.num_classes < (1 if labels.ndim == 2 else 2):
        fail(None, f"type {target}: num_classes is {graph.num_classes}", "Node classification needs 2 classes "
             "or more (a multi-label task 1 or more).")
    if labels.size and (low < -1 or high > top):
        fail(key, f"type {target}: labels range over {low}..{high}, outside 0..{top} (and -1 for none)",
             "Remap the labels or fix num_classes.")
    for split in SPLITS:
        _check_split(graph, split, n, fail)
    overlap = split_overlap(graph.train_idx, graph.val_idx, graph.test_idx, graph.notes)
    if overlap is not None:
        array, what, fix = overlap
        fail(node_array(target, array), f"type {target}: {what}", fix)


def _check_split(graph, split: str, n: int, fail: _Failure) -> None:
    target, key = graph.target, node_array(graph.target, split)
    idx = np.asarray(getattr(graph, split))
    if idx.ndim != 1 or idx.dtype.kind not in "iu":
        fail(key, f"type {target}: {split} must be a 1-D integer array, got {idx.dtype} {idx.shape}",
             "Save it with .astype(np.int64).")
    if idx.size == 0:
        fail(key, f"type {target}: {split} is empty", "Give every split at least one vertex.")
    if int(idx.min()) < 0 or int(idx.max()) >= n:
        bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        fail(key, f"type {target}: {split} holds id {bad}, outside 0..{n - 1} (the {target} vertices)",
             f"Split ids are local to the target type {target}.")
    if np.unique(idx).shape[0] != idx.shape[0]:
        fail(key, f"type {target}: {split} repeats vertex {int(_first_duplicate(idx))}",
             "Each vertex may appear once per split (np.unique).")
    labels = np.asarray(graph.labels[idx])
    known = (labels >= 0).any(axis=1) if labels.ndim == 2 else labels >= 0
    if not known.all():
        fail(key, f"type {target}: {split} holds {int((~known).sum())} unlabelled vertices (first: "
             f"{int(idx[np.flatnonzero(~known)[0]])})", "Leave vertices labelled -1 out of the splits.")


def _range(labels: np.ndarray) -> tuple[int, int]:
    """The smallest and largest label, read in chunks of rows."""
    low = high = None
    step = max(1, _CHUNK // max(1, int(np.prod(labels.shape[1:], dtype=np.int64))))
    for start in range(0, labels.shape[0], step):
        chunk = np.asarray(labels[start:start + step])
        if chunk.size:
            low = int(chunk.min()) if low is None else min(low, int(chunk.min()))
            high = int(chunk.max()) if high is None else max(high, int(chunk.max()))
    return (low or 0), (high or 0)
