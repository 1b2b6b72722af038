"""The one place that knows every mode: builds the mode a configuration names, with its placement."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.features.placement import placement_for, workspace_bytes
from neutronorch.features.store import reads_in_file_order
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
    sampling = dataclasses.replace(config.sampling, rank=shard[0], world=shard[1])
    spans = spans if spans is not None else Spans()
    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, config.hidden, graph.num_classes,
                                config.fanouts, config.batch_size, config.heads if config.model == "gat" else 1)
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    placement = placement_for(graph, config.placement, device, samples_on_device(config, device), workspace, dtype)
    access = build_feature_access(graph, placement, device, sampling, config.cache_policy, dtype,
                                  file_order(config.feature_reads, graph, workspace))
    if config.mode == "exact":
        return ExactMode(graph, sampling, access, spans, threads.sampler)
    if config.mode == "device":
        return DeviceMode(graph, sampling, access, spans)
    return NeutronOrchMode(graph, sampling, config.neutronorch, config.epochs, access, spans,
                           threads.sampler, threads.host)


def file_order(setting: str, graph: Graph, workspace: int) -> bool:
    """Whether the features are read in file order (``TrainConfig.feature_reads``): with ``auto``, when they
    are memory-mapped and larger than half the memory left beside the run's estimated working memory."""
    if setting != "auto":
        return setting == "file-order"
    ordered = reads_in_file_order(graph.features, reserve=workspace)
    if ordered:
        logger.info(f"features: a {graph.features.nbytes / 2**30:.2f} GiB memory map, more than half the memory "
                    f"left beside the run's working memory: rows are read in file order (--feature-reads)")
    return ordered
