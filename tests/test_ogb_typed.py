"""OGB's heterogeneous node-property layout (ogbn-mag) read as a typed graph (``data/ogb_typed.py``), built
here small; its clear errors; and ``neutronorch info``, ``convert`` and ``train`` on typed graphs."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from neutronorch.cli import main
from neutronorch.data import is_typed_dataset, load_dataset, load_typed_dataset, read_typed
from neutronorch.data.ogb_typed import is_ogb_typed_dir, load_ogb_typed
from neutronorch.errors import DataError

COUNTS = {"author": 6, "field_of_study": 4, "institution": 3, "paper": 10}
RELATIONS = {("author", "affiliated_with", "institution"): 5, ("author", "writes", "paper"): 14,
             ("paper", "cites", "paper"): 12, ("paper", "has_topic", "field_of_study"): 9}
SPLIT = {"train": [0, 3, 4, 6, 8, 9], "valid": [1, 2], "test": [7]}  # paper 5 has no label: in none


def _write(path: Path, rows, compress: bool = True) -> Path:
    """Rows (lists of cells, or one value each) as OGB's CSV: no header unless the rows carry one."""
    path = path.with_name(path.name + (".csv.gz" if compress else ".csv"))
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(",".join(map(str, row if isinstance(row, (list, tuple)) else [row])) + "\n" for row in rows)
    with (gzip.open(path, "wt") if compress else open(path, "w")) as f:
        f.write(text)
    return path


def make_mag_like(root: Path, compress: bool = True, seed: int = 0) -> dict:
    """ogbn-mag's layout with 4 types, 4 relations, features on paper only, paper's labels and time split;
    returns what was written."""
    rng = np.random.default_rng(seed)
    raw = root / "raw"
    _write(raw / "num-node-dict", [list(COUNTS), list(COUNTS.values())], compress)
    _write(raw / "triplet-type-list", list(RELATIONS), compress)
    edges = {}
    for key, count in RELATIONS.items():
        src, dst = rng.integers(0, COUNTS[key[0]], count), rng.integers(0, COUNTS[key[2]], count)
        src[0], dst[0] = COUNTS[key[0]] - 1, COUNTS[key[2]] - 1  # the last id of each type is in range
        edges[key] = np.stack([src, dst], axis=1)
        folder = raw / "relations" / "___".join(key)
        _write(folder / "edge", edges[key].tolist(), compress)
        _write(folder / "num-edge-list", [count], compress)
        _write(folder / "edge_reltype", [list(RELATIONS).index(key)] * count, compress)
    features = rng.standard_normal((COUNTS["paper"], 5)).astype(np.float32)
    _write(raw / "node-feat" / "paper" / "node-feat", [[f"{v:.9g}" for v in row] for row in features], compress)
    _write(raw / "node-feat" / "paper" / "node_year", rng.integers(2010, 2020, COUNTS["paper"]).tolist(), compress)
    labels = rng.integers(0, 3, COUNTS["paper"])
    labels[:3] = [0, 1, 2]
    _write(raw / "nodetype-has-label", [list(COUNTS), ["False", "False", "False", "True"]], compress)
    _write(raw / "node-label" / "paper" / "node-label", [v if i != 5 else "nan" for i, v in enumerate(labels)],
           compress)
    labels[5] = -1
    _write(root / "split" / "time" / "nodetype-has-split", [list(COUNTS), ["False", "False", "False", "True"]],
           compress)
    for part, ids in SPLIT.items():
        _write(root / "split" / "time" / "paper" / part, ids[::-1], compress)  # unsorted, as a file may be
    return {"edges": edges, "features": features, "labels": labels}


@pytest.fixture
def mag(tmp_path) -> tuple[Path, dict]:
    folder = tmp_path / "ogbn_mag"
    return folder, make_mag_like(folder)


def _pairs(edges: np.ndarray) -> list:
    return sorted(map(tuple, edges.tolist()))


@pytest.mark.parametrize("compress", [True, False])
def test_the_layout_reads_as_the_typed_graph_written(tmp_path, compress):
    folder = tmp_path / "ogbn_mag"
    written = make_mag_like(folder, compress)
    assert is_ogb_typed_dir(folder) and is_typed_dataset(str(folder))
    graph = load_ogb_typed(folder)
    assert graph.name == "ogbn-mag" and graph.target == "paper" and graph.metric == "accuracy"
    assert graph.num_nodes == COUNTS and list(graph.num_nodes) == list(COUNTS)  # the header's order
    assert list(graph.relations) == list(RELATIONS)  # triplet-type-list's order
    for key, edges in written["edges"].items():
        src, dst = graph.relations[key].edges()
        assert graph.relations[key].num_edges == RELATIONS[key]
        assert _pairs(np.stack([src, dst], axis=1)) == _pairs(edges), key
        assert graph.relations[key].edge_features is None
    assert list(graph.features) == ["paper"] and graph.features["paper"].dtype == np.float32
    np.testing.assert_array_equal(graph.features["paper"], written["features"])
    assert graph.labels.dtype == np.int64
    np.testing.assert_array_equal(graph.labels, written["labels"])
    assert graph.num_classes == 3
    for split, part in (("train_idx", "train"), ("val_idx", "valid"), ("test_idx", "test")):
        np.testing.assert_array_equal(getattr(graph, split), sorted(SPLIT[part]))
    assert graph.notes == ["OGB ogbn-mag: relations one way as OGB gives them (training adds the reverses); "
                           "not read: edge_reltype, node_year"]


def test_the_optional_lists_may_be_absent(mag):
    folder, written = mag
    raw = folder / "raw"
    for path in [raw / "triplet-type-list.csv.gz", raw / "nodetype-has-label.csv.gz",
                 *raw.glob("relations/*/num-edge-list.csv.gz")]:
        path.unlink()
    (raw / "relations" / "paper___cites___paper" / "edge.csv.gz").write_bytes(  # a last line without newline
        gzip.compress("\n".join(f"{s},{d}" for s, d in written["edges"][("paper", "cites", "paper")]).encode()))
    graph = load_ogb_typed(folder)
    assert list(graph.relations) == sorted(RELATIONS)  # the folders, in name order
    for key, edges in written["edges"].items():
        assert _pairs(np.stack(graph.relations[key].edges(), axis=1)) == _pairs(edges), key


def test_the_dataset_dispatch_tells_typed_from_homogeneous(mag, tmp_path):
    folder, _ = mag
    graph = load_typed_dataset(str(folder), split="ratio:0.5,0.2")
    assert graph.name == "ogbn-mag" and "`split` ratio:0.5,0.2 ignored" in graph.notes[-1]
    with pytest.raises(DataError, match="holds a typed graph.*load_typed_dataset"):
        load_dataset(str(folder))
    assert not is_typed_dataset("synthetic") and not is_typed_dataset(str(tmp_path / "none"))
    with pytest.raises(DataError, match="not a typed graph"):
        load_typed_dataset(str(tmp_path))


def _error(folder: Path) -> str:
    with pytest.raises(DataError) as caught:
        load_ogb_typed(folder)
    return str(caught.value)


def test_missing_counts_are_named(mag):
    folder, _ = mag
    (folder / "raw" / "num-node-dict.csv.gz").unlink()
    assert "num-node-dict.csv.gz: file is missing" in _error(folder)


def test_a_relation_naming_an_unknown_type_is_named(mag):
    folder, _ = mag
    raw = folder / "raw"
    unknown = raw / "relations" / "paper___published_in___venue"
    _write(unknown / "edge", [[0, 0]])
    message = _error(folder)  # triplet-type-list does not list the folder
    assert str(unknown) in message and "does not list" in message
    (raw / "triplet-type-list.csv.gz").unlink()  # the folders are the relations then
    message = _error(folder)
    assert str(unknown) in message and "(paper, published_in, venue)" in message
    assert "destination type 'venue'" in message and "num-node-dict.csv.gz does not list" in message


def test_an_id_beyond_its_types_count_is_named(mag):
    folder, written = mag
    edges = written["edges"][("author", "writes", "paper")].copy()
    edges[3, 0] = COUNTS["author"]
    path = _write(folder / "raw" / "relations" / "author___writes___paper" / "edge", edges.tolist())
    message = _error(folder)
    assert str(path) in message and "(author, writes, paper)" in message
    assert "source id 6, outside 0..5" in message and "6 vertices of type author" in message


def test_feature_rows_must_match_the_count(mag):
    folder, written = mag
    path = _write(folder / "raw" / "node-feat" / "paper" / "node-feat", written["features"][:-1].tolist())
    message = _error(folder)
    assert str(path) in message and "10 vertices of type paper" in message


def test_a_missing_split_file_is_named(mag):
    folder, _ = mag
    (folder / "split" / "time" / "paper" / "valid.csv.gz").unlink()
    assert "paper/valid.csv.gz: file is missing" in _error(folder)


def test_one_labelled_type_is_the_target(mag):
    folder, _ = mag
    raw = folder / "raw"
    _write(raw / "nodetype-has-label", [list(COUNTS), ["True", "False", "False", "True"]])
    assert "author/node-label.csv.gz: file is missing" in _error(folder)
    _write(raw / "node-label" / "author" / "node-label", [0] * COUNTS["author"])
    assert "types author, paper all have labels; neutronorch trains one target type" in _error(folder)
    shutil.rmtree(raw / "node-label")
    (raw / "nodetype-has-label.csv.gz").unlink()
    assert "no vertex type has labels" in _error(folder)


def test_a_split_on_a_type_without_labels_is_refused(mag):
    folder, _ = mag
    _write(folder / "split" / "time" / "author" / "train", [0, 1])
    message = _error(folder)
    assert "split/time/author" in message and "type 'author', which has no labels" in message


def test_an_empty_or_overlapping_split_is_named(mag):
    folder, _ = mag
    _write(folder / "split" / "time" / "paper" / "valid", [])
    assert "paper/valid.csv.gz: the split is empty (no vertex ids)" in _error(folder)
    _write(folder / "split" / "time" / "paper" / "valid", [1, 2])
    path = _write(folder / "split" / "time" / "paper" / "test", [7, 2])
    message = _error(folder)
    assert message.startswith(str(path)) and ("type paper: 1 validation vertices are also in test_idx (first: 2), of 2 "
                                              "validation and 2 test vertices") in message


def test_validation_names_the_file_an_array_came_from(mag):
    folder, _ = mag
    path = _write(folder / "split" / "time" / "paper" / "test", [2, 5])  # paper 5 has no label
    message = _error(folder)
    assert message.startswith(str(path)) and "type paper: test_idx holds 1 unlabelled vertices" in message


def test_info_describes_a_typed_graph_in_json(mag, tmp_path, capsys):
    """The homogeneous info's keys where they mean the same, then the types and the relations."""
    folder, _ = mag
    assert main(["info", str(folder)]) == 0
    info = json.loads(capsys.readouterr().out)
    graph = load_ogb_typed(folder)
    assert list(info) == ["name", "nodes", "edges", "classes", "train", "val", "test", "target", "node_types",
                          "relations", "device_gib", "metric", "notes"]
    assert (info["name"], info["nodes"], info["edges"], info["classes"]) == ("ogbn-mag", 23, 40, 3)
    assert (info["train"], info["val"], info["test"], info["target"]) == (6, 2, 1, "paper")
    assert info["node_types"] == {"author": {"nodes": 6, "feature_dim": 0, "feature_dtype": None},
                                  "field_of_study": {"nodes": 4, "feature_dim": 0, "feature_dtype": None},
                                  "institution": {"nodes": 3, "feature_dim": 0, "feature_dtype": None},
                                  "paper": {"nodes": 10, "feature_dim": 5, "feature_dtype": "float32"}}
    assert [(r["src"], r["name"], r["dst"]) for r in info["relations"]] == list(RELATIONS)
    assert [r["edges"] for r in info["relations"]] == list(RELATIONS.values())
    for row, (key, relation) in zip(info["relations"], graph.relations.items()):
        src, dst = relation.edges()
        degrees = relation.in_degrees()
        assert row["max_in_degree"] == degrees.max() and row["mean_in_degree"] == pytest.approx(degrees.mean())
        assert row["duplicate_edges"] == len(src) - len(set(zip(src.tolist(), dst.tolist()))), key
        assert row["edge_feature_dim"] == 0
        if key[0] == key[2]:  # within one type: self loops and one-way edges too, as homogeneous info counts them
            assert row["self_loops"] == int((src == dst).sum()) and "edges_without_reverse" in row
        else:
            assert "self_loops" not in row
    topology = sum(r.indptr.nbytes + r.indices.nbytes for r in graph.relations.values())
    assert info["device_gib"] == {"topology": round(topology / 2**30, 4), "features": round(10 * 5 * 4 / 2**30, 4)}
    assert info["metric"] == "accuracy" and info["notes"][0].startswith("OGB ogbn-mag: relations one way")


def test_convert_writes_the_typed_layout_and_guards_its_output(mag, tmp_path, capsys):
    folder, _ = mag
    out = tmp_path / "native"
    assert main(["convert", str(folder), str(out)]) == 0
    assert "wrote ogbn-mag: 4 vertex types" in capsys.readouterr().out
    native, direct = read_typed(out), load_ogb_typed(folder)
    assert native.num_nodes == direct.num_nodes and list(native.relations) == list(direct.relations)
    for key in direct.relations:
        for array in ("indptr", "indices"):
            np.testing.assert_array_equal(getattr(native.relations[key], array), getattr(direct.relations[key], array))
    np.testing.assert_array_equal(native.features["paper"], direct.features["paper"])
    for array in ("labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(native, array), getattr(direct, array))
    assert native.notes == direct.notes and native.metric == "accuracy"
    assert main(["info", str(out)]) == 0  # a typed native folder too
    assert json.loads(capsys.readouterr().out)["node_types"]["paper"] == {"nodes": 10, "feature_dim": 5,
                                                                        "feature_dtype": "float32"}
    # Onto another run's output, onto the input or into it: refused before anything is read or written.
    before = sorted(p.name for p in out.iterdir())
    assert main(["convert", str(folder), str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["convert", str(folder), str(folder), "--overwrite"]) == 2
    assert "holds files but no typed dataset" in capsys.readouterr().err
    assert main(["convert", str(folder), str(folder / "native")]) == 2
    err = capsys.readouterr().err
    assert "SOURCE" in err and "Traceback" not in err and not (folder / "native").exists()
    assert sorted(p.name for p in out.iterdir()) == before and is_ogb_typed_dir(folder)
    # A typed folder rewritten in place with halved features, from its own memory maps.
    assert main(["convert", str(out), str(out), "--float16", "--overwrite"]) == 0
    halved = read_typed(out)
    assert halved.features["paper"].dtype == np.float16
    np.testing.assert_array_equal(halved.features["paper"], direct.features["paper"].astype(np.float16))


def test_training_reads_the_ogb_folder(mag, capsys):
    folder, _ = mag
    flags = ["--epochs", "1", "--fanouts", "2,2", "--hidden", "8", "--batch-size", "4", "--threads", "1",
             "--no-progress"]
    assert main(["train", "--dataset", str(folder), "--run-name", "mag", *flags]) == 0
    out = capsys.readouterr().out
    assert "results in runs/mag/" in out
    summary = json.loads(Path("runs/mag/summary.json").read_text())
    assert summary["dataset"]["name"] == "ogbn-mag" and summary["config"]["checkpoint_dir"] == "runs/mag"
    shutil.rmtree("runs/mag")
