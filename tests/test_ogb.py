"""OGB node-property datasets read from the layouts the ogb package leaves on disk, built here small."""

import gzip
from pathlib import Path

import numpy as np
import pytest

from neutronorch import DataError, TrainConfig, load_dataset, load_native, train
from neutronorch.cli import main

RNG = np.random.default_rng(0)
N, E = 200, 900


def _write_csv(path: Path, rows: np.ndarray, fmt: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = rows.reshape(rows.shape[0], -1)
    with gzip.open(path, "wt") as f:
        f.write("".join(",".join(fmt.format(v) for v in row) + "\n" for row in rows))


def _topology():
    src, dst = RNG.integers(0, N, E), RNG.integers(0, N, E)
    return np.stack([src, dst], axis=1)


def _splits(root: Path, scheme: str):
    order = RNG.permutation(N)
    parts = {"train": order[:120], "valid": order[120:160], "test": order[160:]}
    for part, ids in parts.items():
        _write_csv(root / "split" / scheme / f"{part}.csv.gz", ids, "{}")
    return parts


def make_arxiv_like(root: Path):
    """The CSV layout of ogbn-arxiv and ogbn-products."""
    edges = _topology()
    features = RNG.standard_normal((N, 6)).astype(np.float32)
    labels = RNG.integers(0, 4, N)
    raw = root / "raw"
    _write_csv(raw / "edge.csv.gz", edges, "{}")
    _write_csv(raw / "node-feat.csv.gz", features, "{:.6f}")
    _write_csv(raw / "node-label.csv.gz", labels, "{}")
    _write_csv(raw / "num-node-list.csv.gz", np.array([N]), "{}")
    _write_csv(raw / "num-edge-list.csv.gz", np.array([E]), "{}")
    return edges, features, labels, _splits(root, "time")


def make_proteins_like(root: Path, tasks=5):
    edges = _topology()
    edge_features = RNG.random((E, 8)).astype(np.float32)
    labels = RNG.integers(0, 2, (N, tasks))
    raw = root / "raw"
    _write_csv(raw / "edge.csv.gz", edges, "{}")
    _write_csv(raw / "edge-feat.csv.gz", edge_features, "{:.3f}")
    _write_csv(raw / "node-label.csv.gz", labels, "{}")
    _write_csv(raw / "node_species.csv.gz", RNG.integers(0, 3, N), "{}")
    _write_csv(raw / "num-node-list.csv.gz", np.array([N]), "{}")
    _write_csv(raw / "num-edge-list.csv.gz", np.array([E]), "{}")
    written = np.array([[float(f"{v:.3f}") for v in row] for row in edge_features])
    return edges, written, labels, _splits(root, "species")


def make_papers_like(root: Path):
    """The binary layout of ogbn-papers100M: unlabelled vertices carry NaN."""
    edges = _topology()
    features = RNG.standard_normal((N, 6)).astype(np.float32)
    labels = RNG.integers(0, 4, N).astype(np.float32)
    labels[::7] = np.nan
    raw = root / "raw"
    raw.mkdir(parents=True)
    np.savez_compressed(raw / "data.npz", edge_index=edges.T, node_feat=features, num_nodes_list=np.array([N]),
                        num_edges_list=np.array([E]), node_year=np.zeros((N, 1), np.int64))
    np.savez_compressed(raw / "node-label.npz", node_label=labels[:, None])
    splits = _splits(root, "time")
    return edges, features, labels, splits


def _edge_set(graph):
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    return set(zip(np.asarray(graph.indices).tolist(), dst.tolist()))


def _undirected(edges):
    kept = {(int(s), int(d)) for s, d in edges if s != d}
    return kept | {(d, s) for s, d in kept}


def test_the_csv_layout_reads_as_written(tmp_path):
    edges, features, labels, splits = make_arxiv_like(tmp_path / "ogbn_arxiv")
    graph = load_dataset(str(tmp_path / "ogbn_arxiv"))
    assert graph.name == "ogbn-arxiv" and graph.metric == "accuracy" and graph.num_classes == 4
    assert _edge_set(graph) == _undirected(edges)
    np.testing.assert_array_equal(graph.features, np.array([[float(f"{v:.6f}") for v in r] for r in features],
                                                          np.float32))
    np.testing.assert_array_equal(graph.labels, labels)
    for ours, part in zip((graph.train_idx, graph.val_idx, graph.test_idx), ("train", "valid", "test")):
        np.testing.assert_array_equal(ours, np.sort(splits[part]))


def test_proteins_features_are_the_mean_of_edge_features_and_its_metric_roc_auc(tmp_path):
    edges, edge_features, labels, _ = make_proteins_like(tmp_path / "ogbn_proteins")
    graph = load_dataset(str(tmp_path / "ogbn_proteins"))
    assert graph.metric == "rocauc" and graph.labels.shape == (N, 5) and graph.num_classes == 5
    want = np.zeros((N, 8))
    count = np.zeros(N)
    for (s, d), f in zip(edges, edge_features):
        want[s] += f
        want[d] += f
        count[s] += 1
        count[d] += 1
    np.testing.assert_allclose(graph.features, want / np.maximum(count, 1)[:, None], rtol=1e-5)
    assert any("mean of its edges' 8 features" in note for note in graph.notes)


def test_the_binary_layout_with_unlabelled_vertices(tmp_path):
    edges, features, labels, splits = make_papers_like(tmp_path / "ogbn_papers100M")
    graph = load_dataset(str(tmp_path / "ogbn_papers100M"))
    assert graph.name == "ogbn-papers100M" and _edge_set(graph) == _undirected(edges)
    np.testing.assert_array_equal(graph.features, features)
    assert (graph.labels[np.isnan(labels)] == -1).all()
    for idx in (graph.train_idx, graph.val_idx, graph.test_idx):
        assert not np.isnan(labels[idx]).any()  # unlabelled vertices left out


@pytest.mark.slow
def test_convert_writes_the_native_format_and_training_reads_either(tmp_path, capsys):
    make_arxiv_like(tmp_path / "ogbn_arxiv")
    assert main(["convert", str(tmp_path / "ogbn_arxiv"), str(tmp_path / "native")]) == 0
    assert "wrote ogbn-arxiv" in capsys.readouterr().out
    native, direct = load_native(tmp_path / "native"), load_dataset(str(tmp_path / "ogbn_arxiv"))
    for key in ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(np.asarray(getattr(native, key)), np.asarray(getattr(direct, key))), key
    assert native.metric == "accuracy"
    make_proteins_like(tmp_path / "ogbn_proteins")
    summary = train(TrainConfig(dataset=str(tmp_path / "ogbn_proteins"), fanouts=[4, 4], hidden=16, epochs=2,
                                progress=False))
    assert summary["metric"] == "rocauc" and 0 <= summary["test_rocauc"] <= 1


def test_an_incomplete_directory_names_the_missing_file(tmp_path):
    make_arxiv_like(tmp_path / "ogbn_arxiv")
    (tmp_path / "ogbn_arxiv" / "raw" / "node-label.csv.gz").unlink()
    with pytest.raises(DataError, match=r"node-label\.csv\.gz: file is missing"):
        load_dataset(str(tmp_path / "ogbn_arxiv"))
    make_arxiv_like(tmp_path / "short")
    path = tmp_path / "short" / "raw" / "edge.csv.gz"
    path.write_bytes(path.read_bytes()[:40])  # truncated
    with pytest.raises(DataError, match=r"edge\.csv\.gz: cannot be read"):
        load_dataset(str(tmp_path / "short"))
