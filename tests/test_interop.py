"""Graphs users already hold: arrays, PyG data and datasets, DGL graphs (the last two when installed)."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch import DataError, Graph, TrainConfig, from_pyg, load_dataset, to_pyg, train

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
