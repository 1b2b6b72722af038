"""The one place that knows every mode: builds the mode a configuration names, with its placement."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.config import SamplingConfig, TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.features.cache import hotness_order
from neutronorch.features.host_cache import host_cache_rows, sized_by_memory
from neutronorch.features.memory import available_memory_bytes
from neutronorch.features.placement import placement_for, workspace_bytes
from neutronorch.features.store import beyond_memory
from neutronorch.observe import Spans
from neutronorch.orchestration.access import build_feature_access
from neutronorch.orchestration.device import DeviceMode
from neutronorch.orchestration.exact import ExactMode
from neutronorch.orchestration.mode import Mode
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.orchestration.neutronorch.node import NodeLink

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


def build_mode(config: TrainConfig, graph: Graph, device: torch.device, threads: Threads | None = None,
               spans: Spans | None = None, shard: tuple[int, int] = (0, 1), node: NodeLink | None = None) -> Mode:
    """The mode of ``config`` (validated, batch size and precision resolved) over ``graph`` on ``device``, its stages
    recording into ``spans`` (default: a recorder of its own) with ``threads`` (default: one per stage).
    ``shard`` = (rank, world): data parallel, the mode trains part ``rank`` of each global batch; ``node``:
    the ranks of this node, that NeutronOrch mode's hot sets are shared by (``hot_set="node"``)."""
    threads = threads or Threads(1, 1, 1)
    spans = spans if spans is not None else Spans()
    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, config.hidden, graph.num_classes,
                                config.fanouts, config.batch_size, config.heads if config.model == "gat" else 1)
    features_in_file_order, topology_in_file_order = read_orders(config.read_order, graph, workspace)
    # Device mode samples from topology copied to the device (or pinned): no host sampler reads the file.
    sampling = dataclasses.replace(config.sampling, rank=shard[0], world=shard[1],
                                   file_order=topology_in_file_order and config.mode != "device")
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    placement = placement_for(graph, config.placement, device, samples_on_device(config, device), workspace, dtype)
    host_rows, why, order = host_cache_size(config, graph, sampling, features_in_file_order, shard[1] > 1)
    access = build_feature_access(graph, placement, device, sampling, config.cache_policy, dtype,
                                  features_in_file_order, host_rows, config.host_cache_dir, order)
    cache = access.store.host_cache
    if cache is not None:
        logger.info(f"host feature cache ({why}): {cache.rows:,} rows ({cache.table.nbytes / 2**30:.2f} GiB) in "
                    f"memory, " + (f"{cache.cold.shape[0]:,} copied to a file of cold rows" if cache.cold_file
                                   else "the others read in place") + f"; built in {cache.seconds:.1f} s")
    elif config.host_cache_gb not in (0, "auto"):
        logger.info(f"no host feature cache: {why if host_rows == 0 else 'the device cache holds every row'}")
    if config.mode == "exact":
        return ExactMode(graph, sampling, access, spans, threads.sampler)
    if config.mode == "device":
        return DeviceMode(graph, sampling, access, spans)
    return NeutronOrchMode(graph, sampling, config.neutronorch, config.epochs, access, spans,
                           threads.sampler, threads.host, node)


def host_cache_size(config: TrainConfig, graph: Graph, sampling: SamplingConfig, file_order: bool,
                    distributed: bool = False) -> tuple[int, str, np.ndarray | None]:
    """Rows of the host feature cache (``TrainConfig.host_cache_gb``; see ``features/host_cache.py``), why,
    and the vertices hottest first where they were ranked for it. ``auto`` sizes it against the working
    memory estimated from the frontiers of the mini-batches sampled to rank the rows (the estimate from the
    fanouts alone assumes no vertex is reached twice: on the 1M-vertex benchmark graph 5.9 GiB where the run
    used 3.5); ``distributed``: each of the node's ranks (``LOCAL_WORLD_SIZE``) builds its own, so each
    takes its share of the memory."""
    setting = config.host_cache_gb
    if setting == 0:
        return 0, "host_cache_gb 0", None
    if sized_by_memory(setting, graph.features, file_order):
        frontiers: list[int] = []
        order = hotness_order(graph.indptr, graph.indices, graph.train_idx, sampling.fanouts, sampling.batch_size,
                              sampling.seed, config.cache_policy, frontiers=frontiers)
        workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, config.hidden, graph.num_classes,
                                    config.fanouts, config.batch_size, config.heads if config.model == "gat" else 1,
                                    measured=frontiers or None)
        if config.mode == "neutronorch" and frontiers:
            # The host producer's memory: its gather of the hot set's bottom hop and the inputs its hot rows
            # keep for their gradient over the super-batches in flight. On the 1M-vertex benchmark graph the
            # mode's peak anonymous memory (4.59 GiB) was 1.6 mini-batches' input rows above exact mode's
            # (3.61 GiB at the end of its run); counted as two.
            workspace += 2 * frontiers[-1] * graph.feature_dim * 4
        available = available_memory_bytes()
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if distributed else 1
        if available is not None and ranks > 1:
            available = available // ranks
        rows, why = host_cache_rows(setting, graph.features, file_order, available, workspace)
        return rows, why + (f", shared by {ranks} ranks" if ranks > 1 else ""), order
    return (*host_cache_rows(setting, graph.features, file_order, None, 0), None)


def read_orders(setting: str, graph: Graph, workspace: int) -> tuple[bool, bool]:
    """Whether the features and the topology are read in file order (``TrainConfig.read_order``): with
    ``auto``, the memory-mapped ones, when together they are larger than half the memory left beside the
    run's estimated working memory."""
    features, topology = graph.features, graph.indices
    if setting != "auto":
        return setting == "file", setting == "file"
    if not beyond_memory([features, topology, graph.indptr], reserve=workspace):
        return False, False
    mapped = [isinstance(a, np.memmap) for a in (features, topology)]
    logger.info(f"memory-mapped {' and '.join(n for n, m in zip(('features', 'topology'), mapped) if m)} larger than "
                f"half the memory left beside the run's working memory: read in file order (--read-order)")
    return mapped[0], mapped[1]
