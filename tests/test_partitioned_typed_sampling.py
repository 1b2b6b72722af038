"""Sampling a typed graph's parts: each rank holds one part (``split_typed``), asks the owners of the vertices
its hops reach to draw through every relation in one round of three exchanges a hop, and gets exactly the
blocks the whole graph's ``TypedNeighborSampler`` gives for the same seeds and key (every relation's row
pointers and local ids, every type's frontier, bit for bit), whichever rank samples them. Ranks run as threads
(``ThreadExchange``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_partitioned_sampling import run_threads
from test_typed_device_sampler import assert_same, assert_same_block

from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.data.typed_parts import split_typed
from neutronorch.errors import ConfigError
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.partitioned_typed import PartitionedTypedSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

pytestmark = pytest.mark.usefixtures("one_thread")
FANOUTS = [[4, 3], {"writes": [2, -1], "default": [3, 2]}, [3, 2, 2]]


@pytest.fixture(scope="module")
def mag():
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=4).with_reverse()


def owners(graph, parts: int, seed: int, empty_type: str | None = None) -> dict[str, np.ndarray]:
    """A random owner per vertex of each type; ``empty_type``'s vertices all on parts other than the last."""
    rng = np.random.default_rng(seed)
    return {t: rng.integers(0, parts - 1 if t == empty_type else parts, n).astype(np.int32)
            for t, n in graph.num_nodes.items()}


def rank_batches(graph, parts: int, rank: int, part_of: np.ndarray) -> list[np.ndarray]:
    """Rank ``rank``'s seeds: some of its own training vertices, a share of a batch whatever their owners, a
    batch of other parts' vertices only (rank 0 owns all of it when there is one part) and an empty batch on
    the last rank (its one training vertex on the others)."""
    train = np.asarray(graph.train_idx, dtype=np.int64)
    own = train[part_of[train] == rank][:30]
    others = train[part_of[train] != rank][:25] if parts > 1 else train[-25:]
    shared = np.array_split(train[40:76], parts)[rank]
    last = train[:1] if rank != parts - 1 or parts == 1 else train[:0]
    return [own, shared, others, last]


def sample_all(graph, parts, owned, fanouts, rank, exchange):
    """Rank ``rank``'s batches on its part and on the whole graph, each rank's keys its own."""
    part = split_typed(graph, owned, parts)[rank]
    sampler = PartitionedTypedSampler(part, exchange, fanouts)
    full = TypedNeighborSampler(graph, fanouts)
    pairs = []
    for k, seeds in enumerate(rank_batches(graph, parts, rank, owned[graph.target])):
        key = batch_key(11, rank, k)
        pairs.append((sampler.sample(seeds, key), full.sample(seeds, key)))
    return pairs, sampler


def expected_asked(graph, sub, rank: int, part_of: dict[str, np.ndarray]) -> int:
    """The destinations of the batch's hops another part owns (a vertex once a hop, whatever draws it)."""
    drawn_into = {r[2] for r in graph.relations}
    return sum(int((part_of[t][block.dst_ids(t).numpy()] != rank).sum())
               for block in sub.blocks for t in block.num_dst if t in drawn_into)


@pytest.mark.parametrize("fanouts", FANOUTS)
@pytest.mark.parametrize("parts, empty_type", [(1, None), (2, None), (3, None), (3, "field")])
def test_ranks_holding_one_typed_part_each_sample_the_whole_graphs_blocks(mag, parts, empty_type, fanouts):
    owned = owners(mag, parts, seed=parts, empty_type=empty_type)
    if empty_type:
        assert not (owned[empty_type] == parts - 1).any()  # the last part owns no vertex of that type
    results = run_threads(lambda rank, exchange: sample_all(mag, parts, owned, fanouts, rank, exchange), parts)
    layers = len(next(iter(fanouts.values())) if isinstance(fanouts, dict) else fanouts)
    for rank, (pairs, sampler) in enumerate(results):
        asked = 0
        for sub, full in pairs:
            assert_same(sub, full)
            asked += expected_asked(mag, full, rank, owned)
        assert sampler.asked == asked
        assert sampler.exchange.traffic()["exchanges"] == 3 * layers * len(pairs)  # ids, counts, neighbours
    assert sum(s.asked for _, s in results) == sum(s.served for _, s in results)
    assert (sum(s.asked for _, s in results) > 0) == (parts > 1)
    assert any(sub.seeds.shape[0] == 0 for pairs, _ in results for sub, _ in pairs) == (parts > 1)


def test_the_top_hops_and_the_bottom_layer_sampled_on_parts_are_the_whole_graphs(mag):
    parts, fanouts = 2, [3, 2, 2]
    owned = owners(mag, parts, seed=9)

    def rank(r, exchange):
        sampler = PartitionedTypedSampler(split_typed(mag, owned, parts)[r], exchange, fanouts)
        full = TypedNeighborSampler(mag, fanouts)
        seeds = np.asarray(mag.train_idx[r * 20:(r + 1) * 20], np.int64)
        key = batch_key(3, 0, r)
        top, whole = sampler.sample_hops(seeds, key, 2), full.sample_hops(seeds, key, 2)
        assert_same(top, whole)
        bottom = {t: ids for t, ids in top.frontiers[0].items()}
        assert_same_block(sampler.sample_bottom(bottom, key), full.sample_bottom(bottom, key))

    run_threads(rank, parts)


def test_a_part_without_an_exchange_samples_its_own_vertices_and_refuses_others(mag):
    owned = owners(mag, 2, seed=5)
    parts = split_typed(mag, owned, 2)
    sampler = PartitionedTypedSampler(parts[1], None, [4, 3])
    full = TypedNeighborSampler(mag, [4, 3])
    mine = {t: parts[1].ids[t][:15] for t in mag.num_nodes}
    key = batch_key(5, 1, 2)
    assert_same_block(sampler.sample_bottom(mine, key), full.sample_bottom(mine, key))
    assert sampler.asked == sampler.served == 0
    whole = split_typed(mag, {t: np.zeros(n, np.int32) for t, n in mag.num_nodes.items()}, 1)[0]
    seeds = np.asarray(mag.train_idx[:40], np.int64)
    assert_same(PartitionedTypedSampler(whole, None, [4, 3]).sample(seeds, key), full.sample(seeds, key))
    theirs = int(parts[0].ids["author"][0])
    with pytest.raises(ConfigError, match=f"author vertex {theirs} is part 0's"):
        sampler.sample_bottom({"author": np.array([theirs])}, key)


def test_a_sampler_refuses_a_rank_of_another_part_and_degrees(mag):
    parts = split_typed(mag, owners(mag, 2, seed=6), 2)
    exchanges = ThreadExchange.group(2)
    with pytest.raises(ConfigError, match="part 0 of 2 sampled by rank 1 of 2"):
        PartitionedTypedSampler(parts[0], exchanges[1], [2])
    with pytest.raises(ConfigError, match="out-degrees"):
        PartitionedTypedSampler(parts[0], exchanges[0], [2], degrees=True)


def test_the_keys_travel_with_the_ids(mag):
    """Two ranks sampling the same seeds with different keys each get their own key's draws (the owner draws
    with the asker's key, not its own)."""
    owned = owners(mag, 2, seed=7)
    seeds = np.asarray(mag.train_idx[:50], np.int64)

    def rank(r, exchange):
        sampler = PartitionedTypedSampler(split_typed(mag, owned, 2)[r], exchange, [5, 5])
        return sampler.sample(seeds, batch_key(1, 0, r))

    got = run_threads(rank, 2)
    full = TypedNeighborSampler(mag, [5, 5])
    for r, sub in enumerate(got):
        assert_same(sub, full.sample(seeds, batch_key(1, 0, r)))
    assert not all(torch.equal(a, b) for a, b in zip(got[0].frontiers[0].values(), got[1].frontiers[0].values()))
