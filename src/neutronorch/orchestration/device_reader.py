"""Reading a device-sampled mini-batch's inputs on the device itself.

What the placement left in host memory (topology beyond the budget, feature rows not cached) is read by
the device in place: pinned host memory seen through a UVA view, or, where the platform cannot map it,
rows gathered on the host into pooled pinned buffers and copied (the staged fallback). On the CPU the
"device" is host memory and the same code runs on host tensors. ``DeviceReader`` serves device mode and
NeutronOrch's device sampling on a homogeneous graph.

A typed graph's (``TypedDeviceReader``): when the run starts (``start(model)``) each relation's topology and
edge features (``TypedTopology``) and the target's labels are moved to the device once, after checking that
they fit beside training's workspace (``typed_cache_rows``: the budget is ``gpu_memory_gb``, else the device's
memory; a ``ConfigError`` naming the sizes otherwise). What the budget still holds becomes a ``FeatureCache``
per featured type (``placement.cache_rows``, the homogeneous decision: every row when they fit, else the
hottest rows by ``typed_hotness_order`` under ``cache_policy``, the bytes shared over the types in proportion
to theirs, ``gpu_cache_gb`` capping them); the rows a cache misses are read in place or gathered by the type's
``FeatureStore`` and copied, as above. Its sampler is ``TypedDeviceSampler`` (for the same key, the host
sampler's blocks, bit for bit).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.config import PlacementConfig, SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features import memory
from neutronorch.features.cache import FeatureCache, typed_hotness_order
from neutronorch.features.placement import (GiB, cache_rows, device_budget, pin, to_device_in_slices, unpin,
                                            uva_view, workspace_bytes)
from neutronorch.features.store import BufferPool, FeatureStore, TypedInputs
from neutronorch.observe import Spans
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch, TypedBatch
from neutronorch.orchestration.mode import StepInputs
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.typed_device_sampler import (TypedDeviceSampler, TypedTopology, edge_feature_bytes,
                                                      topology_bytes)
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

logger = logging.getLogger("neutronorch")


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

    producer = "device-producer"  # the name of device mode's producer thread over it

    def __init__(self, graph: Graph, access: FeatureAccess, spans: Spans):
        self.access = access
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
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

    def start(self, model: torch.nn.Module) -> None:
        pass  # everything is placed when it is made

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        return StepInputs(batch.blocks, batch.features)

    def summary(self) -> dict:
        return {}

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


@dataclass
class TypedDeviceBatch(TypedBatch):
    """A batch made on the sampling stream: on CUDA, ``ready`` is the event after which it may be read."""

    ready: object = None
    cache_hits: int = 0  # input rows served by the device caches
    device_bytes: int = 0  # bytes their misses moved from the host to the device

    def counts(self) -> tuple[int, int, int, int, int]:
        """``TypedBatch.counts`` with the rows the device caches served and the bytes their misses moved."""
        return (*super().counts()[:3], self.cache_hits, self.device_bytes)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a training step reads."""
        found = [*self.features.values(), *self.ids.values(), self.labels]
        for tblock in self.blocks:
            found += [t for block in tblock.blocks.values() for t in block.tensors()]
            found += [*tblock.src_ids.values(), *tblock.edge_ids.values(), *tblock.edge_features.values()]
        return found

    def wait(self) -> None:
        """Order the current stream after the batch's sampling and gathering; no-op off CUDA."""
        if self.ready is None:
            return
        stream = torch.cuda.current_stream(self.labels.device)
        stream.wait_event(self.ready)
        for tensor in self.tensors():
            tensor.record_stream(stream)


def device_bytes(graph: TypedGraph, rows: dict[str, int] | None = None) -> dict[str, int]:
    """What device mode keeps on the device for a typed graph, in bytes: the topology and edge features
    (float32), the featured types' cached rows (``rows`` of each; default every row) as float32 with, for a
    partial cache, its slot map (int32 per vertex), the labels (int64) and the sampler's vertex maps (int64 per
    vertex)."""
    rows = {t: graph.num_nodes[t] for t in graph.features} if rows is None else rows
    slot_maps = sum(4 * graph.num_nodes[t] for t in graph.features if rows[t] < graph.num_nodes[t])
    return {"topology": topology_bytes(graph) + edge_feature_bytes(graph),
            "features": sum(4 * rows[t] * graph.feature_dim(t) for t in graph.features) + slot_maps,
            "labels": 8 * int(np.prod(graph.labels.shape)),
            "maps": 8 * sum(graph.num_nodes.values())}


def typed_cache_rows(graph: TypedGraph, model: torch.nn.Module, fanouts: dict[RelationType, list[int]],
                     batch_size: int, device_memory: int | None, config: PlacementConfig) -> dict[str, int]:
    """Rows of each featured type the device caches (``placement.cache_rows``), after checking that the
    topology, labels and vertex maps fit the budget with training's workspace (the model's parameters with
    their gradients and Adam's moments, the largest mini-batch's activations: ``workspace_bytes`` with, per
    layer, the fanouts summed over the relations into a type). The budget is ``gpu_memory_gb`` (at most the
    device's memory), else ``device_memory``; None (the CPU): not budgeted."""
    setting = None if config.gpu_cache_gb == 0 else config.gpu_cache_gb
    tables = {t: (graph.num_nodes[t], 4 * graph.feature_dim(t)) for t in graph.features}
    notes: list[str] = []
    if device_memory is None:
        return cache_rows(setting, None, tables, all(memory.fits_in_memory(a) for a in graph.features.values()),
                          notes)
    budget = device_budget(device_memory, config.gpu_memory_gb, notes)
    layers = len(next(iter(fanouts.values())))
    per_layer = [max(sum(f[h] if f[h] >= 0 else 64 for r, f in fanouts.items() if r[2] == t)
                     for t in graph.num_nodes) for h in range(layers)]
    width = max([graph.feature_dim(t) for t in graph.num_nodes] + [1])
    hidden = getattr(model, "arguments", {}).get("hidden", width)
    workspace = workspace_bytes(sum(graph.num_nodes.values()), width, hidden, graph.num_classes, per_layer,
                                batch_size)
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


class TypedDeviceReader:
    """A typed graph's topology, labels and device caches on ``device`` from ``start`` on, and the gathering of a
    batch's rows and labels there; ``close`` it."""

    producer = "typed-device-producer"
    store = placement = cache = None  # one device cache per featured type (``caches``), none of the graph's

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 device: torch.device, spans: Spans, placement: PlacementConfig, inputs: TypedInputs,
                 backend: str | None = None):
        self.graph, self.fanouts, self.sampling, self.device, self.spans = graph, fanouts, sampling, device, spans
        self.placement_config, self.inputs, self.backend = placement, inputs, backend
        self.sizes, self.sampler, self.caches, self.misses = device_bytes(graph), None, {}, {}
        self._keep: list[torch.Tensor] = []  # pinned host tensors that UVA views read

    def start(self, model: torch.nn.Module) -> None:
        """Place the topology and the labels on the device, after checking that they fit beside ``model``'s
        training, and fill each featured type's cache with as many of its hottest rows as the budget holds."""
        graph, device = self.graph, self.device
        memory_size = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        rows = typed_cache_rows(graph, model, self.fanouts, self.sampling.batch_size, memory_size,
                                self.placement_config)
        self.sizes = device_bytes(graph, rows)
        clock = time.perf_counter()
        topology = TypedTopology.of(graph, device, lambda array, what: place(array, device, what))
        order: dict[str, np.ndarray] = {}
        if any(rows[t] < graph.num_nodes[t] for t in rows):  # one presample ranks every type
            order = typed_hotness_order(graph, TypedNeighborSampler(graph, self.fanouts), graph.train_idx,
                                        self.sampling.batch_size, self.sampling.seed,
                                        self.placement_config.cache_policy)
        stores = self.inputs.stores
        self.caches = {t: FeatureCache(stores[t], order.get(t, np.empty(0, np.int64)), rows[t], device)
                       for t in graph.features}
        self.misses = {t: (misses_in_place(cache, stores[t], device, f"features of {t}", self._keep),
                           BufferPool(self.sampling.prefetch + 2, stores[t].width, stores[t].dtype,
                                      pin=device.type == "cuda")) for t, cache in self.caches.items()}
        self.labels = (place(np.asarray(graph.labels, dtype=np.int64), device, "labels") if graph.labels is not None
                       else None)  # a link task's graph may have none
        self.sampler = TypedDeviceSampler(topology, self.fanouts, backend=self.backend)
        self.backend = self.sampler.backend
        cached = ", ".join(f"{t} {rows[t]:,} of {graph.num_nodes[t]:,}" for t in rows)
        logger.info(f"device mode: {sum(self.sizes.values()) / GiB:.2f} GiB of topology, cached rows ({cached}), "
                    f"labels and maps on {device} in {time.perf_counter() - clock:.1f} s; sampling with "
                    f"{self.backend}")

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph, targets: torch.Tensor | None = None
             ) -> TypedDeviceBatch:
        """The batch of ``subgraph`` (on the device): each featured type's rows through its cache
        (``FeatureCache.gather``, the misses read in place or staged) and the seeds' labels (or ``targets``), its
        ready event recorded (call on the sampling stream)."""
        with self.spans.stage("gather", index):
            frontier, features, hits, moved = subgraph.input_nodes, {}, 0, 0
            for t, cache in self.caches.items():
                if t in frontier:
                    (view, pool), store = self.misses[t], self.inputs.stores[t]
                    features[t], served, read = cache.gather(frontier[t], view,
                                                             lambda missed: staged_fetch(missed, store, pool))
                    hits, moved = hits + served, moved + read
            on_cuda = self.device.type == "cuda"
            batch = TypedDeviceBatch(epoch, index, subgraph.blocks, features, dict(frontier),
                                     self.labels.index_select(0, subgraph.seeds) if targets is None
                                     else targets.to(self.device, non_blocking=True), subgraph.num_sampled_edges,
                                     sum(int(ids.shape[0]) for ids in frontier.values()), cache_hits=hits,
                                     device_bytes=moved if on_cuda else 0)
            if on_cuda:
                batch.ready = torch.cuda.Event()
                batch.ready.record()
        return batch

    def step_inputs(self, batch: TypedDeviceBatch) -> StepInputs:
        return StepInputs(batch.blocks, batch.features, None, batch.ids)

    def close(self) -> None:
        """Let go of the device's copies and unpin what the caches' misses were read from (a run's end)."""
        self.sampler, self.caches, self.misses = None, {}, {}
        release(self._keep)

    def summary(self) -> dict:
        """What device mode adds to the run summary: what it keeps on the device (``cache``: each featured type's
        cached rows and how its misses are read) and its sampler."""
        cache = {t: {"rows": c.rows, "of": self.graph.num_nodes[t],
                     "misses": "none" if c.full else "uva" if self.misses[t][0] is not None and
                     self.device.type == "cuda" else "host"} for t, c in self.caches.items()}
        return {"device_data": {"bytes": dict(self.sizes), "sampler": self.backend, "cache": cache}}
