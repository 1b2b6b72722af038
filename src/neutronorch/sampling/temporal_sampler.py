"""Time-respecting neighbour sampling on the host (docs/temporal.md): each seed carries a time, every entry
sampled under it inherits that time, and a hop draws only edges whose time is at most the entry's (below it
with ``strict``), uniformly (``uniform``) or the newest (``last``).

``TemporalNeighborSampler`` (a homogeneous graph's CSC with edge times) and ``TemporalTypedSampler`` (a typed
graph, each timed relation through the same kernel, ``temporal_kernels.sample_temporal``) give blocks whose
source frontiers are (vertex, time) entries: ``Block.src_ids`` may repeat a vertex at different times,
``Block.src_time`` says each entry's time and ``Block.edge_ids`` each edge's position in the CSC. Draws are
keyed by (layer key, vertex) over the entry's valid prefix: the same key gives the same sample whatever the
batch, the thread count or the rank. Entries are relabelled through the plain sampler's vertex map when a
batch has one seed time, else through a hash table of (vertex, time) pairs.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from neutronorch.data.times import time_array
from neutronorch.data.typed import RelationType, TypedGraph, relation_label
from neutronorch.errors import ConfigError, DataError
from neutronorch.jit import read_only
from neutronorch.sampling import kernels, temporal_kernels as tk
from neutronorch.sampling.block import Block, SampledSubgraph, TypedBlock
from neutronorch.sampling.fanouts import parse_fanouts
from neutronorch.sampling.neighbor_sampler import NeighborSampler, OneThread, layer_key, relabel_into
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

STRATEGIES = ("uniform", "last")  # PyG's temporal_strategy values
# What a typed temporal sampler (host or device) refuses: batches without times, and NeutronOrch's bottom hop.
UNTIMED = "temporal sampling: sample each batch with sample(seeds, seed_time, key)."
NO_BOTTOM = ("temporal sampling: not yet in NeutronOrch mode (a hot vertex's bottom-layer output holds for one time "
             "only; docs/temporal.md).")


def check_strategy(strategy) -> bool:
    """Whether ``strategy`` (PyG's ``temporal_strategy``) takes the newest edges; ``ConfigError`` unless one of
    ``STRATEGIES``."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"`temporal_strategy` {strategy!r}: give 'uniform' (a uniform draw among the edges "
                          f"before the seed's time) or 'last' (the newest of them).")
    return strategy == "last"


def seed_times(seed_time, count: int, dtype: np.dtype, what: str = "seed times", source: str = "sampler"
               ) -> np.ndarray:
    """``seed_time`` (one per seed) in the edge times' ``dtype``. Integer edge times take whole-number seed
    times only (a fraction would be cut one way or the other unsaid)."""
    times = time_array(seed_time, count, what, source)
    if np.dtype(dtype).kind == "i" and times.dtype.kind == "f":
        if not np.array_equal(times, np.floor(times)) or np.abs(times).max(initial=0) >= 2.0 ** 63:
            raise DataError(f"{source}: {what} hold fractions, but the graph's edge times are whole numbers; give "
                            f"whole-number seed times (floor them for edges at or before, ceil them for strict).")
    return times.astype(dtype, copy=False)


def seed_cuts(seed_time, count: int, dtype: np.dtype, what: str = "seed times") -> tuple[np.ndarray, np.ndarray]:
    """The batch's distinct seed times (ascending, in ``seed_times``' dtype) and each seed's rank among them."""
    cuts, ranks = np.unique(seed_times(seed_time, count, dtype, what), return_inverse=True)
    return cuts, ranks.astype(np.int64).reshape(-1)


def check_entries(ids: np.ndarray, ranks: np.ndarray, what: str) -> None:
    """Each (vertex, time) seed entry once."""
    keys = ids * max(int(ranks.max(initial=0)) + 1, 1) + ranks
    unique, counts = np.unique(keys, return_counts=True)
    if unique.shape[0] != keys.shape[0]:
        first = int(np.flatnonzero(keys == unique[counts > 1][0])[0])
        raise ConfigError(f"sampler: {what} holds vertex {int(ids[first])} twice at one time; each (vertex, time) "
                          f"pair may be a seed once (deduplicate the pairs).")


def time_dtype(graph: TypedGraph) -> np.dtype:
    """The one dtype of a typed graph's timed relations' edge times; ``DataError`` without any, or with two."""
    timed = {r: rel.edge_time.dtype for r, rel in graph.relations.items() if rel.edge_time is not None}
    if not timed:
        raise DataError(f"{graph.name}: no relation has edge times, so a temporal sampler has nothing to cut; "
                        f"give the relations edge_time (docs/temporal.md).")
    if len(set(timed.values())) > 1:
        raise DataError(f"{graph.name}: the relations' edge times mix dtypes ("
                        f"{', '.join(f'{relation_label(r)} {d}' for r, d in timed.items())}); store them all "
                        f"as int64 or all as float64.")
    return next(iter(timed.values()))


def typed_entries(sampler, seeds, seed_time) -> tuple[dict, np.ndarray, dict[str, np.ndarray]]:
    """A typed temporal sampler's seed entries: ``seeds`` (ids of ``sampler``'s target type, or a mapping from
    types to theirs) at ``seed_time`` (one per seed; a mapping when ``seeds`` is) as the ids per type (in the
    graph's type order, ``sampler._ids``), the batch's distinct times and each type's seeds' ranks among them;
    each (vertex, time) entry once."""
    typed = seeds if isinstance(seeds, Mapping) else {sampler.target: seeds}
    times = seed_time if isinstance(seed_time, Mapping) else {sampler.target: seed_time}
    if set(times) != set(typed):
        raise ConfigError(f"sampler: `seed_time` gives times of {sorted(times)} but `seeds` vertices of "
                          f"{sorted(typed)}; give one time per seed of each type.")
    order = [t for t in sampler.num_nodes if t in typed]
    ids = {t: sampler._ids(typed[t]) for t in order}
    host = [(times[t].cpu().numpy() if isinstance(times[t], torch.Tensor) else np.asarray(times[t])).reshape(-1)
            for t in order]
    cuts, ranks = seed_cuts(np.concatenate(host or [[]]), sum(ids[t].shape[0] for t in order), sampler.dtype)
    offsets = np.cumsum([0] + [ids[t].shape[0] for t in order])
    ranks = {t: ranks[offsets[i]:offsets[i + 1]] for i, t in enumerate(order)}
    for t in order:
        check_entries(np.asarray(ids[t].cpu()), ranks[t], f"`seeds` of type {t}")
    return ids, cuts, ranks


class TimedFrontier:
    """A hop's relabel of (vertex, rank) entries: through ``node_map`` (the plain sampler's) when the batch
    has one time, else through a fresh hash table."""

    def __init__(self, node_map: np.ndarray, one_time: bool):
        self.node_map, self.one_time = node_map, one_time

    def grow(self, ids: np.ndarray, ranks: np.ndarray, parts: list[tuple]) -> tuple[list, np.ndarray, np.ndarray]:
        """Each part ``(ptr, dst_rank, nbrs)`` as local ids in the frontier (``ids``, ``ranks``) grown by its new
        entries in first-appearance order over the parts; that frontier."""
        if self.one_time:
            local, grown = relabel_into(ids, [nbrs for _, _, nbrs in parts], self.node_map)
            return local, grown, np.zeros(grown.shape[0], np.int64)
        size = ids.shape[0]
        room = size + sum(nbrs.shape[0] for _, _, nbrs in parts)
        new_ids, new_ranks = np.empty(room, np.int64), np.empty(room, np.int64)
        new_ids[:size], new_ranks[:size] = ids, ranks
        table = tk.new_table(room)
        tk.enter(table, new_ids, new_ranks, size)
        local = []
        for ptr, dst_rank, nbrs in parts:
            positions, size = tk.relabel_timed(table, new_ids, new_ranks, size, ptr, dst_rank, nbrs)
            local.append(positions)
        return local, new_ids[:size], new_ranks[:size]


class TemporalNeighborSampler(OneThread):
    """Host temporal sampler over a CSC graph with ``edge_time`` (each vertex's in-edges ascending by time, as
    ``Graph`` keeps them). ``temporal_strategy``: ``uniform`` or ``last``; ``strict``: edges strictly before
    the seed's time. Not thread-safe: one instance per sampling thread (it owns a vertex -> position map)."""

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, edge_time: np.ndarray, fanouts,
                 temporal_strategy: str = "uniform", strict: bool = False):
        if edge_time is None or edge_time.shape[0] != indices.shape[0]:
            raise DataError("TemporalNeighborSampler: the graph has no edge times (one per edge, CSC order); give a "
                            "graph built with edge_time (docs/temporal.md).")
        self.indptr, self.indices, self.edge_time = read_only(indptr), read_only(indices), read_only(edge_time)
        self.fanouts = parse_fanouts(fanouts)
        self.last, self.strict = check_strategy(temporal_strategy), bool(strict)
        self._node_map = np.full(indptr.shape[0] - 1, -1, dtype=np.int64)

    def sample(self, seeds, seed_time, key: int, fanouts: list[int] | None = None) -> SampledSubgraph:
        """The temporal computation graph of ``seeds`` (global ids, each (vertex, time) pair once) at
        ``seed_time`` (one time per seed), fanouts seed hop first; blocks bottom first, each with
        ``src_time`` and ``edge_ids``."""
        self._check_thread()
        ids = NeighborSampler._ids(seeds)
        cuts, ranks = seed_cuts(seed_time, ids.shape[0], self.edge_time.dtype)
        check_entries(ids, ranks, "`seeds`")
        relabel = TimedFrontier(self._node_map, cuts.shape[0] == 1)
        if relabel.one_time:
            kernels.map_nodes(ids, self._node_map)
        frontier, blocks, frontiers = ids, [], [torch.from_numpy(ids)]
        try:
            for hop, fanout in enumerate(self.fanouts if fanouts is None else fanouts):
                ptr, nbrs, edges = tk.sample_temporal(self.indptr, self.indices, self.edge_time, frontier, ranks,
                                                      cuts, fanout, np.uint64(layer_key(key, hop)), self.strict,
                                                      self.last)
                num_dst = frontier.shape[0]
                (local,), frontier, ranks = relabel.grow(frontier, ranks, [(ptr, ranks, nbrs)])
                frontiers.append(torch.from_numpy(frontier))
                blocks.append(Block(num_dst, frontier.shape[0], torch.from_numpy(ptr), torch.from_numpy(local),
                                    src_ids=frontiers[-1], src_time=torch.from_numpy(cuts[ranks]),
                                    edge_ids=torch.from_numpy(edges)))
        finally:
            if relabel.one_time:
                kernels.reset_map(frontier, self._node_map)
        return SampledSubgraph(frontiers[0], blocks[::-1], frontiers[::-1])


class TemporalTypedSampler(TypedNeighborSampler):
    """``TemporalNeighborSampler`` on a typed graph: ``TypedNeighborSampler``'s hops and arguments, each
    relation with edge times drawn through the temporal kernel, a relation without them (a static one)
    through the plain one (every edge always valid). Every typed block carries ``edge_ids`` of every
    relation and ``src_time`` of every type. The timed relations share one time dtype."""

    def __init__(self, graph: TypedGraph, fanouts, temporal_strategy: str = "uniform", strict: bool = False,
                 edge_features: bool = True):
        super().__init__(graph, fanouts, edge_ids=True, edge_features=edge_features)
        self.dtype = time_dtype(graph)
        self.last, self.strict = check_strategy(temporal_strategy), bool(strict)
        self._cuts, self._ranks, self._relabel_by = np.empty(0), {}, None
        self._parts: dict[RelationType, tuple] = {}

    def sample(self, seeds, seed_time, key: int) -> SampledSubgraph:
        """The temporal computation graph of ``seeds`` (ids of the target type, or a mapping from types to
        theirs) at ``seed_time`` (one time per seed; a mapping when ``seeds`` is)."""
        ids, self._cuts, self._ranks = typed_entries(self, seeds, seed_time)
        self._relabel_by = {t: TimedFrontier(self._maps[t].node_map, self._cuts.shape[0] == 1) for t in self.num_nodes}
        return self.sample_hops(ids, key, self.num_layers)

    def sample_many(self, seeds: list, keys: list[int]) -> list[SampledSubgraph]:
        raise ConfigError(UNTIMED)

    def sample_bottom(self, destinations: Mapping, key: int) -> TypedBlock:
        raise ConfigError(NO_BOTTOM)

    def _enter(self, frontier: dict[str, torch.Tensor]) -> None:
        self._check_thread()
        if self._cuts.shape[0] == 1:
            super()._enter(frontier)

    def _leave(self, frontier: dict[str, torch.Tensor]) -> None:
        if self._cuts.shape[0] == 1:
            super()._leave(frontier)

    def _draw(self, calls: dict[RelationType, tuple]) -> dict[RelationType, tuple[torch.Tensor, ...]]:
        drawn, self._parts = {}, {}
        for relation, (dst, fanout, key) in calls.items():
            csc, ranks = self.graph.relations[relation], self._ranks[relation[2]]
            indptr, indices = read_only(csc.indptr), read_only(csc.indices)
            if csc.edge_time is None:
                out = kernels.sample_neighbor_edges(indptr, indices, dst.numpy(), fanout, np.uint64(key),
                                                    kernels.NO_ORDER)
            else:
                out = tk.sample_temporal(indptr, indices, read_only(csc.edge_time), dst.numpy(), ranks, self._cuts,
                                         fanout, np.uint64(key), self.strict, self.last)
            self._parts[relation] = (out[0], ranks, out[1])
            drawn[relation] = tuple(map(torch.from_numpy, out))
        return drawn

    def _relabel(self, parts: dict[str, list[torch.Tensor]], frontier: dict[str, torch.Tensor]
                 ) -> dict[str, list[torch.Tensor]]:
        """``TypedNeighborSampler._relabel`` of (vertex, time) entries: the relations feeding each source type
        in the order ``_hops`` lists them (the draws' order)."""
        local = {}
        for node_type in parts:
            feed = [self._parts[r] for r in self._parts if r[0] == node_type]
            ids = frontier[node_type].numpy() if node_type in frontier else np.empty(0, np.int64)
            ranks = self._ranks.get(node_type, np.empty(0, np.int64))
            positions, grown, self._ranks[node_type] = self._relabel_by[node_type].grow(ids, ranks, feed)
            local[node_type], frontier[node_type] = list(map(torch.from_numpy, positions)), torch.from_numpy(grown)
        return local

    def _typed_block(self, num_dst, drawn, local, frontier) -> TypedBlock:
        tblock = super()._typed_block(num_dst, drawn, local, frontier)
        tblock.src_time = {t: torch.from_numpy(self._cuts[self._ranks[t]]) for t in tblock.src_ids}
        return tblock

