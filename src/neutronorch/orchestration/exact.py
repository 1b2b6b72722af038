"""Mode ``exact``: sample and gather on the host, train on the device, every layer computed exactly.

The stages of one mini-batch, in the producer thread: seed order -> sample (host kernels) -> gather
features into a reused buffer (pinned on CUDA) -> copy to the device on a side stream
(``host_loader.py``). The training thread only runs forward, backward and the optimizer step.
"""

from __future__ import annotations

from typing import Iterator

import numba
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.host_loader import HostLoader
from neutronorch.orchestration.mode import StepHooksUnused, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.exclude import exclude_edges
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key

HOST_SAMPLING_STAGES = StageTable({"sample": "sampler", "gather": "sampler", "copy": "copy"})


class ExactMode(StepHooksUnused):
    name = "exact"
    stages = HOST_SAMPLING_STAGES
    resumable = resumable_mid_epoch = True  # its batches depend only on (seed, epoch, batch)

    def __init__(self, graph: Graph, sampling: SamplingConfig, access: FeatureAccess, spans: Spans,
                 sampler_threads: int, seeds: NodeSeeds | None = None):
        self.graph = graph
        self.sampling = sampling
        self.access = access
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
        self.spans = spans
        self.sampler_threads = sampler_threads
        self.threads = {"sampler": sampler_threads}
        self.num_nodes = graph.num_nodes
        self.seeds = seeds if seeds is not None else NodeSeeds(graph, sampling)
        self.num_batches = self.seeds.num_batches
        self.loader = HostLoader(access, spans)

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        """This epoch's mini-batches from number ``start`` on, produced ahead in a background thread."""
        return Prefetcher(lambda: self._produce(epoch, start), depth=self.sampling.prefetch,
                          name=f"{self.name}-producer", on_start=lambda: numba.set_num_threads(self.sampler_threads))

    def _produce(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        # A fresh sampler per producer thread: its vertex map is thread-private state.
        sampler = NeighborSampler(self.graph.indptr, self.graph.indices, self.sampling.fanouts, self.sampling.degrees,
                                  self.sampling.file_order)
        batches = self.seeds.epoch(epoch)
        for index in range(start, len(batches)):
            batch = batches[index]
            with self.spans.stage("sample"):
                subgraph = sampler.sample(batch.seeds.numpy(), batch_key(self.sampling.seed, epoch, index))
                if batch.exclude is not None:
                    subgraph = exclude_edges(subgraph, batch.exclude, self.num_nodes)
            yield self.loader.load(epoch, index, subgraph, targets=batch.targets)

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        batch.wait()
        return StepInputs(batch.blocks, batch.features)

    def describe(self) -> str:
        return f"sampler threads {self.sampler_threads}"

    def close(self) -> None:
        pass
