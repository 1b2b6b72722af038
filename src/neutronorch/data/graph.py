"""The in-memory graph every other module reads.

A ``Graph`` is topology in CSC form (for each vertex, the ids of its in-neighbours: the vertices whose
messages it aggregates), node features, labels and a train/val/test split. Arrays may be numpy memory maps,
so nothing here may copy a whole array without need. ``validate`` is the one place that checks a graph
coming from outside; the rest of the package trusts a validated graph.

A link-prediction graph carries its supervision edges in ``links`` (``data/links.py``); it may have no node
task at all: then ``num_classes`` is 0, every label is -1 and the node splits are empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from neutronorch.data.arrays import graph_fields
from neutronorch.data.dtypes import STORAGE_DTYPES
from neutronorch.data.links import LinkSplit, check_link_split
from neutronorch.data.splits import split_overlap
from neutronorch.errors import DataError

# Checks over arrays that may be larger than RAM run in chunks of this many elements.
_CHUNK = 1 << 24
# The metrics a dataset may name as its own (``Graph.metric``); config.METRICS lists the same for --metric.
METRICS = ("accuracy", "rocauc", "f1-micro", "f1-macro")


class GivenChecked:
    """``check_given``, for a graph given in Python (to ``train``, a loader, ``predict`` or ``embed``): it is
    validated as a loaded one is, unless this object passed ``validate`` holding the parts it holds now (a
    loader's graph, checked as it was read): one built or changed by hand is never trusted, and a loaded one
    is not read twice."""

    def check_given(self, classes: bool = True) -> None:
        """Without ``classes`` (inference, which reads no label) a graph need not have classes to learn."""
        if getattr(self, "_validated", None) not in ((self._parts(), True), (self._parts(), classes)):
            self.validate(str(self.name), classes=classes)

    def _mark_validated(self, classes: bool = True) -> None:
        self._validated = (self._parts(), classes)

    def _parts(self) -> tuple:
        """Every field's object and the entries of its dicts (``check_given`` compares them)."""
        parts = []
        for value in (getattr(self, f.name) for f in fields(self)):
            items = tuple((k, id(v)) for k, v in value.items()) if isinstance(value, dict) else ()
            parts.append((id(value), items))
        return tuple(parts)


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


@dataclass
class Graph(GivenChecked):
    """A node-classification graph in CSC form.

    ``indptr[v]:indptr[v+1]`` indexes ``indices``, which holds the in-neighbours of ``v``. ``labels`` is a
    class id per vertex (-1: no label), or for a multi-label task a 0/1 row of ``num_classes`` tasks per
    vertex (-1: unknown). ``metric`` is the metric the dataset's literature reports, when its loader knows it.
    ``links`` is the link split of a link-prediction graph (None for node classification).
    """

    name: str
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    notes: list[str] = field(default_factory=list)
    metric: str | None = None
    links: LinkSplit | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def feature_dim(self) -> int:
        return int(self.features.shape[1])

    def in_degrees(self) -> np.ndarray:
        return np.diff(np.asarray(self.indptr))

    @staticmethod
    def from_arrays(src, dst, features, labels, splits=None, **options) -> "Graph":
        """A graph from edge endpoints, features, labels and optional splits (numpy or torch), cleaned as a
        loaded one is, validated, and without unlabelled vertices in its splits; see
        ``neutronorch.data.arrays.graph_fields`` for the options."""
        graph = Graph(**graph_fields(src, dst, features, labels, splits, **options))
        graph.validate(graph.name)
        graph.drop_unlabelled_from_splits()
        return graph

    def is_labelled(self, ids: np.ndarray) -> np.ndarray:
        """Whether each of ``ids`` has a label (multi-label: at least one known entry)."""
        labels = np.asarray(self.labels[ids])
        return (labels >= 0).any(axis=1) if labels.ndim == 2 else labels >= 0

    def loss_terms(self, ids: np.ndarray) -> int:
        """How many terms a loss over ``ids`` averages: their known labels (multi-label: known entries)."""
        return int((np.asarray(self.labels[ids]) >= 0).sum())

    def drop_unlabelled_from_splits(self) -> None:
        """Leave vertices without a label out of the training, validation and test sets (with a note):
        they count in neither the loss nor a metric."""
        marked = getattr(self, "_validated", None)
        valid = marked is not None and marked[0] == self._parts()
        dropped = []
        for name in ("train_idx", "val_idx", "test_idx"):
            idx = np.asarray(getattr(self, name))
            keep = self.is_labelled(idx)
            if not keep.all():
                if not keep.any():
                    raise DataError(f"{self.name}: no vertex of {name} has a label; give a split whose "
                                    f"{name.removesuffix('_idx')} set holds labelled vertices.")
                setattr(self, name, idx[keep])
                dropped.append(f"{int((~keep).sum()):,} from {name.removesuffix('_idx')}")
        if dropped:
            self.notes.append(f"vertices without a label left out of the splits: {', '.join(dropped)}")
        if valid:  # fewer vertices in a valid split leave it valid: not checked again (check_given)
            self._mark_validated(marked[1])

    def files(self) -> list[str]:
        """The files this graph's arrays are memory-mapped from (none for arrays held in memory)."""
        found = []
        for name in ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
            array = getattr(self, name)
            while array is not None and getattr(array, "filename", None) is None:
                array = getattr(array, "base", None)  # a view of a map (a bfloat16 view, a slice)
            if array is not None and array.filename not in found:
                found.append(array.filename)
        return found

    def describe(self) -> str:
        tasks = [f"{self.num_classes} classes, split {len(self.train_idx):,}/{len(self.val_idx):,}/"
                 f"{len(self.test_idx):,}"] if self.links is None or self.num_classes else []
        tasks += [self.links.describe()] if self.links is not None else []
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, {self.feature_dim} features, "
                f"{', '.join(tasks)}")

    def validate(self, source: str, files: dict[str, str] | None = None, classes: bool = True) -> None:
        """Raise ``DataError`` naming ``source`` if any array is inconsistent; return quietly otherwise.
        ``files`` maps array names to the files they came from, named instead of ``source`` when known;
        without ``classes`` a graph with ``num_classes`` 0 is taken (one to embed or score pairs of)."""
        n = self.num_nodes
        files = files or {}
        # No node task: no labels, no node splits.
        link_only = (self.links is not None or not classes) and self.num_classes == 0

        def fail(what: str, fix: str, array: str | None = None) -> None:
            array = array or what.split()[0]  # every message starts with the array it is about, or names it
            raise DataError(f"{files.get(array, source)}: {what}. {fix}")

        check_kinds({name: getattr(self, name) for name in ("indptr", "indices", "features", "labels", "train_idx",
                                                             "val_idx", "test_idx")}, self.num_classes, fail)
        if self.metric is not None and self.metric not in METRICS:
            fail(f"metric {self.metric!r} names no metric", f"Use one of {', '.join(METRICS)}, or none.")
        if self.indptr.ndim != 1 or self.indptr.shape[0] < 2:
            fail(f"indptr must be a 1-D array of num_nodes+1 offsets, got shape {self.indptr.shape}",
                 "Write the CSC offsets (length num_nodes+1).")
        for arr_name, arr in (("indptr", self.indptr), ("indices", self.indices)):
            if arr.dtype not in (np.int32, np.int64):
                fail(f"{arr_name} has dtype {arr.dtype}, expected int32 or int64",
                     f"Save {arr_name} with .astype(np.int64).")
        if int(self.indptr[0]) != 0 or int(self.indptr[-1]) != self.indices.shape[0]:
            fail(f"indptr must start at 0 and end at len(indices)={self.indices.shape[0]}, "
                 f"got {int(self.indptr[0])}..{int(self.indptr[-1])}",
                 "The file is truncated or indptr and indices come from different graphs.")
        if self.indices.ndim != 1:
            fail(f"indices must be 1-D, got shape {self.indices.shape}", "Flatten it.")
        for start in range(0, n + 1, _CHUNK):
            chunk = np.asarray(self.indptr[start:start + _CHUNK + 1])
            if chunk.shape[0] > 1 and np.any(np.diff(chunk) < 0):
                fail("indptr is not non-decreasing", "Rebuild the CSC offsets with a cumulative sum of degrees.")
        for start in range(0, self.num_edges, _CHUNK):
            chunk = np.asarray(self.indices[start:start + _CHUNK])
            lo, hi = int(chunk.min()), int(chunk.max())
            if lo < 0 or hi >= n:
                bad = lo if lo < 0 else hi
                fail(f"indices hold vertex id {bad}, out of range for {n} nodes",
                     "Vertex ids must be 0..num_nodes-1; relabel the edges or fix num_nodes.")
        if self.features.ndim != 2 or self.features.shape[0] != n:
            fail(f"features must have shape (num_nodes={n}, feature_dim), got {self.features.shape}",
                 "Write one feature row per vertex.")
        if self.features.dtype.name not in STORAGE_DTYPES:
            fail(f"features have dtype {self.features.dtype}, expected float32, float16 or bfloat16",
                 "Convert with .astype(np.float32).")
        rows = max(1, _CHUNK // max(1, self.feature_dim))
        for start in range(0, n, rows):
            chunk = np.asarray(self.features[start:start + rows])
            if not np.isfinite(chunk).all():
                bad_row = start + int(np.argwhere(~np.isfinite(chunk))[0][0])
                fail(f"features contain NaN or inf (first at vertex {bad_row})",
                     "Replace non-finite values (e.g. np.nan_to_num) before training.")
        if self.labels.shape not in ((n,), (n, self.num_classes)):
            fail(f"labels must have shape ({n},) (a class per vertex) or ({n}, num_classes={self.num_classes}) "
                 f"(multi-label), got {self.labels.shape}", "Write one label (or one row of 0/1) per vertex.")
        if self.labels.dtype.kind not in "iu":
            fail(f"labels have dtype {self.labels.dtype}, expected integers",
                 "Convert with .astype(np.int64) (-1 marks a missing label).")
        lab = np.asarray(self.labels)
        if lab.ndim == 2:
            if self.num_classes < 1:
                fail(f"num_classes is {self.num_classes}", "A multi-label graph needs at least 1 task.")
            if lab.size and (int(lab.min()) < -1 or int(lab.max()) > 1):
                fail(f"labels range over {int(lab.min())}..{int(lab.max())}, outside -1..1",
                     "Multi-label labels are 0 or 1 per task, -1 where unknown.")
        else:
            if self.num_classes < 2 and not link_only:
                fail(f"num_classes is {self.num_classes}", "Node classification needs at least 2 classes.")
            if lab.size and (int(lab.min()) < -1 or int(lab.max()) >= self.num_classes):
                fail(f"labels range over {int(lab.min())}..{int(lab.max())}, outside 0..{self.num_classes - 1} "
                     f"(and -1 for no label)",
                     "Labels must be class ids 0..num_classes-1, or -1; remap them or fix num_classes.")
        for split_name in ("train_idx", "val_idx", "test_idx"):
            idx = getattr(self, split_name)
            if idx.ndim != 1 or idx.dtype.kind not in "iu":
                fail(f"{split_name} must be a 1-D integer array, got {idx.dtype} {idx.shape}",
                     "Save it with .astype(np.int64).")
            if idx.size == 0:
                if link_only:
                    continue
                fail(f"{split_name} is empty", "Give every split at least one vertex (see `split`).")
            if int(idx.min()) < 0 or int(idx.max()) >= n:
                fail(f"{split_name} holds vertex ids outside 0..{n - 1}", "Fix the split or num_nodes.")
            unique = np.unique(np.asarray(idx))
            if unique.shape[0] != idx.shape[0]:
                fail(f"{split_name} holds {idx.shape[0] - unique.shape[0]} duplicate vertex ids (first: "
                     f"{int(_first_duplicate(np.asarray(idx)))})",
                     "Each vertex may appear once per split; deduplicate it (np.unique).")
        overlap = split_overlap(self.train_idx, self.val_idx, self.test_idx, self.notes)
        if overlap is not None:
            array, what, fix = overlap
            fail(what, fix, array)
        if self.links is not None:  # a benchmark's fixed negatives are scored as they are (check_link_split)
            check_link_split(self.links, n, files.get("links", source), negatives_may_be_positive=True)
        self._mark_validated(classes)


def _first_duplicate(ids: np.ndarray) -> int:
    ordered = np.sort(ids)
    return ordered[np.flatnonzero(ordered[1:] == ordered[:-1])[0]]
