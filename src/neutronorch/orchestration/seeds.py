"""The seed order of an epoch and its mini-batches: a pure function of (seed, epoch).

Data parallel: mini-batch ``k`` is global, ``batch_size * world`` seeds of the epoch's order, and rank ``r``
trains part ``r`` of it (``torch.tensor_split``: sizes differ by at most one), or, dealt by owner, the seeds of
it that part ``r`` of a partition owns (a partitioned run's, and ``deal_by``'s). Its key is the global batch's
and samplers draw per vertex, so one process with ``batch_size * world`` samples what the ranks sample."""

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
    """One mini-batch's seeds (int64), as a mode samples them. ``targets``: what the loss compares their
    outputs with (None: their labels). ``exclude``: (2, P) vertex pairs whose edges, either way, the sampled
    graph must not contain (a link task's seed edges), or None. ``batch_seeds``: data parallel, the global
    batch's seeds (none of which a NeutronOrch plan serves hot in it); None where they are ``seeds``.
    ``times``: sampled by time, each seed's time (a vertex may be a seed at several; docs/temporal.md)."""

    seeds: torch.Tensor
    targets: torch.Tensor | None = None
    exclude: torch.Tensor | None = None
    batch_seeds: torch.Tensor | None = None
    times: torch.Tensor | None = None


class NodeSeeds:
    """A node task's mini-batches: the training vertices (a typed graph's target's) in the epoch's order.
    ``owner``: the part of every vertex (``world`` parts); each global batch is then dealt by it, rank r
    training the seeds part r owns, in the batch's order."""

    def __init__(self, graph: Graph | TypedGraph, sampling: SamplingConfig, owner: np.ndarray | None = None):
        self.graph, self.train_idx, self.sampling, self.owner = graph, training_seeds(graph), sampling, owner
        self.num_batches = -(-len(graph.train_idx) // (sampling.batch_size * sampling.world))

    def epoch(self, epoch: int) -> list[SeedBatch]:
        """Every mini-batch of ``epoch`` (a sequence, as ``LinkSeeds.epoch``'s)."""
        sampling = self.sampling
        return [SeedBatch(self.parts(batch)[sampling.rank], batch_seeds=None if sampling.world == 1 else batch)
                for batch in global_batches(self.train_idx, sampling, epoch)]

    def parts(self, batch: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's seeds of the global ``batch`` (possibly none): by position, or by ``owner``."""
        if self.sampling.world == 1:
            return [batch]
        if self.owner is None:
            return list(torch.tensor_split(batch, self.sampling.world))
        owners = torch.from_numpy(np.asarray(self.owner[batch.numpy()], dtype=np.int64))
        return [batch[owners == rank] for rank in range(self.sampling.world)]

    def rank_shares(self, epoch: int) -> np.ndarray:
        """Per mini-batch of ``epoch``: ``world`` times this rank's share of the global batch's loss terms
        (``Graph.loss_terms``); 1 where it has none, and wherever the ranks' parts carry equal weight."""
        sampling = self.sampling
        batches = global_batches(self.train_idx, sampling, epoch)
        shares = np.ones(len(batches))
        for k, batch in enumerate(batches):
            terms = [self.graph.loss_terms(part.numpy()) for part in self.parts(batch)]
            if sum(terms):
                shares[k] = sampling.world * terms[sampling.rank] / sum(terms)
        return shares

    def sampler(self, sampler):
        """What a mode draws this task's batches with (``LinkSeeds.sampler``'s counterpart): ``sampler``."""
        return sampler

    def by_type(self, ids: torch.Tensor):
        """``LinkSeeds.by_type``: a node task's seeds are of one type, a typed graph's its target."""
        return {self.graph.target: ids} if isinstance(self.graph, TypedGraph) else ids


def training_seeds(graph: Graph | TypedGraph) -> torch.Tensor:
    """The training vertices as an int64 tensor (a small, writable copy of a possibly read-only map)."""
    return torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))


def global_batches(train_idx: torch.Tensor, sampling: SamplingConfig, epoch: int) -> tuple[torch.Tensor, ...]:
    """Every global mini-batch of ``epoch`` (all ranks' seeds), in batch order; unshuffled
    (``sampling.shuffle`` False), in their given order every epoch."""
    order = epoch_order(train_idx, sampling.seed, epoch) if sampling.shuffle else train_idx
    return torch.split(order, sampling.batch_size * sampling.world)


def epoch_order(train_idx: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """The seed order of one epoch: a permutation derived from (seed, epoch) alone."""
    generator = torch.Generator()
    generator.manual_seed(mix_key(seed, epoch) & 0x7FFF_FFFF_FFFF_FFFF)
    # Indexed by numpy: on a producer thread a parallel torch operator would start an OpenMP team of its own,
    # and the trainer's operators then pay a wake-up each (docs/results/one-engine-2026-12-05-round-two.md).
    return torch.from_numpy(train_idx.numpy()[torch.randperm(train_idx.shape[0], generator=generator).numpy()])

