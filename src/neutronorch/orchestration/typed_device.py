"""Mode ``device`` on a typed graph: every relation's topology on the training device, each featured type's
rows in a device feature cache, each mini-batch sampled and gathered there.

The homogeneous device mode (``device.py``) made typed. When the run starts (``start(model)``) the topology (each
relation's ``indptr``/``indices`` and edge features, ``TypedTopology``) and the target's labels are moved to the
device once, after checking that they fit beside training's workspace (``typed_cache_rows``: the budget is
``gpu_memory_gb``, else the device's memory; a ``ConfigError`` naming the sizes otherwise). What the budget
still holds becomes a ``FeatureCache`` per featured type (``placement.cache_rows``, the homogeneous decision:
every row when they fit, else the hottest rows by ``typed_hotness_order`` under ``cache_policy``, the bytes
shared over the types in proportion to theirs, ``gpu_cache_gb`` capping them). Rows a cache misses are read
from pinned host memory in place (UVA) or gathered by the type's ``FeatureStore`` and copied
(``device_reader.py``). Each
epoch's seed order crosses once; a producer thread (``Prefetcher``, up to ``prefetch`` batches ahead)
samples each batch with ``TypedDeviceSampler`` (``sampling/typed_device_sampler.py``: for the same key, the
host sampler's blocks, bit for bit) and gathers its rows and labels, on a CUDA stream
of its own; each batch carries an event that the trainer's stream waits on before reading it (``step_inputs``,
the trainer's first call on a batch). Nothing crosses from the host per batch but the sampler's reads of
sizes and the cache misses. On the CPU the "device" is host memory: the same code on host tensors (a partial
cache when ``gpu_cache_gb`` is a number), which is how the tests check it (exact mode's losses, step for step).

Relations with edge features keep them on the device too (float32); the sampler reads each batch's edge rows
there by the edges' ids. Evaluation is the trainer's (host sampling, ``typed_logits``), as in the other typed
modes.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from neutronorch.config import PlacementConfig, SamplingConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.cache import FeatureCache, typed_hotness_order
from neutronorch.features.memory import fits_in_memory
from neutronorch.features.placement import GiB, cache_rows, device_budget, workspace_bytes
from neutronorch.features.store import BufferPool, TypedInputs
from neutronorch.observe import Spans
from neutronorch.orchestration.batch import TypedBatch
from neutronorch.orchestration.device_reader import misses_in_place, place, release, staged_fetch
from neutronorch.orchestration.host_loader import TYPED_SAMPLING_STAGES
from neutronorch.orchestration.mode import StepHooksUnused, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import epoch_order, shard_batches
from neutronorch.orchestration.seeds import training_seeds as train_seeds
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_device_sampler import (TypedDeviceSampler, TypedTopology, edge_feature_bytes,
                                                      topology_bytes)
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

logger = logging.getLogger("neutronorch")


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
    """What the mode keeps on the device, in bytes: the topology and edge features (float32), the featured
    types' cached rows (``rows`` of each; default every row) as float32 with, for a partial cache, its slot
    map (int32 per vertex), the labels (int64) and the sampler's vertex maps (int64 per vertex)."""
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
        return cache_rows(setting, None, tables, all(fits_in_memory(a) for a in graph.features.values()), notes)
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


class TypedDevice(StepHooksUnused):
    """The typed device mode of one run: the data on ``device`` from ``start`` on; ``close`` it."""

    name = "device"
    stages = TYPED_SAMPLING_STAGES
    resumable = resumable_mid_epoch = True  # its batches depend only on (seed, epoch, batch)
    store = placement = cache = None  # one device cache per featured type (``caches``), none of the graph's
    threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 device: torch.device, spans: Spans, placement: PlacementConfig, inputs: TypedInputs,
                 backend: str | None = None):
        self.graph, self.fanouts, self.sampling, self.device, self.spans = graph, fanouts, sampling, device, spans
        self.placement_config, self.inputs, self.backend = placement, inputs, backend
        self.train_idx = train_seeds(graph)
        self.num_batches = -(-self.train_idx.shape[0] // (sampling.batch_size * sampling.world))
        self.sizes, self.sampler, self.stream, self.caches, self.misses = device_bytes(graph), None, None, {}, {}
        self._keep: list[torch.Tensor] = []  # pinned host tensors that UVA views read

    def start(self, model: torch.nn.Module) -> None:
        """Place the topology and the labels on the device, after checking that they fit beside ``model``'s
        training, and fill each featured type's cache with as many of its hottest rows as the budget holds."""
        graph, device = self.graph, self.device
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        rows = typed_cache_rows(graph, model, self.fanouts, self.sampling.batch_size, memory, self.placement_config)
        self.sizes = device_bytes(graph, rows)
        clock = time.perf_counter()
        self.topology = TypedTopology.of(graph, device, lambda array, what: place(array, device, what))
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
        self.labels = place(np.asarray(graph.labels, dtype=np.int64), device, "labels")
        self.sampler = TypedDeviceSampler(self.topology, self.fanouts, backend=self.backend)
        self.backend = self.sampler.backend
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(device))  # the copies above, made on that stream
        cached = ", ".join(f"{t} {rows[t]:,} of {graph.num_nodes[t]:,}" for t in rows)
        logger.info(f"device mode: {sum(self.sizes.values()) / GiB:.2f} GiB of topology, cached rows ({cached}), "
                    f"labels and maps on {device} in {time.perf_counter() - clock:.1f} s; sampling with "
                    f"{self.backend}")

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        """The epoch's mini-batches from ``start`` (a resumed run's position) on, sampled and gathered ahead on a
        thread (a context manager: leaving it stops the thread)."""
        order = epoch_order(self.train_idx, self.sampling.seed, epoch) if self.sampling.shuffle else self.train_idx
        return Prefetcher(lambda: self._produce(epoch, order, start), depth=self.sampling.prefetch,
                          name="typed-device-producer")

    def step_inputs(self, batch: TypedDeviceBatch) -> StepInputs:
        """The trainer's first call on a batch: its stream waits for the batch."""
        batch.wait()
        return StepInputs(batch.blocks, batch.features, None, batch.ids)

    def describe(self) -> str:
        return "sampling and gathering on the training device"

    def close(self) -> None:
        """Let go of the device's copies and unpin what the caches' misses were read from (a run's end)."""
        self.topology = self.sampler = None
        self.caches, self.misses = {}, {}
        release(self._keep)

    def summary(self) -> dict:
        """What the mode adds to the run summary: what it keeps on the device (``cache``: each featured type's
        cached rows and how its misses are read) and its sampler."""
        cache = {t: {"rows": c.rows, "of": self.graph.num_nodes[t],
                     "misses": "none" if c.full else "uva" if self.misses[t][0] is not None and
                     self.device.type == "cuda" else "host"} for t, c in self.caches.items()}
        return {"device_data": {"bytes": dict(self.sizes), "sampler": self.backend, "cache": cache}}

    def _produce(self, epoch: int, order: torch.Tensor, first: int = 0) -> Iterator[TypedDeviceBatch]:
        s = self.sampling
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            batches = shard_batches(order.to(self.device), s.batch_size, s.rank, s.world)  # the epoch's one copy
            for index, seeds in enumerate(batches[first:], start=first):
                with self.spans.stage("sample", index):
                    subgraph = self.sampler.sample(seeds, batch_key(s.seed, epoch, index))
                with self.spans.stage("gather", index):
                    frontier = subgraph.input_nodes
                    features, hits, moved = self._gather(frontier)
                    batch = TypedDeviceBatch(epoch, index, subgraph.blocks, features, dict(frontier),
                                             self.labels.index_select(0, seeds), subgraph.num_sampled_edges,
                                             sum(int(ids.shape[0]) for ids in frontier.values()), cache_hits=hits,
                                             device_bytes=moved if self.stream is not None else 0)
                    if self.stream is not None:
                        batch.ready = torch.cuda.Event()
                        batch.ready.record(self.stream)
                yield batch

    def _gather(self, frontier: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int, int]:
        """Each featured type's rows of ``frontier`` through its cache (``FeatureCache.gather``, the misses read in
        place or staged); the rows the caches served and the bytes read from the host."""
        features, hits, moved = {}, 0, 0
        for t, cache in self.caches.items():
            if t in frontier:
                view, pool = self.misses[t]
                store = self.inputs.stores[t]
                features[t], served, read = cache.gather(frontier[t], view,
                                                         lambda missed: staged_fetch(missed, store, pool))
                hits, moved = hits + served, moved + read
        return features, hits, moved
