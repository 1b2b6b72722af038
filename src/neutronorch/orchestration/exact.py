"""Mode ``exact``, for both kinds of graph: sample and gather on the host, train on the device, every layer
computed exactly.

The stages of one mini-batch, in the producer thread: seed order (``seeds.py``, ``link_seeds.py``) -> sample
(host kernels) -> gather its rows and start their copy to the device (the loader: ``host_loader.py``). The
training thread only runs forward, backward and the optimizer step. What differs by kind of graph is handed
in by the factory: the sampler each producer thread makes (a sampler's vertex map is thread-private state)
and the loader of its subgraphs. Each batch is drawn with its key ``batch_key(seed, epoch, index)`` and
depends on it alone, so a run resumes at any step; data parallel, the key is the global batch's.
"""

from __future__ import annotations

from typing import Callable, Iterator

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans
from neutronorch.orchestration.host_loader import HOST_SAMPLING_STAGES, HostLoader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.mode import LoadingMode
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


class ExactMode(LoadingMode):
    name = "exact"
    stages = HOST_SAMPLING_STAGES  # a run's: its loader's

    def __init__(self, seeds: NodeSeeds | LinkSeeds, new_sampler: Callable[[], NeighborSampler | TypedNeighborSampler],
                 loader: HostLoader, sampling: SamplingConfig, spans: Spans, sampler_threads: int):
        super().__init__(seeds, loader, sampling, spans)
        self.new_sampler, self.producer_threads = new_sampler, sampler_threads
        self.threads = {"sampler": sampler_threads}

    def _produce(self, epoch: int, start: int) -> Iterator:
        sampler = self.seeds.sampler(self.new_sampler())
        batches = self.seeds.epoch(epoch)
        for index in range(start, len(batches)):
            batch = batches[index]
            with self.spans.stage("sample", index):
                subgraph = sampler.sample(batch.seeds.numpy(), batch_key(self.sampling.seed, epoch, index))
                if batch.exclude is not None:  # a link task's seed edges
                    subgraph = self.seeds.exclude(subgraph, batch.exclude)
            yield self.loader.load(epoch, index, subgraph, targets=batch.targets)

    def describe(self) -> str:
        return f"sampler threads {self.producer_threads}"
