"""Typed (heterogeneous) graphs: several vertex types, relations between them (``relation.py``), one target
type. Arrays may be memory maps, so nothing here may copy a whole array without need (``collapse``, a typed
graph's one-graph view, builds in memory). ``validate`` (``checks.py``) is the one check of a typed graph from
outside. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from neutronorch.data.checks import check_typed_graph
from neutronorch.data.graph import Graph, GraphCommon
from neutronorch.data.links import LinkSplit
from neutronorch.data.relation import Relation, RelationType, relation_label
from neutronorch.data.times import describe_times
from neutronorch.errors import DataError

TYPED_FORMAT = "neutronorch-typed"  # meta.json's "format" for a typed graph on disk (native.py)
REVERSE_PREFIX = "rev_"
# A homogeneous graph seen as a typed one (``TypedGraph.of``): its one vertex type and one relation.
VERTEX = "vertex"
EDGE: RelationType = (VERTEX, "to", VERTEX)


@dataclass
class TypedGraph(GraphCommon):
    """A node-classification graph with typed vertices and relations.

    ``num_nodes`` lists the types in their fixed order with their counts; ``relations`` maps each ``(src_type,
    name, dst_type)`` to its ``Relation``; ``features`` maps a type to its rows (absent: none). ``labels`` is
    as ``Graph``'s, for the target's vertices, or None; the splits hold local ids of the target type.
    ``links``: a link task's split of one relation (``LinkSplit.ends``). ``node_time``: a time per vertex of
    the types that have them (a relation's edge times are its ``Relation.edge_time``; docs/temporal.md)."""

    name: str
    num_nodes: dict[str, int]
    relations: dict[RelationType, Relation]
    features: dict[str, np.ndarray]
    target: str
    labels: np.ndarray | None
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    num_classes: int
    notes: list[str] = field(default_factory=list)
    metric: str | None = None
    links: LinkSplit | None = None
    node_time: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def temporal(self) -> bool:
        """Whether any relation carries edge times or any type vertex times."""
        return bool(self.node_time) or any(r.edge_time is not None for r in self.relations.values())

    @classmethod
    def of(cls, graph: Graph) -> "TypedGraph":
        """``graph`` as the typed graph of one vertex type (``VERTEX``) and one relation (``EDGE``), sharing
        its arrays (topology, times, features, labels, splits: none is copied, a memory map stays mapped). A
        link split is not carried (``links`` stays None)."""
        return cls(graph.name, {VERTEX: graph.num_nodes},
                   {EDGE: Relation(graph.indptr, graph.indices, None, graph.edge_time)},
                   {VERTEX: graph.features}, VERTEX, graph.labels, graph.train_idx, graph.val_idx, graph.test_idx,
                   graph.num_classes, list(graph.notes), graph.metric,
                   node_time={} if graph.node_time is None else {VERTEX: graph.node_time})

    def as_graph(self) -> Graph:
        """A graph of one vertex type and one relation between its vertices as a homogeneous ``Graph``
        sharing its arrays (``TypedGraph.of``'s way back). ``DataError`` for any other graph, or one whose
        type has no features or labels or whose relation has edge features (a ``Graph`` holds none)."""
        (node_type, _, _), relation = next(iter(self.relations.items()), ((None, None, None), None))
        one = len(self.num_nodes) == len(self.relations) == 1
        why = ("it has not one vertex type and one relation" if not one else
               "its vertices have no features" if node_type not in self.features else
               "its target has no labels" if self.labels is None else
               "its relation has edge features" if relation.edge_features is not None else None)
        if why:
            raise DataError(f"{self.name}: not a homogeneous graph: {why}. Train it as a typed graph.")
        return Graph(self.name, relation.indptr, relation.indices, self.features[node_type], self.labels,
                     self.train_idx, self.val_idx, self.test_idx, self.num_classes, list(self.notes), self.metric,
                     edge_time=relation.edge_time, node_time=self.node_time.get(node_type))

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    @property
    def relation_types(self) -> tuple[RelationType, ...]:
        return tuple(self.relations)

    @property
    def num_edges(self) -> int:
        """Edges over all relations (each relation's ``num_edges`` has its own)."""
        return sum(relation.num_edges for relation in self.relations.values())

    def feature_dim(self, node_type: str) -> int:
        """The feature width of ``node_type``; 0 for a type without features."""
        if node_type not in self.num_nodes:
            raise DataError(f"{self.name}: no vertex type {node_type!r}; the types are {', '.join(self.num_nodes)}.")
        features = self.features.get(node_type)
        return 0 if features is None else int(features.shape[1])

    def arrays(self) -> list[np.ndarray | None]:
        """The graph's arrays: the target's labels and splits, every type's features, every relation's CSC and
        edge features (None where absent)."""
        arrays = [self.labels, self.train_idx, self.val_idx, self.test_idx, *self.features.values(),
                  *self.node_time.values()]
        for relation in self.relations.values():
            arrays += [relation.indptr, relation.indices, relation.edge_features, relation.edge_time]
        return arrays

    def relation(self, key: RelationType | str) -> RelationType:
        """The relation type ``key`` names: a ``(src, name, dst)`` triple, or a name only one relation has."""
        if isinstance(key, tuple):
            if key in self.relations:
                return key
            raise DataError(f"{self.name}: no relation {relation_label(key)}; the relations are "
                            f"{', '.join(map(relation_label, self.relations))}.")
        named = [r for r in self.relations if r[1] == key]
        if len(named) != 1:
            why = "no relation is" if not named else f"{len(named)} relations are"
            raise DataError(f"{self.name}: {why} named {key!r}; name one by (src, name, dst) from "
                            f"{', '.join(map(relation_label, self.relations))}.")
        return named[0]

    def in_degrees(self, relation: RelationType | str) -> np.ndarray:
        """Per destination vertex, its in-neighbours through ``relation`` (a triple or a unique name)."""
        return self.relations[self.relation(relation)].in_degrees()

    def reverse_of(self, relation: RelationType) -> RelationType | None:
        """The relation stored as ``relation``'s reverse, by name: ``(dst, rev_NAME, src)``, or for a
        ``rev_NAME`` relation ``(dst, NAME, src)``; None when there is none."""
        return reverse_relation(relation, self.relations)

    def with_reverse(self) -> "TypedGraph":
        """A graph (sharing this one's arrays) that also holds ``(dst, rev_NAME, src)``, a CSC transpose with
        the edge features, for every relation with no reverse yet (``reverse_of``), after the existing ones; a
        transpose is built in memory (8 bytes an edge a few times over)."""
        relations = dict(self.relations)
        for (src, name, dst), relation in self.relations.items():
            if self.reverse_of((src, name, dst)) is None:
                tails, heads = relation.edges()
                features = None if relation.edge_features is None else np.asarray(relation.edge_features)
                times = None if relation.edge_time is None else np.asarray(relation.edge_time)
                relations[(dst, REVERSE_PREFIX + name, src)] = Relation.from_edges(
                    heads, tails, relation.indptr.shape[0] - 1, self.num_nodes[src], features,
                    source="a relation's transpose", edge_time=times)
        return replace(self, relations=relations, notes=list(self.notes))

    def describe(self) -> str:
        """A few lines for ``neutronorch info``: the types, the relations and the target."""
        splits = "/".join(f"{len(idx):,}" for idx in (self.train_idx, self.val_idx, self.test_idx))
        task = f"{self.num_classes:,} classes, split {splits}" if self.labels is not None else "no labels"
        types, relations = len(self.num_nodes), len(self.relations)
        lines = [f"{self.name}: {types} vertex type{'s' * (types != 1)}, {relations} "
                 f"relation{'s' * (relations != 1)}, {self.num_edges:,} edges; target {self.target} ({task})"]
        width = max((len(t) for t in self.num_nodes), default=0)
        for node_type, count in self.num_nodes.items():
            dim = self.feature_dim(node_type)
            widths = _count(dim, "feature") if dim else "no features"
            lines.append(f"  {node_type:<{width}}  {count:>12,} vertices, {widths}")
        for key, relation in self.relations.items():
            dim = relation.edge_feature_dim
            extra = f", {_count(dim, 'edge feature')}" if dim else ""
            lines.append(f"  {key[0]} -{key[1]}-> {key[2]}: {relation.num_edges:,} edges{extra}")
            if relation.edge_time is not None:
                lines.append(f"    {describe_times(relation.edge_time, 'edge times')}, in-edges sorted by time")
        lines += [f"  {t}: {describe_times(times, 'vertex times')}" for t, times in self.node_time.items()]
        return "\n".join(lines)

    def validate(self, source: str | None = None, files: dict[str, str] | None = None,
                 classes: bool = True) -> "TypedGraph":
        """``Graph.validate`` of a typed graph: ``files`` is keyed by ``node_array``/``relation_array``; a
        graph without labels passes either way of ``classes``."""
        check_typed_graph(self, source or self.name, files or {})
        self._mark_validated(classes)
        return self


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def type_offsets(graph: TypedGraph) -> dict[str, int]:
    """Where each type's vertices start among the stacked ones."""
    starts = np.cumsum([0, *graph.num_nodes.values()])
    return {t: int(start) for t, start in zip(graph.num_nodes, starts)}


def collapse(graph: TypedGraph) -> Graph:
    """``graph`` with its types forgotten, what a type-blind model trains on (docs/heterogeneous.md,
    "Accuracy"), validated: every type's vertices stacked in ``num_nodes``' order, every relation's edges in
    one CSC (an edge kept once; collapse ``graph.with_reverse()`` for the edges a typed run trains on),
    features padded with zeros from column 0 to the widest type's width (a featureless type: zero rows), so
    they do not say a vertex's type; labels -1 off the target. Builds in memory."""
    if graph.labels is None:
        raise DataError(f"{graph.name}: its target {graph.target!r} has no labels; a collapsed graph is for "
                        f"node classification.")
    if graph.temporal:
        raise DataError(f"{graph.name}: temporal sampling: a typed graph with times is not yet collapsed (its "
                        f"times would be lost); collapse it without them (docs/temporal.md).")
    offsets = type_offsets(graph)
    total = sum(graph.num_nodes.values())
    sources, destinations = [], []
    for (src_type, _, dst_type), relation in graph.relations.items():
        src, dst = relation.edges()
        sources.append(src + offsets[src_type])
        destinations.append(dst + offsets[dst_type])
    empty = np.zeros(0, np.int64)
    merged = Relation.from_edges(np.concatenate(sources or [empty]), np.concatenate(destinations or [empty]), total,
                                 total, deduplicate=True, source=f"{graph.name} collapsed")
    width = max(1, max(graph.feature_dim(t) for t in graph.num_nodes))
    features = np.zeros((total, width), np.float32)
    for node_type, rows in graph.features.items():
        start = offsets[node_type]
        features[start:start + graph.num_nodes[node_type], :rows.shape[1]] = rows
    labels_shape = (total,) + tuple(graph.labels.shape[1:])
    labels = np.full(labels_shape, -1, dtype=np.int64)
    start = offsets[graph.target]
    labels[start:start + graph.num_nodes[graph.target]] = graph.labels
    shift = lambda idx: np.asarray(idx, np.int64) + start  # noqa: E731
    collapsed = Graph(name=f"{graph.name}-collapsed", indptr=merged.indptr, indices=merged.indices,
                      features=features, labels=labels, train_idx=shift(graph.train_idx),
                      val_idx=shift(graph.val_idx), test_idx=shift(graph.test_idx), num_classes=graph.num_classes,
                      notes=[f"{graph.name} with its {len(graph.num_nodes)} vertex types and "
                             f"{len(graph.relations)} relations collapsed into one (types ignored)"],
                      metric=graph.metric)
    return collapsed.validate(collapsed.name)


def reverse_relation(relation: RelationType, relations) -> RelationType | None:
    """The relation among ``relations`` stored as ``relation``'s reverse, by name: ``(dst, rev_NAME, src)``,
    or for a ``rev_NAME`` relation ``(dst, NAME, src)``; None when there is none."""
    src, name, dst = relation
    candidates = [(dst, REVERSE_PREFIX + name, src)]
    if name.startswith(REVERSE_PREFIX):
        candidates.append((dst, name[len(REVERSE_PREFIX):], src))
    return next((c for c in candidates if c in relations), None)
