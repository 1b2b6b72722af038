"""Exact mode on a typed graph: each mini-batch sampled whole (``TypedNeighborSampler.sample``) and gathered
on a producer thread, ahead of the trainer.

One producer thread per epoch (``Prefetcher``, up to ``prefetch`` batches ahead), with a sampler of its own
(a sampler is single-threaded state) and numba at ``sampler_threads`` there, so the trainer's torch and
numba work does not wait for the next batch's. Each batch is drawn with its key ``batch_key(seed, epoch,
index)`` and depends on it alone: the losses are those of sampling inline. Data parallel (``sampling.rank``
of ``sampling.world``), batch ``index`` is this rank's part of global batch ``index`` (``shard_batches``),
drawn with the global batch's key: the sampler keys each vertex's draws by the key and the vertex, so the
ranks together draw what one process draws for the global batch. The typed modes implement the ``Mode``
protocol (``mode.py``) as the homogeneous ones do; the model takes a typed batch's every type's ids too
(``StepInputs.ids``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numba
import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.features.store import TypedInputs
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.mode import StepHooksUnused, StepInputs
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import epoch_order, shard_batches
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_block import TypedBlock
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

TYPED_SAMPLING_STAGES = StageTable({"sample": "sampler", "gather": "sampler"})


def target_labels(graph: TypedGraph, seeds: np.ndarray) -> torch.Tensor:
    """The labels of target ids, int64 (a memory-mapped array is read at those rows only)."""
    return torch.from_numpy(np.asarray(graph.labels[seeds], dtype=np.int64))


def train_seeds(graph: TypedGraph) -> torch.Tensor:
    """The target vertices a typed mode's epochs go through (``train_idx``), int64."""
    return torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))


@dataclass
class TypedBatch:
    """A mini-batch as the trainer takes it: the blocks (bottom first, on the device), the bottom frontier's
    featured rows and every type's ids, the seeds' labels, and where it is in its epoch."""

    epoch: int
    index: int
    blocks: list[TypedBlock]
    features: dict[str, torch.Tensor]
    ids: dict[str, torch.Tensor]
    labels: torch.Tensor
    num_sampled_edges: int = 0
    num_inputs: int = 0
    stats: object = None  # NeutronOrch: the plan's stats, with a super-batch's first mini-batch

    def counts(self) -> tuple[int, int, int, int, int]:
        """(sampled edges, input rows, their feature bytes, rows a device cache served, bytes copied to the
        device for it): what an epoch's record sums (``MiniBatch.counts``); no typed mode caches rows."""
        return (self.num_sampled_edges, self.num_inputs, sum(x.nbytes for x in self.features.values()), 0, 0)

    def release(self) -> None:
        """Its tensors are its own: no buffer to give back."""


class TypedExact(StepHooksUnused):
    """The typed exact mode of one run."""

    name = "exact"
    stages = TYPED_SAMPLING_STAGES
    resumable = resumable_mid_epoch = True  # its batches depend only on (seed, epoch, batch)
    store = placement = cache = None  # it reads a typed graph's rows through ``inputs``' stores, no device cache

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 device: torch.device, spans: Spans, sampler_threads: int = 1, inputs: TypedInputs | None = None):
        self.graph, self.fanouts, self.sampling, self.device, self.spans = graph, fanouts, sampling, device, spans
        self.inputs = inputs if inputs is not None else TypedInputs(graph)  # the featured types' stores
        self.train_idx = train_seeds(graph)
        self.sampler_threads = sampler_threads
        self.threads = {"sampler": sampler_threads}
        self.num_batches = -(-self.train_idx.shape[0] // (sampling.batch_size * sampling.world))

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        """The epoch's mini-batches from ``start`` (a resumed run's position) on, produced ahead on a thread (a
        context manager: leaving it stops the thread)."""
        s = self.sampling
        order = epoch_order(self.train_idx, s.seed, epoch) if s.shuffle else self.train_idx
        batches = shard_batches(order, s.batch_size, s.rank, s.world)
        return Prefetcher(lambda: self._produce(epoch, batches, start), depth=s.prefetch, name="typed-producer",
                          on_start=lambda: numba.set_num_threads(self.sampler_threads))

    def summary(self) -> dict:
        """The host caches of its featured types and how their rows were read (``TypedInputs.summary``)."""
        return self.inputs.summary()

    def step_inputs(self, batch: TypedBatch) -> StepInputs:
        return StepInputs(batch.blocks, batch.features, None, batch.ids)

    def describe(self) -> str:
        return f"sampler threads {self.sampler_threads}"

    def close(self) -> None:
        """Nothing outlives an epoch."""

    def _produce(self, epoch: int, batches: tuple[torch.Tensor, ...], first: int) -> Iterator[TypedBatch]:
        sampler = TypedNeighborSampler(self.graph, self.fanouts)
        for index, seeds in enumerate(batches[first:], start=first):
            with self.spans.stage("sample", index):
                subgraph = sampler.sample(seeds.numpy(), batch_key(self.sampling.seed, epoch, index))
            with self.spans.stage("gather", index):
                features, ids = self.inputs(subgraph.input_nodes, self.device)
                labels = target_labels(self.graph, seeds.numpy()).to(self.device)
                blocks = [b.to(self.device) for b in subgraph.blocks]
            yield TypedBatch(epoch, index, blocks, features, ids, labels, subgraph.num_sampled_edges,
                             sum(int(v.shape[0]) for v in subgraph.input_nodes.values()))
