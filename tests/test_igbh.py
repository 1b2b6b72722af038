"""IGBH's array layout (IGB's ``<root>/<size>/processed``) read as a typed graph (``data/igbh.py``), built
here small: the .npy files of tiny/small/medium, the raw float32 files of large/full, MLPerf's seed files; the
clear errors; and the dispatch of ``load_typed_dataset``, ``info`` and ``convert``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch.cli import main
from neutronorch.data import is_typed_dataset, load_dataset, load_typed_dataset, read_typed
from neutronorch.data import igbh, typed_arrays
from neutronorch.data.igbh import is_igbh_dir, load_igbh
from neutronorch.data.typed import Relation
from neutronorch.errors import DataError

COUNTS = {"paper": 30, "author": 20, "institute": 6, "fos": 8, "journal": 4, "conference": 3}
EDGES = {("paper", "cites", "paper"): 40, ("paper", "written_by", "author"): 45,
         ("author", "affiliated_to", "institute"): 22, ("paper", "topic", "fos"): 35,
         ("paper", "published", "journal"): 25, ("paper", "venue", "conference"): 9}
WIDTH = 16  # the .npy features' width (IGB's are 1024; the raw files' must be)


def make_igbh(root: Path, size: str = "tiny", seed: int = 0) -> dict:
    """``root/size/processed`` as IGB ships it: .npy files, and for large/full the raw float32 files of paper
    and author features and labels plus the journal and conference relations; returns what was written."""
    rng = np.random.default_rng(seed)
    processed = root / size / "processed"
    large = size in ("large", "full")
    types = list(COUNTS) if large else list(COUNTS)[:4]
    written = {"features": {}, "edges": {}}
    for node_type in types:
        width = igbh.WIDTH if large and node_type in ("paper", "author") else WIDTH
        rows = rng.standard_normal((COUNTS[node_type], width)).astype(np.float32)
        written["features"][node_type] = rows
        (processed / node_type).mkdir(parents=True)
        _save(processed / node_type / "node_feat.npy", rows, raw=large and node_type in ("paper", "author"))
        mapping = {f"{node_type}-{i}": i for i in range(COUNTS[node_type])}  # IGB saves a dict: a pickle, not read
        np.save(processed / node_type / f"{node_type}_id_index_mapping.npy", mapping, allow_pickle=True)
    for name, classes in (("node_label_19.npy", 19), ("node_label_2K.npy", 2983)):
        labels = rng.integers(0, classes, COUNTS["paper"]).astype(np.float32)
        labels[:2] = [0, classes - 1]
        written[classes] = labels.astype(np.int64)
        _save(processed / "paper" / name, labels, raw=large)
    for key, count in EDGES.items():
        if key[2] not in types:
            continue
        pairs = np.stack([rng.integers(0, COUNTS[key[0]], count), rng.integers(0, COUNTS[key[2]], count)], axis=1)
        pairs[0] = [COUNTS[key[0]] - 1, COUNTS[key[2]] - 1]  # the last id of each type is in range
        pairs[1] = pairs[2]  # a repeated edge, kept
        written["edges"][key] = pairs
        (processed / "__".join(key)).mkdir()
        np.save(processed / "__".join(key) / "edge_index.npy", pairs)
    return written


def _save(path: Path, array: np.ndarray, raw: bool) -> None:
    if raw:
        array.tofile(path)  # what np.memmap(mode="w+") leaves: no header
    else:
        np.save(path, array)


def _pairs(relation: Relation) -> list:
    return sorted(map(tuple, np.stack(relation.edges(), axis=1).tolist()))


@pytest.fixture
def tiny(tmp_path) -> tuple[Path, dict]:
    return tmp_path / "tiny", make_igbh(tmp_path)


def test_the_layout_reads_as_the_typed_graph_written(tiny, monkeypatch):
    folder, written = tiny
    monkeypatch.setattr(typed_arrays, "CHUNK", 7)  # the CSCs built over several chunks
    assert is_igbh_dir(folder) and is_igbh_dir(folder / "processed") and is_typed_dataset(str(folder))
    graph = load_igbh(folder)
    assert graph.name == "igbh-tiny" and graph.target == "paper" and graph.metric == "accuracy"
    assert graph.num_nodes == {t: COUNTS[t] for t in ("paper", "author", "institute", "fos")}
    assert list(graph.relations) == list(EDGES)[:4]  # one way, as stored: no rev_ relations
    for key, pairs in written["edges"].items():
        relation = graph.relations[key]
        assert relation.num_edges == EDGES[key] and _pairs(relation) == sorted(map(tuple, pairs.tolist()))
        expected = Relation.from_edges(pairs[:, 0], pairs[:, 1], COUNTS[key[0]], COUNTS[key[2]])
        np.testing.assert_array_equal(relation.indptr, expected.indptr)
        np.testing.assert_array_equal(relation.indices, expected.indices)  # sources ascending per destination
    for node_type, rows in written["features"].items():
        assert isinstance(graph.features[node_type], np.memmap)
        np.testing.assert_array_equal(graph.features[node_type], rows)
    np.testing.assert_array_equal(graph.labels, written[19])
    assert graph.labels.dtype == np.int64 and graph.num_classes == 19
    splits = [graph.train_idx, graph.val_idx, graph.test_idx]
    assert [len(s) for s in splits] == [18, 6, 6] and all((np.diff(s) > 0).all() for s in splits)
    np.testing.assert_array_equal(np.sort(np.concatenate(splits)), np.arange(30))
    assert graph.notes[0].startswith("IGBH tiny: relations one way as stored (training adds the reverses)")
    assert graph.notes[1:] == ["labels: node_label_19.npy (19 classes)", "split: IGB's rule, 60%/20%/20% of the "
                               "30 labelled papers in a random order (seed 0; IGB's own order is unseeded)"]
    same, other = load_igbh(folder / "processed"), load_igbh(folder, seed=1)
    np.testing.assert_array_equal(same.train_idx, graph.train_idx)
    assert not np.array_equal(other.train_idx, graph.train_idx)


def test_the_other_label_set(tiny):
    folder, written = tiny
    graph = load_igbh(folder, classes=2983)
    np.testing.assert_array_equal(graph.labels, written[2983])
    assert graph.num_classes == 2983 and "node_label_2K.npy (2,983 classes)" in graph.notes[1]
    with pytest.raises(DataError, match="classes 7; IGBH labels papers with 19 or 2983"):
        load_igbh(folder, classes=7)
    (folder / "processed" / "paper" / "node_label_2K.npy").unlink()
    with pytest.raises(DataError, match=r"node_label_2K\.npy: file is missing.*give classes=19"):
        load_igbh(folder, classes=2983)


def test_mlperf_seed_files_give_the_split(tiny):
    folder, _ = tiny
    processed = folder / "processed"
    train, val = torch.tensor([9, 2, 4, 17, 25, 11]), torch.tensor([3, 28])
    torch.save(train, processed / "train_idx.pt")
    torch.save(val, processed / "val_idx.pt")
    graph = load_igbh(folder)
    np.testing.assert_array_equal(graph.train_idx, sorted(train.tolist()))
    np.testing.assert_array_equal(graph.val_idx, [3, 28])
    np.testing.assert_array_equal(graph.test_idx, sorted(set(range(30)) - set(train.tolist()) - {3, 28}))
    assert graph.notes[-1] == ("split: MLPerf's train_idx.pt and val_idx.pt (6/2); test: the 22 labelled papers in "
                               "neither (MLPerf defines no test set)")
    assert len(load_igbh(folder, split="random").train_idx) == 18  # IGB's rule, asked for
    (processed / "val_idx.pt").unlink()
    with pytest.raises(DataError, match=r"val_idx\.pt: file is missing.*split_seeds\.py to write both, or give "
                                        r"split='random'"):
        load_igbh(folder)
    torch.save(torch.tensor([3, 30]), processed / "val_idx.pt")
    with pytest.raises(DataError, match=r"val_idx\.pt: the paper ids holds id 30, outside 0\.\.29.*another size"):
        load_igbh(folder)


def test_large_and_full_read_raw_files_and_count_full_labelled_papers(tmp_path, monkeypatch):
    monkeypatch.setitem(igbh.RAW_COUNTS, "full", {"paper": 30, "author": 20})
    monkeypatch.setitem(igbh.FULL_LABELLED, 19, 25)
    written = make_igbh(tmp_path, "full")
    graph = load_igbh(tmp_path / "full")
    assert graph.name == "igbh-full" and graph.num_nodes == COUNTS and list(graph.relations) == list(EDGES)
    for key, pairs in written["edges"].items():
        assert _pairs(graph.relations[key]) == sorted(map(tuple, pairs.tolist())), key
    for node_type in ("paper", "author"):  # raw: opened with np.memmap, IGB's 1024 wide
        assert graph.features[node_type].shape == (COUNTS[node_type], 1024)
        np.testing.assert_array_equal(graph.features[node_type], written["features"][node_type])
    np.testing.assert_array_equal(graph.labels[:25], written[19][:25])
    assert (graph.labels[25:] == -1).all()  # full's papers beyond the labelled count
    assert sum(map(len, (graph.train_idx, graph.val_idx, graph.test_idx))) == 25
    assert max(graph.test_idx.max(), graph.train_idx.max(), graph.val_idx.max()) < 25
    assert "full's labelled papers are its first 25 (IGB's loader)" in graph.notes[2]
    paper = tmp_path / "full" / "processed" / "paper"
    torch.save(torch.arange(20, 28), paper.parent / "train_idx.pt")
    torch.save(torch.tensor([0]), paper.parent / "val_idx.pt")
    with pytest.raises(DataError, match=r"train_idx\.pt: holds 3 papers without a label \(first: 25\); it was made "
                                        r"for the other label set"):
        load_igbh(tmp_path / "full")
    monkeypatch.setitem(igbh.RAW_COUNTS, "full", {"paper": 31, "author": 20})
    with pytest.raises(DataError, match=r"paper/node_feat\.npy: 30 rows of 1024 float32 values, but IGBH full has "
                                        r"31 vertices of type paper"):
        load_igbh(tmp_path / "full")
    with open(paper / "node_feat.npy", "ab") as file:
        file.write(b"\0" * 8)
    with pytest.raises(DataError, match=r"node_feat\.npy: \d+ bytes, not a whole number of rows of 1024 float32"):
        load_igbh(tmp_path / "full")


def _error(folder: Path, **settings) -> str:
    with pytest.raises(DataError) as caught:
        load_igbh(folder, **settings)
    return str(caught.value)


def test_missing_files_are_named(tiny, tmp_path):
    folder, written = tiny
    processed = folder / "processed"
    path = processed / "paper__topic__fos" / "edge_index.npy"
    path.unlink()
    message = _error(folder)
    assert str(path) in message and "file is missing; it holds relation (paper, topic, fos)'s edges" in message
    np.save(path, written["edges"][("paper", "topic", "fos")])
    (processed / "fos" / "node_feat.npy").unlink()
    assert "fos/node_feat.npy: file is missing; it holds the features of type fos" in _error(folder)
    make_igbh(tmp_path, "large")
    (tmp_path / "large" / "processed" / "paper__venue__conference" / "edge_index.npy").unlink()
    assert "paper__venue__conference/edge_index.npy: file is missing" in _error(tmp_path / "large")


def test_mismatched_rows_and_ids_are_named(tiny):
    folder, written = tiny
    processed = folder / "processed"
    np.save(processed / "paper" / "node_label_19.npy", written[19][:-1].astype(np.float32))
    message = _error(folder)
    assert message.startswith(str(processed / "paper" / "node_label_19.npy"))
    assert f"labels of shape (29,), but {processed / 'paper' / 'node_feat.npy'} has 30 rows" in message
    np.save(processed / "paper" / "node_label_19.npy", written[19].astype(np.float32))
    pairs = written["edges"][("paper", "written_by", "author")].copy()
    pairs[5, 1] = COUNTS["author"]
    path = processed / "paper__written_by__author" / "edge_index.npy"
    np.save(path, pairs)
    message = _error(folder)
    assert message.startswith(str(path))
    assert "(paper, written_by, author) holds destination id 20, outside 0..19" in message
    assert "author/node_feat.npy has 20 rows: 20 vertices of type author" in message
    np.save(path, pairs.T)  # OGB's (2, E), not IGB's (E, 2)
    assert "edges of shape (2, 45) (int64), expected (E, 2): a src,dst pair per row" in _error(folder)
    np.save(path, written["edges"][("paper", "written_by", "author")])
    labels = written[19].astype(np.float32)
    labels[3] = 19
    np.save(processed / "paper" / "node_label_19.npy", labels)
    message = _error(folder)  # the graph's own checks, naming the file
    assert message.startswith(str(processed / "paper" / "node_label_19.npy")) and "outside 0..18" in message


def test_the_dataset_dispatch_info_and_convert(tiny, tmp_path, capsys):
    folder, _ = tiny
    graph = load_typed_dataset(str(folder), split="ratio:0.5,0.2")
    assert graph.name == "igbh-tiny" and "`split` ratio:0.5,0.2 ignored" in graph.notes[-1]
    with pytest.raises(DataError, match="holds a typed graph"):
        load_dataset(str(folder))
    (tmp_path / "homogeneous" / "processed" / "paper__cites__paper").mkdir(parents=True)  # IGB260M's layout
    assert not is_igbh_dir(tmp_path / "homogeneous") and not is_typed_dataset(str(tmp_path / "homogeneous"))
    assert main(["info", str(folder)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["name"], info["nodes"], info["edges"], info["classes"]) == ("igbh-tiny", 64, 142, 19)
    assert (info["train"], info["val"], info["test"], info["target"]) == (18, 6, 6, "paper")
    assert [(r["src"], r["name"], r["dst"]) for r in info["relations"]] == list(EDGES)[:4]
    assert main(["convert", str(folder), str(tmp_path / "native")]) == 0
    native = read_typed(tmp_path / "native")
    assert native.num_nodes == graph.num_nodes and list(native.relations) == list(graph.relations)
    np.testing.assert_array_equal(native.train_idx, graph.train_idx)
