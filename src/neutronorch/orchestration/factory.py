"""The one place that knows every mode: builds the mode a configuration names, with its placement."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.capabilities import refusal
from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.cache import hotness_order
from neutronorch.features.host_cache import HostCache
from neutronorch.features.placement import placement_for, workspace_bytes
from neutronorch.features.reading import auto_size, host_cache_size, read_orders, typed_stores
from neutronorch.features.store import TypedInputs
from neutronorch.observe import Spans
from neutronorch.orchestration.access import build_feature_access
from neutronorch.orchestration.device import DeviceMode
from neutronorch.orchestration.device_reader import DeviceReader, TypedDeviceReader
from neutronorch.orchestration.exact import ExactMode
from neutronorch.orchestration.host_loader import HostLoader, TypedHostLoader
from neutronorch.orchestration.link_seeds import EndsSampler, LinkSeeds
from neutronorch.orchestration.mode import Mode
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.orchestration.neutronorch.cold_sampler import draws_on_device
from neutronorch.orchestration.neutronorch.mode import TypedRun
from neutronorch.orchestration.neutronorch.node import NodeLink
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.device_sampler import make_device_sampler
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler, typed_fanouts

logger = logging.getLogger("neutronorch")


@dataclass(frozen=True)
class Threads:
    """Threads of each stage: the trainer's torch ops, the sampler's and the host producer's kernels."""

    train: int
    sampler: int
    host: int


def samples_on_device(config: TrainConfig, device: torch.device) -> bool:
    """Whether the mode samples (NeutronOrch: its cold bottom hop) on the training device."""
    if config.mode == "device":
        return True
    if config.mode == "neutronorch":
        return config.device_sampling == "on" or (config.device_sampling == "auto" and device.type == "cuda")
    return False


def build_mode(config: TrainConfig, graph: Graph | TypedGraph, device: torch.device, threads: Threads | None = None,
               spans: Spans | None = None, shard: tuple[int, int] = (0, 1), node: NodeLink | None = None,
               fanouts: dict[RelationType, list[int]] | None = None) -> Mode:
    """The mode of ``config`` (validated, batch size and precision resolved) over ``graph`` on ``device``, its stages
    recording into ``spans`` (default: a recorder of its own) with ``threads`` (default: one per stage).
    ``shard`` = (rank, world): data parallel, the mode trains part ``rank`` of each global batch; ``node``:
    the ranks of this node, that NeutronOrch mode's hot sets are shared by (``hot_set="node"``). A
    ``TypedGraph`` gets its typed mode (``typed_mode``; ``fanouts``: per relation)."""
    threads = threads or Threads(1, 1, 1)
    spans = spans if spans is not None else Spans()
    if isinstance(graph, TypedGraph):
        return typed_mode(config, graph, device, threads, spans, shard, fanouts)
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
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    placement = placement_for(graph, config.placement, device, samples_on_device(config, device), workspace, dtype)
    host_rows, why, order = host_cache_size(config.host_cache_gb, graph.features, features_in_file_order, lambda: (
        hotness_order(graph.indptr, graph.indices, graph.train_idx, sampling.fanouts, sampling.batch_size,
                      sampling.seed, config.cache_policy)))
    access = build_feature_access(graph, placement, device, sampling, config.cache_policy, dtype,
                                  features_in_file_order, host_rows, config.host_cache_dir, order)
    cache = access.store.host_cache
    if order is not None and host_rows == 0:  # auto, where the features do not fit: sized by measurement
        device_rows = placement.cache_rows if access.cache is not None else 0
        if device_rows < graph.num_nodes:
            access.store.attach_cache(HostCache(graph.features, order[device_rows:], config.host_cache_dir,
                                                auto_size([graph.features], [graph.indptr, graph.indices],
                                                          shard[1] > 1)))
            logger.info("host feature cache: sized once the first mini-batches have shown the memory they use "
                        "(until then rows are read from the features in place)")
    elif cache is not None:
        logger.info(f"host feature cache ({why}): {cache.rows:,} rows ({cache.table.nbytes / 2**30:.2f} GiB) in "
                    f"memory, " + (f"{cache.cold.shape[0]:,} copied to a file of cold rows" if cache.cold_file
                                   else "the others read in place") + f"; built in {cache.seconds:.1f} s")
    elif config.host_cache_gb not in (0, "auto"):
        logger.info(f"no host feature cache: {why if host_rows == 0 else 'the device cache holds every row'}")
    # A link task's graph carries its links (train/link_task.py's link_graph); its batches are seed edges.
    seeds = LinkSeeds(graph.links.train, graph.num_nodes, sampling, config.negatives) if link else None
    if config.mode == "exact":
        return ExactMode(seeds or NodeSeeds(graph, sampling), lambda: NeighborSampler(
            graph.indptr, graph.indices, sampling.fanouts, sampling.degrees, sampling.file_order),
            HostLoader(access, spans), sampling, spans, threads.sampler)
    if config.mode == "device":
        reader = DeviceReader(graph, access, spans)
        return DeviceMode(seeds or NodeSeeds(graph, sampling), lambda: make_device_sampler(
            reader.indptr, reader.indices, sampling.fanouts, sampling.degrees), reader, sampling, spans)
    return NeutronOrchMode(graph, sampling, config.neutronorch, config.epochs, access, spans,
                           threads.sampler, threads.host, node, seeds)


def typed_mode(config: TrainConfig, graph: TypedGraph, device: torch.device, threads: Threads, spans: Spans,
               shard: tuple[int, int], fanouts: dict[RelationType, list[int]] | None) -> Mode:
    """``build_mode`` for a typed graph (two-way: ``with_reverse``): exact (also what ``auto`` picks), device
    (reading through ``TypedDeviceReader``) or NeutronOrch (``neutronorch/``) over its ``train_idx``;
    ``fanouts``: per relation, default ``config.fanouts`` for every relation. Data parallel where
    ``capabilities.py``'s table says it runs (``check_run`` refuses the others first)."""
    refused = refusal("typed", config.mode, config.task, shard[1])
    if refused is not None:
        raise ConfigError(refused)
    fanouts = typed_fanouts(graph, config.fanouts if fanouts is None else fanouts)
    sampling = dataclasses.replace(config.sampling, rank=shard[0], world=shard[1])
    # The featured types' rows, read on the host (in file order, through host caches, as configured); device
    # mode reads there only what its device caches miss, in place.
    inputs = TypedInputs(graph, typed_stores(config, graph, fanouts, shard[1] > 1, on_host=config.mode != "device"))
    # A link task's batches are seed edges of its relation, in its end types' stacked ids (``LinkEnds``).
    ends = graph.links.ends if config.task == "link" else None
    seeds = (LinkSeeds(graph.links.train, ends.num_nodes, sampling, config.negatives, ends) if ends is not None
             else NodeSeeds(graph, sampling))
    by_type = (lambda sampler: EndsSampler(sampler, ends)) if ends is not None else (lambda sampler: sampler)
    if config.mode == "device":
        reader = TypedDeviceReader(graph, fanouts, sampling, device, spans, config.placement, inputs)
        return DeviceMode(seeds, lambda: by_type(reader.sampler), reader, sampling, spans)
    if config.mode == "neutronorch":
        run = TypedRun(fanouts, device, draws_on_device(config.device_sampling, graph, device))
        return NeutronOrchMode(graph, sampling, config.neutronorch, config.epochs, inputs, spans, threads.sampler,
                               threads.host, typed=run)
    return ExactMode(seeds, lambda: by_type(TypedNeighborSampler(graph, fanouts)),
                     TypedHostLoader(graph, inputs, device, spans), sampling, spans, threads.sampler)
