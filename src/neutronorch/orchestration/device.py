"""Mode ``device``: sample and gather on the training device, like DGL-UVA and GNNLab.

The topology (CSC) is placed on the training device, or, when the memory budget does not hold it, kept
in pinned host memory that the device reads directly (UVA). Features live in the device feature cache
(every row when they fit; the hottest rows otherwise, the rest read from pinned host memory through UVA,
or gathered on the host and copied where UVA is unavailable): ``device_reader.py``. A background thread
samples with the device sampler (Triton kernels on CUDA, torch ops elsewhere: ``sampling/device_sampler.py``)
and gathers with ``index_select``, on its own CUDA stream, so nothing but seed ids and cache misses crosses
the host-device boundary during training. With ``--device cpu`` the same orchestration runs on host tensors.

This is the placement NeutronOrch is compared with: fast while the graph and the features fit in device
memory, and the whole bottom layer is still computed on the device for every mini-batch.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Iterator

import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.mode import StepHooksUnused, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.device_sampler import make_device_sampler
from neutronorch.sampling.exclude import exclude_edges
from neutronorch.sampling.neighbor_sampler import batch_key


# Mini-batches sampled per call of the device sampler (one host synchronisation for them all).
SAMPLE_GROUP = 4


class DeviceMode(StepHooksUnused):
    name = "device"
    stages = StageTable({"sample": "sampler", "gather": "sampler"})
    resumable = resumable_mid_epoch = True  # its batches depend only on (seed, epoch, batch)

    def __init__(self, graph: Graph, sampling: SamplingConfig, access: FeatureAccess, spans: Spans,
                 seeds: NodeSeeds | None = None):
        self.sampling = sampling
        self.device = access.device
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
        self.spans = spans
        self.threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads
        self.num_nodes = graph.num_nodes
        self.seeds = seeds if seeds is not None else NodeSeeds(graph, sampling)
        self.num_batches = self.seeds.num_batches
        self.reader = DeviceReader(graph, access, spans)
        self.sample_stream = torch.cuda.Stream(self.device) if access.on_cuda else None

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        """This epoch's mini-batches from number ``start`` on, sampled and gathered on the device in a
        background thread."""
        return Prefetcher(lambda: self._produce(epoch, start), depth=self.sampling.prefetch,
                          name=f"{self.name}-producer")

    def _produce(self, epoch: int, start: int) -> Iterator[MiniBatch]:
        sampler = make_device_sampler(self.reader.indptr, self.reader.indices, self.sampling.fanouts,
                                      self.sampling.degrees)
        batches = self.seeds.epoch(epoch)
        with torch.cuda.stream(self.sample_stream) if self.sample_stream is not None else nullcontext():
            # A few mini-batches per call: the device sampler reads the device once for them all.
            for first in range(start, len(batches), SAMPLE_GROUP):
                group = [(index, batches[index]) for index in range(first, min(first + SAMPLE_GROUP, len(batches)))]
                with self.spans.stage("sample"):
                    seeds = [batch.seeds.to(self.device, non_blocking=True) for _, batch in group]
                    subgraphs = sampler.sample_many(seeds, [batch_key(self.sampling.seed, epoch, index)
                                                            for index, _ in group])
                    subgraphs = [subgraph if batch.exclude is None else
                                 exclude_edges(subgraph, batch.exclude.to(self.device, non_blocking=True),
                                               self.num_nodes)
                                 for (_, batch), subgraph in zip(group, subgraphs)]
                for (index, batch), subgraph in zip(group, subgraphs):
                    yield self.reader.load(epoch, index, subgraph, targets=batch.targets)

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        batch.wait()
        return StepInputs(batch.blocks, batch.features)

    def describe(self) -> str:
        return "sampling and gathering on the training device"

    def close(self) -> None:
        self.reader.close()
