"""The seed order of an epoch and its mini-batches: a pure function of (seed, epoch).

Data parallel: mini-batch ``k`` of an epoch is global, ``batch_size * world`` seeds of the epoch's order;
rank ``r`` trains part ``r`` of it (``torch.tensor_split`` into ``world`` parts: sizes differ by at most one,
in the last batch too). Its key, ``batch_key(seed, epoch, k)``, is the global batch's, and samplers draw per
vertex, so one process with ``batch_size * world`` samples exactly what the ranks sample together."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.sampling.neighbor_sampler import mix_key


@dataclass(frozen=True)
class SeedBatch:
    """One mini-batch's seeds, as a mode samples them.

    ``seeds``: the vertices whose outputs the step reads (int64). ``targets``: what the loss compares those
    outputs with, or None for the seeds' own labels (a node task). ``exclude``: (2, P) global vertex pairs
    whose edges, in either direction, the batch's sampled graph must not contain (a link task's seed
    edges; ``sampling/exclude.py``), or None. ``batch_seeds``: data parallel, the seeds of the global batch
    this one is a rank's part of (a NeutronOrch plan serves none of them hot in it, as one process would
    not); None where they are ``seeds``."""

    seeds: torch.Tensor
    targets: torch.Tensor | None = None
    exclude: torch.Tensor | None = None
    batch_seeds: torch.Tensor | None = None


class NodeSeeds:
    """A node task's mini-batches: the training vertices in the epoch's order (``epoch_batches``); a typed
    graph's are its target type's (``train_idx``)."""

    def __init__(self, graph: Graph | TypedGraph, sampling: SamplingConfig):
        self.graph, self.train_idx = graph, training_seeds(graph)
        self.sampling = sampling
        self.num_batches = batches_per_epoch(graph, sampling)

    def epoch(self, epoch: int) -> list[SeedBatch]:
        """Every mini-batch of ``epoch`` (a sequence: ``len`` and indexing, as ``LinkSeeds.epoch``'s)."""
        sampling, batches = self.sampling, global_batches(self.train_idx, self.sampling, epoch)
        if sampling.world == 1:
            return [SeedBatch(seeds) for seeds in batches]
        return [SeedBatch(torch.tensor_split(batch, sampling.world)[sampling.rank], batch_seeds=batch)
                for batch in batches]

    def rank_shares(self, epoch: int) -> np.ndarray:
        return rank_shares(self.graph, self.sampling, epoch)

    def sampler(self, sampler):
        """What a mode draws this task's batches with (``LinkSeeds.sampler``'s counterpart): ``sampler``."""
        return sampler


def training_seeds(graph: Graph | TypedGraph) -> torch.Tensor:
    """The training vertices as an int64 tensor (a small, writable copy of a possibly read-only map)."""
    return torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))


def batches_per_epoch(graph: Graph, sampling: SamplingConfig) -> int:
    """Mini-batches of an epoch: the training seeds in global batches of ``batch_size * world``, the last
    one partial."""
    return -(-len(graph.train_idx) // (sampling.batch_size * sampling.world))


def epoch_batches(train_idx: torch.Tensor, sampling: SamplingConfig, epoch: int) -> list[torch.Tensor]:
    """This rank's seeds of every mini-batch of ``epoch``, in batch order (some may be empty when the last
    global batch has fewer seeds than there are ranks). Unshuffled (``sampling.shuffle`` False): in their
    given order every epoch."""
    world = sampling.world
    return [b if world == 1 else torch.tensor_split(b, world)[sampling.rank]
            for b in global_batches(train_idx, sampling, epoch)]


def global_batches(train_idx: torch.Tensor, sampling: SamplingConfig, epoch: int) -> tuple[torch.Tensor, ...]:
    """Every global mini-batch of ``epoch`` (all ranks' seeds), in batch order."""
    order = epoch_order(train_idx, sampling.seed, epoch) if sampling.shuffle else train_idx
    return torch.split(order, sampling.batch_size * sampling.world)


def epoch_order(train_idx: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """The seed order of one epoch: a permutation derived from (seed, epoch) alone."""
    generator = torch.Generator()
    generator.manual_seed(mix_key(seed, epoch) & 0x7FFF_FFFF_FFFF_FFFF)
    # Indexed by numpy: modes draw the order on their producer thread, where a parallel torch operator would
    # start an OpenMP team of its own. The runtime, then holding more threads than cores, stops spinning the
    # trainer's waiting workers and each of its operators pays a wake-up (a typed exact epoch at 2 threads:
    # 0.46 s against 0.32 s; docs/results/one-engine-2026-12-05-round-two.md).
    return torch.from_numpy(train_idx.numpy()[torch.randperm(train_idx.shape[0], generator=generator).numpy()])


def rank_shares(graph: Graph, sampling: SamplingConfig, epoch: int) -> np.ndarray:
    """Per mini-batch of ``epoch``: ``world`` times this rank's share of the global batch's loss terms
    (``Graph.loss_terms``); 1 where the global batch has none. It is 1 wherever the ranks' parts carry equal
    weight: every full batch whose seeds are all labelled."""
    order = epoch_order(training_seeds(graph), sampling.seed, epoch)
    shares = np.ones(batches_per_epoch(graph, sampling))
    for k, batch in enumerate(torch.split(order, sampling.batch_size * sampling.world)):
        terms = [graph.loss_terms(part.numpy()) for part in torch.tensor_split(batch, sampling.world)]
        if sum(terms):
            shares[k] = sampling.world * terms[sampling.rank] / sum(terms)
    return shares
