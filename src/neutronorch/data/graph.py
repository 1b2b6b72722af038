"""The in-memory graph every other module reads: topology in CSC form (for each vertex, its in-neighbours),
node features, labels and a split. Arrays may be memory maps, so nothing here may copy a whole array without
need. ``validate`` is the one check of a graph from outside; the rest of the package trusts a validated one.
A link-prediction graph carries its split in ``links`` and may have no node task (``num_classes`` 0, labels
-1, empty node splits)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from neutronorch.data.arrays import graph_fields
from neutronorch.data.checks import Failure, check_csc, check_kinds, check_metric, check_rows, check_target
from neutronorch.data.links import LinkSplit, check_link_split
from neutronorch.data.times import check_times, describe_times
from neutronorch.errors import DataError

# The arrays of a graph, as the native format names its files.
ARRAYS = ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx")


class GraphCommon:
    """What ``Graph`` and ``TypedGraph`` share. ``check_given`` validates a graph given in Python unless this
    object passed ``validate`` holding the parts it holds now: one built or changed by hand is never trusted,
    a loaded one is not read twice."""

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

    def check_given(self, classes: bool = True) -> None:
        """Without ``classes`` (inference, which reads no label) a graph need not have classes to learn."""
        if getattr(self, "_validated", None) not in ((self._parts(), True), (self._parts(), classes)):
            self.validate(str(self.name), classes=classes)

    def _mark_validated(self, classes: bool = True) -> None:
        self._validated = (self._parts(), classes)

    def files(self) -> list[str]:
        """The files this graph's arrays (``arrays``) are memory-mapped from (none for arrays held in memory)."""
        found = []
        for array in self.arrays():
            while array is not None and getattr(array, "filename", None) is None:
                array = getattr(array, "base", None)  # a view of a map (a bfloat16 view, a slice)
            if array is not None and array.filename not in found:
                found.append(array.filename)
        return found

    def _parts(self) -> tuple:
        """Every field's object and the entries of its dicts (``check_given`` compares them)."""
        parts = []
        for value in (getattr(self, f.name) for f in fields(self)):
            items = tuple((k, id(v)) for k, v in value.items()) if isinstance(value, dict) else ()
            parts.append((id(value), items))
        return tuple(parts)


@dataclass
class Graph(GraphCommon):
    """A node-classification graph in CSC form: ``indices[indptr[v]:indptr[v+1]]`` are ``v``'s in-neighbours.
    ``labels``: a class id per vertex (-1: none), or a 0/1 row of ``num_classes`` tasks (-1: unknown).
    ``metric``: the one the dataset's literature reports; ``links``: a link graph's split. ``edge_time``: a
    time per edge in ``indices``' order, each vertex's in-edges ascending by it; ``node_time``: a time per
    vertex (docs/temporal.md); None where the graph has none."""

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
    edge_time: np.ndarray | None = None
    node_time: np.ndarray | None = None

    @property
    def num_nodes(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @property
    def temporal(self) -> bool:
        """Whether the graph carries edge or vertex times."""
        return self.edge_time is not None or self.node_time is not None

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

    def arrays(self) -> list[np.ndarray | None]:
        """The graph's arrays, in the native format's order (``ARRAYS``), then its times (None where absent)."""
        return [getattr(self, name) for name in ARRAYS] + [self.edge_time, self.node_time]

    def describe(self) -> str:
        task = (f"{self.num_classes:,} classes, split {len(self.train_idx):,}/{len(self.val_idx):,}/"
                f"{len(self.test_idx):,}" if self.num_classes else "no labels")
        tasks = [task] if self.links is None or self.num_classes else []
        tasks += [self.links.describe()] if self.links is not None else []
        tasks += [line for line in (describe_times(self.edge_time, "edge times"),
                                    describe_times(self.node_time, "vertex times")) if line]
        return (f"{self.name}: {self.num_nodes:,} nodes, {self.num_edges:,} edges, {self.feature_dim:,} features, "
                f"{', '.join(tasks)}")

    def validate(self, source: str, files: dict[str, str] | None = None, classes: bool = True) -> "Graph":
        """Raise ``DataError`` naming ``source`` if any array is inconsistent; return the graph otherwise.
        ``files`` maps array names to the files they came from, named instead of ``source`` when known;
        without ``classes`` a graph with ``num_classes`` 0 is taken (one to embed or score pairs of), and with
        them one whose splits are empty too (no labels: a link task's graph, to split as it trains)."""
        n = self.num_nodes
        fail = Failure(source, files or {})
        check_kinds({name: getattr(self, name) for name in ARRAYS}, self.num_classes,
                    lambda what, fix: fail(what.split()[0], what, fix))
        check_metric(self.metric, fail)
        if self.indptr.ndim != 1 or self.indptr.shape[0] < 2:
            fail("indptr", f"indptr must be a 1-D array of num_nodes+1 offsets, got shape {self.indptr.shape}",
                 "Write the CSC offsets (length num_nodes+1).")
        check_csc(self.indptr, self.indices, n, fail)
        check_rows(self.features, n, "features", "vertex", "features", fail)
        # No node task (a link graph's, or one to embed): no labels, no node splits.
        unlabelled = not any(len(getattr(self, name)) for name in ("train_idx", "val_idx", "test_idx"))
        check_target(self, n, fail, link_only=(self.links is not None or not classes or unlabelled)
                     and self.num_classes == 0)
        if self.edge_time is not None:  # in-edges sorted by time: checked, as the samplers' cut relies on it
            check_times(self.edge_time, self.num_edges, "edge times", (files or {}).get("edge_time", source),
                        self.indptr)
        if self.node_time is not None:
            check_times(self.node_time, n, "vertex times", (files or {}).get("node_time", source))
        if self.links is not None:  # a benchmark's fixed negatives are scored as they are (check_link_split)
            check_link_split(self.links, n, (files or {}).get("links", source))
        self._mark_validated(classes)
        return self

