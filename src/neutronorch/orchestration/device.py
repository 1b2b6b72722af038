"""Mode ``device``, for both kinds of graph: sample and gather on the training device, like DGL-UVA and GNNLab.

The topology (CSC; a typed graph's every relation) is placed on the training device, or, when the memory budget
does not hold a homogeneous graph's, kept in pinned host memory that the device reads directly (UVA). Features
live in a device feature cache (every row when they fit; the hottest rows otherwise, the rest read from pinned
host memory through UVA, or gathered on the host and copied where UVA is unavailable); a typed graph has one
cache per featured type. A background thread samples with the device sampler (Triton kernels on CUDA, torch ops
elsewhere: ``sampling/device_sampler.py``, ``sampling/typed_device_sampler.py``) and gathers with
``index_select``, on its own CUDA stream, so nothing but seed ids and cache misses crosses the host-device
boundary during training. With ``--device cpu`` the same orchestration runs on host tensors.

The reader (``device_reader.py``: ``DeviceReader``) places the device topology (a typed graph's, with its
per-type caches, when the run starts), makes the sampler over it and reads a sampled subgraph's rows into a batch. Each batch is drawn with its key
``batch_key(seed, epoch, index)`` and depends on it alone, so a run resumes at any step; data parallel, the
key is the global batch's.

This is the placement NeutronOrch is compared with: fast while the graph and the features fit in device
memory, and the whole bottom layer is still computed on the device for every mini-batch.
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

# Mini-batches sampled per call of a device sampler that reads the device once for them all (``reads_grouped``);
# a sampler that would sample them one after another takes one per call, so none waits behind the others.
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
        """Place what the reader places once ``model`` is known (a typed graph's topology and caches)."""
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
