"""Graphs users already hold: arrays, PyG data and datasets, DGL graphs (the last two when installed)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch import ConfigError, DataError, Graph, TrainConfig, from_pyg, load_dataset, to_pyg, train

SHARED = Path(os.environ.get("NEUTRONORCH_DATASETS", Path(__file__).resolve().parents[1].parent / "shared" / "datasets"))


def _arrays(n=60, seed=0):
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 300), rng.integers(0, n, 300)
    features = rng.standard_normal((n, 5))  # float64: stored as float32
    labels = rng.integers(0, 3, n)
    return src, dst, features, labels


def test_from_arrays_cleans_edges_and_takes_masks_ids_or_a_drawn_split():
    src, dst, features, labels = _arrays()
    src[:5] = dst[:5]  # self loops
    labels[7] = -1
    train_mask = np.zeros(60, bool)
    train_mask[:30] = True
    graph = Graph.from_arrays(torch.from_numpy(src), dst, features, labels,
                              {"train": train_mask, "val": np.arange(30, 45), "test": np.arange(45, 60)})
    assert graph.features.dtype == np.float32 and graph.num_classes == 3 and graph.num_nodes == 60
    assert 7 not in graph.train_idx and len(graph.train_idx) == 29  # unlabelled: out of the splits
    edges = set(zip(np.asarray(graph.indices).tolist(), np.repeat(np.arange(60), np.diff(graph.indptr)).tolist()))
    want = {(int(s), int(d)) for s, d in zip(src, dst) if s != d}
    assert edges == want | {(d, s) for s, d in want}  # undirected, no self loops, no repeats
    drawn = Graph.from_arrays(src, dst, features, labels, split="ratio:0.5,0.25", seed=3)
    assert len(drawn.train_idx) + len(drawn.val_idx) + len(drawn.test_idx) == 59
    directed = Graph.from_arrays(src, dst, features, labels, undirected=False)
    assert directed.num_edges == len(want)
    with pytest.raises(DataError, match=r"4 validation vertices are also in test_idx \(first: 41\), of 15 "
                                        r"validation and 19 test vertices"):
        Graph.from_arrays(src, dst, features, labels, {"train": train_mask, "val": np.arange(30, 45),
                                                       "test": np.arange(41, 60)})


def test_from_arrays_reads_float_labels_with_nan_and_multi_label_rows():
    src, dst, features, labels = _arrays()
    floats = labels.astype(np.float32)
    floats[[3, 9]] = np.nan  # as ogbn-papers100M stores unlabelled vertices
    graph = Graph.from_arrays(src, dst, features, floats)
    assert graph.labels.dtype == np.int64 and graph.labels[3] == -1 and graph.labels[9] == -1
    rows = np.stack([labels == 0, labels == 1], axis=1).astype(np.int8)
    multi = Graph.from_arrays(src, dst, features, rows)
    assert multi.labels.shape == (60, 2) and multi.num_classes == 2
    with pytest.raises(DataError, match="59 labels for 60 vertices"):
        Graph.from_arrays(src, dst, features, labels[:59])
    with pytest.raises(DataError, match="whole class ids"):
        Graph.from_arrays(src, dst, features, labels + 0.5)


def test_from_arrays_keeps_half_precision_features_numpy_or_torch():
    from neutronorch.data.dtypes import bfloat16

    src, dst, features, labels = _arrays()
    as_torch = torch.from_numpy(features).to(torch.bfloat16)
    graph = Graph.from_arrays(src, dst, as_torch, labels)
    assert graph.features.dtype.name == "bfloat16"
    assert torch.equal(torch.from_numpy(np.asarray(graph.features, np.float32)), as_torch.float())
    assert Graph.from_arrays(src, dst, features.astype(bfloat16()), labels).features.dtype.name == "bfloat16"
    assert Graph.from_arrays(src, dst, features.astype(np.float16), labels).features.dtype == np.float16


def test_pyg_round_trip_keeps_the_graph():
    pytest.importorskip("torch_geometric")
    src, dst, features, labels = _arrays()
    graph = Graph.from_arrays(src, dst, features, labels, split="ratio:0.5,0.25")
    data = to_pyg(graph)
    assert data.num_nodes == 60 and data.edge_index.shape == (2, graph.num_edges)
    back = from_pyg(data, name="back")
    for key in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(np.asarray(getattr(back, key)), np.asarray(getattr(graph, key))), key
    np.testing.assert_array_equal(back.features, graph.features)


def test_pyg_masks_with_several_splits_take_the_split_index():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    src, dst, features, labels = _arrays()
    masks = {k: torch.zeros(60, 3, dtype=torch.bool) for k in ("train", "val", "test")}
    for s in range(3):
        order = np.random.default_rng(s).permutation(60)
        for part, ids in zip(masks, np.split(order, [30, 45])):
            masks[part][ids, s] = True
    data = Data(x=torch.from_numpy(features).float(), y=torch.from_numpy(labels),
                edge_index=torch.from_numpy(np.stack([src, dst])), **{f"{k}_mask": m for k, m in masks.items()})
    graph = from_pyg(data, split_index=2)
    assert np.array_equal(graph.train_idx, np.flatnonzero(masks["train"][:, 2].numpy()))
    with pytest.raises(DataError, match="`split_index` 3 is out of range; 3 splits"):
        from_pyg(data, split_index=3)


@pytest.mark.shared_data
@pytest.mark.slow
def test_a_downloaded_pyg_dataset_trains_by_its_spec_and_a_missing_one_is_named(tmp_path):
    pytest.importorskip("torch_geometric")
    source = SHARED / "minesweeper" / "minesweeper.npz"
    if not source.exists():
        pytest.skip(f"{source} is absent")
    raw = tmp_path / "minesweeper" / "raw"
    raw.mkdir(parents=True)
    shutil.copy(source, raw / "minesweeper.npz")  # where PyG's HeterophilousGraphDataset keeps its download
    graph = load_dataset(f"pyg:Minesweeper@{tmp_path}", split_index=4)
    ours = load_dataset(str(source), split_index=4)
    assert (graph.num_nodes, graph.num_edges, graph.num_classes) == (ours.num_nodes, ours.num_edges, 2)
    for key in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(np.asarray(getattr(graph, key)), np.asarray(getattr(ours, key))), key
    assert graph.metric == ours.metric == "rocauc"
    summary = train(TrainConfig(dataset=f"pyg:Minesweeper@{tmp_path}", epochs=2, progress=False))
    assert summary["metric"] == "rocauc" and summary["test_rocauc"] > 0.6
    with pytest.raises(DataError, match="is not downloaded under"):
        load_dataset(f"pyg:Tolokers@{tmp_path}")
    with pytest.raises(DataError, match="pyg:NAME@ROOT"):
        load_dataset("pyg:Cora")


def test_dgl_round_trip_keeps_the_graph():
    pytest.importorskip("dgl")
    from neutronorch import from_dgl, to_dgl

    src, dst, features, labels = _arrays()
    graph = Graph.from_arrays(src, dst, features, labels, split="ratio:0.5,0.25")
    g = to_dgl(graph)
    assert g.num_nodes() == 60 and g.num_edges() == graph.num_edges
    back = from_dgl(g, name="back")
    for key in ("indptr", "indices", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(np.asarray(getattr(back, key)), np.asarray(getattr(graph, key))), key


def test_conversions_say_what_to_install():
    import importlib.util

    from neutronorch import to_dgl

    if importlib.util.find_spec("dgl") is not None:
        pytest.skip("dgl is installed")
    src, dst, features, labels = _arrays()
    with pytest.raises(DataError, match="pip install dgl"):
        to_dgl(Graph.from_arrays(src, dst, features, labels))


def _random_link_split(undirected: bool, **options):
    """PyG's own split of a small synthetic graph: (graph, (train_data, val_data, test_data))."""
    from torch_geometric.transforms import RandomLinkSplit

    from neutronorch.data import SyntheticSpec, generate

    graph = generate(SyntheticSpec.parse("synthetic:nodes=300,degree=6,features=8,classes=3"))
    torch.manual_seed(0)
    return graph, RandomLinkSplit(num_val=0.1, num_test=0.2, is_undirected=undirected, **options)(to_pyg(graph))


def _csc_edges(graph) -> set:
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return set(zip(np.asarray(graph.indices).tolist(), dst.tolist()))


def _pairs(data, label) -> np.ndarray:
    return data.edge_label_index[:, data.edge_label == label].numpy()


@pytest.mark.parametrize("undirected", [True, False])
def test_a_random_link_split_keeps_its_pairs_and_no_held_out_edge_passes_messages(undirected):
    pytest.importorskip("torch_geometric")
    from neutronorch import from_pyg_link

    _, (train_data, val_data, test_data) = _random_link_split(undirected)
    graph = from_pyg_link(train_data, val_data, test_data, name="split")
    links = graph.links
    assert links.undirected is undirected and links.negative_kind == "shared" and graph.num_classes == 0
    for part, data in (("train", train_data), ("val", val_data), ("test", test_data)):
        assert np.array_equal(getattr(links, part), _pairs(data, 1)), part  # every positive, in its order
    assert np.array_equal(links.val_neg, _pairs(val_data, 0)) and np.array_equal(links.test_neg, _pairs(test_data, 0))
    np.testing.assert_array_equal(graph.features, train_data.x.numpy())
    edges = _csc_edges(graph)
    # The training graph as PyG left it: nothing symmetrised back in, though a directed split keeps each
    # held-out edge's reverse.
    assert edges == set(map(tuple, train_data.edge_index.t().tolist()))
    held_out = {(int(s), int(d)) for part in (links.val, links.test) for s, d in part.T}
    assert not held_out & edges and (not undirected or not {(d, s) for s, d in held_out} & edges)


def test_the_labels_only_layout_and_a_split_without_negatives_read_too():
    pytest.importorskip("torch_geometric")
    from neutronorch import from_pyg_link

    _, stages = _random_link_split(True, split_labels=True)
    graph = from_pyg_link(*stages)
    assert np.array_equal(graph.links.val_neg, stages[1].neg_edge_label_index.numpy())
    _, stages = _random_link_split(True, neg_sampling_ratio=0.0)
    assert from_pyg_link(*stages).links.negative_kind == "sampled"


def test_to_pyg_link_lays_a_split_out_as_random_link_split_and_comes_back_unchanged():
    pytest.importorskip("torch_geometric")
    from neutronorch import from_pyg_link, to_pyg_link
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.data.edge_split import split_edges

    graph = split_edges(generate(SyntheticSpec.parse("synthetic:nodes=300,degree=6,features=8")), 0.8, 0.1, seed=2)
    train_data, val_data, test_data = to_pyg_link(graph, seed=1)
    links = graph.links
    for data, positives in ((train_data, links.train), (val_data, links.val), (test_data, links.test)):
        assert np.array_equal(_pairs(data, 1), positives) and _pairs(data, 0).shape == positives.shape
        negatives = {tuple(p) for p in _pairs(data, 0).T.tolist()}
        assert not negatives & (_csc_edges(graph) | {(int(s), int(d)) for s, d in positives.T})
        assert all(s != d for s, d in negatives)
    assert torch.equal(train_data.edge_index, val_data.edge_index)
    added = set(map(tuple, test_data.edge_index.t().tolist())) - set(map(tuple, train_data.edge_index.t().tolist()))
    assert added == {(int(s), int(d)) for s, d in links.val.T} | {(int(d), int(s)) for s, d in links.val.T}
    back = from_pyg_link(train_data, val_data, test_data, name="back")
    for key in ("indptr", "indices"):
        assert np.array_equal(np.asarray(getattr(back, key)), np.asarray(getattr(graph, key))), key
    for key in ("train", "val", "test"):
        assert np.array_equal(getattr(back.links, key), getattr(links, key)), key
    assert back.links.undirected and np.array_equal(back.links.val_neg, _pairs(val_data, 0))
    again = from_pyg_link(*to_pyg_link(back, seed=5))  # stored negatives go out and come back as they are
    assert np.array_equal(again.links.val_neg, back.links.val_neg)
    assert np.array_equal(again.links.test_neg, back.links.test_neg)
    summary = train(TrainConfig(task="link", epochs=1, fanouts=[5, 5], hidden=16, progress=False, device="cpu",
                                dataset="given"), graph=back)
    assert np.isfinite(summary["epochs"][-1]["train_loss"]) and summary["link"]["negatives"] == "shared"


def test_a_pyg_link_split_that_cannot_be_read_says_why():
    pytest.importorskip("torch_geometric")
    from neutronorch import from_pyg_link, to_pyg_link

    graph, (train_data, val_data, test_data) = _random_link_split(True)

    def fails(match, train=train_data, val=val_data, test=test_data):
        with pytest.raises(DataError, match=match):
            from_pyg_link(train, val, test)

    fails("has no edge_label_index", val=val_data.clone().update({"edge_label_index": None}))
    doubled = test_data.clone().update({"edge_label": test_data.edge_label * 2})
    fails(r"holds \[0.0, 2.0\], where a link split has 1", test=doubled)
    fails("expected \\(2, E\\)", train=train_data.clone().update({"edge_label_index": train_data.edge_label_index[0]}))
    out_of_range = val_data.edge_label_index.clone()
    out_of_range[1, 0] = 300
    fails("val names vertex 300, outside 0..299", val=val_data.clone().update({"edge_label_index": out_of_range}))
    fails("train_data has no `x`", train=train_data.clone().update({"x": None}))
    fails("not a PyG Data", test=None)
    only_positives = test_data.clone().update({"edge_label_index": _pairs_tensor(test_data, 1),
                                               "edge_label": torch.ones(len(test_data.edge_label) // 2)})
    fails("val_data holds negatives but test_data none", test=only_positives)
    leaked = torch.cat([train_data.edge_index, val_data.edge_label_index[:, :1]], dim=1)
    fails("1 val edges .* are in train_data.edge_index", train=train_data.clone().update({"edge_index": leaked}))
    with pytest.raises(DataError, match="carries no link split"):
        to_pyg_link(graph)


def _pairs_tensor(data, label):
    return data.edge_label_index[:, data.edge_label == label]


@pytest.mark.parametrize("options, error, message", [
    ({"splits": {"train": np.arange(30)}}, DataError, r"splits has the keys \['train'\]; give exactly train, val"),
    ({"splits": {"train": [0], "val": [1], "test": [2], "tset": [3]}}, DataError, "splits has the keys"),
    ({"num_classes": 3.5}, DataError, "num_classes is 3.5, expected a whole number"),
    ({"num_classes": "3"}, DataError, "num_classes is '3', expected a whole number"),
    ({"undirected": "no"}, ConfigError, "`undirected` 'no': expected True or False"),
    ({"seed": -1}, ConfigError, "`seed` -1: must be a whole number from 0"),
    ({"name": 5}, DataError, "`name` 5: expected a string"),
    ({"src": np.zeros((2, 30), np.int64)}, DataError, r"`src` has shape \(2, 30\); give the edges' src ids as a 1-D"),
])
def test_from_arrays_refuses_options_it_would_misread(options, error, message):
    src, dst, features, labels = _arrays()
    src = options.pop("src", src)
    with pytest.raises(error, match=message):
        Graph.from_arrays(src, dst, features, labels, **options)


def test_from_arrays_refuses_a_tensor_without_values():
    src, dst, features, labels = _arrays()
    with pytest.raises(DataError, match="src: a tensor on the meta device"):
        Graph.from_arrays(torch.from_numpy(src).to("meta"), dst, features, labels)


def test_exports_and_imports_name_the_kind_of_graph_they_take(tmp_path):
    from neutronorch.data import from_dgl, to_dgl, to_pyg_hetero
    from neutronorch.data.synthetic_typed import synthetic_typed
    from neutronorch.nn.pyg import to_pyg_model

    typed = synthetic_typed(nodes=200)
    graph = load_dataset("synthetic:nodes=200")
    with pytest.raises(DataError, match="to_pyg: expected a neutronorch Graph, not a TypedGraph; to_pyg_hetero"):
        to_pyg(typed)
    with pytest.raises(DataError, match="to_dgl: expected a neutronorch Graph, not a str"):
        to_dgl("synthetic")
    with pytest.raises(DataError, match="to_pyg_hetero: expected a neutronorch TypedGraph, not a Graph; to_pyg"):
        to_pyg_hetero(graph)
    with pytest.raises(DataError, match="from_dgl reads a dgl.DGLGraph, not a dict"):
        from_dgl({"feat": graph.features})
    with pytest.raises(ConfigError, match="to_pyg_model exports a neutronorch GNN .*, not a NoneType"):
        to_pyg_model(None)
