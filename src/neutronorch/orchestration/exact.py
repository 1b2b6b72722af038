"""Mode ``exact``: sample and gather on the host, train on the device, every layer computed exactly.

The stages of one mini-batch, in the producer thread: seed order -> sample (host kernels) -> gather
features into a reused buffer (pinned on CUDA) -> copy to the device on a side stream. The training thread
only runs forward/backward/step. A mode is the one place that arranges these stages; the trainer, the
sampler and the models are shared by every mode.
"""

from __future__ import annotations

import time
from typing import Iterator

import numba
import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.features.cache import FeatureCache, hotness_order
from neutronorch.features.placement import placement_for
from neutronorch.features.store import BufferPool, FeatureStore
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.sampling.block import MiniBatch
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key, mix_key
from neutronorch.train.telemetry import Spans


def epoch_order(train_idx: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """The seed order of one epoch: a permutation derived from (seed, epoch) alone."""
    generator = torch.Generator()
    generator.manual_seed(mix_key(seed, epoch) & 0x7FFF_FFFF_FFFF_FFFF)
    return train_idx[torch.randperm(train_idx.shape[0], generator=generator)]


class ExactMode:
    name = "exact"

    def __init__(self, graph: Graph, config: TrainConfig, device: torch.device, sampler_threads: int):
        self.graph = graph
        self.config = config
        self.device = device
        self.sampler_threads = sampler_threads
        self.store = FeatureStore(graph.features, graph.labels)
        self.train_idx = torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))  # small; a writable copy
        self.on_cuda = device.type == "cuda"
        # Buffers in flight: the queue, one being filled, one being trained on.
        self.pool = BufferPool(config.prefetch + 2, self.store.width, pin=self.on_cuda)
        self.copy_stream = torch.cuda.Stream(device) if self.on_cuda else None
        self._sampler: NeighborSampler | None = None
        self.spans = Spans()  # every stage's time, from every thread (see train/telemetry.py)
        self.placement = placement_for(graph, config, device)
        # Where the device samples, its reads go through the cache even when it holds no row.
        needs_cache = self.placement.features != "host" or self.placement.topology != "host"
        self.cache = self._build_cache() if needs_cache else None

    def _build_cache(self) -> FeatureCache:
        """The device feature cache the placement asks for (every row when they all fit)."""
        rows = self.placement.cache_rows
        order = np.empty(0, np.int64)
        if 0 < rows < self.graph.num_nodes:
            order = hotness_order(self.graph.indptr, self.graph.indices, self.graph.train_idx, self.config.fanouts,
                                  self.config.batch_size, self.config.seed, self.config.cache_policy)
        try:
            return FeatureCache(self.store, order, rows, self.device,
                                device_lookup=self.placement.topology != "host")
        except torch.cuda.OutOfMemoryError:
            raise ConfigError(f"the device feature cache ({self.placement.cache_bytes / 2**30:.2f} GiB) does not "
                              f"fit in the memory of {self.device}. Lower --gpu-cache-gb or --gpu-memory-gb "
                              f"(rows not cached are read from host memory).") from None

    # Hooks the training loop calls; exact mode needs none of them.
    def start(self, model: torch.nn.Module) -> None:
        """Before the first epoch."""

    def close(self) -> None:
        """After the last epoch, or on any error: stop every thread the mode runs."""

    def before_step(self, batch: MiniBatch) -> None:
        """After the backward pass, before the optimizer step."""

    def after_step(self, batch: MiniBatch) -> None:
        """After the optimizer step."""

    def end_epoch(self, record: dict) -> None:
        """After each epoch's training (before evaluation), with the epoch's record."""

    def summary(self) -> dict:
        """Mode-specific entries of the run summary."""
        return {}

    @property
    def num_batches(self) -> int:
        return -(-self.train_idx.shape[0] // self.config.batch_size)

    def batches(self, epoch: int) -> Prefetcher:
        """This epoch's mini-batches, produced ahead in a background thread."""
        return Prefetcher(lambda: self._produce(epoch), depth=self.config.prefetch, name=f"{self.name}-producer",
                          on_start=lambda: numba.set_num_threads(self.sampler_threads))

    def _produce(self, epoch: int) -> Iterator[MiniBatch]:
        # A fresh sampler per producer thread: its vertex map is thread-private state.
        sampler = NeighborSampler(self.graph.indptr, self.graph.indices, self.config.fanouts)
        order = epoch_order(self.train_idx, self.config.seed, epoch)
        for index, seeds in enumerate(torch.split(order, self.config.batch_size)):
            t0 = time.perf_counter()
            subgraph = sampler.sample(seeds.numpy(), batch_key(self.config.seed, epoch, index))
            self.spans.add("sample", t0, time.perf_counter())
            yield self._gather_and_ship(epoch, index, subgraph)

    def _gather_and_ship(self, epoch: int, index: int, subgraph, splice=None) -> MiniBatch:
        """Gather a sampled subgraph's features and labels into a pooled buffer and, on CUDA, start the copy
        to the device (``splice``, if any, an object with ``to(device)``, travels along). With a device
        feature cache only the rows it misses are gathered and copied; the device assembles the rest."""
        t0 = time.perf_counter()
        rows = subgraph.input_nodes
        parts = None
        if self.cache is None:
            buffer = self.pool.acquire(rows.shape[0])
            features = self.store.gather_into(rows, buffer)
            hits = 0
        else:
            slots, miss_pos, missed = self.cache.split(rows)
            buffer = self.pool.acquire(missed.shape[0])
            features = self.store.gather_into(torch.from_numpy(missed), buffer)
            parts = [torch.from_numpy(slots), torch.from_numpy(miss_pos)]
            hits = rows.shape[0] - missed.shape[0]
        labels = self.store.labels[subgraph.seeds]
        t1 = time.perf_counter()
        self.spans.add("gather", t0, t1)
        batch = MiniBatch(epoch, index, subgraph, features, labels, splice=splice)
        batch.cache_hits = hits
        if self.on_cuda:
            batch.device_bytes = self._copy_to_device(batch, buffer, parts)
            self.spans.add("copy", t1, time.perf_counter())
        elif parts is not None:
            batch.features = self.cache.assemble(*parts, features)  # a copy: the buffer is free
            self.pool.release(buffer)
        else:
            batch.release = lambda: self.pool.release(buffer)
        return batch

    def _copy_to_device(self, batch: MiniBatch, buffer: torch.Tensor, parts: list | None = None) -> int:
        """Start the batch's copy to the device (on the copy stream, not waited for here); return the bytes
        copied. With ``parts`` (every row's cache slot, the misses' positions), ``batch.features`` holds
        only the missed rows, and the batch's rows are assembled on the device from the cache."""
        moved = batch.features.nbytes + batch.labels.nbytes
        moved += sum(t.nbytes for b in batch.blocks for t in (b.indptr, b.indices))
        moved += sum(t.nbytes for t in parts) if parts else 0
        if batch.splice is not None:
            moved += sum(t.nbytes for t in batch.splice.index.tensors())
        with torch.cuda.stream(self.copy_stream):
            if batch.splice is not None:
                batch.splice = batch.splice.to(self.device, non_blocking=True)
            features = batch.features.to(self.device, non_blocking=True)
            if parts is not None:
                parts = [t.pin_memory().to(self.device, non_blocking=True) for t in parts]
                features = self.cache.assemble(*parts, features)
            batch.features = features
            batch.labels = batch.labels.to(self.device, non_blocking=True)
            batch.subgraph.blocks = [b.to(self.device, non_blocking=True) for b in batch.blocks]
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        # The pinned buffer is refilled only after the copy out of it has finished: the pool holds it back
        # until the event completes, without blocking this thread now.
        self.pool.release_after(buffer, done)
        batch.ready = done
        return moved

    def prepare(self, batch: MiniBatch) -> None:
        """Called in the training thread before the step: order the step after the batch's copy."""
        if self.on_cuda:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(batch.ready)
            for tensor in [batch.features, batch.labels] + [t for b in batch.blocks for t in (b.indptr, b.indices)]:
                tensor.record_stream(stream)

    def forward(self, model: torch.nn.Module, batch: MiniBatch) -> torch.Tensor:
        return model(batch.blocks, batch.features)
