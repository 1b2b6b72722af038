"""The one place that knows every mode: builds the mode a configuration names, with its placement."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.features.placement import placement_for, workspace_bytes
from neutronorch.features.store import beyond_memory
from neutronorch.observe import Spans
from neutronorch.orchestration.access import build_feature_access
from neutronorch.orchestration.device import DeviceMode
from neutronorch.orchestration.exact import ExactMode
from neutronorch.orchestration.mode import Mode
from neutronorch.orchestration.neutronorch import NeutronOrchMode

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
               spans: Spans | None = None, shard: tuple[int, int] = (0, 1)) -> Mode:
    """The mode of ``config`` (validated, batch size and precision resolved) over ``graph`` on ``device``, its stages
    recording into ``spans`` (default: a recorder of its own) with ``threads`` (default: one per stage).
    ``shard`` = (rank, world): data parallel, the mode trains part ``rank`` of each global batch."""
    threads = threads or Threads(1, 1, 1)
    spans = spans if spans is not None else Spans()
    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, config.hidden, graph.num_classes,
                                config.fanouts, config.batch_size, config.heads if config.model == "gat" else 1)
    features_in_file_order, topology_in_file_order = read_orders(config.read_order, graph, workspace)
    sampling = dataclasses.replace(config.sampling, rank=shard[0], world=shard[1], file_order=topology_in_file_order)
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    placement = placement_for(graph, config.placement, device, samples_on_device(config, device), workspace, dtype)
    access = build_feature_access(graph, placement, device, sampling, config.cache_policy, dtype,
                                  features_in_file_order)
    if config.mode == "exact":
        return ExactMode(graph, sampling, access, spans, threads.sampler)
    if config.mode == "device":
        return DeviceMode(graph, sampling, access, spans)
    return NeutronOrchMode(graph, sampling, config.neutronorch, config.epochs, access, spans,
                           threads.sampler, threads.host)


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
