"""Mode ``exact``, for both kinds of graph: sample and gather on the host, train on the device, every layer
computed exactly.

A producer thread draws each batch's seeds (``seeds.py``, ``link_seeds.py``), samples them with a sampler of
its own (its vertex map is thread-private) and loads them (``host_loader.py``); the trainer only steps. Each
batch depends only on its key ``batch_key(seed, epoch, index)``, so a run resumes at any step.
"""

from __future__ import annotations

from typing import Callable

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans
from neutronorch.orchestration.host_loader import HOST_SAMPLING_STAGES, HostLoader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.mode import LoadingMode
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


class ExactMode(LoadingMode):
    name = "exact"
    stages = HOST_SAMPLING_STAGES  # a run's: its loader's

    def __init__(self, seeds: NodeSeeds | LinkSeeds, new_sampler: Callable[[], NeighborSampler | TypedNeighborSampler],
                 loader: HostLoader, sampling: SamplingConfig, spans: Spans, sampler_threads: int):
        super().__init__(seeds, loader, sampling, spans)
        self.new_sampler, self.producer_threads = new_sampler, sampler_threads
        self.threads = {"sampler": sampler_threads}

    def describe(self) -> str:
        return f"sampler threads {self.producer_threads}"
