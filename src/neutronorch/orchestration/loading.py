"""Modes ``exact`` and ``device``, for both kinds of graph: a producer thread draws each batch's seeds
(``seeds.py``, ``link_seeds.py``), samples them with a sampler of its own (its vertex map is thread-private)
and loads them; the trainer only steps. Each batch depends only on its key ``batch_key(seed, epoch, index)``,
so a run resumes at any step.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.host_loader import HOST_SAMPLING_STAGES, HostLoader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.mode import Mode, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

# Mini-batches per call of a sampler that reads the device once for them all (``reads_grouped``); others
# take one per call, so none waits behind the others.
SAMPLE_GROUP = 4


class LoadingMode(Mode):
    """What exact and device mode share (a mixin, not a mode): the producer thread, named after the mode,
    samples with ``new_sampler()``'s sampler (seeds on ``sample_device``, on ``sample_stream`` if any)."""

    resumable = resumable_mid_epoch = True
    warm_epochs = 1
    new_sampler: Callable[[], object]
    sample_device = torch.device("cpu")
    sample_stream = None
    numbered = True  # a sample span carries its batch's index (device mode's do not)

    def __init__(self, seeds, loader, sampling, spans):
        self.seeds, self.loader, self.sampling, self.spans = seeds, loader, sampling, spans
        access = loader.access
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
        self.num_batches = seeds.num_batches

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        return Prefetcher(lambda: self._produce(epoch, start), depth=self.sampling.prefetch,
                          name=f"{self.name}-producer", threads=self.threads.get("sampler"))

    def _produce(self, epoch: int, start: int) -> Iterator:
        sampler = self.seeds.sampler(self.new_sampler())
        batches = self.seeds.epoch(epoch)
        with torch.cuda.stream(self.sample_stream):  # None: a no-op
            size = SAMPLE_GROUP if getattr(sampler, "reads_grouped", False) else 1
            for first in range(start, len(batches), size):
                group = [(index, batches[index]) for index in range(first, min(first + size, len(batches)))]
                with self.spans.stage("sample", first if self.numbered else -1):
                    device = self.sample_device
                    seeds = [batch.seeds.to(device, non_blocking=True) for _, batch in group]
                    keys = [batch_key(self.sampling.seed, epoch, index) for index, _ in group]
                    subgraphs = (sampler.sample_many(seeds, keys) if group[0][1].times is None else  # by time
                                 sampler.sample_timed(seeds, [batch.times for _, batch in group], keys))
                    subgraphs = [subgraph if batch.exclude is None else  # a link task's seed edges
                                 self.seeds.exclude(subgraph, batch.exclude.to(device, non_blocking=True))
                                 for (_, batch), subgraph in zip(group, subgraphs)]
                for (index, batch), subgraph in zip(group, subgraphs):
                    yield self.loader.load(epoch, index, subgraph, targets=batch.targets)

    def start(self, model: torch.nn.Module) -> None:
        """Place what the loader places once ``model`` is known (a typed graph's device reader)."""
        self.loader.start(model)
        if self.sample_stream is not None:  # after the copies, made on the training stream
            self.sample_stream.wait_stream(torch.cuda.current_stream(self.sample_device))

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        """The trainer's first call on a batch: its stream waits for the batch's copies."""
        batch.wait()
        return StepInputs(batch.blocks, batch.features, None, batch.ids)

    def summary(self) -> dict:
        return self.loader.summary()

    def close(self) -> None:
        self.loader.close()


class ExactMode(LoadingMode):
    """Sample and gather on the host (``host_loader.py``), train on the device, every layer computed exactly."""

    name = "exact"
    stages = HOST_SAMPLING_STAGES  # a run's: its loader's

    def __init__(self, seeds: NodeSeeds | LinkSeeds, new_sampler: Callable[[], NeighborSampler | TypedNeighborSampler],
                 loader: HostLoader, sampling: SamplingConfig, spans: Spans, sampler_threads: int):
        super().__init__(seeds, loader, sampling, spans)
        self.new_sampler = new_sampler
        self.threads = {"sampler": sampler_threads}

    def describe(self) -> str:
        return f"sampler threads {self.threads['sampler']}"


class DeviceMode(LoadingMode):
    """Sample and gather on the training device, like DGL-UVA and GNNLab: the device sampler over topology on
    the device (or read through UVA), rows through a device feature cache (``device_reader.py``), on a CUDA
    stream of its own, so only seed ids and cache misses cross the host-device boundary while training. With
    ``--device cpu`` the same code runs on host tensors."""

    name = "device"
    stages = StageTable({"sample": "sampler", "gather": "sampler"})
    threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads
    numbered = False

    def __init__(self, seeds: NodeSeeds | LinkSeeds, reader: DeviceReader, sampling: SamplingConfig, spans: Spans):
        super().__init__(seeds, reader, sampling, spans)
        self.device = self.sample_device = reader.device
        self.new_sampler = reader.new_sampler
        self.sample_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def describe(self) -> str:
        return "sampling and gathering on the training device"
