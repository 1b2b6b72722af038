"""The host temporal samplers (docs/temporal.md, "A temporal hop"): no sampled edge after its entry's time on
random graphs of both kinds, both strategies, strict or not; `last` the newest; keyed, deterministic draws;
the plain sampler's blocks when every edge is valid; clear errors for bad seed times."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from neutronorch.data import Graph
from neutronorch.data.relation import Relation
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError
from neutronorch.sampling import temporal_sampler
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler, TemporalTypedSampler


def timed_graph(seed: int, n: int = 60, edges: int = 900, float_times: bool = False) -> Graph:
    rng = np.random.default_rng(seed)
    times = rng.random(edges) * 100 if float_times else rng.integers(0, 100, edges)
    return Graph.from_arrays(rng.integers(0, n, edges), rng.integers(0, n, edges), rng.random((n, 2)),
                             np.arange(n) % 2, edge_time=times, undirected=bool(seed % 2))


def typed_graph(seed: int) -> TypedGraph:
    """Two types, a timed relation each way and a static one (no times: valid at every time)."""
    rng = np.random.default_rng(seed)
    users, items, edges = 30, 20, 400
    src, dst, times = rng.integers(0, users, edges), rng.integers(0, items, edges), rng.integers(0, 50, edges)
    return TypedGraph("timed", {"user": users, "item": items},
                      {("user", "buys", "item"): Relation.from_edges(src, dst, users, items, edge_time=times),
                       ("item", "bought_by", "user"): Relation.from_edges(dst, src, items, users, edge_time=times),
                       ("item", "like", "item"): Relation.from_edges(rng.integers(0, items, 60),
                                                                     rng.integers(0, items, 60), items, items)},
                      {"item": rng.random((items, 3)).astype(np.float32)}, "item", np.arange(items) % 2,
                      np.arange(10), np.arange(10, 15), np.arange(15, 20), 2).validate()


def check_block(block, indptr, indices, edge_time, strict, last, fanout):
    """Every edge of ``block`` is a real in-edge of its destination entry's vertex, no later than the entry's
    time (earlier when ``strict``), its source entry at that same time; each row draws min(valid, fanout)
    distinct edges, with ``last`` the newest."""
    ptr, src_time = block.indptr.numpy(), block.src_time.numpy()
    dst_ids, edges = block.src_ids.numpy()[:block.num_dst], block.edge_ids.numpy()
    rows = np.repeat(np.arange(block.num_dst), np.diff(ptr))
    sources = block.indices.numpy()
    assert np.array_equal(np.asarray(indices)[edges], block.src_ids.numpy()[sources])
    assert np.all((edges >= indptr[dst_ids[rows]]) & (edges < indptr[dst_ids[rows] + 1]))
    times = edge_time[edges]
    assert np.all(times < src_time[rows]) if strict else np.all(times <= src_time[rows])
    assert np.array_equal(src_time[sources], src_time[rows])  # every entry inherits its seed's time
    for i, v in enumerate(dst_ids):
        column = edge_time[indptr[v]:indptr[v + 1]]
        valid = int(np.searchsorted(column, src_time[i], side="left" if strict else "right"))
        drawn = edges[ptr[i]:ptr[i + 1]] - indptr[v]
        assert drawn.shape[0] == min(valid, fanout) and np.unique(drawn).shape[0] == drawn.shape[0]
        if last:
            assert drawn.tolist() == list(range(valid - drawn.shape[0], valid))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("strict", [False, True])
def test_no_homogeneous_sample_looks_into_the_future(seed, strategy, strict):
    g = timed_graph(seed, float_times=seed >= 4)
    fanouts = [4, 3]
    sampler = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, fanouts, strategy, strict)
    rng = np.random.default_rng(100 + seed)
    seeds = rng.choice(g.num_nodes, 12, replace=False)
    for at in (rng.integers(0, 110, 12), np.full(12, int(rng.integers(0, 110)))):  # own times; one time
        sub = sampler.sample(seeds, at, key=seed)
        for block, fanout in zip(sub.blocks[::-1], fanouts):
            check_block(block, g.indptr, g.indices, g.edge_time, strict, strategy == "last", fanout)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("strict", [False, True])
def test_no_typed_sample_looks_into_the_future(seed, strategy, strict):
    g = typed_graph(seed)
    sampler = TemporalTypedSampler(g, [3, 2], strategy, strict)
    rng = np.random.default_rng(seed)
    sub = sampler.sample(np.arange(8), rng.integers(0, 60, 8), key=seed)
    for tblock in sub.blocks:
        for relation, block in tblock.blocks.items():
            rel = g.relations[relation]
            block.src_ids, block.edge_ids = tblock.src_ids[relation[0]], tblock.edge_ids[relation]
            dst_time = tblock.src_time[relation[2]][:block.num_dst]
            if rel.edge_time is None:  # a static relation: any edge, the source entry at the destination's time
                assert torch.equal(tblock.src_time[relation[0]][block.indices.long()],
                                   dst_time.repeat_interleave(block.in_degrees()))
                continue
            # check_block reads destinations and sources from one frontier: give it the two types' own
            block.src_time = torch.cat([dst_time, tblock.src_time[relation[0]]])
            shifted = type(block)(block.num_dst, block.num_src + block.num_dst, block.indptr,
                                  block.indices + block.num_dst,
                                  src_ids=torch.cat([tblock.src_ids[relation[2]][:block.num_dst],
                                                     tblock.src_ids[relation[0]]]),
                                  src_time=block.src_time, edge_ids=block.edge_ids)
            check_block(shifted, rel.indptr, rel.indices, rel.edge_time, strict, strategy == "last", 3 if
                        tblock is sub.blocks[-1] else 2)


def test_every_edge_valid_gives_the_plain_samplers_blocks():
    g = timed_graph(0)
    seeds = np.arange(0, 60, 3)
    temporal = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [5, 3]).sample(seeds, np.full(20, 10**6), 9)
    plain = NeighborSampler(g.indptr, g.indices, [5, 3]).sample(seeds, 9)
    for a, b in zip(temporal.blocks, plain.blocks):
        assert torch.equal(a.indptr, b.indptr) and torch.equal(a.indices, b.indices)
        assert torch.equal(a.src_ids, b.src_ids)
    typed = TemporalTypedSampler(TypedGraph.of(g), [5, 3]).sample(seeds, np.full(20, 10**6), 9)
    for a, b in zip(typed.blocks, plain.blocks):
        block = next(iter(a.blocks.values()))
        assert torch.equal(block.indptr, b.indptr) and torch.equal(block.indices, b.indices)


def test_the_hash_relabel_and_the_vertex_map_give_the_same_blocks(monkeypatch):
    g = timed_graph(1)
    seeds, at = np.arange(15), np.full(15, 40)
    one = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [4, 4]).sample(seeds, at, 3)
    real = temporal_sampler.TimedFrontier.__init__
    monkeypatch.setattr(temporal_sampler.TimedFrontier, "__init__",
                        lambda self, node_map, one_time: real(self, node_map, False))
    hashed = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [4, 4]).sample(seeds, at, 3)
    for a, b in zip(one.blocks, hashed.blocks):
        for name in ("indptr", "indices", "src_ids", "src_time", "edge_ids"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_draws_are_keyed_by_vertex_whatever_the_batch_or_threads():
    g = timed_graph(2, n=200, edges=4000)
    sampler = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [6])
    rng = np.random.default_rng(0)
    seeds, at = rng.choice(200, 40, replace=False), rng.integers(0, 100, 40)
    alone = sampler.sample(seeds[:10], at[:10], 5).blocks[0]
    within = sampler.sample(seeds, at, 5).blocks[0]
    for i in range(10):  # the first ten entries draw the same edges in either batch
        rows = slice(alone.indptr[i], alone.indptr[i + 1]), slice(within.indptr[i], within.indptr[i + 1])
        assert torch.equal(alone.edge_ids[rows[0]], within.edge_ids[rows[1]])
    again = sampler.sample(seeds, at, 5).blocks[0]
    other = sampler.sample(seeds, at, 6).blocks[0]
    assert torch.equal(again.edge_ids, within.edge_ids) and not torch.equal(other.edge_ids, within.edge_ids)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = sampler.sample(seeds, at, 5).blocks[0]
    finally:
        numba.set_num_threads(before)
    assert torch.equal(many.edge_ids, within.edge_ids) and torch.equal(many.indices, within.indices)


def test_a_vertex_at_two_times_is_two_entries():
    g = timed_graph(3)
    sub = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [3]).sample([5, 5], [10, 90], 1)
    block = sub.blocks[0]
    assert block.src_ids[:2].tolist() == [5, 5] and block.src_time[:2].tolist() == [10, 90]


def test_bad_seed_times_and_options_are_clear_errors():
    g = timed_graph(0)
    sampler = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [3])
    with pytest.raises(DataError, match="hold fractions"):
        sampler.sample([1, 2], [1.5, 2.0], 0)
    with pytest.raises(DataError, match=r"seed times have shape \(1,\), expected \(2,\)"):
        sampler.sample([1, 2], [1], 0)
    with pytest.raises(DataError, match="nan"):
        sampler.sample([1, 2], [1.0, np.nan], 0)
    with pytest.raises(ConfigError, match="holds vertex 1 twice at one time"):
        sampler.sample([1, 1], [4, 4], 0)
    with pytest.raises(ConfigError, match="`temporal_strategy` 'newest'"):
        TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [3], "newest")
    with pytest.raises(DataError, match="no edge times"):
        TemporalNeighborSampler(g.indptr, g.indices, None, [3])
    assert sampler.sample([1, 2], [1.0, 2.0], 0).blocks[0].src_time.dtype == torch.int64  # whole floats pass
    typed = typed_graph(0)
    with pytest.raises(ConfigError, match="not yet in NeutronOrch mode"):
        TemporalTypedSampler(typed, [2]).sample_bottom({"item": np.arange(3)}, 0)
    static = TypedGraph.of(Graph.from_arrays([0, 1, 2], [1, 2, 3], np.zeros((10, 2)), np.arange(10) % 2))
    with pytest.raises(DataError, match="no relation has edge times"):
        TemporalTypedSampler(static, [2])


def test_seed_edge_exclusion_refuses_a_temporal_block():
    from neutronorch.sampling.exclude import exclude_edges

    g = timed_graph(0)
    sub = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [3]).sample([1, 2], [90, 90], 0)
    with pytest.raises(ConfigError, match="not yet offered for blocks sampled by time"):
        exclude_edges(sub, torch.tensor([[1], [int(sub.blocks[0].src_ids[sub.blocks[0].indices[0]])]]), g.num_nodes)


@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("strict", [False, True])
def test_planted_spoilers_after_the_seeds_times_change_no_sample(strategy, strict):
    """Copy edges to times after every seed's (and add edges that exist only then): each seed's sampled
    neighbourhood stays the same, vertex for vertex and draw for draw, since the future edges sort after every
    valid prefix and draws are keyed over the prefix alone."""
    rng = np.random.default_rng(7)
    n, edges = 80, 1500
    src, dst, times = rng.integers(0, n, edges), rng.integers(0, n, edges), rng.integers(0, 100, edges)
    late = rng.integers(0, edges, 600)  # spoilers: copies of existing edges, and new edges, after time 200
    spoiled = (np.concatenate([src, src[late], rng.integers(0, n, 300)]),
               np.concatenate([dst, dst[late], rng.integers(0, n, 300)]),
               np.concatenate([times, 200 + rng.integers(0, 50, 600), 200 + rng.integers(0, 50, 300)]))
    rows = (rng.random((n, 2)), np.arange(n) % 2)
    clean = Graph.from_arrays(src, dst, *rows, edge_time=times)
    dirty = Graph.from_arrays(*spoiled[:2], *rows, edge_time=spoiled[2])
    seeds, at = rng.choice(n, 25, replace=False), rng.integers(0, 200, 25)
    a = TemporalNeighborSampler(clean.indptr, clean.indices, clean.edge_time, [5, 4], strategy, strict)
    b = TemporalNeighborSampler(dirty.indptr, dirty.indices, dirty.edge_time, [5, 4], strategy, strict)
    for one, two in zip(a.sample(seeds, at, 11).blocks, b.sample(seeds, at, 11).blocks):
        for name in ("indptr", "indices", "src_ids", "src_time"):
            assert torch.equal(getattr(one, name), getattr(two, name)), name
        assert np.array_equal(clean.edge_time[one.edge_ids.numpy()], dirty.edge_time[two.edge_ids.numpy()])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("strict", [False, True])
def test_the_torch_sampler_draws_the_host_samplers_blocks_bit_for_bit(seed, strategy, strict):
    from neutronorch.sampling.temporal_device import TorchTemporalSampler

    g = timed_graph(seed, float_times=seed == 3)
    host = TemporalNeighborSampler(g.indptr, g.indices, g.edge_time, [4, 3, -1], strategy, strict)
    torch_sampler = TorchTemporalSampler(torch.from_numpy(g.indptr), torch.from_numpy(g.indices),
                                         torch.from_numpy(g.edge_time), [4, 3, -1], strategy, strict)
    rng = np.random.default_rng(seed)
    seeds = rng.choice(g.num_nodes, 10, replace=False)
    for at in (rng.integers(0, 110, 10), np.full(10, 50)):
        for a, b in zip(host.sample(seeds, at, seed).blocks, torch_sampler.sample(seeds, at, seed).blocks):
            assert (a.num_dst, a.num_src) == (b.num_dst, b.num_src)
            for name in ("indptr", "indices", "src_ids", "src_time", "edge_ids"):
                assert torch.equal(getattr(a, name).long() if name != "src_time" else getattr(a, name),
                                   getattr(b, name).long() if name != "src_time" else getattr(b, name)), name


def typed_blocks(subgraph) -> list:
    """A typed sample's blocks as plain lists (per type and relation), for comparing two samplers."""
    return [({t: (ids.tolist(), block.src_time[t].tolist()) for t, ids in block.src_ids.items()},
             {r: (b.indptr.tolist(), b.indices.long().tolist(), block.edge_ids[r].tolist())
              for r, b in block.blocks.items()}) for block in subgraph.blocks]


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("strict", [False, True])
def test_the_typed_device_sampler_draws_the_host_samplers_blocks(seed, strategy, strict, device="cpu"):
    """TypedTemporalDeviceSampler (torch ops, on the CPU here) draws TemporalTypedSampler's blocks, timed and
    static relations, seeds of one type or two."""
    from neutronorch.sampling.temporal_device import TypedTemporalDeviceSampler

    g = typed_graph(seed)
    rng = np.random.default_rng(seed)
    seeds = {"item": np.arange(8), "user": np.arange(5)} if seed % 2 else {"item": np.arange(8)}
    times = {t: rng.integers(0, 60, ids.shape[0]) for t, ids in seeds.items()}
    host = TemporalTypedSampler(g, [3, 2], strategy, strict).sample(seeds, times, seed + 7)
    moved = TypedTemporalDeviceSampler(g, torch.device(device), [3, 2], strategy, strict)
    got = moved.sample({t: torch.from_numpy(ids).to(device) for t, ids in seeds.items()}, times, seed + 7)
    assert typed_blocks(got) == typed_blocks(host)
