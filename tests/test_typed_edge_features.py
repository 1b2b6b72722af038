"""Edge features through sampled typed blocks: the sampler's edge ids name the edges it drew (and drawing them
changes no draw), the rows it reads are the graph's, and the models read them (R-GAT's attention as PyG's
``GATConv(edge_dim=...)``, SAGE's and R-GCN's weighted means), in the bottom layer too, in training and
evaluation."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from neutronorch import TrainConfig, train
from neutronorch.data import read_typed, synthetic_typed, write_typed
from neutronorch.data.typed import Relation, TypedGraph
from neutronorch.jit import read_only
from neutronorch.errors import ConfigError, DataError
from neutronorch.nn.relational import module_key
from neutronorch.nn.typed_models import LEAKY_SLOPE, TypedGNN, TypedSpec, edge_arguments
from neutronorch.sampling import kernels
from neutronorch.sampling.typed_sampler import TypedNeighborSampler, gather_edge_features
from neutronorch.features.store import TypedInputs

CPU = torch.device("cpu")
CITES, REV_CITES = ("paper", "cites", "paper"), ("paper", "rev_cites", "paper")
WRITES, REV_WRITES = ("author", "writes", "paper"), ("paper", "rev_writes", "author")


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (conftest.py)


def with_wide_writes(graph: TypedGraph, width: int = 3) -> TypedGraph:
    """``graph`` whose ``writes`` edges also carry ``width`` random columns (before the reverses are added)."""
    rel = graph.relations[WRITES]
    rows = np.random.default_rng(7).uniform(-1, 1, (rel.num_edges, width)).astype(np.float32)
    return dataclasses.replace(graph, relations={**graph.relations, WRITES: Relation(rel.indptr, rel.indices, rows)})


@pytest.fixture(scope="module")
def mag() -> TypedGraph:
    """A MAG-like graph with a weight on every cites edge and 3 columns on every writes edge, both ways."""
    graph = synthetic_typed(nodes=3000, degree=8, features=8, seed=1, edge_weights=True)
    return with_wide_writes(graph).with_reverse()


def seeds_of(graph: TypedGraph, count: int = 48) -> np.ndarray:
    return np.array(graph.train_idx[:count], dtype=np.int64)


# ------------------------------------------------------------------------------------------------ sampling


@pytest.mark.parametrize("order", [False, True], ids=["own-order", "region-order"])
@pytest.mark.parametrize("fanout", [-1, 0, 1, 3, 10])
def test_recording_edges_draws_what_the_neighbour_kernel_draws(mag, fanout, order):
    csc = mag.relations[CITES]
    dst = np.random.default_rng(0).choice(mag.num_nodes["paper"], 300, replace=False).astype(np.int64)
    visit = kernels.region_order(dst, 64, mag.num_nodes["paper"]) if order else kernels.NO_ORDER
    indptr, indices = read_only(csc.indptr), read_only(csc.indices)  # as the samplers pass them
    for key in (np.uint64(5), np.uint64(2**63 + 11)):
        ptr, nbrs = kernels.sample_neighbors(indptr, indices, dst, fanout, key, visit)
        ptr2, nbrs2, edges = kernels.sample_neighbor_edges(indptr, indices, dst, fanout, key, visit)
        assert np.array_equal(ptr, ptr2) and np.array_equal(nbrs, nbrs2)
        assert nbrs.dtype == nbrs2.dtype
        assert edges.dtype == np.int64 and np.array_equal(csc.indices[edges], nbrs)
        owner = np.repeat(dst, np.diff(ptr))
        assert ((edges >= csc.indptr[owner]) & (edges < csc.indptr[owner + 1])).all()
        assert all(np.unique(edges[a:b]).shape[0] == b - a for a, b in zip(ptr[:-1], ptr[1:]))  # no edge twice


def test_edge_ids_point_at_the_sampled_edges(mag):
    """Each sampled edge's global (source, destination) is the CSC's at its id."""
    subgraph = TypedNeighborSampler(mag, [4, 3], edge_ids=True).sample(seeds_of(mag), 3)
    checked = 0
    for tblock in subgraph.blocks:
        assert set(tblock.edge_ids) == set(tblock.blocks)
        for relation, block in tblock.blocks.items():
            ids = tblock.edge_ids[relation]
            assert ids.dtype == torch.int64 and ids.shape == (block.num_edges,)
            csc = mag.relations[relation]
            src = tblock.src_ids[relation[0]][block.indices.long()].numpy()
            dst = torch.repeat_interleave(tblock.dst_ids(relation[2]), block.in_degrees()).numpy()
            assert np.array_equal(np.asarray(csc.indices)[ids.numpy()], src)
            assert np.array_equal(np.searchsorted(csc.indptr, ids.numpy(), side="right") - 1, dst)
            checked += block.num_edges
    assert checked == subgraph.num_sampled_edges > 0


def test_recording_edge_ids_changes_no_draw(mag):
    """The same key draws the same blocks and frontiers with edge ids recorded for every relation, for the
    relations with edge features (the default), or for none."""
    seeds = seeds_of(mag)
    samples = [TypedNeighborSampler(mag, [5, 4], edge_ids=choice).sample(seeds, 17) for choice in (False, None, True)]
    assert [set(b.edge_ids) for b in samples[1].blocks] == [{CITES, REV_CITES, WRITES, REV_WRITES} & set(b.blocks)
                                                             for b in samples[1].blocks]
    plain = samples[0]
    assert all(not b.edge_ids and not b.edge_features for b in plain.blocks)
    for other in samples[1:]:
        for a, b in zip(plain.blocks, other.blocks):
            assert a.num_dst == b.num_dst and a.num_src == b.num_src and a.blocks.keys() == b.blocks.keys()
            for t in a.src_ids:
                assert torch.equal(a.src_ids[t], b.src_ids[t])
            for r in a.blocks:
                assert torch.equal(a.blocks[r].indptr, b.blocks[r].indptr)
                assert torch.equal(a.blocks[r].indices, b.blocks[r].indices)


def test_a_graph_without_edge_features_samples_as_before(monkeypatch):
    """No edge features: the kernel records no edge, no edge ids, nothing to gather."""
    graph = synthetic_typed(nodes=1000, features=4, seed=2).with_reverse()

    plain = kernels.sample_neighbors

    def refuse(*args):
        if args[6:] and args[6]:
            raise AssertionError("edges were recorded for a graph without edge features")
        return plain(*args)

    monkeypatch.setattr(kernels, "sample_neighbors", refuse)
    sampler = TypedNeighborSampler(graph, [3, 3])
    assert not sampler.edge_ids and not sampler.edge_features
    subgraph = sampler.sample(seeds_of(graph), 1)
    assert all(not b.edge_ids and not b.edge_features for b in subgraph.blocks)


def test_edge_ids_by_name_and_bad_choices():
    graph = synthetic_typed(nodes=1000, features=4, seed=2, edge_weights=True).with_reverse()
    assert TypedNeighborSampler(graph, [2], edge_ids=["writes", CITES]).edge_ids == {WRITES, CITES}
    with pytest.raises(ConfigError, match="no relation is named 'nope'"):
        TypedNeighborSampler(graph, [2], edge_ids=["nope"])
    with pytest.raises(ConfigError, match="edge_ids"):
        TypedNeighborSampler(graph, [2], edge_ids="writes")


# -------------------------------------------------------------------------------------------------- gather


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gathered_edge_features_are_the_graphs_rows(mag, tmp_path, dtype):
    """From a memory-mapped folder: each block's rows are the relation's at its edge ids, as float32, and
    ``TypedBlock.to`` carries them and the ids along."""
    relations = {r: Relation(rel.indptr, rel.indices, None if rel.edge_features is None
                             else np.asarray(rel.edge_features).astype(dtype))
                 for r, rel in mag.relations.items()}
    write_typed(dataclasses.replace(mag, relations=relations), tmp_path / "g")
    graph = read_typed(tmp_path / "g")
    assert isinstance(graph.relations[CITES].edge_features, np.memmap)
    subgraph = TypedNeighborSampler(graph, [6, 4]).sample(seeds_of(graph), 5)
    found = 0
    for tblock in subgraph.blocks:
        assert tblock.edge_features.keys() == tblock.edge_ids.keys() == {CITES, REV_CITES, WRITES, REV_WRITES} & set(
            tblock.blocks)
        for relation, rows in tblock.edge_features.items():
            want = np.asarray(graph.relations[relation].edge_features)[tblock.edge_ids[relation].numpy()]
            assert rows.dtype == torch.float32 and torch.equal(rows, torch.from_numpy(want.astype(np.float32)))
            found += rows.shape[0]
        moved = tblock.to(torch.device("meta"))
        assert all(t.device.type == "meta" for t in [*moved.edge_ids.values(), *moved.edge_features.values()])
        assert moved.edge_features.keys() == tblock.edge_features.keys()
    assert found > 0


def test_a_block_sampled_without_rows_gets_them_later(mag):
    sampler = TypedNeighborSampler(mag, [4, 4], edge_features=False)
    late = sampler.sample(seeds_of(mag), 8)
    assert all(b.edge_ids and not b.edge_features for b in late.blocks)
    gather_edge_features(mag, late.blocks, CPU)
    now = TypedNeighborSampler(mag, [4, 4]).sample(seeds_of(mag), 8)
    for a, b in zip(late.blocks, now.blocks):
        assert a.edge_features.keys() == b.edge_features.keys()
        assert all(torch.equal(a.edge_features[r], b.edge_features[r]) for r in a.edge_features)


def test_edge_features_of_the_wrong_length_name_the_relation(mag):
    rel = mag.relations[CITES]
    short = Relation(rel.indptr, rel.indices, np.ones((rel.num_edges - 1, 1), np.float32))
    bad = dataclasses.replace(mag, relations={**mag.relations, CITES: short})
    with pytest.raises(DataError, match=r"\(paper, cites, paper\).*one row"):
        TypedNeighborSampler(bad, [2, 2])
    subgraph = TypedNeighborSampler(mag, [2, 2]).sample(seeds_of(mag), 1)
    with pytest.raises(DataError, match=r"\(paper, cites, paper\)"):
        gather_edge_features(bad, subgraph.blocks, CPU)


# -------------------------------------------------------------------------------------------------- models


def test_the_spec_carries_edge_widths_and_round_trips(mag):
    spec = TypedSpec.of(mag)
    assert spec.edge_dims == {CITES: 1, REV_CITES: 1, WRITES: 3, REV_WRITES: 3}
    assert TypedSpec.from_dict(spec.to_dict()) == spec
    stored = spec.to_dict()
    del stored["edge_dims"]  # as a spec stored before edge features were read
    assert TypedSpec.from_dict(stored) == dataclasses.replace(spec, edge_dims={})


def pyg_rgat(layer):
    """PyG's ``HeteroConv`` of ``GATConv(..., edge_dim=...)`` holding ``layer``'s weights (the MLPerf R-GAT)."""
    from torch_geometric.nn import GATConv, HeteroConv

    convs = {}
    for relation in layer.relations:
        widths = (layer.in_dims[relation[0]], layer.in_dims[relation[2]])
        conv = GATConv(widths[0] if widths[0] == widths[1] else widths, layer.head_dim, heads=layer.heads,
                       add_self_loops=False, edge_dim=layer.edge_dims.get(relation))
        conv.load_state_dict(layer.convs[module_key(relation)].state_dict())
        convs[relation] = conv
    return HeteroConv(convs)


def pyg_inputs(tblock):
    """A sampled typed block as PyG's per-relation ``edge_index`` (frontier positions) and ``edge_attr``."""
    index = {r: torch.stack([b.indices.long(), torch.repeat_interleave(torch.arange(b.num_dst), b.in_degrees())])
             for r, b in tblock.blocks.items()}
    return index, dict(tblock.edge_features)


@pytest.mark.filterwarnings("ignore:There exist node types")  # PyG's note on types no relation of a layer ends at
def test_rgat_with_edge_features_equals_pyg_gatconv_with_edge_dim_on_a_sampled_batch(mag):
    pytest.importorskip("torch_geometric")
    torch.manual_seed(0)
    model = TypedGNN("rgat", TypedSpec.of(mag), 16, mag.num_classes, 2, heads=2).eval()
    assert model.layers[0].edge_dims == {CITES: 1, REV_CITES: 1, WRITES: 3, REV_WRITES: 3}
    subgraph = TypedNeighborSampler(mag, [5, 4]).sample(seeds_of(mag), 21)
    features, ids = TypedInputs(mag)(subgraph.input_nodes, CPU)
    with torch.no_grad():
        ours = model(subgraph.blocks, features, ids)
        theirs = {}
        for attend in (True, False):  # PyG's GATConv skips the edge term when given no edge_attr
            h = model.input_rows(features, ids)
            for index, (layer, tblock) in enumerate(zip(model.layers, subgraph.blocks)):
                edge_index, edge_attr = pyg_inputs(tblock)
                out = pyg_rgat(layer)(h, edge_index, **({"edge_attr_dict": edge_attr} if attend else {}))
                h = {t: out[t][:n] for t, n in tblock.num_dst.items() if t in out}
                if index == 0:
                    h = {t: F.leaky_relu(v, LEAKY_SLOPE) for t, v in h.items()}
            theirs[attend] = h["paper"]
    assert ours.shape == (len(seeds_of(mag)), mag.num_classes)
    torch.testing.assert_close(ours, theirs[True], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, theirs[False], atol=1e-3)  # the edge features mattered


def weighted_sage_reference(layer, tblock, x, graph):
    """One typed SAGE layer by hand: per relation into a type, ``sum_e w_e x_u / deg`` (``w`` the graph's weight
    rows at the sampled edges' ids for one-column relations, else 1) through ``W_r``, plus each root term."""
    out = {}
    for t, n_dst in tblock.num_dst.items():
        y = 0
        for r, block in tblock.blocks.items():
            if r[2] != t:
                continue
            rows = graph.relations[r].edge_features
            w = torch.ones(block.num_edges)
            if rows is not None and rows.shape[1] == 1:
                w = torch.from_numpy(np.asarray(rows)[tblock.edge_ids[r].numpy(), 0])
            dense = torch.zeros(n_dst, tblock.num_src[r[0]])
            dst = torch.repeat_interleave(torch.arange(n_dst), block.in_degrees())
            dense.index_put_((dst, block.indices.long()), w, accumulate=True)
            mean = (dense / block.in_degrees().clamp(min=1).unsqueeze(1)) @ x[r[0]]
            root = layer.root[module_key(r)]
            y = y + mean @ layer.neigh[module_key(r)].weight.T + x[t][:n_dst] @ root.weight.T + root.bias
        out[t] = y
    return out


def test_sage_weights_its_means_by_one_column_edge_features_and_ignores_wider_ones(mag, caplog):
    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="neutronorch"):
        model = TypedGNN("sage", TypedSpec.of(mag), 16, mag.num_classes, 1).eval()
    ignored = [m for m in caplog.messages if "ignores wider ones" in m]
    assert len(ignored) == 1 and "(author, writes, paper) (3 columns)" in ignored[0]
    assert model.weighted == (CITES, REV_CITES)
    subgraph = TypedNeighborSampler(mag, [6]).sample(seeds_of(mag), 2)
    features, ids = TypedInputs(mag)(subgraph.input_nodes, CPU)
    tblock = subgraph.blocks[0]
    with torch.no_grad():
        ours = model(subgraph.blocks, features, ids)
        x = model.input_rows(features, ids)
        want = weighted_sage_reference(model.layers[0], tblock, x, mag)["paper"]
        plain = model.layers[0](tblock, x)["paper"]
    torch.testing.assert_close(ours, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, plain, atol=1e-3)  # the weights mattered


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_every_layer_and_the_bottom_one_read_their_blocks_edge_features(mag, kind):
    """The model's forward equals the layers called with the edge features handed over by hand, and the
    bottom layer alone (NeutronOrch's host layer) reads them as the model does."""
    torch.manual_seed(1)
    model = TypedGNN(kind, TypedSpec.of(mag), 16, mag.num_classes, 2, heads=2).eval()
    subgraph = TypedNeighborSampler(mag, [4, 3]).sample(seeds_of(mag), 4)
    features, ids = TypedInputs(mag)(subgraph.input_nodes, CPU)
    name = "edge_attr" if kind == "rgat" else "edge_weight"
    wanted = {CITES, REV_CITES} | ({WRITES, REV_WRITES} if kind == "rgat" else set())
    with torch.no_grad():
        ours = model(subgraph.blocks, features, ids)
        rows = model.input_rows(features, ids)
        bottom = model.bottom(subgraph.blocks[0], rows)
        h = {t: model.projections[t](r) if t in model.projections and t not in model.folded else r
             for t, r in rows.items()}  # the unfolded projections applied, as the bottom layer applies them
        folded = {"projections": {t: model.projections[t] for t in model.folded}} if model.folded else {}
        for index, (layer, tblock) in enumerate(zip(model.layers, subgraph.blocks)):
            given = {r: f for r, f in tblock.edge_features.items() if r in wanted and r in layer.relations}
            handed = edge_arguments(layer, tblock, model.weighted)
            assert given and list(handed) == [name] and handed[name].keys() == given.keys()
            assert all(handed[name][r] is given[r] for r in given)
            y = layer(tblock, h, **{name: given}, **(folded if index == 0 else {}))
            if index == 0:
                for t in y:
                    torch.testing.assert_close(bottom[t], y[t], rtol=0, atol=0)
            h = {t: F.leaky_relu(v, LEAKY_SLOPE) if kind == "rgat" else torch.relu(v) for t, v in y.items()}
    torch.testing.assert_close(ours, y["paper"], rtol=0, atol=0)


def test_a_block_without_the_rows_the_model_reads_is_refused_naming_the_relation(mag):
    model = TypedGNN("sage", TypedSpec.of(mag), 8, mag.num_classes, 1)
    subgraph = TypedNeighborSampler(mag, [3], edge_features=False).sample(seeds_of(mag), 6)
    features, ids = TypedInputs(mag)(subgraph.input_nodes, CPU)
    with pytest.raises(ValueError, match=r"\(paper, cites, paper\) has edge features.*gather_edge_features"):
        model(subgraph.blocks, features, ids)
    gather_edge_features(mag, subgraph.blocks, CPU)
    tblock = subgraph.blocks[0]
    tblock.edge_features[CITES] = tblock.edge_features[CITES][:-1]
    with pytest.raises(ValueError, match=r"\(paper, cites, paper\): edge features of shape"):
        model(subgraph.blocks, features, ids)


# ---------------------------------------------------------------------------------------------------- runs


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_a_typed_run_trains_and_evaluates_with_edge_features(kind):
    graph = with_wide_writes(synthetic_typed(nodes=2000, features=8, train=0.3, val=0.1, seed=3, edge_weights=True))
    summary = train(TrainConfig(model=kind, epochs=2, fanouts=[5, 5], hidden=16, heads=2, batch_size=64, lr=0.01,
                                dropout=0.2, threads=1, device="cpu", eval_every=1), graph=graph)
    assert summary["status"] == "completed"
    trained = [e["train_loss"] for e in summary["epochs"]]
    assert all(np.isfinite(trained)) and trained[-1] < trained[0], trained
    assert np.isfinite(summary["test_accuracy"])
    stored = TypedSpec.from_dict(summary["model"]["arguments"]["spec"]).edge_dims
    assert stored == {CITES: 1, WRITES: 3, REV_CITES: 1, REV_WRITES: 3}


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_lockstep_neutronorch_with_edge_features_equals_exact_mode(kind):
    """The host's bottom layer (``TypedBottom`` on ``sample_bottom``'s blocks) reads the edge features as the
    model's does: with every reusable row hot and no staleness, NeutronOrch mode's losses are exact mode's."""
    graph = with_wide_writes(synthetic_typed(nodes=2000, degree=6, features=8, seed=2, edge_weights=True))
    base = dict(dataset="-", model=kind, epochs=2, batch_size=24, fanouts=[4, 3], hidden=16, lr=0.01, eval_every=1,
                threads=1, seed=5, device="cpu")
    exact = train(TrainConfig(**base), graph=graph)
    orch = train(TrainConfig(**base, mode="neutronorch", super_batch=1, staleness_bound=0, hot_ratio=1.0,
                             hot_grad="cpu", snapshot_lead=0), graph=graph)
    assert orch["mode"] == "neutronorch" and orch["hot"]["reuse_rate"] > 0.5
    np.testing.assert_allclose([e["train_loss"] for e in orch["epochs"]], [e["train_loss"] for e in exact["epochs"]],
                               rtol=2e-4, atol=1e-5)
    assert orch["test_acc"] == pytest.approx(exact["test_acc"], abs=2e-3)


def test_a_checkpoint_restores_a_model_that_reads_edge_features(tmp_path):
    """The stored spec keeps the edge feature widths: R-GAT's edge weights load into the model it rebuilds."""
    from neutronorch import load_typed_checkpoint

    graph = with_wide_writes(synthetic_typed(nodes=1000, features=8, train=0.3, val=0.1, seed=3, edge_weights=True))
    summary = train(TrainConfig(model="rgat", epochs=1, fanouts=[3, 3], hidden=8, heads=2, batch_size=64,
                                threads=1, device="cpu", checkpoint_dir=str(tmp_path)), graph=graph)
    restored = load_typed_checkpoint(summary["checkpoints"]["last"]).model
    assert restored.spec.edge_dims == {CITES: 1, WRITES: 3, REV_CITES: 1, REV_WRITES: 3}
    assert any(name.endswith("lin_edge.weight") for name in restored.state_dict())


def test_synthetic_cites_weights_mark_the_citations_within_a_label():
    plain = synthetic_typed(nodes=2000, seed=4)
    graph = synthetic_typed(nodes=2000, seed=4, edge_weights=True)
    graph.validate()
    assert graph.name == plain.name + "-w"
    for r, rel in plain.relations.items():
        assert np.array_equal(rel.indptr, graph.relations[r].indptr)
        assert np.array_equal(rel.indices, graph.relations[r].indices)
        assert (graph.relations[r].edge_features is None) == (r != CITES)
    src, dst = graph.relations[CITES].edges()
    weights = graph.relations[CITES].edge_features[:, 0]
    same = graph.labels[src] == graph.labels[dst]
    assert weights.dtype == np.float32 and 0.5 < same.mean() < 1
    assert (weights[same] >= 0.75).all() and (weights[~same] <= 0.25).all()
    assert np.array_equal(graph.features["paper"], plain.features["paper"])
