"""The one place that knows every mode: builds the mode a configuration names, with its placement."""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.capabilities import check_static
from neutronorch.config import SamplingConfig, TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.partition_files import dealing_owners
from neutronorch.data.partition_typed_files import typed_link_owners
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.cache import FeatureCache, hotness_order
from neutronorch.features.placement import GiB, placement_for, workspace_bytes
from neutronorch.features.reading import attach_host_cache, auto_size, read_orders, typed_stores
from neutronorch.features.store import BufferPool, FeatureStore, TypedInputs
from neutronorch.nn.precision import precision_dtype
from neutronorch.observe import Spans
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.host_loader import HostLoader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.loading import DeviceMode, ExactMode
from neutronorch.orchestration.mode import Mode
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.orchestration.neutronorch.mode import HomogeneousKind, TypedKind
from neutronorch.orchestration.neutronorch.node import NodeLink
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.orchestration.temporal import OTHER_MODES, TemporalRequest
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.sampling.typed_device_sampler import topology_bytes
from neutronorch.sampling.typed_sampler import TypedNeighborSampler, typed_fanouts

logger = logging.getLogger("neutronorch")


@dataclass(frozen=True)
class Threads:
    """Threads of each stage: the trainer's torch ops, the sampler's and the host producer's kernels."""

    train: int
    sampler: int
    host: int


def samples_on_device(config: TrainConfig, device: torch.device) -> bool:
    """Whether a homogeneous graph's mode samples (NeutronOrch: its cold bottom hop) on the device."""
    setting = config.device_sampling
    return config.mode == "device" or (config.mode == "neutronorch" and (
        setting == "on" or (setting == "auto" and device.type == "cuda")))


def draws_on_device(setting: str, graph: TypedGraph, device: torch.device, free: int | None = None) -> bool:
    """Whether a typed graph's mini-batches are drawn on ``device``: ``on``, or ``auto`` with CUDA where the
    topology and edge features take at most half its ``free`` bytes (default CUDA's); ``on`` beyond that is
    refused."""
    on = setting == "on" or (setting == "auto" and device.type == "cuda")
    if not on or device.type != "cuda":
        return on
    free = torch.cuda.mem_get_info(device)[0] if free is None else free
    need = topology_bytes(graph)
    if need <= free // 2:
        return True
    if setting == "on":
        raise ConfigError(f"`device_sampling` on: typed NeutronOrch places the graph's topology and edge "
                          f"features on {device} whole ({need / GiB:.2f} GiB), more than half its free "
                          f"{free / GiB:.2f} GiB; set `device_sampling` off to sample on the host")
    logger.info(f"device sampling off: the topology ({need / GiB:.2f} GiB) takes more than half of "
                f"{device}'s free memory")
    return False


def build_mode(config: TrainConfig, graph: Graph | TypedGraph, device: torch.device, threads: Threads | None = None,
               spans: Spans | None = None, shard: tuple[int, int] = (0, 1), node: NodeLink | None = None,
               fanouts: dict[RelationType, list[int]] | None = None, temporal: TemporalRequest | None = None) -> Mode:
    """The mode of ``config`` (resolved, and passed by ``capabilities.check_run``) over ``graph`` on
    ``device``, recording into ``spans`` (default its own) with ``threads`` (default one per stage).
    ``shard`` = (rank, world): data parallel, the mode trains part ``rank`` of each global batch; ``node``:
    this node's ranks (``hot_set="node"``); ``fanouts``: a typed graph's, per relation; ``temporal``: a
    temporal loader's request (exact mode samples its seeds by time; without one a graph with times is
    refused, docs/temporal.md)."""
    if temporal is None:
        check_static(graph)
    elif config.mode == "neutronorch":
        raise ConfigError(OTHER_MODES.format(mode=config.mode))
    else:
        temporal.check(config, graph)
        graph = temporal.timed_graph(graph)
    threads = threads or Threads(1, 1, 1)
    spans = spans if spans is not None else Spans()
    typed = isinstance(graph, TypedGraph)
    if typed:
        fanouts, sampling, access, seeds = typed_access(config, graph, device, shard, fanouts)
        host_sampler = lambda: TypedNeighborSampler(graph, fanouts)  # noqa: E731
        if temporal is not None:
            host_sampler = lambda: temporal.sampler(graph, sampling, fanouts)  # noqa: E731
    else:
        graph, sampling, access, seeds = homogeneous_access(config, graph, device, shard)
        host_sampler = lambda: NeighborSampler(graph.indptr, graph.indices, sampling.fanouts,  # noqa: E731
                                               sampling.degrees, sampling.file_order)
        if temporal is not None:
            host_sampler = lambda: temporal.sampler(graph, sampling)  # noqa: E731
    if temporal is not None and temporal.link:
        if config.deal_by is not None:
            raise ConfigError(f"`deal_by` {config.deal_by}: a link task sampled by time deals its seed edges by "
                              f"position so far; leave `deal_by` out.")
        seeds = temporal.link_seeds(graph, sampling, config.negatives)
    if config.mode == "exact":
        return ExactMode(seeds, host_sampler, HostLoader(access, spans), sampling, spans, threads.sampler)
    if config.mode == "device":
        reader = DeviceReader(graph, access, spans, sampling, config.placement, fanouts)
        if temporal is not None:  # each producer's TorchTemporalSampler over the reader's topology
            reader.new_sampler = temporal.device_sampler(reader, graph, sampling)
        return DeviceMode(seeds, reader, sampling, spans)
    kind = (TypedKind(graph, access, fanouts, draws_on_device(config.device_sampling, graph, device), spans,
                      host_sampler) if typed else HomogeneousKind(graph, access, spans, sampling, host_sampler))
    return NeutronOrchMode(kind, seeds, sampling, config.neutronorch, config.epochs, spans, threads.sampler,
                           threads.host, node)


def homogeneous_access(config: TrainConfig, graph: Graph, device: torch.device, shard: tuple[int, int]
                       ) -> tuple[Graph, SamplingConfig, FeatureAccess, NodeSeeds | LinkSeeds]:
    """A homogeneous graph (a link task's with its training edges' ends as ``train_idx``), its sampling
    settings, how its rows are read and its batches' seeds."""
    link = config.task == "link"
    if link:  # the caches rank rows by where mini-batches start: the training edges' ends, not a node split
        graph = dataclasses.replace(graph, train_idx=np.unique(np.asarray(graph.links.train).reshape(-1)))
    # A link batch's seeds: up to both ends of each positive and each of its negatives.
    seeds_per_batch = config.batch_size * (2 + config.negatives) if link else config.batch_size
    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, config.hidden, graph.num_classes,
                                config.fanouts, seeds_per_batch, config.heads if config.model == "gat" else 1)
    features_in_file_order, topology_in_file_order = read_orders(config.read_order, [graph.features],
                                                                 [graph.indices, graph.indptr], workspace)
    # Device mode samples from topology copied to the device (or pinned): no host sampler reads the file.
    sampling = dataclasses.replace(config.sampling, rank=shard[0], world=shard[1],
                                   file_order=topology_in_file_order and config.mode != "device")
    dtype = precision_dtype(config.precision)
    placement = placement_for(graph, config.placement, device, samples_on_device(config, device), workspace, dtype)

    @functools.cache
    def ranked() -> np.ndarray:  # the vertices hottest first, ranked once if a cache needs them
        return hotness_order(graph, sampling.fanouts, sampling.batch_size, sampling.seed, config.cache_policy)

    store = FeatureStore(graph.features, graph.labels, dtype, features_in_file_order)
    pool = BufferPool(sampling.prefetch + 2, store.width, dtype, pin=device.type == "cuda")
    # Where the device samples, its reads go through the cache even when it holds no row.
    needs_cache = placement.features != "host" or placement.topology != "host"
    device_rows = placement.cache_rows if needs_cache else 0
    order = ranked() if 0 < device_rows < graph.num_nodes else np.empty(0, np.int64)
    try:
        cache = (FeatureCache(store, order, device_rows, device, device_lookup=placement.topology != "host")
                 if needs_cache else None)
    except torch.cuda.OutOfMemoryError:
        raise ConfigError(f"the device feature cache ({placement.cache_bytes / 2**30:.2f} GiB) does not fit "
                          f"in the memory of {device}. Lower `gpu_cache_gb` or `gpu_memory_gb` (rows not "
                          f"cached are read from host memory).") from None
    attach_host_cache(store, config.host_cache_gb, ranked, config.host_cache_dir,
                      lambda: auto_size([graph.features], [graph.indptr, graph.indices], shard[1] > 1),
                      device_rows)
    # A link task's graph carries its links (train/link_task.py's link_graph); its batches are seed edges.
    owner = (dealing_owners(config.deal_by, shard[1], graph.num_nodes, typed=False) if config.deal_by is not None
             else None)
    seeds = LinkSeeds(graph.links.train, graph.num_nodes, sampling, config.negatives, owner=owner) if link else \
        NodeSeeds(graph, sampling, owner)
    return graph, sampling, FeatureAccess(device, store, placement, cache, pool), seeds


def typed_access(config: TrainConfig, graph: TypedGraph, device: torch.device, shard: tuple[int, int],
                 fanouts: dict[RelationType, list[int]] | None
                 ) -> tuple[dict[RelationType, list[int]], SamplingConfig, FeatureAccess, NodeSeeds | LinkSeeds]:
    """A typed graph's fanouts per relation (default ``config.fanouts`` for every relation), sampling
    settings, rows and batches' seeds (a link task's: its relation's edges, ``LinkEnds``)."""
    fanouts = typed_fanouts(graph, config.fanouts if fanouts is None else fanouts)
    # A link task's batches are seed edges of its relation, in its end types' stacked ids (``LinkEnds``).
    ends = graph.links.ends if config.task == "link" else None
    # A node task's seeds dealt by the target type's owners in a typed graph's partition folder (``deal_by``), a
    # link task's seed edges by the owners of their sources in a folder holding its split.
    owner = None if config.deal_by is None else (
        typed_link_owners(config.deal_by, shard[1], ends, config.link_relation) if ends is not None else
        dealing_owners(config.deal_by, shard[1], graph.num_nodes[graph.target], typed=True))
    sampling = dataclasses.replace(config.sampling, rank=shard[0], world=shard[1])
    stores = typed_stores(config, graph, fanouts, shard[1] > 1, on_host=config.mode != "device")
    seeds = (LinkSeeds(graph.links.train, ends.num_nodes, sampling, config.negatives, ends, owner) if ends is not None
             else NodeSeeds(graph, sampling, owner))
    # Its rows read on the host (device mode's reader caches them).
    access = FeatureAccess(device, None, None, None, None, TypedInputs(graph, stores), graph)
    return fanouts, sampling, access, seeds
