"""The typed sampling contract: per-relation draws through each relation's CSC, keyed by (batch key, hop,
relation, vertex), over per-type frontiers that lead with their destinations."""

from __future__ import annotations

import threading
from collections import Counter

import numba
import numpy as np
import pytest
import torch

from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.data.typed import Relation, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.jit import read_only
from neutronorch.sampling import kernels
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key, layer_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler, hop_keys, relation_key, typed_fanouts

WRITES = ("author", "writes", "paper")
CITES = ("paper", "cites", "paper")
REV_WRITES = ("paper", "rev_writes", "author")
REV_CITES = ("paper", "rev_cites", "paper")


def tiny() -> TypedGraph:
    """3 papers (the target), 3 authors. Paper 0 is written by authors 0 and 1 and cites papers 1 and 2,
    paper 1 by author 1 and cites nothing, paper 2 by author 2 and cites paper 0; then the reverses."""
    writes = Relation.from_edges([0, 1, 1, 2], [0, 0, 1, 2], 3, 3)
    cites = Relation.from_edges([1, 2, 0], [0, 0, 2], 3, 3)
    return TypedGraph(name="tiny", num_nodes={"paper": 3, "author": 3}, relations={WRITES: writes, CITES: cites},
                      features={}, target="paper", labels=None, train_idx=np.array([], np.int64),
                      val_idx=np.array([], np.int64), test_idx=np.array([], np.int64),
                      num_classes=0).with_reverse()


@pytest.fixture(scope="module")
def mag() -> TypedGraph:
    """A MAG-like graph of 3,000 vertices with every relation reversed, so messages reach every type."""
    return synthetic_typed(nodes=3000, degree=8, features=8, seed=1).with_reverse()


def check_contract(graph: TypedGraph, sg, fanouts) -> int:
    """Assert the typed sampling contract on ``sg`` and return how many rows drew fewer neighbours than
    their degree (rows where the draw was a real sample)."""
    per_relation = typed_fanouts(graph, fanouts)
    assert list(sg.frontiers[-1]) == [graph.target]
    assert torch.equal(sg.frontiers[-1][graph.target], sg.seeds)
    assert len(sg.frontiers) == len(sg.blocks) + 1
    sampled = 0
    for layer, typed in enumerate(sg.blocks):
        hop = len(sg.blocks) - 1 - layer  # blocks run bottom layer first: the seed hop is the last block
        src, dst = sg.frontiers[layer], sg.frontiers[layer + 1]
        assert list(typed.num_src) == list(src) and list(typed.src_ids) == list(src)
        assert list(typed.num_dst) == list(dst)
        for t, ids in src.items():
            assert typed.num_src[t] == ids.shape[0] and torch.equal(typed.src_ids[t], ids)
            assert ids.dtype == torch.int64 and torch.unique(ids).shape[0] == ids.shape[0], f"{t} repeats"
            assert ids.shape[0] == 0 or int(ids.max()) < graph.num_nodes[t]
        for t, ids in dst.items():
            assert typed.num_dst[t] == ids.shape[0]
            assert torch.equal(src[t][:ids.shape[0]], ids), f"{t}'s destinations must lead its frontier"
            assert torch.equal(typed.dst_ids(t), ids)
        assert list(typed.blocks) == [r for r in graph.relations if typed.num_dst.get(r[2], 0) > 0]
        reached = {t: torch.arange(n) < typed.num_dst.get(t, 0) for t, n in typed.num_src.items()}
        for relation, block in typed.blocks.items():
            s, _, d = relation
            assert block.num_dst == typed.num_dst[d] and block.num_src == typed.num_src[s]
            assert block.indptr.shape[0] == block.num_dst + 1 and int(block.indptr[-1]) == block.num_edges
            assert block.src_ids is None and block.dst_offset == 0
            reached[s][block.indices] = True
            csc, fanout = graph.relations[relation], per_relation[relation][hop]
            for i, v in enumerate(dst[d].tolist()):
                full = Counter(csc.indices[csc.indptr[v]:csc.indptr[v + 1]].tolist())
                got = Counter(src[s][block.indices[block.indptr[i]:block.indptr[i + 1]]].tolist())
                degree = sum(full.values())
                assert sum(got.values()) == (degree if fanout < 0 else min(fanout, degree))
                assert not got - full, f"{relation} hop {hop}: drew a non-edge, or an edge twice, for {v}"
                sampled += sum(got.values()) < degree
        assert all(bool(m.all()) for m in reached.values()), "a frontier vertex is neither destination nor drawn"
        # New vertices follow the destinations in first-appearance order over the relations in graph order.
        expected = {t: list(dict.fromkeys(ids.tolist())) for t, ids in dst.items()}
        for relation, block in typed.blocks.items():
            order = expected.setdefault(relation[0], [])
            order += [u for u in dict.fromkeys(src[relation[0]][block.indices].tolist()) if u not in order]
        assert {t: ids.tolist() for t, ids in src.items()} == expected
    for lower, upper in zip(sg.blocks, sg.blocks[1:]):
        assert lower.num_dst == upper.num_src  # one layer's outputs are the next one's inputs
    return sampled


def neighbours(sg) -> dict:
    """(hop, relation, vertex) -> the global ids drawn for it, in draw order."""
    out = {}
    for layer, typed in enumerate(sg.blocks):
        hop = len(sg.blocks) - 1 - layer
        for relation, block in typed.blocks.items():
            src = sg.frontiers[layer][relation[0]]
            for i, v in enumerate(sg.frontiers[layer + 1][relation[2]].tolist()):
                out[hop, relation, v] = src[block.indices[block.indptr[i]:block.indptr[i + 1]]].tolist()
    return out


def test_sampled_edges_exist_and_follow_each_relations_fanout(mag):
    fanouts = {"writes": [4, 2], "cites": [3, 3], "rev_writes": [2, 5], "default": [5, 3]}
    seeds = np.random.default_rng(0).choice(mag.num_nodes["paper"], 40, replace=False)
    sg = TypedNeighborSampler(mag, fanouts).sample(seeds, batch_key(0, 1, 2))
    assert check_contract(mag, sg, fanouts) > 100
    assert set(sg.input_nodes) == set(mag.node_types)  # two hops reach every type of a reversed MAG
    assert sg.num_sampled_edges == sum(b.num_edges for typed in sg.blocks for b in typed.blocks.values())


@pytest.mark.parametrize("fanout", [-1, 100])
def test_all_neighbours_when_the_fanout_covers_the_degree(mag, fanout):
    seeds = np.arange(0, mag.num_nodes["paper"], 50)
    sg = TypedNeighborSampler(mag, [fanout, fanout]).sample(seeds, 5)
    check_contract(mag, sg, [fanout, fanout])
    covered = 0
    for (_, relation, v), got in neighbours(sg).items():
        csc = mag.relations[relation]
        full = csc.indices[csc.indptr[v]:csc.indptr[v + 1]].tolist()
        if fanout < 0 or len(full) <= fanout:
            assert got == full  # all of them, in CSC order
            covered += 1
    assert covered > 1000


def test_frontiers_grow_in_relation_order_by_first_appearance():
    graph = tiny()
    sg = TypedNeighborSampler(graph, [-1, -1]).sample(np.array([2, 0]), 0)
    check_contract(graph, sg, [-1, -1])
    top, bottom = sg.blocks[1], sg.blocks[0]
    # Hop 0: papers 2 and 0 are the only destinations, so the relation into authors has no block. Their
    # authors (2; 0, 1) come first through writes, then the papers they cite join after them (1 is new).
    assert top.num_dst == {"paper": 2} and list(top.blocks) == [WRITES, CITES, REV_CITES]
    assert top.src_ids["paper"].tolist() == [2, 0, 1] and top.src_ids["author"].tolist() == [2, 0, 1]
    assert top.blocks[WRITES].indices.tolist() == [0, 1, 2] and top.blocks[WRITES].indptr.tolist() == [0, 1, 3]
    assert top.blocks[CITES].indices.tolist() == [1, 2, 0]
    # Hop 1: every type has destinations, so every relation has a block; paper 1 cites nothing.
    assert bottom.num_dst == {"paper": 3, "author": 3} and list(bottom.blocks) == list(graph.relations)
    assert bottom.blocks[CITES].indptr.tolist() == [0, 1, 3, 3]
    assert bottom.blocks[REV_WRITES].indices.tolist() == [0, 1, 1, 2]


def test_a_relation_with_fanout_zero_adds_no_edge_and_a_type_may_enter_empty():
    graph = tiny()
    fanouts = {WRITES: [0, 1], "default": [-1, -1]}
    sg = TypedNeighborSampler(graph, fanouts).sample(np.array([0, 1]), 3)
    check_contract(graph, sg, fanouts)
    top, bottom = sg.blocks[1], sg.blocks[0]
    assert top.blocks[WRITES].num_edges == 0 and top.blocks[WRITES].indptr.tolist() == [0, 0, 0]
    assert top.num_src["author"] == 0 and bottom.num_dst["author"] == 0  # reached by writes, with no vertex
    assert REV_WRITES not in bottom.blocks and [t for t, n in bottom.num_dst.items() if n] == ["paper"]
    assert bottom.blocks[WRITES].num_edges == 3  # one author per paper of papers 0, 1 and 2 at fanout 1


def test_same_key_same_blocks_and_another_key_other_blocks(mag):
    seeds = np.arange(0, mag.num_nodes["paper"], 17)
    sampler = TypedNeighborSampler(mag, [4, 3])
    a, b, c = (sampler.sample(seeds, key) for key in (batch_key(0, 0, 0), batch_key(0, 0, 0), batch_key(0, 0, 1)))
    for x, y in zip(a.blocks, b.blocks):
        assert x.src_ids.keys() == y.src_ids.keys()
        assert all(torch.equal(x.src_ids[t], y.src_ids[t]) for t in x.src_ids)
        assert all(torch.equal(x.blocks[r].indptr, y.blocks[r].indptr)
                   and torch.equal(x.blocks[r].indices, y.blocks[r].indices) for r in x.blocks)
    assert neighbours(a) == neighbours(b) and neighbours(a) != neighbours(c)


def test_a_vertex_draws_the_same_neighbours_in_any_batch_sampler_or_thread_count(mag):
    key = batch_key(3, 1, 4)
    seeds = np.random.default_rng(1).choice(mag.num_nodes["paper"], 60, replace=False)
    whole = neighbours(TypedNeighborSampler(mag, [3, 2]).sample(seeds, key))
    others = [TypedNeighborSampler(mag, [3, 2]).sample(seeds[i:i + 1], key) for i in range(5)]
    others.append(TypedNeighborSampler(mag, [3, 2]).sample(np.concatenate([seeds[30:], [7, 8, 9]]), key))
    numba.set_num_threads(1)
    try:
        others.append(TypedNeighborSampler(mag, [3, 2]).sample(seeds[::-1].copy(), key))
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    shared = 0
    for sg in others:
        part = neighbours(sg)
        common = part.keys() & whole.keys()
        assert all(part[k] == whole[k] for k in common)
        shared += sum(hop == 1 for hop, _, _ in common)
    assert shared > 100  # vertices reached at hop 1 in both samples too, not only the seeds


def test_each_hop_of_a_one_relation_graph_is_neighbor_samplers_hop_with_the_layer_key(small_csc):
    indptr, indices = small_csc
    edge = ("vertex", "to", "vertex")
    graph = TypedGraph(name="one", num_nodes={"vertex": 300}, relations={edge: Relation(indptr, indices)},
                       features={}, target="vertex", labels=None, train_idx=np.array([], np.int64),
                       val_idx=np.array([], np.int64), test_idx=np.array([], np.int64), num_classes=0)
    fanouts, key = [7, 4, 3], batch_key(1, 2, 3)
    sg = TypedNeighborSampler(graph, fanouts).sample(np.arange(0, 300, 9), key)
    homogeneous = NeighborSampler(indptr, indices, fanouts)
    for hop, fanout in enumerate(fanouts):
        typed, layer = sg.blocks[-1 - hop], -1 - hop
        block, frontier = homogeneous.sample_hop(sg.frontiers[layer]["vertex"].numpy(), fanout,
                                                 layer_key(key, hop))
        assert np.array_equal(frontier, sg.frontiers[layer - 1]["vertex"].numpy())
        assert torch.equal(typed.blocks[edge].indptr, block.indptr)
        assert torch.equal(typed.blocks[edge].indices, block.indices)
    # One relation draws with the layer key itself; of several, each mixes its own name in.
    assert hop_keys(key, 0, [edge]) == {edge: layer_key(key, 0)}
    assert hop_keys(key, 0, [edge, WRITES]) == {r: relation_key(key, 0, r) for r in (edge, WRITES)}


def test_each_relations_draws_are_the_kernels_with_its_key(mag):
    seeds = np.arange(0, mag.num_nodes["paper"], 23)
    key = batch_key(7, 0, 0)
    top = TypedNeighborSampler(mag, [3]).sample(seeds, key).blocks[0]
    keys = {relation_key(key, 0, r) for r in mag.relations}
    assert len(keys) == len(mag.relations)
    for relation, block in top.blocks.items():
        csc = mag.relations[relation]
        ptr, nbrs = kernels.sample_neighbors(read_only(csc.indptr), read_only(csc.indices), seeds, 3,
                                             np.uint64(relation_key(key, 0, relation)), kernels.NO_ORDER)
        assert np.array_equal(block.indptr.numpy(), ptr)
        assert np.array_equal(top.src_ids[relation[0]][block.indices].numpy(), nbrs)


def test_relation_keys_are_pinned():
    # A stable hash of the relation (not Python's salted hash()): every process and rank agrees, and a
    # change here changes every typed sample ever drawn.
    assert relation_key(12345, 1, WRITES) == relation_key(12345, 1, ("author", "writes", "paper"))
    assert relation_key(12345, 1, WRITES) == 0x99BAF56CBD93D1C8


def test_degrees_are_out_degrees_through_the_relation(mag):
    seeds = np.arange(0, mag.num_nodes["paper"], 31)
    with_degrees = TypedNeighborSampler(mag, [3, 2], degrees=True).sample(seeds, 1)
    for typed in with_degrees.blocks:
        for (s, name, d), block in typed.blocks.items():
            out = np.bincount(mag.relations[s, name, d].indices, minlength=mag.num_nodes[s])
            assert block.src_degree.dtype == torch.float32
            assert np.array_equal(block.src_degree.numpy(), out[typed.src_ids[s].numpy()])
    plain = TypedNeighborSampler(mag, [3, 2]).sample(seeds, 1)
    assert all(b.src_degree is None for typed in plain.blocks for b in typed.blocks.values())


def test_fanouts_by_triple_name_or_default():
    graph = tiny()
    resolved = typed_fanouts(graph, {WRITES: [1, 2], "cites": "3,4", "default": (-1, 0)})
    assert resolved == {WRITES: [1, 2], CITES: [3, 4], REV_WRITES: [-1, 0], REV_CITES: [-1, 0]}
    assert typed_fanouts(graph, [5, 5]) == dict.fromkeys(graph.relations, [5, 5])


@pytest.mark.parametrize("fanouts, words", [
    ({"writes": [1, 2], "default": [3]}, ["(paper, cites, paper) (the default) 1 layer but (author, writes, "
                                          "paper) 2"]),
    ({"wrote": [1], "default": [1]}, ["'wrote'", "no relation is named"]),
    ({("paper", "writes", "author"): [1], "default": [1]}, ["no relation (paper, writes, author)"]),
    ({"writes": [1], "cites": [1]}, ["(paper, rev_writes, author)", "(paper, rev_cites, paper)", "'default'"]),
    ({"writes": [1], WRITES: [1], "default": [1]}, ["(author, writes, paper) twice"]),
    ({"writes": [-2], "default": [1]}, ["(author, writes, paper)", "-1 for all"]),
    ({"writes": [1.5], "default": [1]}, ["(author, writes, paper)", "not a list of integers"]),
    ([True, 2], ["every relation", "not a list of integers"]),
    ([], ["every relation", "one fanout per layer"]),
    ({"default": 3}, ["the default", "not a list of integers"]),
])
def test_bad_fanouts_name_the_relation(fanouts, words):
    with pytest.raises(ConfigError) as error:
        TypedNeighborSampler(tiny(), fanouts)
    assert all(word in str(error.value) for word in words), str(error.value)


def test_a_name_two_relations_share_must_be_a_triple():
    graph = tiny()
    graph.relations[("author", "cites", "author")] = Relation.from_edges([0], [1], 3, 3)
    with pytest.raises(ConfigError, match="2 relations are named 'cites'"):
        typed_fanouts(graph, {"cites": [1], "default": [1]})
    assert typed_fanouts(graph, {CITES: [2], "default": [1]})[CITES] == [2]


def test_one_sampler_per_thread():
    sampler = TypedNeighborSampler(tiny(), [1])
    sampler.sample(np.array([0]), 0)
    errors = []

    def elsewhere():
        try:
            sampler.sample(np.array([0]), 0)
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert len(errors) == 1 and "one sampler per thread" in errors[0]


def block_edges(typed, src_ids, dst_ids) -> dict:
    """Per relation, each destination's (global id) drawn sources (global ids), as a set of pairs."""
    out = {}
    for relation, block in typed.blocks.items():
        counts = torch.diff(block.indptr)
        dst = torch.repeat_interleave(dst_ids[relation[2]][:block.num_dst], counts)
        out[relation] = set(zip(src_ids[relation[0]][block.indices].tolist(), dst.tolist()))
    return out


def test_upper_hops_then_the_bottom_block_are_the_whole_sample(mag):
    """``sample_hops(L - 1)`` and ``sample_bottom`` of its last frontier draw, to the block, what ``sample``
    does: the split NeutronOrch plans its hot sets by."""
    seeds = np.array([5, 17, 3, 250, 999], np.int64)
    sampler = TypedNeighborSampler(mag, [4, 3, 2])
    whole = sampler.sample(seeds, 77)
    upper = sampler.sample_hops(seeds, 77, 2)
    bottom = sampler.sample_bottom({t: ids.numpy() for t, ids in upper.frontiers[0].items()}, 77)
    assert len(upper.blocks) == 2
    for a, b in zip(whole.blocks[1:], upper.blocks):
        assert a.num_dst == b.num_dst and a.num_src == b.num_src
        for relation in a.blocks:
            assert torch.equal(a.blocks[relation].indptr, b.blocks[relation].indptr)
            assert torch.equal(a.blocks[relation].indices, b.blocks[relation].indices)
    assert bottom.num_dst == whole.blocks[0].num_dst and bottom.num_src == whole.blocks[0].num_src
    for t in bottom.src_ids:
        assert torch.equal(bottom.src_ids[t], whole.blocks[0].src_ids[t])
    for relation, block in whole.blocks[0].blocks.items():
        assert torch.equal(bottom.blocks[relation].indptr, block.indptr)
        assert torch.equal(bottom.blocks[relation].indices, block.indices)


def test_the_bottom_block_of_some_destinations_draws_what_the_whole_sample_draws_for_them(mag):
    seeds = np.arange(0, 600, 7, dtype=np.int64)
    sampler = TypedNeighborSampler(mag, [5, 3])
    whole = sampler.sample(seeds, 5)
    full = whole.frontiers[1]
    # every third destination of each type, in reverse order
    chosen = {t: ids.numpy()[::-3].copy() for t, ids in full.items()}
    part = sampler.sample_bottom(chosen, 5)
    assert part.num_dst == {t: ids.shape[0] for t, ids in chosen.items()}
    for t, ids in chosen.items():
        assert torch.equal(part.src_ids[t][:ids.shape[0]], torch.from_numpy(ids))
    mine = block_edges(part, part.src_ids, part.src_ids)
    theirs = block_edges(whole.blocks[0], whole.blocks[0].src_ids, whole.blocks[0].src_ids)
    for relation, pairs in mine.items():
        wanted = {int(v) for v in chosen[relation[2]]}
        assert pairs == {(u, v) for u, v in theirs[relation] if v in wanted}
