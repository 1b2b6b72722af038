"""``TemporalNeighborSampler``'s contract in torch ops, on the device holding the topology and edge times
(docs/temporal.md, "A temporal hop"): the same blocks, bit for bit. Each entry's valid prefix is found by a
binary search run for every entry at once (one round per bit of the largest in-degree), its draw is the
plain device sampler's keyed Floyd draw over the prefix (``TorchNeighborSampler._floyd``, which equals the
host's), and (vertex, time) entries are relabelled by sorting their keys, first appearances first.

``TypedTemporalDeviceSampler`` is ``TemporalTypedSampler``'s twin: each timed relation drawn by its own
``TorchTemporalSampler``, each static one by the typed device sampler's plain draw, entries relabelled per
source type with ``relabel_pairs``; the same blocks, bit for bit. Device mode samples either kind of graph by
time with them (``orchestration/temporal.py``'s ``device_sampler``)."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph, relation_label
from neutronorch.errors import ConfigError, DataError
from neutronorch.sampling.block import Block, SampledSubgraph, TypedBlock
from neutronorch.sampling.fanouts import parse_fanouts
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, drawn_slots, layer_key, together
from neutronorch.sampling.temporal_sampler import (NO_BOTTOM, UNTIMED, check_entries, check_strategy, seed_cuts,
                                                   time_dtype, typed_entries)
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler, as_tensor


class TorchTemporalSampler:
    """Temporal sampling of a CSC graph with ``edge_time`` (torch tensors on one device, each column ascending
    by time), ``temporal_strategy`` uniform or last, ``strict`` edges before the time only."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, edge_time: torch.Tensor, fanouts,
                 temporal_strategy: str = "uniform", strict: bool = False):
        if edge_time is None or edge_time.shape[0] != indices.shape[0]:
            raise DataError("TorchTemporalSampler: the graph has no edge times (one per edge, CSC order); give a "
                            "graph built with edge_time (docs/temporal.md).")
        self.draws = TorchNeighborSampler(indptr, indices, parse_fanouts(fanouts))  # its keyed Floyd draw
        self.indptr, self.indices, self.edge_time = self.draws.indptr, indices, edge_time
        self.fanouts, self.device = self.draws.fanouts, indptr.device
        self.last, self.strict = check_strategy(temporal_strategy), bool(strict)
        degrees = self.indptr[1:] - self.indptr[:-1]
        self.rounds = int(degrees.max()).bit_length() + 1 if degrees.numel() else 1  # of the binary search

    def sample(self, seeds, seed_time, key: int, fanouts: list[int] | None = None) -> SampledSubgraph:
        """As ``TemporalNeighborSampler.sample``: blocks bottom first, each with ``src_time`` and ``edge_ids``."""
        ids = torch.as_tensor(seeds).to(self.device, torch.int64)
        times = seed_time.cpu().numpy() if isinstance(seed_time, torch.Tensor) else seed_time
        cuts, ranks = seed_cuts(times, ids.shape[0], np.dtype(str(self.edge_time.dtype).split(".")[-1]))
        check_entries(ids.cpu().numpy(), ranks, "`seeds`")
        cuts, ranks = torch.from_numpy(cuts).to(self.device), torch.from_numpy(ranks).to(self.device)
        frontiers, blocks = [ids], []
        for hop, fanout in enumerate(self.fanouts if fanouts is None else fanouts):
            ptr, nbrs, edges = self._draw(ids, cuts[ranks], fanout, layer_key(key, hop))
            row = torch.repeat_interleave(torch.arange(ids.shape[0], device=self.device), ptr[1:] - ptr[:-1],
                                          output_size=nbrs.shape[0])
            local, ids, ranks = relabel_pairs(ids, ranks, nbrs, ranks.index_select(0, row), cuts.shape[0])
            frontiers.append(ids)
            blocks.append(Block(int(ptr.shape[0] - 1), int(ids.shape[0]), ptr, local, src_ids=ids,
                                src_time=cuts.index_select(0, ranks), edge_ids=edges))
        return SampledSubgraph(frontiers[0], blocks[::-1], frontiers[::-1])

    def _draw(self, dst: torch.Tensor, cut: torch.Tensor, fanout: int, key: int) -> tuple[torch.Tensor, ...]:
        """(ptr, sampled sources, their edge positions) of one hop from entries ``dst`` at times ``cut``."""
        start = self.indptr.index_select(0, dst)
        valid = self._valid_end(start, self.indptr.index_select(0, dst + 1), cut) - start
        take = valid if fanout < 0 else valid.clamp(max=fanout)
        ptr = torch.zeros(dst.shape[0] + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(take, 0, out=ptr[1:])
        total = int(ptr[-1])
        row, slot = drawn_slots(ptr, take, total)
        offset = (valid - take).index_select(0, row) + slot  # a whole prefix, or `last`'s newest
        if fanout > 0 and not self.last:
            picks = self.draws._floyd(valid, fanout, dst, key).view(-1).index_select(0, row * fanout + slot)
            offset = torch.where(valid.index_select(0, row) > fanout, picks, offset)
        positions = start.index_select(0, row) + offset
        return ptr, self.indices.index_select(0, positions).long(), positions

    def _valid_end(self, start: torch.Tensor, end: torch.Tensor, cut: torch.Tensor) -> torch.Tensor:
        """Per entry, the end of its column's prefix at most ``cut`` (below it if ``strict``)."""
        lo, hi = start.clone(), end.clone()
        if self.edge_time.shape[0] == 0:
            return lo
        last = self.edge_time.shape[0] - 1
        for _ in range(self.rounds):
            mid = (lo + hi) // 2
            times = self.edge_time.index_select(0, mid.clamp(max=last))
            inside = times < cut if self.strict else times <= cut
            searching = lo < hi
            lo = torch.where(searching & inside, mid + 1, lo)
            hi = torch.where(searching & ~inside, mid, hi)
        return lo


def relabel_pairs(ids: torch.Tensor, ranks: torch.Tensor, nbrs: torch.Tensor, nbr_ranks: torch.Tensor,
                  times: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The host's relabel of (vertex, rank) entries in torch: ``nbrs`` (at ``nbr_ranks``) as positions in the
    frontier [the distinct entries ``ids``/``ranks``, then new entries in order of first appearance], and that
    frontier's ids and ranks. Entries are keyed ``vertex * times + rank``, sorted once."""
    keys = torch.cat([ids * times + ranks, nbrs * times + nbr_ranks])
    unique, inverse = torch.unique(keys, return_inverse=True)
    positions = torch.arange(keys.shape[0], device=keys.device)
    first = torch.full((unique.shape[0],), keys.shape[0], dtype=torch.int64, device=keys.device)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    order = torch.argsort(first)  # distinct firsts: the frontier's entries, then the new ones as they came
    rank_of = torch.empty_like(order)
    rank_of[order] = torch.arange(order.shape[0], device=keys.device)
    frontier = unique.index_select(0, order)
    return rank_of.index_select(0, inverse[ids.shape[0]:]), frontier // times, frontier % times


class TypedTemporalDeviceSampler(TypedDeviceSampler):
    """``TemporalTypedSampler`` (its arguments and blocks) on tensors of ``device``: ``TypedDeviceSampler``'s
    topology there, and the timed relations' edge times beside it (``tensor`` places every array)."""

    def __init__(self, graph: TypedGraph, device: torch.device, fanouts, temporal_strategy: str = "uniform",
                 strict: bool = False, edge_features: bool = True, tensor=as_tensor):
        super().__init__(graph, device, fanouts, edge_ids=True, edge_features=edge_features, tensor=tensor)
        self.dtype = time_dtype(graph)
        self.last, self.strict = check_strategy(temporal_strategy), bool(strict)
        self._timed = {r: TorchTemporalSampler(*self.relations[r], tensor(rel.edge_time, "edge times of "
                                                                          f"{relation_label(r)}").to(self.device),
                                               self.fanouts[r], temporal_strategy, strict)
                       for r, rel in graph.relations.items() if rel.edge_time is not None}
        self._cuts = torch.empty(0, device=self.device)
        self._ranks: dict[str, torch.Tensor] = {}
        self._parts: dict[RelationType, tuple[torch.Tensor, torch.Tensor]] = {}

    def sample(self, seeds, seed_time, key: int) -> SampledSubgraph:
        """As ``TemporalTypedSampler.sample``: seeds on the device, their times anywhere."""
        ids, cuts, ranks = typed_entries(self, seeds, seed_time)
        self._cuts = torch.from_numpy(cuts).to(self.device)
        self._ranks = {t: torch.from_numpy(r).to(self.device) for t, r in ranks.items()}
        return self.sample_hops(ids, key, self.num_layers)

    def sample_many(self, seeds: list, keys: list[int]) -> list[SampledSubgraph]:
        raise ConfigError(UNTIMED)

    def sample_bottom(self, destinations, key: int) -> TypedBlock:
        raise ConfigError(NO_BOTTOM)

    def _draw(self, calls: dict[RelationType, tuple]) -> dict[RelationType, tuple[torch.Tensor, ...]]:
        """Each relation's (ptr, sources, edge positions): a timed one's under its destinations' times, a static
        one's plain (one read of the device for all of them)."""
        static = [r for r in calls if r not in self._timed]
        drawn = dict(zip(static, together([self._samplers[r].start_draw(*calls[r], True) for r in static])))
        for relation in calls:
            if relation in self._timed:
                dst, fanout, key = calls[relation]
                cut = self._cuts.index_select(0, self._ranks[relation[2]])
                drawn[relation] = self._timed[relation]._draw(dst, cut, fanout, key)
        self._parts = {r: (drawn[r][0], self._ranks[r[2]]) for r in calls}
        return {r: drawn[r] for r in calls}

    def _relabel(self, parts: dict[str, list[torch.Tensor]], frontier: dict[str, torch.Tensor]
                 ) -> dict[str, list[torch.Tensor]]:
        """Each source type's (vertex, time) entries relabelled into its frontier, the relations feeding it in
        the draws' order, as the host's ``TimedFrontier`` does."""
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        local = {}
        for node_type, nbrs in parts.items():
            feed = [self._parts[r] for r in self._parts if r[0] == node_type]
            nbr_ranks = torch.cat([ranks.repeat_interleave(ptr[1:] - ptr[:-1], output_size=n.shape[0])
                                   for (ptr, ranks), n in zip(feed, nbrs)])
            positions, frontier[node_type], self._ranks[node_type] = relabel_pairs(
                frontier.get(node_type, empty), self._ranks.get(node_type, empty), torch.cat(nbrs), nbr_ranks,
                self._cuts.shape[0])
            local[node_type] = torch.split(positions, [int(n.shape[0]) for n in nbrs])
        return local

    def _typed_block(self, num_dst, drawn, local, frontier) -> TypedBlock:
        tblock = super()._typed_block(num_dst, drawn, local, frontier)
        tblock.src_time = {t: self._cuts.index_select(0, self._ranks[t]) for t in tblock.src_ids}
        return tblock
