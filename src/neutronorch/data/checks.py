"""The checks ``validate`` runs on a graph from outside, shared by ``Graph.validate`` and
``TypedGraph.validate``. Every message names the file (else the graph), the type or relation, the problem
and the fix. Arrays may be memory maps larger than RAM: they are read in chunks, never copied whole."""

from __future__ import annotations

import re
from functools import partial

import numpy as np

from neutronorch.data.dtypes import STORAGE_DTYPES, id_outside
from neutronorch.data.relation import Relation, node_array, relation_array, relation_label
from neutronorch.data.splits import split_overlap
from neutronorch.data.times import check_times
from neutronorch.errors import DataError

# Type and relation names become folder names on disk (native.py); "___" joins a relation's three.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SPLITS = ("train_idx", "val_idx", "test_idx")
# Checks over arrays that may be larger than RAM run in chunks of this many elements.
_CHUNK = 1 << 24
# The metrics a dataset may name as its own (``Graph.metric``) and --metric takes (config.py).
METRICS = ("accuracy", "rocauc", "f1-micro", "f1-macro")


class Failure:
    """Raises the ``DataError`` for one array (``key``: its name in ``files``): named by its file when known,
    else by the source."""

    def __init__(self, source: str, files: dict[str, str]):
        self.source, self.files = source, files

    def __call__(self, key: str | None, what: str, fix: str) -> None:
        raise DataError(f"{self.files.get(key, self.source) if key else self.source}: {what}. {fix}")


def check_kinds(arrays: dict, count, fail) -> None:
    """``arrays`` (name -> value; None for an optional one absent) numpy arrays and ``count`` (num_classes) a
    whole number >= 0, else ``fail(what, fix)``: a graph built by hand may hold lists, tensors or strings."""
    for name, array in arrays.items():
        if array is not None and not isinstance(array, np.ndarray):
            fix = ".numpy()" if hasattr(array, "detach") else "np.asarray"
            fail(f"{name} is a {type(array).__name__}, expected a numpy array",
                 f"Convert it with {fix} (a memory map is a numpy array too).")
    if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
        fail(f"num_classes {count!r} is not a whole number >= 0", "Give the number of classes as an int.")


def check_metric(metric, fail: Failure) -> None:
    if metric is not None and metric not in METRICS:
        fail("metric", f"metric {metric!r} names no metric", f"Use one of {', '.join(METRICS)}, or none.")


def check_typed_graph(graph, source: str, files: dict[str, str]) -> None:
    fail = Failure(source, files)
    check_names(graph, source)
    check_metric(graph.metric, fail)
    for key, relation in graph.relations.items():
        label = f"relation {relation_label(key)}"
        check_csc(relation.indptr, relation.indices, int(graph.num_nodes[key[0]]), fail, label + ": ",
                  partial(relation_array, key), f"the {{}} vertices of source type {key[0]}",
                  (f"one per {key[2]} vertex, plus one", f"Build the CSC over the destination type {key[2]}."),
                  int(graph.num_nodes[key[2]]))
        if relation.edge_features is not None:
            check_rows(relation.edge_features, relation.indices.shape[0], f"{label}: edge_features", "edge",
                       relation_array(key, "edge_features"), fail)
        if relation.edge_time is not None:
            check_times(relation.edge_time, relation.num_edges, f"{label}: edge times",
                        files.get(relation_array(key, "edge_time"), source), relation.indptr)
    if not isinstance(graph.node_time, dict):
        fail(None, f"node_time is a {type(graph.node_time).__name__}, expected a dict", "Map each timed type to "
             "its vertex times.")
    for node_type, times in graph.node_time.items():
        if node_type not in graph.num_nodes:
            fail(None, f"vertex times are given for type {node_type!r}, which the graph does not have",
                 "Add it to num_nodes, or fix the name.")
        check_times(times, int(graph.num_nodes[node_type]), f"type {node_type}: vertex times",
                    files.get(node_array(node_type, "time"), source))
    for node_type, features in graph.features.items():
        check_rows(features, int(graph.num_nodes[node_type]), f"type {node_type}: features", f"{node_type} vertex",
                   node_array(node_type, "features"), fail)
    target = graph.target
    if graph.labels is None:  # a graph to sample or embed, not to classify: no split either
        sizes = [int(np.asarray(getattr(graph, s)).shape[0]) for s in SPLITS]
        if any(sizes):
            fail(node_array(target, "labels"), f"type {target}: the split ({'/'.join(map(str, sizes))} vertices) is "
                 f"on a type without labels", f"Give labels for the target type {target} (a class id per vertex, -1 "
                 f"for none).")
        return
    check_target(graph, int(graph.num_nodes[target]), fail, f"type {target}: ", partial(node_array, target),
                 f"{target} vertex", labelled_splits=True)


def check_names(graph, source: str) -> None:
    """Types and relations have names a folder can take, counts are whole numbers, and every relation
    joins two types the graph has: what writing a graph relies on, checked without reading an array."""
    fail = Failure(source, {})
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


def _check_kinds(graph, fail: Failure) -> None:
    """Every part of the kind ``TypedGraph`` says (a graph built by hand may hold lists, tensors or tuples):
    dicts, ``Relation`` values, numpy arrays (``check_kinds``) and a whole ``num_classes``."""
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


def _check_name(name, what: str, fail: Failure) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or "___" in name:
        fail(None, f"{what} {name!r} is not a name a folder can take",
             "Use letters, digits, '_', '-' and '.', starting with a letter or digit, and no '___'.")


def check_csc(indptr, indices, num_src: int, fail: Failure, prefix: str = "", key=lambda part: part,
              vertices: str = "{} nodes", rows: tuple[str, str] | None = None, num_dst: int | None = None) -> None:
    """A CSC over ``num_dst`` destinations (by default ``indptr``'s length less one) whose ``indices`` are ids
    of ``num_src`` sources: int32/int64, offsets from 0 to ``len(indices)`` that never fall, ids in range. Each
    message starts with ``prefix`` and is raised for the array ``key(name)``; ``vertices`` words the sources
    (``{}``: their count) and ``rows`` why ``indptr`` has ``num_dst + 1`` entries, and its fix."""
    for name, array in (("indptr", indptr), ("indices", indices)):
        if array.ndim != 1 or array.dtype not in (np.int32, np.int64):
            fail(key(name), f"{prefix}{name} must be a 1-D int32 or int64 array, got {array.dtype} {array.shape}",
                 "Save it with .astype(np.int64).")
    if rows is not None and indptr.shape[0] != num_dst + 1:
        fail(key("indptr"), f"{prefix}indptr has {indptr.shape[0]} entries, expected {num_dst + 1} ({rows[0]})",
             rows[1])
    if int(indptr[0]) != 0 or int(indptr[-1]) != indices.shape[0]:
        fail(key("indptr"), f"{prefix}indptr must start at 0 and end at len(indices)={indices.shape[0]}, got "
             f"{int(indptr[0])}..{int(indptr[-1])}", "The file is truncated or indptr and indices come from "
             "different graphs.")
    for start in range(0, indptr.shape[0], _CHUNK):
        chunk = np.asarray(indptr[start:start + _CHUNK + 1])
        if chunk.shape[0] > 1 and np.any(np.diff(chunk) < 0):
            fail(key("indptr"), f"{prefix}indptr is not non-decreasing",
                 "Rebuild the CSC offsets with a cumulative sum of in-degrees.")
    for start in range(0, indices.shape[0], _CHUNK):
        if (bad := id_outside(np.asarray(indices[start:start + _CHUNK]), num_src)) is not None:
            fail(key("indices"), f"{prefix}indices hold vertex id {bad}, out of range for "
                 f"{vertices.format(num_src)}", f"Ids are 0..{num_src - 1}; relabel the edges or fix the count.")


def check_rows(array: np.ndarray, rows: int, what: str, row: str, key: str, fail: Failure) -> None:
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
            fail(key, f"{what} contain NaN or inf (first at {row} {bad})",
                 "Replace non-finite values (e.g. np.nan_to_num).")


def check_target(graph, n: int, fail: Failure, prefix: str = "", key=lambda part: part, row: str = "vertex",
                 labelled_splits: bool = False, link_only: bool = False) -> None:
    """``graph``'s labels (a class id per vertex, or a 0/1/-1 row of ``num_classes`` tasks) and its splits
    (distinct ids among ``n``, disjoint): what ``check_csc`` says of ``prefix`` and ``key``. With
    ``labelled_splits`` a split may hold no unlabelled vertex; with ``link_only`` (no node task) the splits
    may be empty and ``num_classes`` 0."""
    labels, classes = graph.labels, graph.num_classes
    if labels.shape not in ((n,), (n, classes)):
        fail(key("labels"), f"{prefix}labels must have shape ({n},) (a class per {row}) or ({n}, num_classes="
             f"{classes}) (multi-label), got {labels.shape}", f"Give one label (or one row of 0/1) per {row}.")
    if labels.dtype.kind not in "iu":
        fail(key("labels"), f"{prefix}labels have dtype {labels.dtype}, expected integers",
             "Convert with .astype(np.int64) (-1 marks a missing label).")
    if classes < (1 if labels.ndim == 2 else 2) and not link_only:
        fail(key("num_classes"), f"{prefix}num_classes is {classes}", "Node classification needs 2 classes or more "
             "(a multi-label task 1 or more).")
    low, high = _range(labels)
    top = 1 if labels.ndim == 2 else classes - 1
    if labels.size and (low < -1 or high > top):
        fail(key("labels"), f"{prefix}labels range over {low}..{high}, outside 0..{top} (and -1 for none)",
             "Remap the labels or fix num_classes.")
    for split in SPLITS:
        idx = np.asarray(getattr(graph, split))
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            fail(key(split), f"{prefix}{split} must be a 1-D integer array, got {idx.dtype} {idx.shape}",
                 "Save it with .astype(np.int64).")
        if idx.size == 0:
            if link_only:
                continue
            fail(key(split), f"{prefix}{split} is empty", "Give every split at least one vertex (see `split`).")
        if (bad := id_outside(idx, n)) is not None:
            fail(key(split), f"{prefix}{split} holds vertex id {bad}, outside 0..{n - 1}",
                 f"Split ids are {row} ids; fix the split or the count.")
        unique, counts = np.unique(idx, return_counts=True)
        if unique.shape[0] != idx.shape[0]:
            fail(key(split), f"{prefix}{split} holds {idx.shape[0] - unique.shape[0]} duplicate vertex ids (first: "
                 f"{int(unique[counts > 1][0])})", "Each vertex may appear once per split; deduplicate it (np.unique).")
        if labelled_splits:
            known = graph.is_labelled(idx)
            if not known.all():
                fail(key(split), f"{prefix}{split} holds {int((~known).sum())} unlabelled vertices (first: "
                     f"{int(idx[np.flatnonzero(~known)[0]])})", "Leave vertices labelled -1 out of the splits.")
    overlap = split_overlap(graph.train_idx, graph.val_idx, graph.test_idx, graph.notes)
    if overlap is not None:
        array, what, fix = overlap
        fail(key(array), f"{prefix}{what}", fix)


def _range(labels: np.ndarray) -> tuple[int, int]:
    """The smallest and largest label (0 and 0 for none), read in chunks of rows."""
    step = max(1, _CHUNK // max(1, int(np.prod(labels.shape[1:], dtype=np.int64))))
    chunks = (np.asarray(labels[start:start + step]) for start in range(0, labels.shape[0], step))
    bounds = [(int(chunk.min()), int(chunk.max())) for chunk in chunks if chunk.size]
    return (min(low for low, _ in bounds), max(high for _, high in bounds)) if bounds else (0, 0)
