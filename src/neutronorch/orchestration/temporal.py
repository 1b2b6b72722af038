"""A temporal node loader's sampling (docs/temporal.md, "The loader"): ``NeighborLoader(time_attr=...,
input_time=...)`` asks for it with a ``TemporalRequest`` (as ``train()``'s temporal tasks do), and exact mode
then samples each batch's seeds at their times with ``TemporalNeighborSampler`` (device mode with
``TorchTemporalSampler``, on a typed graph ``TypedTemporalDeviceSampler``: ``device_sampler``). A seed's time is
a function of the seed (a vertex is a seed once per epoch), so a batch still depends only on its seeds and its
key: resume mid-epoch replays it exactly. What cannot run with time yet is refused here, with the reason."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.config import SamplingConfig, TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.relation import RelationType
from neutronorch.data.time_split import Appearance
from neutronorch.data.times import times_from_vertices
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError

# Why NeutronOrch mode does not sample by time yet.
OTHER_MODES = ("temporal sampling: not yet in mode {mode} (NeutronOrch's hot rows are computed for one time, and "
               "would serve seeds of other times); give `mode` exact or device.")
from neutronorch.orchestration.link_seeds import TimedLinkSeeds
from neutronorch.sampling.temporal_device import TorchTemporalSampler, TypedTemporalDeviceSampler
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler, TemporalTypedSampler


@dataclass(frozen=True)
class TemporalRequest:
    """Sample by time: each seed of the graph view's ``train_idx`` at ``seed_time`` (aligned with it, in the
    times' dtype; with ``link``, each supervision edge of ``links.train`` at it: ``TimedLinkSeeds``),
    ``strategy`` uniform or last, ``strict`` edges before the time only. ``by_vertices``: by the vertex
    times, each edge at its source's time (``times_from_vertices``: a neighbour exists from its own time),
    else by the edge times."""

    seed_time: np.ndarray
    strategy: str = "uniform"
    strict: bool = False
    by_vertices: bool = False
    link: bool = False
    appearance: Appearance | None = None  # a link task's negatives as of each positive's time (else uniform)

    def check(self, config: TrainConfig, graph) -> None:
        """Refuse what cannot honour time: a link task without link times (or link times for a node task),
        several ranks, GCN's symmetric norm (its degrees count future edges); NeutronOrch mode is refused by
        ``factory.build_mode``."""
        typed = not isinstance(graph, Graph)
        why = ("a link task without `edge_label_time`" if (config.task == "link") != self.link else
               "several ranks" if config.sampling.world > 1 else
               "`gcn_norm` symmetric (its in-degrees count every edge, future ones too)" if config.sampling.degrees
               else None)
        if why:
            raise ConfigError(f"temporal sampling: not yet in {why}; sampling by time runs in one process, in mode "
                              f"exact or device (docs/temporal.md).")
        if typed:
            return  # TemporalTypedSampler says when no relation has times
        if (graph.node_time if self.by_vertices else graph.edge_time) is None:
            raise ConfigError(f"temporal sampling: {graph.name} has no {'vertex' if self.by_vertices else 'edge'} "
                              f"times to sample by (docs/temporal.md).")

    def timed_graph(self, graph: Graph | TypedGraph) -> Graph | TypedGraph:
        """``graph`` as the mode samples it: by vertex times, its edges at their sources' times (a typed graph's
        relations without edge times of their own, from a type with vertex times; any other stays static)."""
        if not self.by_vertices:
            return graph
        if isinstance(graph, TypedGraph):
            return timed_relations(graph)[0]
        indices, edge_time, _ = times_from_vertices(graph.indptr, graph.indices, graph.node_time)
        return dataclasses.replace(graph, indices=indices, edge_time=edge_time)

    def sampler(self, graph: Graph | TypedGraph, sampling: SamplingConfig, fanouts=None) -> "TimedSampler":
        """A new sampler of the mode's producer thread (a typed graph's with its ``fanouts`` per relation): the
        seeds' times looked up by vertex (of the target type)."""
        typed = isinstance(graph, TypedGraph)
        time_of = self.time_of(graph)
        if typed:
            return TimedSampler(TemporalTypedSampler(graph, fanouts, self.strategy, self.strict), time_of)
        return TimedSampler(TemporalNeighborSampler(graph.indptr, graph.indices, graph.edge_time, sampling.fanouts,
                                                    self.strategy, self.strict), time_of)

    def time_of(self, graph: Graph | TypedGraph) -> np.ndarray | None:
        """Each vertex's time as a seed (of the target type; None for a link task, whose batches' seeds carry
        their times: ``SeedBatch.times``)."""
        if self.link:
            return None
        typed = isinstance(graph, TypedGraph)
        time_of = np.zeros(graph.num_nodes[graph.target] if typed else graph.num_nodes, self.seed_time.dtype)
        time_of[np.asarray(graph.train_idx)] = self.seed_time
        return time_of

    def device_sampler(self, reader, graph: Graph | TypedGraph, sampling: SamplingConfig):
        """Device mode's sampler maker: ``TorchTemporalSampler`` over ``reader``'s topology (a
        ``DeviceReader``), with the edge times placed as it is; a typed graph's ``TypedTemporalDeviceSampler``,
        which ``reader.start`` makes with the relations' times beside their topology."""
        time_of = None if self.link else torch.from_numpy(self.time_of(graph))
        if isinstance(graph, TypedGraph):
            reader.typed_sampler = functools.partial(TypedTemporalDeviceSampler, temporal_strategy=self.strategy,
                                                     strict=self.strict)
            return lambda: DeviceTimedSampler(reader.sampler, time_of)
        edge_time = reader.like_topology(np.asarray(graph.edge_time), "edge times")

        def new_sampler() -> DeviceTimedSampler:
            return DeviceTimedSampler(TorchTemporalSampler(reader.indptr, reader.indices, edge_time, sampling.fanouts,
                                                           self.strategy, self.strict), time_of)
        return new_sampler

    def link_seeds(self, graph: Graph | TypedGraph, sampling: SamplingConfig, negatives: int) -> TimedLinkSeeds:
        """A link task's batches by time: ``graph.links.train``'s edges at ``seed_time`` (a typed graph's in
        its ends' stacked ids)."""
        ends = graph.links.ends if isinstance(graph, TypedGraph) else None
        return TimedLinkSeeds(graph.links.train, self.seed_time, graph.num_nodes if ends is None else ends.num_nodes,
                              sampling, negatives, self.appearance, ends)


class TimedSampler:
    """What exact mode's producer samples with: each batch's seeds at their times."""

    def __init__(self, sampler: TemporalNeighborSampler | TemporalTypedSampler, time_of: np.ndarray | None):
        self.sampler, self.time_of = sampler, time_of

    def sample_many(self, seeds: list, keys: list[int]) -> list:
        """Node seeds, each at its time (``time_of`` its vertex)."""
        return self.sample_timed(seeds, [self.time_of[ids.numpy()] for ids in seeds], keys)

    def sample_timed(self, seeds: list, times: list, keys: list[int]) -> list:
        """``seeds[i]`` at ``times[i]`` (one time per seed; mappings by type on a typed graph) with
        ``keys[i]``."""
        return [self.sampler.sample(ids if isinstance(ids, Mapping) else ids.numpy(), at, key)
                for ids, at, key in zip(seeds, times, keys)]


class DeviceTimedSampler(TimedSampler):
    """What device mode's producer samples with: each batch's seeds (on the device) at their times."""

    def sample_many(self, seeds: list, keys: list[int]) -> list:
        return self.sample_timed(seeds, [self.time_of[ids.cpu()] for ids in seeds], keys)

    def sample_timed(self, seeds: list, times: list, keys: list[int]) -> list:
        return [self.sampler.sample(ids, at, key) for ids, at, key in zip(seeds, times, keys)]


def timed_relations(graph: TypedGraph, replace: bool = False) -> tuple[TypedGraph, dict[RelationType, np.ndarray]]:
    """``graph`` by its vertex times: each relation from a type with vertex times and without edge times of its
    own (``replace``: with them too) with each edge at its source's time (its edges re-sorted by them, edge
    features with them), any other as it is; and each re-sorted relation's order (the old position of every
    new one)."""
    relations, orders = {}, {}
    for r, relation in graph.relations.items():
        source_time = graph.node_time.get(r[0])
        if (relation.edge_time is not None and not replace) or source_time is None:
            relations[r] = relation
            continue
        indices, edge_time, orders[r] = times_from_vertices(relation.indptr, relation.indices, source_time)
        features = None if relation.edge_features is None else np.asarray(relation.edge_features)[orders[r]]
        relations[r] = dataclasses.replace(relation, indices=indices, edge_time=edge_time, edge_features=features)
    if replace:  # a relation whose source type has no vertex times is static, its own edge times dropped
        relations = {r: rel if r[0] in graph.node_time or rel.edge_time is None else
                     dataclasses.replace(rel, edge_time=None) for r, rel in relations.items()}
    return dataclasses.replace(graph, relations=relations), orders
