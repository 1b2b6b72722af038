"""Typed (heterogeneous) graphs: several vertex types, relations between them, one target type.

A ``TypedGraph`` keeps, for each relation ``(src_type, name, dst_type)``, a CSC over the destination type:
``indices[indptr[v]:indptr[v+1]]`` are the local ids (among ``src_type``'s vertices) of ``v``'s
in-neighbours through that relation, with optional edge features in the same order. Features are kept per
type, and a type may have none (a model then gives it a learnable embedding table); labels and the split
belong to the target type. Arrays may be numpy memory maps, so nothing here may copy a whole array without
need. ``validate`` (``typed_checks.py``) is the one place that checks a typed graph coming from outside; the
rest of the package trusts a validated one.

This is the data layer only: it knows nothing of sampling or models, and, like ``graph.py``, imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from neutronorch.data.dtypes import as_int64
from neutronorch.data.graph import GivenChecked, Graph
from neutronorch.errors import DataError

RelationType = tuple[str, str, str]  # (source type, relation name, destination type)
TYPED_FORMAT = "neutronorch-typed"  # meta.json's "format" for a typed graph on disk (typed_native.py)
REVERSE_PREFIX = "rev_"
# A homogeneous graph seen as a typed one (``TypedGraph.of``): its one vertex type and one relation.
VERTEX = "vertex"
EDGE: RelationType = (VERTEX, "to", VERTEX)
# Source and destination ids below this product make one int64 sort key per edge (the cheapest sort).
_KEY_LIMIT = 1 << 62
_INT32_LIMIT = np.iinfo(np.int32).max


def relation_label(relation: RelationType) -> str:
    """How messages name a relation: ``(author, writes, paper)``."""
    return f"({', '.join(relation)})"


def node_array(node_type: str, array: str) -> str:
    """An array of one vertex type as the native layout names it (``nodes/paper/features``); the key of
    ``validate``'s ``files``."""
    return f"nodes/{node_type}/{array}"


def relation_array(relation: RelationType, array: str) -> str:
    """An array of one relation as the native layout names it (``relations/author___writes___paper/indptr``)."""
    return f"relations/{'___'.join(relation)}/{array}"


@dataclass
class Relation:
    """One relation's edges as a CSC over its destination type.

    ``indptr`` has a row per destination vertex plus one; ``indices`` holds source-type ids (int32 or int64);
    ``edge_features`` (edges x width, float) follows ``indices``' order, or is None."""

    indptr: np.ndarray
    indices: np.ndarray
    edge_features: np.ndarray | None = None

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def edge_feature_dim(self) -> int:
        return 0 if self.edge_features is None else int(self.edge_features.shape[1])

    def in_degrees(self) -> np.ndarray:
        return np.diff(np.asarray(self.indptr))

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` of every edge as int64, in CSC order (reads the whole topology)."""
        dst = np.repeat(np.arange(self.indptr.shape[0] - 1, dtype=np.int64), self.in_degrees())
        return np.asarray(self.indices, dtype=np.int64), dst

    @staticmethod
    def from_edges(src, dst, num_src: int, num_dst: int, edge_features=None, deduplicate: bool = False,
                   source: str = "edge list") -> "Relation":
        """The relation with edges ``src[i] -> dst[i]`` (numpy arrays or anything ``np.asarray`` takes).

        Each destination's in-neighbours come in ascending source order; repeated edges are kept (two
        transactions between the same accounts are two edges), unless ``deduplicate`` (the first one's edge
        features are then kept). Float edge features other than float32/float16/bfloat16 become float32.
        Ids out of range raise ``DataError`` naming ``source``. Cost: one int64 sort of the edges (a stable
        lexicographic sort when there are edge features, to carry them along)."""
        src = as_int64(src, source, "edge sources").ravel()
        dst = as_int64(dst, source, "edge destinations").ravel()
        if src.shape != dst.shape:
            raise DataError(f"{source}: {src.shape[0]} edge sources but {dst.shape[0]} destinations; give one "
                            f"of each per edge.")
        for ids, count, end, name in ((src, num_src, "source", "num_src"), (dst, num_dst, "destination", "num_dst")):
            if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
                raise DataError(f"{source}: {name} is {count!r}, expected the number of {end} vertices (a whole "
                                f"number >= 0).")
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= count):
                bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
                raise DataError(f"{source}: {end} id {bad} is out of range for {count} vertices of the "
                                f"{end} type; ids are 0..{count - 1}.")
        features = _edge_feature_rows(edge_features, src.shape[0], source)
        src, dst, features = _csc_order(src, dst, num_src, num_dst, features)
        if deduplicate and src.size:
            keep = np.empty(src.shape[0], dtype=bool)
            keep[0] = True
            keep[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
            if not keep.all():
                src, dst = src[keep], dst[keep]
                features = features[keep] if features is not None else None
        indptr = np.zeros(num_dst + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
        index_dtype = np.int32 if num_src <= _INT32_LIMIT else np.int64
        return Relation(indptr, src.astype(index_dtype, copy=False), features)

    def transpose(self, num_src: int) -> "Relation":
        """The same edges reversed: a CSC over this relation's source type (``num_src`` vertices), edge
        features carried along. Builds in memory (8 bytes an edge a few times over)."""
        src, dst = self.edges()
        features = None if self.edge_features is None else np.asarray(self.edge_features)
        return Relation.from_edges(dst, src, self.indptr.shape[0] - 1, num_src, features,
                                   source="a relation's transpose")


def _edge_feature_rows(edge_features, num_edges: int, source: str) -> np.ndarray | None:
    if edge_features is None:
        return None
    features = np.asarray(edge_features)
    if features.ndim == 1:
        features = features.reshape(-1, 1)  # one weight per edge
    if features.ndim != 2 or features.shape[0] != num_edges:
        raise DataError(f"{source}: edge features of shape {features.shape} for {num_edges} edges; give one "
                        f"row per edge.")
    if features.dtype.name in ("float32", "float16", "bfloat16"):
        return features
    if features.dtype.kind not in "fiub":
        raise DataError(f"{source}: edge features have dtype {features.dtype}, expected real numbers.")
    return features.astype(np.float32)


def _csc_order(src: np.ndarray, dst: np.ndarray, num_src: int, num_dst: int, features: np.ndarray | None):
    """``src``, ``dst`` and ``features`` sorted by destination, then source; repeated pairs keep their order."""
    if features is None and num_src * num_dst < _KEY_LIMIT:
        keys = dst * num_src  # a new array: the caller's dst is not changed
        keys += src
        keys.sort()
        dst = keys // max(num_src, 1)
        keys -= dst * num_src
        return keys, dst, None
    order = np.lexsort((src, dst))
    return src[order], dst[order], (features[order] if features is not None else None)


@dataclass
class TypedGraph(GivenChecked):
    """A node-classification graph with typed vertices and relations.

    ``num_nodes`` lists the vertex types in their fixed order with their counts; ``relations`` maps each
    ``(src_type, name, dst_type)`` to its ``Relation``; ``features`` maps a type to its rows (a type without
    features is absent). ``labels`` has a row per ``target`` vertex (a class id, -1: no label; or a 0/1 row
    of ``num_classes`` tasks, -1: unknown), or is None when the target carries none; the splits hold local
    ids of the target type. ``notes`` and ``metric`` mean what they mean in ``Graph``."""

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

    @classmethod
    def of(cls, graph: Graph) -> "TypedGraph":
        """``graph`` as the typed graph of one vertex type (``VERTEX``) and one relation (``EDGE``), sharing
        its arrays (topology, features, labels, splits: none is copied, a memory map stays mapped). A link
        split is not carried: a typed graph has none."""
        return cls(graph.name, {VERTEX: graph.num_nodes}, {EDGE: Relation(graph.indptr, graph.indices)},
                   {VERTEX: graph.features}, VERTEX, graph.labels, graph.train_idx, graph.val_idx, graph.test_idx,
                   graph.num_classes, list(graph.notes), graph.metric)

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
                     self.train_idx, self.val_idx, self.test_idx, self.num_classes, list(self.notes), self.metric)

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    @property
    def relation_types(self) -> tuple[RelationType, ...]:
        return tuple(self.relations)

    @property
    def num_edges(self) -> int:
        """Edges over all relations (``edge_counts`` has them per relation)."""
        return sum(relation.num_edges for relation in self.relations.values())

    def edge_counts(self) -> dict[RelationType, int]:
        return {key: relation.num_edges for key, relation in self.relations.items()}

    def feature_dim(self, node_type: str) -> int:
        """The feature width of ``node_type``; 0 for a type without features."""
        if node_type not in self.num_nodes:
            raise DataError(f"{self.name}: no vertex type {node_type!r}; the types are {', '.join(self.num_nodes)}.")
        features = self.features.get(node_type)
        return 0 if features is None else int(features.shape[1])

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
        src, name, dst = relation
        candidates = [(dst, REVERSE_PREFIX + name, src)]
        if name.startswith(REVERSE_PREFIX):
            candidates.append((dst, name[len(REVERSE_PREFIX):], src))
        return next((c for c in candidates if c in self.relations), None)

    def with_reverse(self) -> "TypedGraph":
        """A graph (sharing this one's arrays) that also holds ``(dst, rev_NAME, src)`` for every relation
        with no reverse yet (``reverse_of``), each a CSC transpose with the edge features carried along; the
        new relations follow the existing ones, in their order. Relations reached backwards let a message
        flow both ways: papers learn from their authors and authors from their papers."""
        relations = dict(self.relations)
        for key in self.relations:
            if self.reverse_of(key) is None:
                src, name, dst = key
                relations[(dst, REVERSE_PREFIX + name, src)] = self.relations[key].transpose(self.num_nodes[src])
        return replace(self, relations=relations, notes=list(self.notes))

    def describe(self) -> str:
        """A few lines for ``neutronorch info``: the types, the relations and the target."""
        splits = "/".join(f"{len(idx):,}" for idx in (self.train_idx, self.val_idx, self.test_idx))
        lines = [f"{self.name}: {len(self.num_nodes)} vertex types, {len(self.relations)} relations, "
                 f"{self.num_edges:,} edges; target {self.target} ({self.num_classes} classes, split {splits})"]
        width = max((len(t) for t in self.num_nodes), default=0)
        for node_type, count in self.num_nodes.items():
            dim = self.feature_dim(node_type)
            widths = _count(dim, "feature") if dim else "no features"
            lines.append(f"  {node_type:<{width}}  {count:>12,} vertices, {widths}")
        for key, relation in self.relations.items():
            dim = relation.edge_feature_dim
            extra = f", {_count(dim, 'edge feature')}" if dim else ""
            lines.append(f"  {key[0]} -{key[1]}-> {key[2]}: {relation.num_edges:,} edges{extra}")
        return "\n".join(lines)

    def validate(self, source: str | None = None, files: dict[str, str] | None = None, classes: bool = True) -> None:
        """Raise ``DataError`` naming ``source`` (by default the graph's name), the type and the relation if
        anything is inconsistent; return quietly otherwise. ``files`` maps array keys (``node_array``,
        ``relation_array``) to the files they came from, named instead of ``source`` when known.
        ``classes`` is ``Graph.validate``'s: a typed graph without labels (None) passes either way."""
        from neutronorch.data.typed_checks import check_typed_graph  # noqa: PLC0415 - it reads this module

        check_typed_graph(self, source or self.name, files or {})
        self._mark_validated(classes)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
