"""Mode ``device`` on a typed graph: every relation's topology and every featured type's rows on the training
device, each mini-batch sampled and gathered there.

The homogeneous device mode (``device.py``) made typed. At construction the topology (each relation's
``indptr``/``indices`` and edge features, ``TypedTopology``), the featured types' rows (as float32) and the
target's labels are moved to the device once, after checking that they fit beside training's workspace
(``check_fits``: the budget is ``gpu_memory_gb``, else the device's memory; a ``ConfigError`` naming the
sizes otherwise). Each
epoch's seed order crosses once; a producer thread (``Prefetcher``, up to ``prefetch`` batches ahead)
samples each batch with ``TypedDeviceSampler`` (``sampling/typed_device_sampler.py``: for the same key, the
host sampler's blocks, bit for bit) and gathers its rows and labels with ``index_select``, on a CUDA stream
of its own; each batch carries an event that the trainer's stream waits on before reading it (``hot_rows``,
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

from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.placement import GiB, workspace_bytes
from neutronorch.orchestration.device_reader import place
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import epoch_order, shard_batches
from neutronorch.orchestration.typed_exact import TypedBatch
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


class TypedDevice:
    """The typed device mode of one run: the data on ``device`` from construction on; ``close`` it."""

    name = "device"
    shuffle = True  # False (a loader's choice, set on the mode): ``train_idx`` in its given order every epoch

    def __init__(self, graph: TypedGraph, model: torch.nn.Module, fanouts: dict[RelationType, list[int]],
                 train_idx: torch.Tensor, batch_size: int, seed: int, device: torch.device, prefetch: int = 2,
                 gpu_memory_gb: float | None = None, backend: str | None = None, shard: tuple[int, int] = (0, 1)):
        memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
        self.sizes = check_fits(graph, model, fanouts, batch_size, memory, gpu_memory_gb)
        clock = time.perf_counter()
        self.graph, self.train_idx, self.batch_size, self.seed = graph, train_idx, batch_size, seed
        self.device, self.prefetch = device, prefetch
        self.shard = shard  # (rank, world): data parallel, this rank's part of each global batch (typed_exact.py)
        self.topology = TypedTopology.of(graph, device, lambda array, what: place(array, device, what))
        self.features = {t: place(rows, device, f"features of {t}").float() for t, rows in graph.features.items()}
        self.labels = place(np.asarray(graph.labels, dtype=np.int64), device, "labels")
        self.sampler = TypedDeviceSampler(self.topology, fanouts, backend=backend)
        self.backend = self.sampler.backend
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(device))  # the copies above, made on that stream
        logger.info(f"device mode: {sum(self.sizes.values()) / GiB:.2f} GiB of topology, features, labels and "
                    f"maps on {device} in {time.perf_counter() - clock:.1f} s; sampling with {self.backend}")

    def epoch(self, epoch: int, count: int, first: int = 0) -> Prefetcher:
        """The epoch's mini-batches from ``first`` (a resumed run's position) to ``count``, sampled and gathered
        ahead on a thread (a context manager: leaving it stops the thread)."""
        order = epoch_order(self.train_idx, self.seed, epoch) if self.shuffle else self.train_idx
        global_batch = self.batch_size * self.shard[1]
        assert -(-order.shape[0] // global_batch) == count, "the epoch's batch count is the trainer's"
        return Prefetcher(lambda: self._produce(epoch, order, first), depth=self.prefetch,
                          name="typed-device-producer")

    def hot_rows(self, batch: TypedDeviceBatch, version: int) -> None:
        """Device mode reuses no rows. The trainer's first call on a batch: its stream waits for the batch."""
        batch.wait()
        return None

    def finish(self, batch: TypedDeviceBatch) -> None:
        """Nothing to add to a step's gradients."""

    def state(self) -> None:
        """Nothing of the mode outlives a step: a resumed run needs no state of it."""
        return None

    def close(self) -> None:
        """Let go of the device's copies (a run's end)."""
        self.topology = self.sampler = None
        self.features = {}

    def records(self) -> dict:
        """What the mode adds to an epoch's record: nothing."""
        return {}

    def summary(self, hot: dict) -> dict:
        """What the mode adds to the run summary: what it keeps on the device and its sampler."""
        return {"device_data": {"bytes": dict(self.sizes), "sampler": self.backend}}

    def state(self) -> None:
        """Nothing of the mode outlives a step (a batch depends on its key alone): a resumed run needs no state
        of it."""
        return None

    def _produce(self, epoch: int, order: torch.Tensor, first: int = 0) -> Iterator[TypedDeviceBatch]:
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            batches = shard_batches(order.to(self.device), self.batch_size, *self.shard)  # the epoch's one copy
            for index, seeds in enumerate(batches[first:], start=first):
                clock = time.perf_counter()
                subgraph = self.sampler.sample(seeds, batch_key(self.seed, epoch, index))
                sampled = time.perf_counter()
                frontier = subgraph.input_nodes
                features = {t: rows.index_select(0, frontier[t]) for t, rows in self.features.items() if t in frontier}
                batch = TypedDeviceBatch(subgraph.blocks, features, dict(frontier), self.labels.index_select(0, seeds),
                                         {"sample": sampled - clock, "gather": 0.0}, subgraph.num_sampled_edges,
                                         sum(int(ids.shape[0]) for ids in frontier.values()))
                if self.stream is not None:
                    batch.ready = torch.cuda.Event()
                    batch.ready.record(self.stream)
                done = time.perf_counter()
                batch.seconds["gather"] = done - sampled
                batch.spans = [("sample", clock, sampled), ("gather", sampled, done)]
                yield batch
