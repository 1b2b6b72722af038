"""Reading a device-sampled mini-batch's inputs on the device itself, for both kinds of graph (device mode,
and NeutronOrch's device sampling on a homogeneous graph).

What the placement left in host memory is read by the device in place (pinned memory through a UVA view),
or where the platform cannot map it gathered on the host into pooled pinned buffers and copied. On the CPU
the same code runs on host tensors.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.config import PlacementConfig, SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features import memory
from neutronorch.features.cache import FeatureCache, hotness_order
from neutronorch.features.placement import (GiB, cache_rows, device_budget, pin, to_device_in_slices, unpin,
                                            typed_workspace, uva_view)
from neutronorch.features.store import BufferPool, FeatureStore
from neutronorch.observe import Spans
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch, per_type
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.device_sampler import make_device_sampler
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler, topology_bytes

logger = logging.getLogger("neutronorch")


def place(array: np.ndarray, device: torch.device, what: str) -> torch.Tensor:
    """A host array as a tensor on ``device`` (a memory map copied a slice at a time); ``ConfigError`` when
    the device has no room."""
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
    """A host array as a tensor, zero-copy when numpy allows it (read-only maps are copied: ``ConfigError``
    when they do not fit in memory)."""
    if not memory.fits_in_memory(array):
        raise ConfigError(f"the {what} ({array.nbytes / 2**30:.2f} GiB, memory-mapped) must be in memory for the "
                          f"device to sample from them, and only {memory.available_memory_bytes() / 2**30:.2f} GiB is "
                          f"available. Use `mode` exact, or neutronorch with `device_sampling` off: their "
                          f"samplers read memory-mapped topology from the file, in file order when it does not "
                          f"fit (`read_order`).")
    return tensor_from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array))


def host_readable(array: np.ndarray, device: torch.device, what: str, keep: list[torch.Tensor],
                  required: bool = False) -> torch.Tensor | None:
    """``array`` as ``device`` reads it in place: the host tensor on the CPU, a UVA view on CUDA (its pinned
    tensor appended to ``keep``); None, or if ``required`` a ``ConfigError``, where it cannot be mapped."""
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


def misses_in_place(cache: FeatureCache | None, store: FeatureStore, device: torch.device, what: str,
                    keep: list[torch.Tensor]) -> torch.Tensor | None:
    """The rows a partial ``cache`` misses as ``device`` reads them in place, or None where the host gathers
    them (``staged_fetch``): all cached, a host cache serving them, a map too large for memory, or no UVA."""
    if cache is None or cache.full or store.host_cache is not None or not memory.fits_in_memory(store.features):
        return None
    return host_readable(store.features, device, what, keep)


def staged_fetch(missed: torch.Tensor, store: FeatureStore, pool: BufferPool) -> torch.Tensor:
    """Rows ``missed`` (on the device) gathered on the host into a pooled pinned buffer and copied on the
    current stream; the buffer returns to the pool after the copy."""
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
    """The topology the device's sampler reads (``new_sampler``) and the gathering of a batch's rows and
    labels there. A typed graph's (``config``: its placement, ``fanouts``: per relation) is placed by
    ``start``."""

    def __init__(self, graph: Graph | TypedGraph, access: FeatureAccess, spans: Spans, sampling: SamplingConfig,
                 config: PlacementConfig | None = None, fanouts: dict[RelationType, list[int]] | None = None):
        self.graph, self.access, self.spans, self.sampling = graph, access, spans, sampling
        self.device = access.device
        self.placement_config, self.fanouts, self.sampler, self.backend = config, fanouts, None, None
        self.typed_sampler = TypedDeviceSampler  # what ``start`` samples a typed graph with (by time: temporal.py's)
        self._keep: list[torch.Tensor] = []  # pinned host tensors that UVA views read
        if access.inputs is not None:  # a typed graph's: placed by ``start``
            self.sizes, self.stores, self.caches, self.misses = device_bytes(graph), access.inputs.stores, {}, {}
            return
        if access.placement.topology == "device":
            self.indptr = place(graph.indptr, self.device, "topology")
            self.indices = place(graph.indices, self.device, "topology")
        else:
            self.indptr = host_readable(graph.indptr, self.device, "topology (indptr)", self._keep, required=True)
            self.indices = host_readable(graph.indices, self.device, "topology (indices)", self._keep, required=True)
        # A homogeneous graph's rows are its one type's ("").
        self.stores, self.caches = {"": access.store}, {"": access.cache}
        self.misses = {"": (misses_in_place(access.cache, access.store, self.device, "features", self._keep),
                            access.pool)}
        self.labels = access.store.labels.to(self.device)

    def start(self, model: torch.nn.Module) -> None:
        """A typed graph's: place the topology and labels, after checking that they fit beside ``model``'s
        training, and fill each featured type's cache with its hottest rows the budget holds."""
        if self.access.inputs is None:
            return
        graph, device, sampling = self.graph, self.device, self.sampling
        memory_size = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        rows = typed_cache_rows(graph, model, self.fanouts, sampling.batch_size, memory_size, self.placement_config)
        self.sizes = device_bytes(graph, rows)
        clock = time.perf_counter()
        self.sampler = self.typed_sampler(graph, device, self.fanouts,
                                          tensor=lambda array, what: place(array, device, what))
        order: dict[str, np.ndarray] = {}
        if any(rows[t] < graph.num_nodes[t] for t in rows):  # one presample ranks every type
            order = hotness_order(graph, self.fanouts, sampling.batch_size, sampling.seed,
                                  self.placement_config.cache_policy)
        stores = self.stores
        self.caches = {t: FeatureCache(stores[t], order.get(t, np.empty(0, np.int64)), rows[t], device)
                       for t in graph.features}
        self.misses = {t: (misses_in_place(cache, stores[t], device, f"features of {t}", self._keep),
                           BufferPool(sampling.prefetch + 2, stores[t].width, stores[t].dtype,
                                      pin=device.type == "cuda")) for t, cache in self.caches.items()}
        self.labels = (place(np.asarray(graph.labels, dtype=np.int64), device, "labels") if graph.labels is not None
                       else None)  # a link task's graph may have none
        self.backend = self.sampler.backend
        cached = ", ".join(f"{t} {rows[t]:,} of {graph.num_nodes[t]:,}" for t in rows)
        logger.info(f"device mode: {sum(self.sizes.values()) / GiB:.2f} GiB of topology, cached rows ({cached}), "
                    f"labels and maps on {device} in {time.perf_counter() - clock:.1f} s; sampling with "
                    f"{self.backend}")

    def like_topology(self, array: np.ndarray, what: str) -> torch.Tensor:
        """``array`` (one entry per edge, such as edge times) where the homogeneous topology is: on the device,
        or pinned and read through UVA."""
        if self.access.placement.topology == "device":
            return place(array, self.device, what)
        return host_readable(array, self.device, what, self._keep, required=True)

    def new_sampler(self):
        """The sampler of a producer thread (a typed graph's: the one ``start`` made)."""
        if self.access.inputs is not None:
            return self.sampler
        return make_device_sampler(self.indptr, self.indices, self.sampling.fanouts, self.sampling.degrees)

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph,
             make: Callable[..., MiniBatch] = MiniBatch, targets: torch.Tensor | None = None) -> MiniBatch:
        """The batch of ``subgraph`` (frontier on the device), built by ``make``, its rows gathered through
        their caches and its labels (or ``targets``) there, its ready event recorded (sampling stream)."""
        with self.spans.stage("gather", index):
            frontier = per_type(subgraph.input_nodes)
            read = {t: self._gather(t, frontier[t]) for t in self.caches if t in frontier}
            features = {t: rows for t, (rows, _, _) in read.items()}
            features = features if isinstance(subgraph.input_nodes, dict) else features[""]
            hits, moved = sum(r[1] for r in read.values()), sum(r[2] for r in read.values())
            labels = (self.labels.index_select(0, subgraph.seeds.to(self.device, non_blocking=True))
                      if targets is None else targets)
            batch = make(epoch, index, subgraph, features, labels, cache_hits=hits)
            if self.access.on_cuda:
                batch.device_bytes = moved + batch.transfer_bytes()  # nothing crosses a link on the CPU
                batch.to(self.device, non_blocking=True)
                batch.mark_ready()
        return batch

    def _gather(self, node_type: str, rows: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        (view, pool), store = self.misses[node_type], self.stores[node_type]
        return self.caches[node_type].gather(rows, view, lambda missed: staged_fetch(missed, store, pool))

    def close(self) -> None:
        """At a run's end: drop the device's copies and unpin what UVA views read."""
        for tensor in self._keep:
            unpin(tensor)
        self._keep.clear()
        self.indptr = self.indices = self.sampler = None
        self.caches, self.misses = {}, {}

    def summary(self) -> dict:
        """A typed graph's ``device_data``: its bytes there, how each cache's misses are read, its sampler."""
        if self.access.inputs is None:
            return {}
        cache = {t: {"rows": c.rows, "of": self.graph.num_nodes[t],
                     "misses": "none" if c.full else "uva" if self.misses[t][0] is not None and
                     self.device.type == "cuda" else "host"} for t, c in self.caches.items()}
        return {"device_data": {"bytes": dict(self.sizes), "sampler": self.backend, "cache": cache}}


def device_bytes(graph: TypedGraph, rows: dict[str, int] | None = None) -> dict[str, int]:
    """Bytes device mode keeps on the device for a typed graph: topology and edge features, cached rows
    (``rows`` per featured type, default all; float32, with an int32 slot map per vertex when partial),
    labels (int64) and the sampler's vertex maps (int64 per vertex)."""
    rows = {t: graph.num_nodes[t] for t in graph.features} if rows is None else rows
    slot_maps = sum(4 * graph.num_nodes[t] for t in graph.features if rows[t] < graph.num_nodes[t])
    return {"topology": topology_bytes(graph),
            "features": sum(4 * rows[t] * graph.feature_dim(t) for t in graph.features) + slot_maps,
            "labels": 0 if graph.labels is None else 8 * int(np.prod(graph.labels.shape)),
            "maps": 8 * sum(graph.num_nodes.values())}


def typed_cache_rows(graph: TypedGraph, model: torch.nn.Module, fanouts: dict[RelationType, list[int]],
                     batch_size: int, device_memory: int | None, config: PlacementConfig) -> dict[str, int]:
    """Rows of each featured type the device caches (``placement.cache_rows``), after checking that the
    topology, labels and vertex maps fit the budget (``gpu_memory_gb``, else ``device_memory``; None: not
    budgeted) beside training's workspace; ``ConfigError`` naming the sizes otherwise."""
    setting = None if config.gpu_cache_gb == 0 else config.gpu_cache_gb
    tables = {t: (graph.num_nodes[t], 4 * graph.feature_dim(t)) for t in graph.features}
    notes: list[str] = []
    if device_memory is None:
        return cache_rows(setting, None, tables, all(memory.fits_in_memory(a) for a in graph.features.values()),
                          notes)
    budget = device_budget(device_memory, config.gpu_memory_gb, notes)
    workspace = typed_workspace(graph, fanouts, getattr(model, "arguments", {}).get("hidden"), batch_size)
    workspace += 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    sizes = device_bytes(graph, {t: 0 for t in graph.features})
    need = sum(sizes.values()) - sizes["features"] + workspace
    if need > budget:
        given = config.gpu_memory_gb
        where = f"`gpu_memory_gb` {given}" if given is not None else "the device's memory"
        raise ConfigError(
            f"`mode` device: {graph.name} does not fit on the device. Its topology and edge features take "
            f"{sizes['topology'] / GiB:.2f} GiB, the labels and the sampler's vertex maps "
            f"{(sizes['labels'] + sizes['maps']) / GiB:.2f} GiB, and training about {workspace / GiB:.2f} GiB (the "
            f"model, its optimizer state and a mini-batch's activations): {need / GiB:.2f} GiB before any feature "
            f"row, against {budget / GiB:.2f} GiB ({where}). Raise `gpu_memory_gb`, lower `batch_size` or "
            f"`fanouts`, or use `mode` exact or neutronorch, which sample on the host.")
    rows = cache_rows(setting, budget - need, tables, True, notes)
    for note in notes:
        logger.info(f"device mode: {note}")
    return rows
