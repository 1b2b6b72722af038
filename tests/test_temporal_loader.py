"""NeighborLoader sampling by time (docs/temporal.md, "The loader"): PyG's argument names, no edge after its
seed's time on any batch of an epoch, resume mid-epoch bit-identical, and refusals for what cannot run with
time yet."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from neutronorch.data import Graph
from neutronorch.data.relation import Relation
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError
from neutronorch.loader import LinkNeighborLoader, NeighborLoader

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def graph() -> Graph:
    rng = np.random.default_rng(0)
    n, edges = 300, 4000
    return Graph.from_arrays(rng.integers(0, n, edges), rng.integers(0, n, edges), rng.random((n, 4)),
                             rng.integers(0, 3, n), edge_time=rng.integers(0, 100, edges),
                             node_time=rng.integers(0, 120, n))


def seeds_and_times(graph: Graph, seed: int = 1):
    rng = np.random.default_rng(seed)
    seeds = rng.choice(graph.num_nodes, 90, replace=False)
    return seeds, rng.integers(0, 120, seeds.shape[0])


@pytest.mark.parametrize("strategy, strict", [("uniform", False), ("last", False), ("uniform", True)])
def test_no_batch_of_an_epoch_sees_an_edge_after_its_seed(graph, strategy, strict):
    seeds, times = seeds_and_times(graph)
    time_of = dict(zip(seeds.tolist(), times.tolist()))
    loader = NeighborLoader(graph, [5, 3], 16, seeds=seeds, time_attr="edge_time", input_time=times,
                            temporal_strategy=strategy, strict_time=strict)
    batches = 0
    for batch in loader:
        data = batch.to_pyg()
        assert batch.input_time.tolist() == [time_of[s] for s in batch.seeds.tolist()]
        dst_time = data.seed_time[data.edge_index[1]]
        assert torch.all(data.edge_time < dst_time) if strict else torch.all(data.edge_time <= dst_time)
        assert torch.equal(data.seed_time[data.edge_index[0]], dst_time)  # sources inherit the seed's time
        assert torch.equal(torch.from_numpy(np.asarray(graph.indices)[data.e_id.numpy()]).long(),
                           data.n_id[data.edge_index[0]])  # each edge is the graph's edge e_id
        assert torch.equal(data.x, torch.from_numpy(graph.features[data.n_id.numpy()]).float())
        batches += 1
    assert batches == len(loader) == 6


def test_resume_mid_epoch_is_bit_identical(graph):
    seeds, times = seeds_and_times(graph, 2)

    def snapshot(batch):
        data = batch.to_pyg()
        return [t.clone() for t in (data.n_id, data.edge_index, data.x, data.seed_time, data.edge_time, data.y)]

    settings = dict(seeds=seeds, time_attr="edge_time", input_time=times, epoch=1)
    whole = [snapshot(b) for b in NeighborLoader(graph, [4, 4], 16, **settings)]
    resumed = [snapshot(b) for b in NeighborLoader(graph, [4, 4], 16, start=3, **settings)]
    assert len(resumed) == len(whole) - 3
    for a, b in zip(whole[3:], resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_vertex_times_are_the_default_input_time(graph):
    seeds, _ = seeds_and_times(graph)
    batch = next(iter(NeighborLoader(graph, [3], 8, seeds=seeds, time_attr="edge_time", shuffle=False)))
    assert batch.input_time.tolist() == graph.node_time[seeds[:8]].tolist()


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_device_mode_samples_by_time_what_exact_mode_samples(graph, strategy):
    """TorchTemporalSampler in device mode (its torch ops on the CPU here) draws the host sampler's blocks."""
    seeds, times = seeds_and_times(graph)
    edges = np.stack([seeds[:60], seeds[30:]])
    made = {}
    for mode in ("exact", "device"):
        nodes = NeighborLoader(graph, [3, 2], 16, seeds=seeds, time_attr="edge_time", input_time=times, mode=mode,
                               temporal_strategy=strategy)
        links = LinkNeighborLoader(graph, [3, 2], 16, edges=edges, time_attr="edge_time", edge_label_time=times[:60],
                                   mode=mode, temporal_strategy=strategy)
        made[mode] = [(b.n_id.tolist(), b.seed_time.tolist(), [bl.edge_ids.tolist() for bl in b.blocks])
                      for loader in (nodes, links) for b in loader]
    assert made["device"] == made["exact"] and len(made["exact"]) == 10
    typed = {mode: [({t: ids.tolist() for t, ids in b.n_id.items()}, {t: at.tolist() for t, at in b.seed_time.items()})
                    for b in NeighborLoader(TypedGraph.of(graph), [3, 2], 16, seeds=seeds, time_attr="edge_time",
                                            input_time=times, mode=mode, temporal_strategy=strategy)]
             for mode in ("exact", "device")}
    assert typed["device"] == typed["exact"] and len(typed["exact"]) == 6


def test_what_cannot_sample_by_time_yet_is_refused(graph):
    seeds, times = seeds_and_times(graph)
    with pytest.raises(ConfigError, match="`gcn_norm` symmetric"):
        NeighborLoader(graph, [3], 8, seeds=seeds, time_attr="edge_time", input_time=times, model="gcn",
                       gcn_norm="symmetric")
    static = dataclasses.replace(graph, edge_time=None, node_time=None)
    with pytest.raises(ConfigError, match="names edge times, and .* has none"):
        NeighborLoader(static, [3], 8, time_attr="edge_time", input_time=times)
    with pytest.raises(ConfigError, match="names vertex times, and .* has none"):
        NeighborLoader(static, [3], 8, time_attr="node_time", input_time=times)
    with pytest.raises(ConfigError, match="`time_attr` 'year'"):
        NeighborLoader(graph, [3], 8, time_attr="year", input_time=times)
    with pytest.raises(ConfigError, match="`input_time`, `temporal_strategy`: settings of sampling by time"):
        NeighborLoader(static, [3], 8, input_time=times, temporal_strategy="last")
    with pytest.raises(ConfigError, match="temporal sampling: .*NeighborLoader"):
        NeighborLoader(graph, [3], 8)  # times in the graph, none asked for: not sampled without them


def test_bad_input_times_are_clear_errors(graph):
    seeds, times = seeds_and_times(graph)
    with pytest.raises(DataError, match=r"`input_time` have shape \(89,\), expected \(90,\)"):
        NeighborLoader(graph, [3], 8, seeds=seeds, time_attr="edge_time", input_time=times[1:])
    with pytest.raises(DataError, match="hold fractions"):
        NeighborLoader(graph, [3], 8, seeds=seeds, time_attr="edge_time", input_time=times + 0.5)
    with pytest.raises(ConfigError, match="`temporal_strategy` 'newest'"):
        NeighborLoader(graph, [3], 8, seeds=seeds, time_attr="edge_time", input_time=times,
                       temporal_strategy="newest")
    no_vertex_times = dataclasses.replace(graph, node_time=None)
    with pytest.raises(ConfigError, match="`input_time`: give each seed its time"):
        NeighborLoader(no_vertex_times, [3], 8, seeds=seeds, time_attr="edge_time")


@pytest.mark.parametrize("time_attr", ["node_time", "time"])
def test_sampling_by_vertex_times_takes_neighbours_that_existed_at_the_seeds_time(graph, time_attr):
    seeds, times = seeds_and_times(graph, 3)
    only_vertices = dataclasses.replace(graph, edge_time=None)  # "time" then names the vertex times too
    for strict in (False, True):
        for batch in NeighborLoader(only_vertices if time_attr == "time" else graph, [4, 3], 32, seeds=seeds,
                                    time_attr=time_attr, input_time=times, strict_time=strict):
            data = batch.to_pyg()
            assert torch.equal(data.time, torch.from_numpy(graph.node_time[data.n_id.numpy()]))
            source_time, dst_time = data.time[data.edge_index[0]], data.seed_time[data.edge_index[1]]
            assert torch.all(source_time < dst_time) if strict else torch.all(source_time <= dst_time)
    full = NeighborLoader(graph, [-1], 90, seeds=seeds, time_attr="node_time", input_time=times, shuffle=False)
    block = next(iter(full)).blocks[0]
    for i, v in enumerate(seeds.tolist()):  # fanout -1: exactly the in-neighbours that existed by then
        column = np.asarray(graph.indices[graph.indptr[v]:graph.indptr[v + 1]])
        expected = sorted(column[graph.node_time[column] <= times[i]].tolist())
        got = block.src_ids[block.indices[block.indptr[i]:block.indptr[i + 1]]].tolist()
        assert sorted(got) == expected


def test_a_typed_graph_is_sampled_by_its_relations_times():
    pytest.importorskip("torch_geometric")
    rng = np.random.default_rng(5)
    users, items, edges = 40, 30, 600
    src, dst, times = rng.integers(0, users, edges), rng.integers(0, items, edges), rng.integers(0, 50, edges)
    from neutronorch.data.relation import Relation

    typed = TypedGraph("timed", {"user": users, "item": items},
                       {("user", "buys", "item"): Relation.from_edges(src, dst, users, items, edge_time=times)},
                       {"item": rng.random((items, 3)).astype(np.float32), "user": rng.random((users, 2))
                        .astype(np.float32)}, "item", np.arange(items) % 2, np.arange(20), np.arange(20, 25),
                       np.arange(25, 30), 2).validate()
    seeds = np.arange(20)
    at = rng.integers(0, 60, 20)
    whole = []
    for batch in NeighborLoader(typed, [4, 3], 8, seeds=seeds, time_attr="edge_time", input_time=at):
        data = batch.to_pyg()
        whole.append(data)
        assert data["item"].seed_time[:batch.batch_size].tolist() == at[batch.seeds.numpy()].tolist()
        for relation in data.edge_types:  # (user, buys, item) and its reverse, both timed
            store = data[relation]
            dst_time = data[relation[2]].seed_time[store.edge_index[1]]
            assert store.edge_time.shape[0] == store.edge_index.shape[1] and torch.all(store.edge_time <= dst_time)
            assert torch.equal(data[relation[0]].seed_time[store.edge_index[0]], dst_time)
    resumed = next(iter(NeighborLoader(typed, [4, 3], 8, seeds=seeds, time_attr="edge_time", input_time=at,
                                       start=1))).to_pyg()
    for relation in resumed.edge_types:
        assert torch.equal(resumed[relation].edge_index, whole[1][relation].edge_index)
        assert torch.equal(resumed[relation].edge_time, whole[1][relation].edge_time)


def link_setup(seed: int = 4, spoil: bool = False):
    """A timed graph and 240 of its edges as supervision edges at their own times; with ``spoil``, every
    supervision edge copied to a time after all of them (a planted spoiler)."""
    rng = np.random.default_rng(seed)
    n, count = 200, 3000
    src, dst, times = rng.integers(0, n, count), rng.integers(0, n, count), rng.integers(0, 100, count)
    picked = rng.choice(count, 240, replace=False)
    labelled = np.stack([src[picked], dst[picked]])
    if spoil:
        src, dst = np.concatenate([src, src[picked]]), np.concatenate([dst, dst[picked]])
        times = np.concatenate([times, times[picked] + 1000])
    graph = Graph.from_arrays(src, dst, rng.random((n, 4)), rng.integers(0, 3, n), edge_time=times)
    return graph, labelled, np.asarray(times[picked])


def link_snapshot(batch):
    data = batch.to_pyg()
    return [t.clone() for t in (data.n_id, data.edge_index, data.x, data.seed_time, data.edge_label_index,
                                data.edge_label_time)]


def test_no_link_batch_sees_its_positive_or_anything_after_it():
    graph, edges, times = link_setup()
    loader = LinkNeighborLoader(graph, [5, 3], 40, edges=edges, negatives=2, time_attr="edge_time",
                                edge_label_time=times, temporal_strategy="uniform")
    for batch in loader:
        data = batch.to_pyg()
        p = batch.num_pairs
        assert torch.all(data.edge_time < data.seed_time[data.edge_index[1]])  # strictly before: not itself
        assert torch.equal(data.edge_label_time[:p], torch.from_numpy(times[batch.input_id.numpy()]))
        for row in (0, 1):  # both ends and every negative are seeds at their positive's time
            assert torch.equal(data.seed_time[data.edge_label_index[row]], data.edge_label_time)
        assert torch.equal(data.n_id[data.edge_label_index[:, :p]], torch.from_numpy(edges[:, batch.input_id]))


def test_planted_spoilers_change_no_link_batch_and_resume_is_bit_identical():
    graph, edges, times = link_setup()
    spoiled, _, _ = link_setup(spoil=True)
    settings = dict(edges=edges, negatives=1, time_attr="edge_time", edge_label_time=times, epoch=2)
    clean = [link_snapshot(b) for b in LinkNeighborLoader(graph, [4, 4], 48, **settings)]
    dirty = [link_snapshot(b) for b in LinkNeighborLoader(spoiled, [4, 4], 48, **settings)]
    resumed = [link_snapshot(b) for b in LinkNeighborLoader(graph, [4, 4], 48, start=2, **settings)]
    assert len(clean) == len(dirty) == 5 and len(resumed) == 3
    for a, b in zip(clean, dirty):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    for a, b in zip(clean[2:], resumed):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_link_loader_time_arguments_are_checked():
    graph, edges, times = link_setup()
    with pytest.raises(ConfigError, match="give edge_label_time"):
        LinkNeighborLoader(graph, [3], 8, edges=edges, time_attr="edge_time")
    with pytest.raises(ConfigError, match="give time_attr='edge_time'"):
        LinkNeighborLoader(graph, [3], 8, edges=edges, edge_label_time=times)
    with pytest.raises(ConfigError, match="`temporal_strategy`: a setting of sampling by time"):
        LinkNeighborLoader(dataclasses.replace(graph, edge_time=None, node_time=None), [3], 8, edges=edges,
                           temporal_strategy="last")
    with pytest.raises(DataError, match=r"`edge_label_time` have shape \(239,\), expected \(240,\)"):
        LinkNeighborLoader(graph, [3], 8, edges=edges, time_attr="edge_time", edge_label_time=times[1:])


def test_dgl_blocks_carry_the_times(graph):
    dgl = pytest.importorskip("dgl")
    seeds, times = seeds_and_times(graph)
    batch = next(iter(NeighborLoader(graph, [4, 3], 16, seeds=seeds, time_attr="edge_time", input_time=times)))
    for block, g in zip(batch.blocks, batch.to_dgl_blocks()):
        assert torch.equal(g.srcdata["seed_time"], block.src_time)
        assert torch.equal(g.edata["timestamp"], torch.from_numpy(graph.edge_time[block.edge_ids.numpy()]))
        src, dst = g.edges()
        assert torch.all(g.edata["timestamp"] <= g.dstdata["seed_time"][dst])
        assert torch.equal(g.srcdata[dgl.NID][src], torch.from_numpy(np.asarray(graph.indices)[
            g.edata[dgl.EID].numpy()]).long())


def test_a_typed_graph_is_sampled_by_its_vertex_times():
    """Papers with years citing papers, written by authors without years: by vertex times a cited paper exists
    from its year (each edge at its source's time, at most its destination entry's), an author at every time;
    the PyG form's ``e_id`` are the edges' positions in the relations as given, and ``time`` each vertex's."""
    pytest.importorskip("torch_geometric")
    rng = np.random.default_rng(3)
    papers, authors = 80, 30
    years = rng.integers(2000, 2020, papers)
    cites = (rng.integers(0, papers, 500), rng.integers(0, papers, 500))
    writes = (rng.integers(0, authors, 200), rng.integers(0, papers, 200))
    typed = TypedGraph("dated", {"author": authors, "paper": papers},
                       {("author", "writes", "paper"): Relation.from_edges(*writes, authors, papers,
                                                                           rng.random((200, 2)).astype(np.float32)),
                        ("paper", "cites", "paper"): Relation.from_edges(*cites, papers, papers)},
                       {"paper": rng.random((papers, 3)).astype(np.float32)}, "paper", np.arange(papers) % 2,
                       np.arange(60), np.arange(60, 70), np.arange(70, 80), 2, node_time={"paper": years}).validate()
    checked = 0
    for mode in ("exact", "device"):
        for batch in NeighborLoader(typed, [4, 3], 16, seeds=np.arange(60), time_attr="node_time", mode=mode):
            data = batch.to_pyg()
            assert torch.equal(data["paper"].time, torch.from_numpy(years)[data["paper"].n_id])
            assert data["paper"].seed_time[:batch.batch_size].tolist() == years[batch.seeds.numpy()].tolist()
            for relation in data.edge_types:
                store, given = data[relation], typed.with_reverse().relations[relation]
                src_ids = data[relation[0]].n_id[store.edge_index[0]]
                assert torch.equal(torch.from_numpy(np.asarray(given.indices))[store.e_id], src_ids) \
                    if "e_id" in store else relation[0] == "author"
                dst_time = data[relation[2]].seed_time[store.edge_index[1]]
                if relation[0] == "paper":  # at its source's year, at most its seed's
                    assert torch.equal(store.edge_time, torch.from_numpy(years)[src_ids])
                    assert torch.all(store.edge_time <= dst_time)
                checked += store.edge_index.shape[1]
    assert checked > 500
