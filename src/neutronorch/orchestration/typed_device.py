"""Mode ``device`` on a typed graph: every relation's topology and every featured type's rows on the training
device, each mini-batch sampled and gathered there.

The homogeneous device mode (``device.py``) made typed. When the run starts (``start(model)``) the topology (each
relation's ``indptr``/``indices`` and edge features, ``TypedTopology``), the featured types' rows (as float32)
and the target's labels are moved to the device once, after checking that they fit beside training's workspace
(``check_fits``: the budget is ``gpu_memory_gb``, else the device's memory; a ``ConfigError`` naming the
sizes otherwise). Each
epoch's seed order crosses once; a producer thread (``Prefetcher``, up to ``prefetch`` batches ahead)
samples each batch with ``TypedDeviceSampler`` (``sampling/typed_device_sampler.py``: for the same key, the
host sampler's blocks, bit for bit) and gathers its rows and labels with ``index_select``, on a CUDA stream
of its own; each batch carries an event that the trainer's stream waits on before reading it (``step_inputs``,
the trainer's first call on a batch). Nothing crosses from the host per batch but the sampler's reads of
sizes. On the CPU the "device" is host memory: the same code on host tensors, which is how the tests check
it (exact mode's losses, step for step).

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

from neutronorch.config import SamplingConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.placement import GiB, workspace_bytes
from neutronorch.observe import Spans
from neutronorch.orchestration.batch import TypedBatch
from neutronorch.orchestration.device_reader import place
from neutronorch.orchestration.host_loader import TYPED_SAMPLING_STAGES
from neutronorch.orchestration.mode import StepHooksUnused, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import epoch_order, shard_batches
from neutronorch.orchestration.seeds import training_seeds as train_seeds
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_device_sampler import (TypedDeviceSampler, TypedTopology, edge_feature_bytes,
                                                      topology_bytes)

logger = logging.getLogger("neutronorch")


@dataclass
class TypedDeviceBatch(TypedBatch):
    """A batch made on the sampling stream: on CUDA, ``ready`` is the event after which it may be read."""

    ready: object = None

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


def device_bytes(graph: TypedGraph) -> dict[str, int]:
    """What the mode keeps on the device, in bytes: the topology and edge features (float32), the featured
    types' rows as float32, the labels (int64) and the sampler's vertex maps (int64 per vertex)."""
    return {"topology": topology_bytes(graph) + edge_feature_bytes(graph),
            "features": sum(4 * int(np.prod(rows.shape)) for rows in graph.features.values()),
            "labels": 8 * int(np.prod(graph.labels.shape)),
            "maps": 8 * sum(graph.num_nodes.values())}


def check_fits(graph: TypedGraph, model: torch.nn.Module, fanouts: dict[RelationType, list[int]], batch_size: int,
               device_memory: int | None, gpu_memory_gb: float | None) -> dict[str, int]:
    """``device_bytes(graph)``, after checking that they fit the budget with training's workspace (the
    model's parameters with their gradients and Adam's moments, the largest mini-batch's activations:
    ``workspace_bytes`` with, per layer, the fanouts summed over the relations into a type). The budget is
    ``gpu_memory_gb`` (at most the device's memory), else ``device_memory``; None (the CPU): not checked."""
    sizes = device_bytes(graph)
    if device_memory is None:
        return sizes
    budget = device_memory if gpu_memory_gb is None else min(device_memory, int(gpu_memory_gb * GiB))
    layers = len(next(iter(fanouts.values())))
    per_layer = [max(sum(f[h] if f[h] >= 0 else 64 for r, f in fanouts.items() if r[2] == t)
                     for t in graph.num_nodes) for h in range(layers)]
    width = max([graph.feature_dim(t) for t in graph.num_nodes] + [1])
    hidden = getattr(model, "arguments", {}).get("hidden", width)
    workspace = workspace_bytes(sum(graph.num_nodes.values()), width, hidden, graph.num_classes, per_layer,
                                batch_size)
    workspace += 4 * sum(p.numel() * p.element_size() for p in model.parameters())
    need = sum(sizes.values()) + workspace
    if need > budget:
        where = f"`gpu_memory_gb` {gpu_memory_gb}" if gpu_memory_gb is not None else "the device's memory"
        raise ConfigError(
            f"`mode` device: {graph.name} does not fit on the device. Its topology and edge features take "
            f"{sizes['topology'] / GiB:.2f} GiB, its features as float32 {sizes['features'] / GiB:.2f} GiB, the "
            f"labels and the sampler's vertex maps {(sizes['labels'] + sizes['maps']) / GiB:.2f} GiB, and training "
            f"about {workspace / GiB:.2f} GiB (the model, its optimizer state and a mini-batch's activations): "
            f"{need / GiB:.2f} GiB against {budget / GiB:.2f} GiB ({where}). Raise `gpu_memory_gb`, lower "
            f"`batch_size` or `fanouts`, or use `mode` exact or neutronorch, which sample on the host.")
    return sizes


class TypedDevice(StepHooksUnused):
    """The typed device mode of one run: the data on ``device`` from ``start`` on; ``close`` it."""

    name = "device"
    stages = TYPED_SAMPLING_STAGES
    resumable = resumable_mid_epoch = True  # its batches depend only on (seed, epoch, batch)
    store = placement = cache = None  # every featured type's rows on the device, no cache of them
    threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 device: torch.device, spans: Spans, gpu_memory_gb: float | None = None, backend: str | None = None):
        self.graph, self.fanouts, self.sampling, self.device, self.spans = graph, fanouts, sampling, device, spans
        self.gpu_memory_gb, self.backend = gpu_memory_gb, backend
        self.train_idx = train_seeds(graph)
        self.num_batches = -(-self.train_idx.shape[0] // (sampling.batch_size * sampling.world))
        self.sizes, self.sampler, self.stream = device_bytes(graph), None, None

    def start(self, model: torch.nn.Module) -> None:
        """Place the topology, the featured types' rows and the labels on the device, after checking that they
        fit beside ``model``'s training (``check_fits``)."""
        graph, device = self.graph, self.device
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        self.sizes = check_fits(graph, model, self.fanouts, self.sampling.batch_size, memory, self.gpu_memory_gb)
        clock = time.perf_counter()
        self.topology = TypedTopology.of(graph, device, lambda array, what: place(array, device, what))
        self.features = {t: place(rows, device, f"features of {t}").float() for t, rows in graph.features.items()}
        self.labels = place(np.asarray(graph.labels, dtype=np.int64), device, "labels")
        self.sampler = TypedDeviceSampler(self.topology, self.fanouts, backend=self.backend)
        self.backend = self.sampler.backend
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(device))  # the copies above, made on that stream
        logger.info(f"device mode: {sum(self.sizes.values()) / GiB:.2f} GiB of topology, features, labels and "
                    f"maps on {device} in {time.perf_counter() - clock:.1f} s; sampling with {self.backend}")

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
        """Let go of the device's copies (a run's end)."""
        self.topology = self.sampler = None
        self.features = {}

    def summary(self) -> dict:
        """What the mode adds to the run summary: what it keeps on the device and its sampler."""
        return {"device_data": {"bytes": dict(self.sizes), "sampler": self.backend}}

    def _produce(self, epoch: int, order: torch.Tensor, first: int = 0) -> Iterator[TypedDeviceBatch]:
        s = self.sampling
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            batches = shard_batches(order.to(self.device), s.batch_size, s.rank, s.world)  # the epoch's one copy
            for index, seeds in enumerate(batches[first:], start=first):
                with self.spans.stage("sample", index):
                    subgraph = self.sampler.sample(seeds, batch_key(s.seed, epoch, index))
                with self.spans.stage("gather", index):
                    frontier = subgraph.input_nodes
                    features = {t: rows.index_select(0, frontier[t]) for t, rows in self.features.items()
                                if t in frontier}
                    batch = TypedDeviceBatch(epoch, index, subgraph.blocks, features, dict(frontier),
                                             self.labels.index_select(0, seeds), subgraph.num_sampled_edges,
                                             sum(int(ids.shape[0]) for ids in frontier.values()))
                    if self.stream is not None:
                        batch.ready = torch.cuda.Event()
                        batch.ready.record(self.stream)
                yield batch
