"""One part of a partitioned typed graph (docs/distributed.md, "Typed graphs on parts"): every vertex of every
type has one owner part, and a part holds, per type, its owned vertices (ascending ids of their type, local
index i is ``ids[t][i]``) and their feature rows, and per relation the in-edges of its owned destinations as a
CSC over their local rows whose ``indices`` are source ids of the whole graph (of the source type), each
destination's in-edges in the whole graph's order, so that a draw keyed by the vertex draws what the whole
graph's sampler draws. A homogeneous graph's part (``partition_files.Partition``) is the case of one type and
one relation; ``TypedPartition.view(t)`` is one type's ``OwnedRows``, what ``RemoteRows`` fetches from.

``split_typed`` cuts a ``TypedGraph`` into its parts in memory (the writer, ``partition_typed.py``, writes them
as files; tests build parts with it). Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from neutronorch.data.checks import SPLITS
from neutronorch.data.links import LinkSplit
from neutronorch.data.relation import Relation, RelationType
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import DataError


@dataclass
class OwnedRows:
    """One kind of vertices of a part, what fetching rows from their owners reads (``RemoteRows``): each
    vertex's owner (``part_of``) and row in its owner's arrays (``local_index``), and this part's rows of them,
    ``features`` and ``labels`` (zero-width where there are none). A homogeneous part (``partition_files.
    Partition``) is one; a typed part's type is another (``TypedPartition.view``, ``node_type`` naming it)."""

    part: int
    parts: int
    part_of: np.ndarray
    local_index: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    node_type: str | None = None

    @property
    def num_nodes(self) -> int:
        """The vertices of the whole graph (of the type)."""
        return int(self.part_of.shape[0])

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.part_of[np.asarray(ids)])

    def local(self, ids: np.ndarray) -> np.ndarray:
        """The local index of each of ``ids``, which this part must own."""
        ids = np.asarray(ids)
        if (self.part_of[ids] != self.part).any():
            kind = f"{self.node_type} " if self.node_type else ""
            raise DataError(f"part {self.part}: asked for the local index of {kind}vertices another part owns.")
        return np.asarray(self.local_index[ids], dtype=np.int64)


@dataclass
class TypedPartition:
    """Part ``part`` of ``parts`` of a typed graph (see the module's docstring). ``num_nodes``: the whole
    graph's vertices per type, in its type order; ``relations``: each relation's in-edges into this part's
    owned destinations (``Relation``: rows are local, ``indices`` whole-graph source ids); ``features``: per
    featured type its owned rows; ``labels``: the target's owned rows; ``splits``: the target's owned split
    ids (whole-graph ids, in the split's order); ``global_splits``: the whole split; ``feature_dims``: every
    type's width (0: featureless). ``manifest``: the partition folder's (empty for parts made in memory)."""

    part: int
    parts: int
    name: str
    num_nodes: dict[str, int]
    target: str
    part_of: dict[str, np.ndarray]
    local_index: dict[str, np.ndarray]
    ids: dict[str, np.ndarray]
    relations: dict[RelationType, Relation]
    features: dict[str, np.ndarray]
    feature_dims: dict[str, int]
    labels: np.ndarray
    splits: dict[str, np.ndarray]
    global_splits: dict[str, np.ndarray]
    num_classes: int
    metric: str | None = None
    notes: list[str] = field(default_factory=list)
    manifest: dict = field(default_factory=dict)
    links: LinkSplit | None = None  # a link task's split of one relation, whole (``partition_typed_links.py``)

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    def local(self, node_type: str, ids: np.ndarray) -> np.ndarray:
        return self.view(node_type).local(ids)

    def view(self, node_type: str) -> OwnedRows:
        """``node_type``'s vertices of this part (``OwnedRows``), as a homogeneous part's are."""
        owned = self.ids[node_type].shape[0]
        features = self.features.get(node_type)
        if features is None:
            features = np.zeros((owned, 0), np.float32)
        labels = self.labels if node_type == self.target else np.zeros((owned, 0), np.int64)
        return OwnedRows(self.part, self.parts, self.part_of[node_type], self.local_index[node_type], features,
                        labels, node_type)


def local_indices(part_of: np.ndarray, parts: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each vertex's index among its owner's (int32 where that fits), and each part's vertices ascending."""
    counts = np.bincount(part_of, minlength=parts)
    local = np.empty(part_of.shape[0], dtype=np.int32 if counts.max(initial=0) < 2**31 else np.int64)
    order = np.argsort(part_of, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    owned = [order[starts[k]:starts[k + 1]].astype(np.int64) for k in range(parts)]
    for ids in owned:
        local[ids] = np.arange(ids.shape[0], dtype=local.dtype)
    return local, owned


def owned_in_edges(relation: Relation, ids: np.ndarray) -> Relation:
    """The in-edges of the destinations ``ids`` (ascending) as a CSC over them, in the whole graph's order."""
    indptr = np.asarray(relation.indptr)
    degrees = np.diff(indptr)[ids]
    own = np.zeros(ids.shape[0] + 1, dtype=np.int64)
    np.cumsum(degrees, out=own[1:])
    starts = indptr[ids]
    positions = np.repeat(starts - own[:-1], degrees) + np.arange(own[-1], dtype=np.int64)
    return Relation(own, np.asarray(relation.indices)[positions])


def check_partitionable(graph: TypedGraph, spec: str) -> None:
    """A typed graph this project can cut into parts: a graph without times or edge features, with its target's
    labels, and a link split, if any, of one relation (``link_task.split_typed_relation``'s)."""
    why = ("it has edge or vertex times (a part does not carry times yet; training on parts without them would "
           "sample the future, docs/temporal.md)" if graph.temporal else
           "its target has no labels (a typed graph's parts hold them)" if graph.labels is None else
           "it carries a link split of its own (a typed graph's parts carry the split of one relation that "
           "`--split edges:T,V --link-relation REL` makes)" if graph.links is not None and (
               graph.links.ends is None or graph.links.timed) else None)
    edge = [r for r, rel in graph.relations.items() if rel.edge_features is not None]
    if why is None and edge:
        why = f"relation {'/'.join(edge[0])} has edge features (a part does not carry them yet)"
    if why:
        raise DataError(f"{spec}: cannot be partitioned: {why}. Partition the graph without them.")


def split_typed(graph: TypedGraph, owners: dict[str, np.ndarray], parts: int) -> list[TypedPartition]:
    """``graph`` cut into ``parts`` by ``owners`` (the owner part of every vertex, per type), in memory: every
    part's ``TypedPartition``. The relations are ``graph``'s as given (a run trains with the reverses:
    partition ``graph.with_reverse()``)."""
    check_partitionable(graph, graph.name)
    for t, n in graph.num_nodes.items():
        if t not in owners or owners[t].shape != (n,):
            raise DataError(f"{graph.name}: the owners of type {t} must be one part per vertex ({n:,}).")
    local, owned = {}, {}
    for t in graph.num_nodes:
        local[t], owned[t] = local_indices(np.asarray(owners[t], dtype=np.int32), parts)
    target = graph.target
    out = []
    for k in range(parts):
        ids = {t: owned[t][k] for t in graph.num_nodes}
        split_of = {s: np.asarray(getattr(graph, s), dtype=np.int64) for s in SPLITS}
        out.append(TypedPartition(
            part=k, parts=parts, name=graph.name, num_nodes=dict(graph.num_nodes), target=target,
            part_of={t: np.asarray(owners[t], dtype=np.int32) for t in graph.num_nodes}, local_index=local, ids=ids,
            relations={r: owned_in_edges(rel, ids[r[2]]) for r, rel in graph.relations.items()},
            features={t: np.asarray(rows[ids[t]]) for t, rows in graph.features.items()},
            feature_dims={t: graph.feature_dim(t) for t in graph.num_nodes},
            labels=np.asarray(graph.labels[ids[target]]),
            splits={s: v[owners[target][v] == k] for s, v in split_of.items()}, global_splits=split_of,
            num_classes=int(graph.num_classes), metric=graph.metric, notes=list(graph.notes), links=graph.links))
    return out
