"""A link task's mini-batches: seed edges, their negatives, and the vertices whose outputs score them.

Epoch ``e`` takes the training edges in global batches of ``batch_size * world`` in the order
``epoch_order(seed, e)`` (a rank trains its ``tensor_split`` part, as node tasks do). Each positive ``(u, v)``
gets ``negatives`` destinations drawn uniformly, keyed by the global batch (``batch_key(seed, e, k)``). The
batch's seeds are the distinct ends of its pairs (sorted); row ``i`` of its (P, 2 + negatives) int64
``targets`` holds the positions of ``u``, ``v`` and each negative destination of positive ``i`` among them.
``SeedBatch.exclude`` holds the global batch's positives: a rank samples what one process with it samples.
Dealt by owner (``owner``: the part of every vertex, a partitioned run's or ``deal_by``'s), rank r trains the
positives of each global batch whose source (row 0) part r owns, in the batch's order, with their negatives: a
positive's embeddings start from its source, whose in-edges its owner holds.

A typed graph's link task (``ends``: ``data.links.LinkEnds``) is the same in its end types' stacked ids
(negatives among the destination type's; ``EndsSampler`` hands the sampler each batch's seeds by type)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.links import LinkEnds
from neutronorch.orchestration.seeds import SeedBatch, global_batches
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.exclude import exclude_edges
from neutronorch.sampling.neighbor_sampler import batch_key, mix_key

NEGATIVE_SALT = 0x4E45_4741  # negatives' stream of a batch key, apart from the neighbour draws'


class LinkSeeds:
    def __init__(self, edges: np.ndarray, num_nodes: int, sampling: SamplingConfig, negatives: int,
                 ends: LinkEnds | None = None, owner: np.ndarray | None = None):
        self.owner = owner
        self.edges = torch.from_numpy(np.array(edges, dtype=np.int64).reshape(2, -1))  # small: a copy
        self.num_nodes, self.sampling, self.negatives = int(num_nodes), sampling, int(negatives)
        self.num_batches = -(-self.edges.shape[1] // (sampling.batch_size * sampling.world))
        self.ends = ends
        self.destinations = ends.destinations if ends is not None else (0, self.num_nodes)

    def sampler(self, sampler):
        """What a mode draws this task's batches with: ``sampler``, fed by type on a typed graph (``EndsSampler``)."""
        return sampler if self.ends is None else EndsSampler(sampler, self.ends)

    def by_type(self, ids: torch.Tensor):
        """Vertices in this task's ids (sorted) as a typed graph's per end type, or as they are."""
        return ids if self.ends is None else self.ends.split(ids)

    def exclude(self, subgraph: SampledSubgraph, pairs: torch.Tensor) -> SampledSubgraph:
        """``subgraph`` without the edges between the ends of a batch's seed edges ``pairs``."""
        return exclude_edges(subgraph, pairs, self.num_nodes, self.ends)

    def epoch(self, epoch: int) -> "LinkEpoch":
        """This rank's part of every mini-batch of ``epoch``, in batch order: each made when it is asked for
        (a whole epoch of a large graph's batches would hold gigabytes and delay the first batch)."""
        return LinkEpoch(self, epoch)

    def batch(self, epoch: int, index: int, part: torch.Tensor) -> SeedBatch:
        """Mini-batch ``index`` of ``epoch``, of the edges at positions ``part``."""
        sampling = self.sampling
        positives = self.edges[:, part]
        key, (first, count) = batch_key(sampling.seed, epoch, index), self.destinations
        negatives = draw_negatives(key, positives.shape[1], self.negatives, count, first)
        # The global batch's positives excluded: each rank samples what one process would.
        if sampling.world == 1:
            return SeedBatch(*pair_targets(positives, negatives), exclude=positives)
        batch_seeds = torch.unique(torch.cat([positives.reshape(-1), negatives.reshape(-1)]))  # pair_targets' seeds
        part = self.mine(positives)
        return SeedBatch(*pair_targets(positives[:, part], negatives[part]), exclude=positives,
                         batch_seeds=batch_seeds)

    def mine(self, positives: torch.Tensor) -> torch.Tensor:
        """The positions of this rank's positives among a global batch's (2, P) ``positives``: its
        ``tensor_split`` part, or, dealt by ``owner``, those whose source it owns."""
        sampling = self.sampling
        if self.owner is None:
            return torch.tensor_split(torch.arange(positives.shape[1]), sampling.world)[sampling.rank]
        owners = np.asarray(self.owner[positives[0].numpy()], dtype=np.int64)
        return torch.from_numpy(np.flatnonzero(owners == sampling.rank))

    def rank_shares(self, epoch: int) -> np.ndarray:
        """Per mini-batch: ``world`` times this rank's share of the global batch's positives (each a loss term
        of equal weight; ``NodeSeeds.rank_shares`` says what they scale)."""
        sampling = self.sampling
        if self.owner is not None and sampling.world > 1:
            shares = np.ones(self.num_batches)
            for k, part in enumerate(global_batches(torch.arange(self.edges.shape[1]), sampling, epoch)):
                shares[k] = sampling.world * self.mine(self.edges[:, part]).shape[0] / max(1, part.shape[0])
            return shares
        sizes = np.diff(np.minimum(np.arange(self.num_batches + 1) * sampling.batch_size * sampling.world,
                                   self.edges.shape[1]))
        mine = sizes // sampling.world + (sampling.rank < sizes % sampling.world)  # tensor_split's part sizes
        return np.where(sizes > 0, sampling.world * mine / np.maximum(sizes, 1), 1.0)


class LinkEpoch(Sequence):
    """One epoch's mini-batches (``LinkSeeds.epoch``): its edge order drawn once, each batch made on access."""

    def __init__(self, seeds: LinkSeeds, epoch: int):
        self.seeds, self.epoch = seeds, epoch
        self.parts = global_batches(torch.arange(seeds.edges.shape[1]), seeds.sampling, epoch)

    def __len__(self) -> int:
        return self.seeds.num_batches

    def __getitem__(self, index: int) -> SeedBatch:
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self.seeds.batch(self.epoch, index, self.parts[index])


class EndsSampler:
    """A typed sampler fed a link batch's seeds in ``ends``' stacked ids: it samples them by type."""

    def __init__(self, sampler, ends: LinkEnds):
        self.sampler, self.ends = sampler, ends

    @property
    def num_layers(self) -> int:
        return self.sampler.num_layers

    def sample(self, seeds, key: int) -> SampledSubgraph:
        return self.sampler.sample(self.ends.split(seeds), key)

    def sample_hops(self, seeds, key: int, hops: int) -> SampledSubgraph:
        return self.sampler.sample_hops(self.ends.split(seeds), key, hops)

    def sample_many(self, seeds: list, keys: list[int]) -> list[SampledSubgraph]:
        return [self.sample(s, key) for s, key in zip(seeds, keys)]

    def sample_timed(self, seeds: list, times: list, keys: list[int]) -> list[SampledSubgraph]:
        """A timed sampler's ``sample_timed``, each batch's entries and their times split by type."""
        typed = [self.ends.split(ids) for ids in seeds]
        return self.sampler.sample_timed(typed, [dict(zip(parts, torch.split(at, [p.shape[0] for p in parts.values()])))
                                                 for parts, at in zip(typed, times)], keys)


def negative_generator(key: int) -> torch.Generator:
    """The generator whose stream the negatives of ``key`` are (``draw_negatives``; drawn a chunk at a time
    by evaluation, the same numbers)."""
    generator = torch.Generator()
    generator.manual_seed(mix_key(key, NEGATIVE_SALT) & 0x7FFF_FFFF_FFFF_FFFF)
    return generator


def draw_negatives(key: int, positives: int, per_positive: int, num_nodes: int,
                   first: int = 0) -> torch.Tensor:
    """(positives, per_positive) destinations drawn uniformly from ``key`` over the ``num_nodes`` vertices
    from ``first`` on."""
    return torch.randint(first, first + num_nodes, (positives, per_positive),
                         generator=negative_generator(key), dtype=torch.int64)


class TimedLinkSeeds(LinkSeeds):
    """A link task's mini-batches sampled by time (docs/temporal.md, "The loader"): positive ``i`` at
    ``times[i]``, its ends and its negative destinations seeds at that time. A batch's seeds are its distinct
    (vertex, time) pairs (a vertex may be a seed at several times), ``SeedBatch.times`` their times; no edge
    is excluded: the sampler takes only edges before each seed's time (``strict``), so a positive never sees
    itself, and its earlier interactions are the history it is predicted from."""

    def __init__(self, edges: np.ndarray, times: np.ndarray, num_nodes: int, sampling: SamplingConfig,
                 negatives: int, appearance=None, ends: LinkEnds | None = None):
        super().__init__(edges, num_nodes, sampling, negatives, ends)
        self.times = torch.from_numpy(np.asarray(times))
        self.appearance = appearance  # ``data.time_split.Appearance``: negatives as of each positive's time

    def batch(self, epoch: int, index: int, part: torch.Tensor) -> SeedBatch:
        positives, times = self.edges[:, part], self.times[part]
        key, (first, count) = batch_key(self.sampling.seed, epoch, index), self.destinations
        if self.appearance is not None:
            negatives = self.appearance.draw(negative_generator(key), times, self.negatives)
        else:
            negatives = draw_negatives(key, positives.shape[1], self.negatives, count, first)
        return timed_seed_batch(positives, times, negatives)


def timed_seed_batch(positives: torch.Tensor, times: torch.Tensor, negatives: torch.Tensor) -> SeedBatch:
    """The batch of (2, P) ``positives`` at ``times`` with (P, K) negative destinations at their positive's
    time: its distinct (vertex, time) entries (by vertex, then time) and each pair's positions among them."""
    ends = torch.cat([positives[0], positives[1], negatives.reshape(-1)])
    at = torch.cat([times, times, times.repeat_interleave(negatives.shape[1])])
    cuts, rank = torch.unique(at, return_inverse=True)
    entries, where = torch.unique(ends * cuts.shape[0] + rank, return_inverse=True)  # by vertex, then time
    p = positives.shape[1]
    targets = torch.cat([where[:p, None], where[p:2 * p, None], where[2 * p:].view(p, negatives.shape[1])], 1)
    return SeedBatch(entries // cuts.shape[0], targets, times=cuts[entries % cuts.shape[0]])


def pair_targets(positives: torch.Tensor, negatives: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The distinct vertices of (2, P) ``positives`` and (P, K) negative destinations (sorted), and each
    pair's positions among them: (P, 2 + K) int64, columns source, destination, negatives."""
    count = positives.shape[1]
    ends = torch.cat([positives[0], positives[1], negatives.reshape(-1)])
    seeds, where = torch.unique(ends, return_inverse=True)
    targets = torch.cat([where[:count, None], where[count:2 * count, None], where[2 * count:].view(count, -1)], 1)
    return seeds, targets
