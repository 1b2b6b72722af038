"""Mode ``device``: sample and gather on the training device, like DGL-UVA and GNNLab.

The topology (CSC) is placed on the training device, or, when the memory budget does not hold it, kept
in pinned host memory that the device reads directly (UVA). Features live in the device feature cache
(every row when they fit; the hottest rows otherwise, the rest read from pinned host memory through UVA,
or gathered on the host and copied where UVA is unavailable). A background thread samples with the
vectorised torch sampler and gathers with ``index_select``, on its own CUDA stream, so nothing but seed
ids and cache misses crosses the host-device boundary during training. With ``--device cpu`` the same
orchestration runs on host tensors (the stages then share the CPU with training, as every mode does on a
CPU-only machine).

This is the placement NeutronOrch is compared with: fast while the graph and the features fit in device
memory, and the whole bottom layer is still computed on the device for every mini-batch.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Iterator

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.features.placement import pin, unpin, uva_view
from neutronorch.orchestration.exact import ExactMode, epoch_order
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.sampling.block import MiniBatch, SampledSubgraph
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key


def place(array: np.ndarray, device: torch.device, what: str) -> torch.Tensor:
    """A host array as a tensor on ``device`` (zero-copy on the CPU for writable arrays); a clear error when
    the device has no room."""
    tensor = host_tensor(array)
    if device.type == "cpu":
        return tensor
    try:
        return tensor.to(device)
    except torch.cuda.OutOfMemoryError:
        raise ConfigError(f"the {what} ({tensor.nbytes / 2**30:.1f} GiB) do not fit in the memory of {device}. "
                          f"Lower --gpu-memory-gb so that they are read from pinned host memory instead, or "
                          f"use --mode neutronorch or --mode exact, which sample on the host.") from None


def host_tensor(array: np.ndarray) -> torch.Tensor:
    """A host array as a tensor, zero-copy when numpy allows it (read-only maps are copied)."""
    return torch.from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array))


class DeviceReader:
    """Device-side reads of what the placement left in host memory: pinned tensors, their UVA views, and
    the staged-copy fallback. Shared by device mode and NeutronOrch's device sampling."""

    def __init__(self, mode: ExactMode):
        self.mode = mode
        self.device = mode.device
        self._keep: list[torch.Tensor] = []  # pinned host tensors that UVA views read
        placement = mode.placement
        if placement.topology == "device":
            self.indptr = place(mode.graph.indptr, self.device, "topology")
            self.indices = place(mode.graph.indices, self.device, "topology")
        else:
            self.indptr = self._host_readable(mode.graph.indptr, "topology (indptr)", required=True)
            self.indices = self._host_readable(mode.graph.indices, "topology (indices)", required=True)
        self.host_features = None
        if mode.cache is not None and not mode.cache.full:
            self.host_features = self._host_readable(mode.graph.features, "features", required=False)
        self.labels = mode.store.labels.to(self.device)

    def _host_readable(self, array: np.ndarray, what: str, required: bool) -> torch.Tensor | None:
        """``array`` as a tensor the device reads in place: the host tensor itself on the CPU, a UVA view of
        pinned memory on CUDA; None (or, if ``required``, an error) when the platform cannot map it."""
        tensor = host_tensor(array)
        if self.device.type == "cpu":
            return tensor
        pinned, ok = pin(tensor, what)
        view = uva_view(pinned, self.device) if ok else None
        if view is None:
            if required:
                raise ConfigError(f"the {what} do not fit the device memory budget and cannot be read from "
                                  f"pinned host memory here. Raise --gpu-memory-gb, or use --mode neutronorch "
                                  f"with --device-sampling off, or --mode exact (both sample on the host).")
            return None
        self._keep.append(pinned)
        return view

    def close(self) -> None:
        """Unpin what was pinned in place (the views over it must no longer be used)."""
        for tensor in self._keep:
            unpin(tensor)
        self._keep.clear()
        self.indptr = self.indices = self.host_features = None

    def features(self, rows: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """``features[rows]`` for device-resident ``rows``: (features, cache hits, bytes copied)."""
        return self.mode.cache.gather(rows, self.host_features, self._staged_fetch)

    def _staged_fetch(self, missed: torch.Tensor) -> torch.Tensor:
        """Rows the device cannot read in place: gathered on the host into a pooled pinned buffer and copied
        on the current (sampling) stream; the buffer returns to the pool once that copy has completed."""
        ids = missed.cpu()  # a sync in the sampling thread: the host needs the ids
        store, pool = self.mode.store, self.mode.pool
        if self.device.type == "cpu":
            return store.gather(ids)
        buffer = pool.acquire(ids.shape[0])
        rows = store.gather_into(ids, buffer).to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        pool.release_after(buffer, done)
        return rows

    def ship(self, epoch: int, index: int, subgraph: SampledSubgraph, splice=None) -> MiniBatch:
        """A batch whose input frontier is on the device: gather its rows and labels there, move the other
        blocks over, and mark when it is ready (call on the sampling stream)."""
        t0 = time.perf_counter()
        features, hits, moved = self.features(subgraph.input_nodes)
        labels = self.labels.index_select(0, subgraph.seeds.to(self.device, non_blocking=True))
        if self.device.type == "cuda":
            moved += sum(b.indptr.nbytes + b.indices.nbytes for b in subgraph.blocks if not b.indptr.is_cuda)
            subgraph.blocks = [b.to(self.device, non_blocking=True) for b in subgraph.blocks]
            if splice is not None:
                moved += sum(t.nbytes for t in splice.index.tensors())
                splice = splice.to(self.device, non_blocking=True)
        batch = MiniBatch(epoch, index, subgraph, features, labels, splice=splice)
        batch.cache_hits = hits
        batch.device_bytes = moved if self.device.type == "cuda" else 0  # nothing crosses a link on the CPU
        if self.device.type == "cuda":
            batch.ready = torch.cuda.Event()
            batch.ready.record()
        self.mode.spans.add("gather", t0, time.perf_counter())
        return batch


class DeviceMode(ExactMode):
    name = "device"

    def __init__(self, graph: Graph, config: TrainConfig, device: torch.device, sampler_threads: int):
        super().__init__(graph, config, device, sampler_threads)
        self.reader = DeviceReader(self)
        self.sample_stream = torch.cuda.Stream(device) if self.on_cuda else None

    def close(self) -> None:
        super().close()
        self.reader.close()

    def batches(self, epoch: int) -> Prefetcher:
        """This epoch's mini-batches, sampled and gathered on the device in a background thread."""
        return Prefetcher(lambda: self._produce(epoch), depth=self.config.prefetch, name=f"{self.name}-producer")

    def _produce(self, epoch: int) -> Iterator[MiniBatch]:
        sampler = TorchNeighborSampler(self.reader.indptr, self.reader.indices, self.config.fanouts)
        order = epoch_order(self.train_idx, self.config.seed, epoch)
        stream_context = torch.cuda.stream(self.sample_stream) if self.on_cuda else nullcontext()
        with stream_context:
            for index, seeds in enumerate(torch.split(order, self.config.batch_size)):
                t0 = time.perf_counter()
                seeds = seeds.to(self.device, non_blocking=True)
                subgraph = sampler.sample(seeds, batch_key(self.config.seed, epoch, index))
                self.spans.add("sample", t0, time.perf_counter())
                yield self.reader.ship(epoch, index, subgraph)
