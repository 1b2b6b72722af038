"""OGB-LSC's MAG240M layout (``mag240m_kddcup2021``) read as a typed graph (``data/mag240m.py``), built here
small: float16 paper features, NaN labels, (2, E) edge indices, ``meta.pt`` and ``split_dict.pt``; the
hidden test labels, the featureless types, the clear errors, and the dispatch of ``load_typed_dataset``,
``info`` and ``train``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch.cli import main
from neutronorch.data import is_typed_dataset, load_dataset, load_typed_dataset
from neutronorch.data import typed_arrays
from neutronorch.data.mag240m import is_mag240m_dir, load_mag240m
from neutronorch.data.typed import Relation
from neutronorch.errors import DataError

COUNTS = {"paper": 30, "author": 20, "institution": 5}
EDGES = {("author", "affiliated_with", "institution"): 18, ("author", "writes", "paper"): 50,
         ("paper", "cites", "paper"): 45}
CLASSES = 7
TRAIN, VALID, TEST = [1, 4, 5, 8, 12, 13, 17, 20, 22, 26], [2, 9, 21, 28], [0, 6, 11, 15, 19, 24, 27, 29]


def make_mag240m(folder: Path, seed: int = 0, split_keys: str = "test") -> dict:
    """The folder OGB's MAG240MDataset leaves, small; returns what was written. ``split_keys``: ``test`` (as
    stored) or ``parts`` (test-whole, test-dev and test-challenge, as split_test leaves the dict)."""
    rng = np.random.default_rng(seed)
    processed = folder / "processed"
    (processed / "paper").mkdir(parents=True)
    torch.save({"paper": COUNTS["paper"], "author": COUNTS["author"], "institution": COUNTS["institution"],
                "num_classes": CLASSES}, folder / "meta.pt")
    test = np.array(TEST, np.int64)
    split = {"train": np.array(TRAIN[::-1], np.int64), "valid": np.array(VALID, np.int64)}
    dev = np.arange(len(TEST)) % 5 < 3  # split_test's rule
    split.update({"test": test} if split_keys == "test" else
                 {"test-whole": test, "test-dev": test[dev], "test-challenge": test[~dev]})
    torch.save(split, folder / "split_dict.pt")
    features = rng.standard_normal((COUNTS["paper"], 768)).astype(np.float16)
    np.save(processed / "paper" / "node_feat.npy", features)
    labels = np.full(COUNTS["paper"], np.nan, np.float32)  # hidden: the test papers and the unsplit ones
    labels[TRAIN + VALID] = rng.integers(0, CLASSES, len(TRAIN + VALID))
    labels[TRAIN[0]] = CLASSES - 1
    np.save(processed / "paper" / "node_label.npy", labels)
    np.save(processed / "paper" / "node_year.npy", rng.integers(1990, 2021, COUNTS["paper"]))
    edges = {}
    for key, count in EDGES.items():
        index = np.stack([rng.integers(0, COUNTS[key[0]], count), rng.integers(0, COUNTS[key[2]], count)])
        index[:, 0] = [COUNTS[key[0]] - 1, COUNTS[key[2]] - 1]
        index[:, 1] = index[:, 2]  # a repeated edge, kept
        edges[key] = index
        (processed / "___".join(key)).mkdir()
        np.save(processed / "___".join(key) / "edge_index.npy", index)
    return {"features": features, "labels": np.where(np.isnan(labels), -1, labels).astype(np.int64), "edges": edges}


@pytest.fixture
def mag(tmp_path) -> tuple[Path, dict]:
    folder = tmp_path / "mag240m_kddcup2021"
    return folder, make_mag240m(folder)


def test_the_layout_reads_as_the_typed_graph_written(mag, monkeypatch):
    folder, written = mag
    monkeypatch.setattr(typed_arrays, "CHUNK", 8)  # the CSCs and labels read over several chunks
    assert is_mag240m_dir(folder) and is_typed_dataset(str(folder))
    graph = load_mag240m(folder)
    assert graph.name == "mag240m" and graph.target == "paper" and graph.metric == "accuracy"
    assert graph.num_nodes == COUNTS and list(graph.num_nodes) == ["paper", "author", "institution"]
    assert list(graph.relations) == list(EDGES)  # one way, as OGB stores them: no rev_ relations
    for key, index in written["edges"].items():
        relation = graph.relations[key]
        expected = Relation.from_edges(index[0], index[1], COUNTS[key[0]], COUNTS[key[2]])
        assert relation.num_edges == EDGES[key]
        np.testing.assert_array_equal(relation.indptr, expected.indptr)
        np.testing.assert_array_equal(relation.indices, expected.indices)
    assert list(graph.features) == ["paper"] and graph.feature_dim("author") == graph.feature_dim("institution") == 0
    assert graph.features["paper"].dtype == np.float16 and isinstance(graph.features["paper"], np.memmap)
    np.testing.assert_array_equal(graph.features["paper"], written["features"])
    np.testing.assert_array_equal(graph.labels, written["labels"])
    assert graph.labels.dtype == np.int64 and graph.num_classes == CLASSES  # meta.pt's, not the labels' largest
    np.testing.assert_array_equal(graph.train_idx, TRAIN)
    np.testing.assert_array_equal(graph.val_idx, VALID)
    np.testing.assert_array_equal(graph.test_idx, VALID)  # the test labels are hidden
    assert graph.notes[1] == ("the 8 test papers' labels are hidden (OGB's leaderboard scores test-dev and "
                              "test-challenge), so the test split is the validation split (4 papers), whose "
                              "accuracy OGB's examples report")
    assert "node_year not read" in graph.notes[0]


def test_a_split_dict_as_split_test_leaves_it(tmp_path):
    folder = tmp_path / "mag240m_kddcup2021"
    make_mag240m(folder, split_keys="parts")
    graph = load_mag240m(folder)
    np.testing.assert_array_equal(graph.train_idx, TRAIN)
    assert "the 8 test papers' labels are hidden" in graph.notes[1]


def _error(folder: Path) -> str:
    with pytest.raises(DataError) as caught:
        load_mag240m(folder)
    return str(caught.value)


@pytest.mark.parametrize("missing", ["meta.pt", "split_dict.pt", "processed/paper/node_feat.npy",
                                     "processed/paper/node_label.npy",
                                     "processed/paper___cites___paper/edge_index.npy"])
def test_a_missing_file_is_named(mag, missing):
    folder, _ = mag
    (folder / missing).unlink()
    assert f"{folder / missing}: file is missing" in _error(folder)


def test_mismatched_rows_and_ids_are_named(mag):
    folder, written = mag
    path = folder / "processed" / "paper" / "node_feat.npy"
    np.save(path, written["features"][:-2])
    message = _error(folder)
    assert message.startswith(str(path)) and "features of shape (28, 768), but" in message
    assert f"{folder / 'meta.pt'} says 30 vertices of type paper" in message
    np.save(path, written["features"])
    index = written["edges"][("author", "affiliated_with", "institution")].copy()
    index[0, 4] = COUNTS["author"]
    path = folder / "processed" / "author___affiliated_with___institution" / "edge_index.npy"
    np.save(path, index)
    message = _error(folder)
    assert message.startswith(str(path)) and "(author, affiliated_with, institution) holds source id 20" in message
    assert "meta.pt says 20 vertices of type author" in message
    np.save(path, index.T)  # IGB's (E, 2), not OGB's (2, E)
    assert "expected (2, E): a row of sources, one of destinations" in _error(folder)


def test_the_counts_and_the_split_are_checked(mag):
    folder, written = mag
    torch.save({"paper": 30, "author": 20, "num_classes": CLASSES}, folder / "meta.pt")
    assert "meta.pt: 'institution' is None, expected a count" in _error(folder)
    torch.save({"paper": 30, "author": 20, "institution": 5, "num_classes": CLASSES}, folder / "meta.pt")
    torch.save({"train": np.array(TRAIN), "valid": np.array([2, 30]), "test": np.array(TEST)},
               folder / "split_dict.pt")
    assert "split_dict.pt: 'valid' holds id 30, outside 0..29" in _error(folder)
    torch.save({"train": np.array(TRAIN + [0]), "valid": np.array(VALID), "test": np.array(TEST)},
               folder / "split_dict.pt")  # paper 0 is a test paper: its label is hidden
    message = _error(folder)  # the graph's own checks, naming the file
    assert message.startswith(str(folder / "split_dict.pt")) and "train_idx holds 1 unlabelled vertices" in message
    torch.save({"train": np.array(TRAIN), "valid": np.array(VALID)}, folder / "split_dict.pt")
    assert "lacks the test papers (test, test-whole, test-dev, test-challenge)" in _error(folder)


def test_reading_the_pt_files_without_torch_says_so(mag, monkeypatch):
    folder, _ = mag
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now fails, as where it is not installed
    message = _error(folder)
    assert message.startswith(str(folder / "meta.pt")) and "reading it needs torch, which is not installed" in message


def test_the_dataset_dispatch_info_and_training(mag, tmp_path, capsys):
    folder, _ = mag
    graph = load_typed_dataset(str(folder))
    assert graph.name == "mag240m" and graph.num_nodes == COUNTS
    with pytest.raises(DataError, match="holds a typed graph"):
        load_dataset(str(folder))
    assert main(["info", str(folder)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["name"], info["nodes"], info["edges"], info["classes"]) == ("mag240m", 55, 113, CLASSES)
    assert info["node_types"]["author"]["feature_dim"] == 0 and info["node_types"]["paper"]["feature_dim"] == 768
    flags = ["--epochs", "1", "--fanouts", "2,2", "--hidden", "8", "--batch-size", "4", "--threads", "1",
             "--no-progress"]
    assert main(["train", "--dataset", str(folder), "--run-name", "mag240m", *flags]) == 0
    summary = json.loads(Path("runs/mag240m/summary.json").read_text())
    assert summary["dataset"]["name"] == "mag240m"
    shutil.rmtree("runs/mag240m")
