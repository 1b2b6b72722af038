"""Exact mode on a typed graph: each mini-batch sampled whole (``TypedNeighborSampler.sample``) and gathered
on a producer thread, ahead of the trainer.

One producer thread per epoch (``Prefetcher``, up to ``prefetch`` batches ahead), with a sampler of its own
(a sampler is single-threaded state) and numba at ``sampler_threads`` there, so the trainer's torch and
numba work does not wait for the next batch's. Each batch is drawn with its key ``batch_key(seed, epoch,
index)`` and depends on it alone: the losses are those of sampling inline. Data parallel (``shard`` = (rank,
world)), batch ``index`` is this rank's part of global batch ``index`` (``shard_batches``), drawn with the
global batch's key: the sampler keys each vertex's draws by the key and the vertex, so the ranks together
draw what one process draws for the global batch. ``TypedNeutronOrch``
(``typed_neutronorch.py``) is the other typed mode, behind the same four calls: ``epoch``, ``hot_rows``,
``finish`` and ``close``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numba
import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import epoch_order, shard_batches
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_block import TypedBlock
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

# inputs(frontier, device) -> (rows of the featured types, ids of every type), both on ``device``
Inputs = Callable[[dict[str, torch.Tensor], torch.device], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]
Labels = Callable[[np.ndarray], torch.Tensor]


@dataclass
class TypedBatch:
    """A mini-batch as the trainer takes it: the blocks (bottom first, on the device), the bottom frontier's
    featured rows and every type's ids, the seeds' labels, and the producer's seconds per stage."""

    blocks: list[TypedBlock]
    features: dict[str, torch.Tensor]
    ids: dict[str, torch.Tensor]
    labels: torch.Tensor
    seconds: dict[str, float]
    num_sampled_edges: int = 0
    num_inputs: int = 0
    stats: object = None  # NeutronOrch: the plan's stats, with a super-batch's first mini-batch
    spans: list = field(default_factory=list)  # (stage, start, end) of the producer's (and host's) work on it


class TypedExact:
    """The typed exact mode of one run."""

    name = "exact"
    shuffle = True  # False (a loader's choice, set on the mode): ``train_idx`` in its given order every epoch

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], train_idx: torch.Tensor,
                 batch_size: int, seed: int, device: torch.device, inputs: Inputs, labels: Labels,
                 prefetch: int = 2, sampler_threads: int = 1, shard: tuple[int, int] = (0, 1)):
        self.graph, self.fanouts, self.train_idx = graph, fanouts, train_idx
        self.batch_size, self.seed, self.device = batch_size, seed, device
        self.inputs, self.labels = inputs, labels
        self.prefetch, self.sampler_threads = prefetch, sampler_threads
        self.shard = shard  # (rank, world): data parallel, this rank's part of each global batch

    def epoch(self, epoch: int, count: int, first: int = 0) -> Prefetcher:
        """The epoch's mini-batches from ``first`` (a resumed run's position) to ``count``, produced ahead on a
        thread (a context manager: leaving it stops the thread)."""
        order = epoch_order(self.train_idx, self.seed, epoch) if self.shuffle else self.train_idx
        batches = shard_batches(order, self.batch_size, *self.shard)
        assert len(batches) == count, "the epoch's batch count is the trainer's"
        return Prefetcher(lambda: self._produce(epoch, batches, first), depth=self.prefetch, name="typed-producer",
                          on_start=lambda: numba.set_num_threads(self.sampler_threads))

    def hot_rows(self, batch: TypedBatch, version: int) -> None:
        """Exact mode reuses no rows."""
        return None

    def finish(self, batch: TypedBatch) -> None:
        """Nothing to add to a step's gradients."""

    def close(self) -> None:
        """Nothing outlives an epoch."""

    def records(self) -> dict:
        """What the mode adds to an epoch's record: nothing."""
        return {}

    def summary(self, hot: dict) -> dict:
        """What the mode adds to the run summary: nothing."""
        return {}

    def state(self) -> None:
        """Nothing of the mode outlives a step: a resumed run needs no state of it."""
        return None

    def _produce(self, epoch: int, batches: tuple[torch.Tensor, ...], first: int) -> Iterator[TypedBatch]:
        sampler = TypedNeighborSampler(self.graph, self.fanouts)
        for index, seeds in enumerate(batches[first:], start=first):
            clock = time.perf_counter()
            subgraph = sampler.sample(seeds.numpy(), batch_key(self.seed, epoch, index))
            sampled = time.perf_counter()
            features, ids = self.inputs(subgraph.input_nodes, self.device)
            labels = self.labels(seeds.numpy()).to(self.device)
            blocks, done = [b.to(self.device) for b in subgraph.blocks], time.perf_counter()
            yield TypedBatch(blocks, features, ids, labels, {"sample": sampled - clock, "gather": done - sampled},
                             subgraph.num_sampled_edges, sum(int(v.shape[0]) for v in subgraph.input_nodes.values()),
                             spans=[("sample", clock, sampled), ("gather", sampled, done)])
