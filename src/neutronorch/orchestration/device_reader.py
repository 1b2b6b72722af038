"""Reading a device-sampled mini-batch's inputs on the device itself.

What the placement left in host memory (topology beyond the budget, feature rows not cached) is read by
the device in place: pinned host memory seen through a UVA view, or, where the platform cannot map it,
rows gathered on the host into pooled pinned buffers and copied (the staged fallback). On the CPU the
"device" is host memory and the same code runs on host tensors. Shared by device mode and NeutronOrch's
device sampling.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.features import memory
from neutronorch.features.placement import pin, to_device_in_slices, unpin, uva_view
from neutronorch.observe import Spans
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.sampling.block import SampledSubgraph


def place(array: np.ndarray, device: torch.device, what: str) -> torch.Tensor:
    """A host array as a tensor on ``device`` (zero-copy on the CPU for writable arrays; a memory map copied
    a slice at a time, never whole in host memory on the way to a GPU); a clear error when the device has
    no room."""
    if device.type == "cpu":
        return host_tensor(array, what)
    try:
        if isinstance(array, np.memmap):
            return to_device_in_slices(array, device)
        return host_tensor(array, what).to(device)
    except torch.cuda.OutOfMemoryError:
        raise ConfigError(f"the {what} ({array.nbytes / 2**30:.1f} GiB) do not fit in the memory of {device}. "
                          f"Lower `gpu_memory_gb` so that they are read from pinned host memory instead, or "
                          f"use `mode` neutronorch or exact, which sample on the host.") from None


def host_tensor(array: np.ndarray, what: str = "array") -> torch.Tensor:
    """A host array as a tensor, zero-copy when numpy allows it (read-only maps are copied into memory: a
    clear error when they cannot fit there)."""
    if not memory.fits_in_memory(array):
        raise ConfigError(f"the {what} ({array.nbytes / 2**30:.2f} GiB, memory-mapped) must be in memory for the "
                          f"device to sample from them, and only {memory.available_memory_bytes() / 2**30:.2f} GiB is "
                          f"available. Use `mode` exact, or neutronorch with `device_sampling` off: their "
                          f"samplers read memory-mapped topology from the file, in file order when it does not "
                          f"fit (`read_order`).")
    return tensor_from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array))


class DeviceReader:
    """The topology as the device's sampler reads it, and the gathering of a batch's rows and labels."""

    def __init__(self, graph: Graph, access: FeatureAccess, spans: Spans):
        self.access = access
        self.device = access.device
        self.spans = spans
        self._keep: list[torch.Tensor] = []  # pinned host tensors that UVA views read
        if access.placement.topology == "device":
            self.indptr = place(graph.indptr, self.device, "topology")
            self.indices = place(graph.indices, self.device, "topology")
        else:
            self.indptr = self._host_readable(graph.indptr, "topology (indptr)", required=True)
            self.indices = self._host_readable(graph.indices, "topology (indices)", required=True)
        self.host_features = None
        # Memory-mapped features that do not fit in memory (with or without a host feature cache) are read
        # through the host store, the device cache's misses gathered there.
        if (access.cache is not None and not access.cache.full and access.store.host_cache is None
                and memory.fits_in_memory(graph.features)):
            self.host_features = self._host_readable(graph.features, "features", required=False)
        self.labels = access.store.labels.to(self.device)

    def _host_readable(self, array: np.ndarray, what: str, required: bool) -> torch.Tensor | None:
        """``array`` as a tensor the device reads in place: the host tensor itself on the CPU, a UVA view of
        pinned memory on CUDA; None (or, if ``required``, an error) when the platform cannot map it."""
        tensor = host_tensor(array, what)
        if self.device.type == "cpu":
            return tensor
        pinned, ok = pin(tensor, what)
        view = uva_view(pinned, self.device) if ok else None
        if view is None:
            if required:
                raise ConfigError(f"the {what} do not fit the device memory budget and cannot be read from "
                                  f"pinned host memory here. Raise `gpu_memory_gb`, or use `mode` neutronorch "
                                  f"with `device_sampling` off, or `mode` exact (both sample on the host).")
            return None
        self._keep.append(pinned)
        return view

    def close(self) -> None:
        """Unpin what was pinned in place (the views over it must no longer be used)."""
        for tensor in self._keep:
            unpin(tensor)
        self._keep.clear()
        self.indptr = self.indices = self.host_features = None

    def _staged_fetch(self, missed: torch.Tensor) -> torch.Tensor:
        """Rows the device cannot read in place: gathered on the host into a pooled pinned buffer and copied
        on the current (sampling) stream; the buffer returns to the pool once that copy has completed."""
        ids = missed.cpu()  # a sync in the sampling thread: the host needs the ids
        store, pool = self.access.store, self.access.pool
        if self.device.type == "cpu":
            return store.gather(ids)
        buffer = pool.acquire(ids.shape[0])
        rows = store.gather_into(ids, buffer).to(self.device, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        pool.release_after(buffer, done)
        return rows

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph,
             make: Callable[..., MiniBatch] = MiniBatch, targets: torch.Tensor | None = None) -> MiniBatch:
        """The batch of ``subgraph`` (input frontier on the device), built by ``make``: its rows and labels
        (or ``targets``, ``SeedBatch.targets``) gathered there, what is still on the host moved over, and its
        ready event recorded (call on the sampling stream)."""
        with self.spans.stage("gather"):
            features, hits, moved = self.access.cache.gather(subgraph.input_nodes, self.host_features,
                                                             self._staged_fetch)
            labels = (self.labels.index_select(0, subgraph.seeds.to(self.device, non_blocking=True))
                      if targets is None else targets)
            batch = make(epoch, index, subgraph, features, labels, cache_hits=hits)
            if self.access.on_cuda:
                batch.device_bytes = moved + batch.transfer_bytes()  # nothing crosses a link on the CPU
                batch.to(self.device, non_blocking=True)
                batch.mark_ready()
        return batch
