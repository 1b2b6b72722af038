"""Per-relation uniform neighbour sampling on typed graphs: seeds of the target type (or of several types,
a mapping) in, a ``SampledSubgraph`` out (one ``TypedBlock`` per layer, one ``Block`` per relation).

Each relation draws with the homogeneous kernel (``kernels.sample_neighbors``) through its own CSC and key
(``hop_keys``); which relations draw in a hop, which types a frontier holds and in which order, and the
edge ids and rows the blocks carry are docs/heterogeneous.md, "Sampling". A vertex's neighbours through a
relation in a hop depend on (key, hop, relation, vertex) alone, and a one-relation graph (``TypedGraph.of``
a homogeneous one) is sampled exactly as ``NeighborSampler`` samples it, bit for bit.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping

import numpy as np
import torch

from neutronorch.data.csc import out_degrees
from neutronorch.data.typed import RelationType, TypedGraph, relation_label
from neutronorch.errors import ConfigError, DataError
from neutronorch.jit import read_only
from neutronorch.sampling import kernels
from neutronorch.sampling.block import Block, SampledSubgraph, TypedBlock
from neutronorch.sampling.fanouts import parse_fanouts
from neutronorch.sampling.frontier_map import DenseMap, FrontierMap
from neutronorch.sampling.neighbor_sampler import NeighborSampler, OneThread, layer_key, mix_key

DEFAULT = "default"  # the key of a fanouts dict whose list serves every relation the dict does not name


def relation_key(key: int, hop: int, relation: RelationType) -> int:
    """The key of ``relation``'s draws in hop ``hop`` of the batch of ``key``: ``layer_key(key, hop)`` mixed
    with the CRC-32 of ``"src/name/dst"`` (names hold no ``/``). A stable hash, the same in every process and
    on every machine; Python's ``hash`` of a string is salted per process, so ranks would disagree."""
    return mix_key(layer_key(key, hop), zlib.crc32("/".join(relation).encode()))


def hop_keys(key: int, hop: int, relations) -> dict[RelationType, int]:
    """Each of ``relations``' keys (a graph's, all of them) in hop ``hop`` of the batch of ``key``: its
    ``relation_key``, or ``layer_key(key, hop)`` for a graph's only relation, so that the typed samplers draw
    on a homogeneous graph what the homogeneous ones draw."""
    relations = tuple(relations)
    if len(relations) == 1:
        return {relations[0]: layer_key(key, hop)}
    return {relation: relation_key(key, hop, relation) for relation in relations}


def typed_fanouts(graph: TypedGraph, fanouts) -> dict[RelationType, list[int]]:
    """Every relation's fanouts, seed hop first, in ``graph.relations``' order, from one list for every
    relation or a dict keyed by triples or unique names, ``"default"`` for the relations not named
    (docs/heterogeneous.md, "Sampling"). Without a default every relation must be named, so a relation added
    to the graph is never sampled with a fanout nobody chose. Raises ``ConfigError`` naming the relation."""
    if not graph.relations:
        raise ConfigError(f"{graph.name}: a typed graph without relations has no neighbours to sample.")
    if not isinstance(fanouts, Mapping):
        shared = parse_fanouts(fanouts, whose="every relation", none=True)
        return {relation: list(shared) for relation in graph.relations}
    given: dict[RelationType, list[int]] = {}
    default = None
    for name, value in fanouts.items():
        if name == DEFAULT:
            default = parse_fanouts(value, whose="the default", none=True)
            continue
        try:
            relation = graph.relation(name)
        except DataError as error:
            raise ConfigError(f"`fanouts` key {name!r}: {error}") from None
        if relation in given:
            raise ConfigError(f"`fanouts` names relation {relation_label(relation)} twice; give it one list.")
        given[relation] = parse_fanouts(value, whose=relation_label(relation), none=True)
    missing = [relation for relation in graph.relations if relation not in given]
    if missing and default is None:
        raise ConfigError(f"`fanouts` gives no list for {', '.join(map(relation_label, missing))}; give every "
                          f"relation one, or a {DEFAULT!r} list for those not named.")
    whose = {relation: relation_label(relation) + ("" if relation in given else " (the default)")
             for relation in graph.relations}
    resolved = {relation: list(given.get(relation, default)) for relation in graph.relations}
    first = next(iter(resolved))
    for relation, layers in resolved.items():
        if len(layers) != len(resolved[first]):
            count = f"{len(layers)} layer{'' if len(layers) == 1 else 's'}"
            raise ConfigError(f"`fanouts` gives {whose[relation]} {count} but {whose[first]} "
                              f"{len(resolved[first])}; give every relation one fanout per layer.")
    return resolved


def _edge_id_relations(graph: TypedGraph, edge_ids) -> frozenset[RelationType]:
    """The relations ``TypedNeighborSampler(edge_ids=...)`` records edge positions for."""
    if edge_ids is None:
        return frozenset(r for r, rel in graph.relations.items() if rel.edge_features is not None)
    if isinstance(edge_ids, bool):
        return frozenset(graph.relations) if edge_ids else frozenset()
    if isinstance(edge_ids, str):
        raise ConfigError(f"`edge_ids` {edge_ids!r}: give True, False, None or a collection of relations.")
    try:
        return frozenset(graph.relation(r) for r in edge_ids)
    except DataError as error:
        raise ConfigError(f"`edge_ids`: {error}") from None


class TypedHops:
    """The hops both typed samplers run (``TypedNeighborSampler`` on the host, ``TypedDeviceSampler`` on the
    training device), with ``TypedNeighborSampler``'s arguments: per hop, the draws of every relation whose
    destination type has destinations (``hop_keys``), each source type's draws relabelled into its
    frontier, one ``TypedBlock``. A sampler implements ``_ids``, ``_draw``, ``_relabel`` and ``_edge_rows``
    (``_enter`` and ``_leave`` where it keeps state per call)."""

    def __init__(self, graph: TypedGraph, fanouts, degrees: bool = False, edge_ids=None,
                 edge_features: bool = True):
        self.graph = graph
        self.num_nodes, self.target = graph.num_nodes, graph.target
        self.fanouts = typed_fanouts(graph, fanouts)
        self.num_layers = len(next(iter(self.fanouts.values())))
        self.degrees = degrees
        self.edge_ids = _edge_id_relations(graph, edge_ids)
        check_edge_features(graph, self.edge_ids)
        self.edge_features = edge_features and any(graph.relations[r].edge_features is not None
                                                    for r in self.edge_ids)
        self._out_degrees = {r: torch.from_numpy(out_degrees(rel.indices, self.num_nodes[r[0]])).float()
                             for r, rel in graph.relations.items() if degrees}

    def sample(self, seeds, key: int) -> SampledSubgraph:
        """Sample the typed computation graph of ``seeds`` (unique local ids of the target type, or a mapping
        from types to theirs: a typed link task's two end types) with the batch key ``key``: ``num_layers``
        blocks, bottom layer first."""
        return self.sample_hops(seeds, key, self.num_layers)

    def sample_many(self, seeds: list, keys: list[int]) -> list[SampledSubgraph]:
        """``sample`` of several mini-batches (``seeds[i]`` with ``keys[i]``), as the device sampler takes them."""
        return [self.sample(s, key) for s, key in zip(seeds, keys)]

    def sample_hops(self, seeds, key: int, hops: int) -> SampledSubgraph:
        """The top ``hops`` layers of ``sample(seeds, key)``, exactly as it draws them: ``frontiers[0]`` then
        holds the destinations of the layer below (with ``hops = num_layers - 1``, the bottom layer's
        destinations per type, which NeutronOrch plans its hot sets among)."""
        typed = seeds if isinstance(seeds, Mapping) else {self.target: seeds}
        start = {t: self._ids(typed[t]) for t in self.num_nodes if t in typed}
        blocks, frontiers = self._hops(start, key, 0, hops)
        ids = list(start.values())  # the subgraph's seeds: every type's, in the graph's type order
        return SampledSubgraph(ids[0] if len(ids) == 1 else torch.cat(ids), blocks, frontiers)

    def sample_bottom(self, destinations: Mapping, key: int) -> TypedBlock:
        """The bottom layer's block of ``destinations`` (unique local ids per type) with the batch key ``key``:
        each destination draws, through each relation, exactly the neighbours ``sample`` draws for it in that
        hop (draws are keyed by vertex), its source frontier leading with the destinations in the order given."""
        blocks, _ = self._hops({t: self._ids(ids) for t, ids in destinations.items()}, key, self.num_layers - 1, 1)
        return blocks[0]

    def _hops(self, start: dict[str, torch.Tensor], key: int, first_hop: int, hops: int
              ) -> tuple[list[TypedBlock], list[dict[str, torch.Tensor]]]:
        """Hops ``first_hop`` to ``first_hop + hops - 1`` from the destinations ``start`` (per type): the blocks
        and frontiers, bottom first (``frontiers[-1]`` is ``start``)."""
        frontier = {t: start[t] for t in self.num_nodes if t in start}
        blocks: list[TypedBlock] = []
        frontiers = [dict(frontier)]
        self._enter(frontier)
        try:
            for hop in range(first_hop, first_hop + hops):
                num_dst = {t: int(ids.shape[0]) for t, ids in frontier.items()}
                keys = hop_keys(key, hop, self.fanouts)
                drawn = self._draw({r: (frontier[r[2]], fanouts[hop], keys[r]) for r, fanouts in self.fanouts.items()
                                    if num_dst.get(r[2], 0)})
                feeds: dict[str, list[RelationType]] = {}  # each source type's relations, in order
                for relation in drawn:
                    feeds.setdefault(relation[0], []).append(relation)
                positions = self._relabel({t: [drawn[r][1] for r in feed] for t, feed in feeds.items()}, frontier)
                local = {r: part for t, feed in feeds.items() for r, part in zip(feed, positions[t])}
                blocks.append(self._typed_block(num_dst, drawn, local, frontier))
                frontiers.append(dict(blocks[-1].src_ids))
        finally:
            self._leave(frontier)
        blocks.reverse()
        frontiers.reverse()
        return blocks, frontiers

    def _typed_block(self, num_dst: dict[str, int], drawn, local, frontier: dict[str, torch.Tensor]) -> TypedBlock:
        types = [t for t in self.num_nodes if t in frontier]
        blocks = {r: Block(num_dst[r[2]], int(frontier[r[0]].shape[0]), ptr, local[r],
                           src_degree=self._out_degrees[r].index_select(0, frontier[r[0]]) if self.degrees else None)
                  for r, (ptr, *_) in drawn.items()}
        edge_ids = {r: d[2] for r, d in drawn.items() if len(d) == 3}
        return TypedBlock({t: num_dst[t] for t in types if t in num_dst},
                          {t: int(frontier[t].shape[0]) for t in types}, blocks, {t: frontier[t] for t in types},
                          edge_ids, self._edge_rows(edge_ids) if self.edge_features else {})

    def _enter(self, frontier: dict[str, torch.Tensor]) -> None:
        """Before the first hop from ``frontier``."""

    def _leave(self, frontier: dict[str, torch.Tensor]) -> None:
        """After the last hop (or a failed one), ``frontier`` the last reached."""


class HostFrontiers(OneThread):
    """The host side of a typed sampler's frontiers, shared by ``TypedNeighborSampler`` and the sampler of a
    typed graph's parts (``partitioned_typed.py``): ids as int64 tensors, a vertex -> position map per type
    (made by ``_make_maps``: a ``DenseMap`` of 8 bytes a vertex, or with ``sized_to_frontier`` a ``FrontierMap``),
    each source type's draws relabelled into its frontier. Not thread-safe: one thread at a time."""

    def _make_maps(self, num_nodes: dict[str, int], sized_to_frontier: bool = False) -> None:
        self._maps = {t: FrontierMap() if sized_to_frontier else DenseMap(n) for t, n in num_nodes.items()}

    def _ids(self, ids) -> torch.Tensor:
        return torch.from_numpy(NeighborSampler._ids(ids))

    def _enter(self, frontier: dict[str, torch.Tensor]) -> None:
        self._check_thread()
        for t, ids in frontier.items():
            self._maps[t].start(ids.numpy())

    def _leave(self, frontier: dict[str, torch.Tensor]) -> None:
        for t, ids in frontier.items():  # exactly the frontiers' vertices are in the maps
            self._maps[t].clear(ids.numpy())

    def _relabel(self, parts: dict[str, list[torch.Tensor]], frontier: dict[str, torch.Tensor]
                 ) -> dict[str, list[torch.Tensor]]:
        """Per source type, its relations' sampled sources as positions in its frontier, which grows (in
        ``frontier``) by the new ones in first-appearance order over the relations in order."""
        local = {}
        for node_type, nbrs in parts.items():
            ids = frontier[node_type].numpy() if node_type in frontier else np.empty(0, np.int64)
            positions, grown = self._maps[node_type].relabel(ids, [n.numpy() for n in nbrs])
            local[node_type], frontier[node_type] = list(map(torch.from_numpy, positions)), torch.from_numpy(grown)
        return local


class TypedNeighborSampler(HostFrontiers, TypedHops):
    """Host sampler over a typed graph's relations (numpy arrays or memory maps); ``fanouts`` as
    ``typed_fanouts`` reads them, resolved per relation in ``self.fanouts``. Each type's ids are in
    ``TypedBlock.src_ids``, the relation blocks' ``src_ids`` None. ``degrees``: each relation block carries
    its source rows' out-degrees through the relation (float32). ``edge_ids`` (None: the relations with edge
    features) and ``edge_features``: docs/heterogeneous.md, "Sampling"; edge features not one row per edge
    raise ``DataError`` naming the relation.

    Not thread-safe: one instance per sampling thread (a vertex -> position map per type, 8 bytes a vertex).
    """

    def __init__(self, graph: TypedGraph, fanouts, degrees: bool = False, edge_ids=None,
                 edge_features: bool = True):
        super().__init__(graph, fanouts, degrees, edge_ids, edge_features)
        self._make_maps(graph.num_nodes)

    def _draw(self, calls: dict[RelationType, tuple]) -> dict[RelationType, tuple[torch.Tensor, ...]]:
        """Each relation's (ptr, sampled source ids[, edge positions]) for its ``(destinations, fanout, key)``;
        the edge positions for the relations in ``self.edge_ids``."""
        drawn = {}
        for relation, (dst, fanout, key) in calls.items():
            csc = self.graph.relations[relation]
            kernel = kernels.sample_neighbor_edges if relation in self.edge_ids else kernels.sample_neighbors
            out = kernel(read_only(csc.indptr), read_only(csc.indices), dst.numpy(), fanout, np.uint64(key),
                         kernels.NO_ORDER)
            drawn[relation] = tuple(map(torch.from_numpy, out))
        return drawn

    def _edge_rows(self, edge_ids: dict[RelationType, torch.Tensor]) -> dict[RelationType, torch.Tensor]:
        return edge_rows(self.graph, edge_ids)


def edge_rows(graph: TypedGraph, edge_ids: dict) -> dict[RelationType, torch.Tensor]:
    """The rows (edges x width, float32) of each relation of ``edge_ids`` that has edge features at its edge
    ids (int64 on the CPU), read by the gather feature rows go through (``kernels.gather_stored``: a memory
    map at those rows only)."""
    rows = {}
    for relation, ids in edge_ids.items():
        source = graph.relations[relation].edge_features
        if source is not None:
            rows[relation] = torch.empty((ids.shape[0], source.shape[1]), dtype=torch.float32)
            kernels.gather_stored(source, ids.numpy(), kernels.NO_ORDER, rows[relation])
    return rows


def check_edge_features(graph: TypedGraph, relations: Iterable[RelationType]) -> None:
    """Raise ``DataError`` naming the relation when one of ``relations`` has edge features that are not one
    row per edge (``edges x width``): a gather at the edges' ids would read past them."""
    for relation in relations:
        csc = graph.relations[relation]
        source = csc.edge_features
        if source is not None and (source.ndim != 2 or source.shape[0] != csc.num_edges):
            raise DataError(f"{graph.name}: relation {relation_label(relation)} has edge features of shape "
                            f"{tuple(source.shape)} for {csc.num_edges} edges; give one row (edges x width) "
                            f"per edge.")


def gather_edge_features(graph: TypedGraph, blocks: Iterable[TypedBlock],
                         device: torch.device | str = "cpu") -> None:
    """Set each typed block's ``edge_features[r]`` to relation ``r``'s edge feature rows at the block's
    ``edge_ids[r]`` (float32, on ``device``), for every relation with edge features whose edge ids the
    block holds (checked by ``check_edge_features``)."""
    for tblock in blocks:
        check_edge_features(graph, tblock.edge_ids)
        rows = edge_rows(graph, {r: ids.cpu() for r, ids in tblock.edge_ids.items()})
        tblock.edge_features.update({r: part.to(device) for r, part in rows.items()})
