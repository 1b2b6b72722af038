"""Reading a device-sampled mini-batch's inputs on the device itself.

What the placement left in host memory (topology beyond the budget, feature rows not cached) is read by
the device in place: pinned host memory seen through a UVA view, or, where the platform cannot map it,
rows gathered on the host into pooled pinned buffers and copied (the staged fallback). On the CPU the
"device" is host memory and the same code runs on host tensors. Shared by device mode (a typed graph's
featured types each through ``misses_in_place`` and ``staged_fetch``) and NeutronOrch's device sampling.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.features import memory
from neutronorch.features.cache import FeatureCache
from neutronorch.features.placement import pin, to_device_in_slices, unpin, uva_view
from neutronorch.features.store import BufferPool, FeatureStore
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


def host_readable(array: np.ndarray, device: torch.device, what: str, keep: list[torch.Tensor],
                  required: bool = False) -> torch.Tensor | None:
    """``array`` as a tensor ``device`` reads in place: the host tensor itself on the CPU, a UVA view of pinned
    memory on CUDA (the pinned tensor appended to ``keep``, for ``release``); None (or, if ``required``, an
    error) when the platform cannot map it."""
    tensor = host_tensor(array, what)
    if device.type == "cpu":
        return tensor
    pinned, ok = pin(tensor, what)
    view = uva_view(pinned, device) if ok else None
    if view is None:
        if required:
            raise ConfigError(f"the {what} do not fit the device memory budget and cannot be read from "
                              f"pinned host memory here. Raise `gpu_memory_gb`, or use `mode` neutronorch "
                              f"with `device_sampling` off, or `mode` exact (both sample on the host).")
        return None
    keep.append(pinned)
    return view


def release(keep: list[torch.Tensor]) -> None:
    """Unpin what ``host_readable`` pinned in place (the views over it must no longer be used)."""
    for tensor in keep:
        unpin(tensor)
    keep.clear()


def misses_in_place(cache: FeatureCache | None, store: FeatureStore, device: torch.device, what: str,
                    keep: list[torch.Tensor]) -> torch.Tensor | None:
    """The rows a partial device ``cache`` misses as ``device`` reads them in place (``host_readable``), or None
    where they are gathered by the host instead (``staged_fetch``): every row cached, a host feature cache
    serving them, memory-mapped rows that do not fit in memory, or no UVA."""
    if cache is None or cache.full or store.host_cache is not None or not memory.fits_in_memory(store.features):
        return None
    return host_readable(store.features, device, what, keep)


def staged_fetch(missed: torch.Tensor, store: FeatureStore, pool: BufferPool) -> torch.Tensor:
    """Rows the device cannot read in place (``missed``, on the device): gathered on the host into a pooled
    pinned buffer and copied on the current (sampling) stream; the buffer returns to the pool once that copy
    has completed."""
    ids = missed.cpu()  # a sync in the sampling thread: the host needs the ids
    if missed.device.type == "cpu":
        return store.gather(ids)
    buffer = pool.acquire(ids.shape[0])
    rows = store.gather_into(ids, buffer).to(missed.device, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    pool.release_after(buffer, done)
    return rows


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
            self.indptr = host_readable(graph.indptr, self.device, "topology (indptr)", self._keep, required=True)
            self.indices = host_readable(graph.indices, self.device, "topology (indices)", self._keep, required=True)
        self.host_features = misses_in_place(access.cache, access.store, self.device, "features", self._keep)
        self.labels = access.store.labels.to(self.device)

    def close(self) -> None:
        """Unpin what was pinned in place (the views over it must no longer be used)."""
        release(self._keep)
        self.indptr = self.indices = self.host_features = None

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph,
             make: Callable[..., MiniBatch] = MiniBatch, targets: torch.Tensor | None = None) -> MiniBatch:
        """The batch of ``subgraph`` (input frontier on the device), built by ``make``: its rows and labels
        (or ``targets``, ``SeedBatch.targets``) gathered there, what is still on the host moved over, and its
        ready event recorded (call on the sampling stream)."""
        with self.spans.stage("gather"):
            store, pool = self.access.store, self.access.pool
            features, hits, moved = self.access.cache.gather(
                subgraph.input_nodes, self.host_features, lambda missed: staged_fetch(missed, store, pool))
            labels = (self.labels.index_select(0, subgraph.seeds.to(self.device, non_blocking=True))
                      if targets is None else targets)
            batch = make(epoch, index, subgraph, features, labels, cache_hits=hits)
            if self.access.on_cuda:
                batch.device_bytes = moved + batch.transfer_bytes()  # nothing crosses a link on the CPU
                batch.to(self.device, non_blocking=True)
                batch.mark_ready()
        return batch
