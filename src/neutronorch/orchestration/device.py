"""Mode ``device``, for both kinds of graph: sample and gather on the training device, like DGL-UVA and GNNLab.

The topology (CSC; a typed graph's every relation) is placed on the training device, or, when the memory budget
does not hold a homogeneous graph's, kept in pinned host memory that the device reads directly (UVA). Features
live in a device feature cache (every row when they fit; the hottest rows otherwise, the rest read from pinned
host memory through UVA, or gathered on the host and copied where UVA is unavailable); a typed graph has one
cache per featured type. A background thread samples with the device sampler (Triton kernels on CUDA, torch ops
elsewhere: ``sampling/device_sampler.py``, ``sampling/typed_device_sampler.py``) and gathers with
``index_select``, on its own CUDA stream, so nothing but seed ids and cache misses crosses the host-device
boundary during training. With ``--device cpu`` the same orchestration runs on host tensors.

What differs by kind of graph is handed in by the factory: the sampler over the device topology and the reader
of a sampled subgraph's rows into a batch (``device_reader.py``: ``DeviceReader``, or ``TypedDeviceReader``
with its per-type caches, placed when the run starts). Each batch is drawn with its key
``batch_key(seed, epoch, index)`` and depends on it alone, so a run resumes at any step; data parallel, the
key is the global batch's.

This is the placement NeutronOrch is compared with: fast while the graph and the features fit in device
memory, and the whole bottom layer is still computed on the device for every mini-batch.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Iterator

import torch

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.device_reader import DeviceReader, TypedDeviceReader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.mode import StepHooksUnused, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.neighbor_sampler import batch_key

# Mini-batches sampled per call of the device sampler (one host synchronisation for them all).
SAMPLE_GROUP = 4


class DeviceMode(StepHooksUnused):
    name = "device"
    stages = StageTable({"sample": "sampler", "gather": "sampler"})
    resumable = resumable_mid_epoch = True  # its batches depend only on (seed, epoch, batch)
    threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads

    def __init__(self, seeds: NodeSeeds | LinkSeeds, new_sampler: Callable, reader: DeviceReader | TypedDeviceReader,
                 sampling: SamplingConfig, spans: Spans):
        self.seeds, self.new_sampler, self.reader = seeds, new_sampler, reader
        self.sampling, self.spans = sampling, spans
        self.device = reader.device
        self.store, self.placement, self.cache = reader.store, reader.placement, reader.cache
        self.num_batches = seeds.num_batches
        self.sample_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def start(self, model: torch.nn.Module) -> None:
        """Place what the reader places once ``model`` is known (a typed graph's topology and caches)."""
        self.reader.start(model)
        if self.sample_stream is not None:
            self.sample_stream.wait_stream(torch.cuda.current_stream(self.device))  # the copies, made on that stream

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        """This epoch's mini-batches from number ``start`` on, sampled and gathered on the device in a
        background thread."""
        return Prefetcher(lambda: self._produce(epoch, start), depth=self.sampling.prefetch, name=self.reader.producer)

    def _produce(self, epoch: int, start: int) -> Iterator:
        sampler = self.new_sampler()
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
                                 self.seeds.exclude(subgraph, batch.exclude.to(self.device, non_blocking=True))
                                 for (_, batch), subgraph in zip(group, subgraphs)]
                for (index, batch), subgraph in zip(group, subgraphs):
                    yield self.reader.load(epoch, index, subgraph, targets=batch.targets)

    def step_inputs(self, batch) -> StepInputs:
        """The trainer's first call on a batch: its stream waits for the batch."""
        batch.wait()
        return self.reader.step_inputs(batch)

    def summary(self) -> dict:
        return self.reader.summary()

    def describe(self) -> str:
        return "sampling and gathering on the training device"

    def close(self) -> None:
        self.reader.close()
