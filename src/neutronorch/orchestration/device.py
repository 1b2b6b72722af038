"""Mode ``device``, for both kinds of graph: sample and gather on the training device, like DGL-UVA and GNNLab.

A background thread samples with the device sampler over topology on the device (or read through UVA) and
gathers through a device feature cache (``device_reader.py``), on its own CUDA stream, so only seed ids and
cache misses cross the host-device boundary while training. With ``--device cpu`` the same code runs on host
tensors. Each batch depends only on its key ``batch_key(seed, epoch, index)``, so a run resumes at any step.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Iterator

import torch

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.mode import LoadingMode
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.neighbor_sampler import batch_key

# Mini-batches per call of a sampler that reads the device once for them all (``reads_grouped``); others
# take one per call, so none waits behind the others.
SAMPLE_GROUP = 4


class DeviceMode(LoadingMode):
    name = "device"
    stages = StageTable({"sample": "sampler", "gather": "sampler"})
    threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads

    def __init__(self, seeds: NodeSeeds | LinkSeeds, reader: DeviceReader, sampling: SamplingConfig, spans: Spans):
        super().__init__(seeds, reader, sampling, spans)
        self.device = reader.device
        self.sample_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def start(self, model: torch.nn.Module) -> None:
        """Place what the reader places once ``model`` is known (a typed graph's)."""
        self.loader.start(model)
        if self.sample_stream is not None:
            self.sample_stream.wait_stream(torch.cuda.current_stream(self.device))  # the copies, made on that stream

    def _produce(self, epoch: int, start: int) -> Iterator:
        sampler = self.seeds.sampler(self.loader.new_sampler())
        batches = self.seeds.epoch(epoch)
        with torch.cuda.stream(self.sample_stream) if self.sample_stream is not None else nullcontext():
            size = SAMPLE_GROUP if getattr(sampler, "reads_grouped", False) else 1
            for first in range(start, len(batches), size):
                group = [(index, batches[index]) for index in range(first, min(first + size, len(batches)))]
                with self.spans.stage("sample"):
                    seeds = [batch.seeds.to(self.device, non_blocking=True) for _, batch in group]
                    subgraphs = sampler.sample_many(seeds, [batch_key(self.sampling.seed, epoch, index)
                                                            for index, _ in group])
                    subgraphs = [subgraph if batch.exclude is None else
                                 self.seeds.exclude(subgraph, batch.exclude.to(self.device, non_blocking=True))
                                 for (_, batch), subgraph in zip(group, subgraphs)]
                for (index, batch), subgraph in zip(group, subgraphs):
                    yield self.loader.load(epoch, index, subgraph, targets=batch.targets)

    def describe(self) -> str:
        return "sampling and gathering on the training device"
