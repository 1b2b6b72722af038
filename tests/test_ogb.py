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


def _rewrite(path: Path, text: str) -> None:
    with gzip.open(path, "wt") as f:
        f.write(text)


def _read_text(path: Path) -> str:
    with gzip.open(path, "rt") as f:
        return f.read()


@pytest.mark.parametrize("file, text, message", [
    ("num-edge-list.csv.gz", f"{E + 1}\n", r"edge\.csv\.gz: holds 1800 values, but .*num-edge-list\.csv\.gz says 901"),
    ("num-edge-list.csv.gz", f"{E - 1}\n", r"edge\.csv\.gz: holds more than the 1798 values expected"),
    ("num-edge-list.csv.gz", "1000000000000\n", r"edge\.csv\.gz: .*says 1,000,000,000,000 edges.*holds at most"),
    ("num-node-list.csv.gz", f"{N + 5}\n", r"node-label\.csv\.gz: holds 200 values, but .*says 205 vertices"),
    ("num-node-list.csv.gz", f"{N - 5}\n", r"node-label\.csv\.gz: holds more than the 195 values"),
    ("num-node-list.csv.gz", "-3\n", r"num-node-list\.csv\.gz: holds \[-3\], expected one count"),
    ("num-node-list.csv.gz", f"{N}\n{N}\n", r"num-node-list\.csv\.gz: holds \[200, 200\], expected one count"),
    ("num-node-list.csv.gz", "", r"num-node-list\.csv\.gz: holds \[\], expected one count"),
    ("num-node-list.csv.gz", "200.5\n", r"num-node-list\.csv\.gz: value number 1 is 200\.5, not a whole number"),
    ("num-node-list.csv.gz", "x\n", r"num-node-list\.csv\.gz: line 1 holds 'x', which is not a number"),
])
def test_counts_that_disagree_with_their_files_are_named(tmp_path, file, text, message):
    make_arxiv_like(tmp_path / "ogbn_arxiv")
    _rewrite(tmp_path / "ogbn_arxiv" / "raw" / file, text)
    with pytest.raises(DataError, match=message):
        load_dataset(str(tmp_path / "ogbn_arxiv"))


def _merge_lines(text: str, at: int) -> str:
    """Lines ``at`` and ``at + 1`` run into one: the file holds as many values as before, in a ragged table."""
    lines = text.split("\n")
    return "\n".join(lines[:at] + [lines[at] + "," + lines[at + 1]] + lines[at + 2:])


@pytest.mark.parametrize("file, change, message", [
    ("edge.csv.gz", lambda t: t.replace("\n", ".5\n", 1), r"edge\.csv\.gz: value number 2 is .*\.5, not a whole"),
    ("edge.csv.gz", lambda t: "99999999999999999999" + t[t.index(","):], r"edge\.csv\.gz: value number 1 is 1e\+20"),
    ("edge.csv.gz", lambda t: "1,2,3\n" + t, r"edge\.csv\.gz: the first line holds 3 values"),
    ("edge.csv.gz", lambda t: _merge_lines(t, 1), r"edge\.csv\.gz: line 2 holds 4 values, where every line holds 2"),
    ("node-feat.csv.gz", lambda t: _merge_lines(t, 1), r"node-feat\.csv\.gz: line 2 holds 12 values, where every"),
    ("node-label.csv.gz", lambda t: "nonsense\n" + t.split("\n", 1)[1], r"line 1 holds 'nonsense', which is not"),
    ("split/time/train.csv.gz", lambda t: f"{N + 3}\n" + t, r"train\.csv\.gz: the split holds id 203, outside 0\.\.199"),
    ("split/time/valid.csv.gz", lambda t: t + t.split("\n", 1)[0] + "\n", r"valid\.csv\.gz: the split lists vertex .* more than"),
    ("split/time/test.csv.gz", lambda t: t.replace("\n", ".25\n", 1), r"test\.csv\.gz: value number 1 is .*\.25"),
])
def test_values_a_file_cannot_mean_are_refused_not_truncated(tmp_path, file, change, message):
    make_arxiv_like(tmp_path / "ogbn_arxiv")
    path = tmp_path / "ogbn_arxiv" / (file if file.startswith("split") else f"raw/{file}")
    _rewrite(path, change(_read_text(path)))
    with pytest.raises(DataError, match=message):
        load_dataset(str(tmp_path / "ogbn_arxiv"))


@pytest.mark.parametrize("part", ["train", "valid", "test"])
def test_an_empty_split_file_is_said_to_be_empty(tmp_path, part):
    make_arxiv_like(tmp_path / "ogbn_arxiv")
    path = tmp_path / "ogbn_arxiv" / "split" / "time" / f"{part}.csv.gz"
    with gzip.open(path, "wt"):
        pass
    with pytest.raises(DataError, match=rf"{part}\.csv\.gz: the split is empty \(no vertex ids\)"):
        load_dataset(str(tmp_path / "ogbn_arxiv"))
    path.write_bytes(b"")  # not even gzip's header
    with pytest.raises(DataError, match=rf"{part}\.csv\.gz: the split is empty"):
        load_dataset(str(tmp_path / "ogbn_arxiv"))


def test_split_files_that_share_vertices_are_refused_with_the_counts(tmp_path):
    _, _, _, splits = make_arxiv_like(tmp_path / "ogbn_arxiv")
    folder = tmp_path / "ogbn_arxiv" / "split" / "time"
    _write_csv(folder / "test.csv.gz", np.concatenate([splits["test"], splits["valid"][:3]]), "{}")
    with pytest.raises(DataError, match=r"test\.csv\.gz: 3 validation vertices are also in test_idx \(first: \d+\), "
                                        r"of 40 validation and 43 test vertices.*disjoint"):
        load_dataset(str(tmp_path / "ogbn_arxiv"))


@pytest.mark.parametrize("change, message", [
    (dict(num_nodes_list=np.array([N, N])), r"num_nodes_list holds 2 counts"),
    (dict(num_nodes_list=np.array([N + 1])), r"node_feat has shape \(200, 6\), but num_nodes_list says 201"),
    (dict(num_nodes_list=np.array([-1])), r"num_nodes_list says -1 vertices"),
    (dict(edge_index=np.zeros((3, E), np.int64)), r"edge_index has shape \(3, 900\)"),
    (dict(edge_index=np.full((2, E), 1.5)), r"data\.npz|raw: edge sources hold 1\.5, which is not a whole number"),
    (dict(edge_index=np.full((2, E), 2 ** 64 - 1, np.uint64)), r"beyond the largest int64"),
    (dict(node_feat=np.array([None] * N, dtype=object)), r"holds pickled Python objects"),
])
def test_the_binary_layout_checks_its_counts_and_types(tmp_path, change, message):
    make_papers_like(tmp_path / "ogbn_papers100M")
    path = tmp_path / "ogbn_papers100M" / "raw" / "data.npz"
    with np.load(path) as archive:
        arrays = {k: archive[k] for k in archive.files}
    arrays.update(change)
    np.savez(path, **arrays)
    with pytest.raises(DataError, match=message) as error:
        load_dataset(str(tmp_path / "ogbn_papers100M"))
    assert "allow_pickle" not in str(error.value)


def test_an_unreadable_file_says_permission_denied(tmp_path, monkeypatch):
    import builtins
    import io

    make_arxiv_like(tmp_path / "ogbn_arxiv")
    refused = tmp_path / "ogbn_arxiv" / "raw" / "node-feat.csv.gz"
    original = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file) == str(refused):
            raise PermissionError(13, "Permission denied", str(file))
        return original(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)
    with pytest.raises(DataError, match=rf"cannot read {refused}: permission denied; give the user"):
        load_dataset(str(tmp_path / "ogbn_arxiv"))
