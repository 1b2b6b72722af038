"""Your own tables to a dataset (``load_tables``, ``neutronorch convert EDGES OUT --features F --labels L``):
each layout reads to the graph the tables describe, row for row, and each kind of bad table is a DataError
naming the file and the problem."""

from __future__ import annotations

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from neutronorch import TrainConfig, embed, predict, score_pairs, train
from neutronorch.cli import main
from neutronorch.cli.info import dataset_info
from neutronorch.data import load_dataset, load_native, load_tables, load_typed_dataset
from neutronorch.data.tabular import FEATURELESS, LIKE_IDS, NO_LABELS, only_a_table
from neutronorch.data.text_tables import from_text
from neutronorch.errors import ConfigError, DataError

N = 60
ROOT = Path(__file__).resolve().parents[1]


def _world(seed: int = 0):
    """Named vertices in a shuffled order, edges, 4 features and a class name per vertex."""
    rng = np.random.default_rng(seed)
    names = np.array([f"v{i:03d}" for i in rng.permutation(N)])
    src, dst = rng.integers(0, N, 400), rng.integers(0, N, 400)
    classes = rng.integers(0, 3, N)
    x = (rng.standard_normal((N, 4)) + classes[:, None]).astype(np.float32).round(3)
    return names, src, dst, classes, x


def _write_named(tmp_path, gz: bool = False):
    names, src, dst, classes, x = _world()
    edges = tmp_path / ("edges.csv.gz" if gz else "edges.csv")
    text = "src,dst\n" + "".join(f"{names[a]},{names[b]}\n" for a, b in zip(src, dst))
    if gz:
        edges.write_bytes(gzip.compress(text.encode()))
    else:
        edges.write_text(text)
    (tmp_path / "x.tsv").write_text("# my features\n" + "".join(
        f"{names[i]}\t" + "\t".join(map(str, x[i])) + "\n" for i in range(N)))
    (tmp_path / "y.csv").write_text("".join(f"{names[i]},{'abc'[classes[i]]}\n" for i in range(N) if i % 7))
    return edges, tmp_path / "x.tsv", tmp_path / "y.csv"


@pytest.mark.parametrize("gz", [False, True])
def test_named_vertices_are_renumbered_and_every_row_lands_on_its_vertex(tmp_path, gz):
    names, src, dst, classes, x = _world()
    graph, kept = load_tables(*_write_named(tmp_path, gz))
    ids = kept["node_ids"]
    assert list(ids) == sorted(names) and graph.num_nodes == N
    at = {name: k for k, name in enumerate(ids)}
    for i, name in enumerate(names):
        np.testing.assert_allclose(graph.features[at[name]], x[i], rtol=1e-6)
        assert graph.labels[at[name]] == (-1 if i % 7 == 0 else classes[i])  # a vertex left out has no label
    assert list(kept["class_names"]) == ["a", "b", "c"]
    edges = {(int(graph.indices[k]), v) for v in range(N) for k in range(graph.indptr[v], graph.indptr[v + 1])}
    expected = {(at[names[a]], at[names[b]]) for a, b in zip(src, dst) if a != b}
    assert edges == expected | {(b, a) for a, b in expected}  # undirected by default
    labelled = graph.labels >= 0
    for part in (graph.train_idx, graph.val_idx, graph.test_idx):
        assert part.size and labelled[part].all()
    assert any("header src,dst" in note for note in graph.notes)


def test_whole_number_ids_arrays_in_id_order_and_a_directed_graph(tmp_path):
    names, src, dst, classes, x = _world()
    (tmp_path / "e.txt").write_text("".join(f"{a} {b}\n" for a, b in zip(src, dst)))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "y.txt").write_text("label\n" + "".join(f"{c}\n" for c in classes))
    graph, kept = load_tables(tmp_path / "e.txt", tmp_path / "x.npy", tmp_path / "y.txt", directed=True)
    assert kept == {} and graph.num_nodes == N  # ids 0..N-1 already: nothing renumbered
    np.testing.assert_array_equal(graph.features, x)
    np.testing.assert_array_equal(graph.labels, classes)
    edges = {(int(graph.indices[k]), v) for v in range(N) for k in range(graph.indptr[v], graph.indptr[v + 1])}
    assert edges == {(int(a), int(b)) for a, b in zip(src, dst) if a != b}


def test_ids_with_gaps_json_tables_and_a_split_table(tmp_path):
    names, src, dst, classes, x = _world()
    big = np.arange(N) * 1000 + 7  # whole numbers, not 0..n-1
    (tmp_path / "e.json").write_text(json.dumps([[int(big[a]), int(big[b])] for a, b in zip(src, dst)]))
    (tmp_path / "x.json").write_text(json.dumps({str(big[i]): x[i].tolist() for i in range(N)}))
    (tmp_path / "y.json").write_text(json.dumps({str(big[i]): int(classes[i]) for i in range(N)}))
    sets = ["train"] * 30 + ["valid"] * 15 + ["test"] * 15
    (tmp_path / "s.csv").write_text("id,set\n" + "".join(f"{big[i]},{s}\n" for i, s in enumerate(sets)))
    graph, kept = load_tables(tmp_path / "e.json", tmp_path / "x.json", tmp_path / "y.json", tmp_path / "s.csv")
    np.testing.assert_array_equal(kept["node_ids"], big)  # sorted already
    np.testing.assert_allclose(graph.features, x, rtol=1e-6)
    assert list(graph.train_idx) == list(range(30)) and list(graph.test_idx) == list(range(45, 60))
    (tmp_path / "s.json").write_text(json.dumps({"train": [int(i) for i in big[:20]], "test": [int(big[-1])],
                                                 "val": [int(big[25])]}))
    graph, _ = load_tables(tmp_path / "e.json", tmp_path / "x.json", tmp_path / "y.json", tmp_path / "s.json")
    assert list(graph.val_idx) == [25] and list(graph.test_idx) == [N - 1] and len(graph.train_idx) == 20


def _bad(tmp_path, edges="0,1\n1,2\n2,0\n", x="0,1.0\n1,2.0\n2,3.0\n", y="0,0\n1,1\n2,0\n", split=None,
         names=("e.csv", "x.csv", "y.csv")):
    paths = [tmp_path / name for name in names]
    for path, text in zip(paths, (edges, x, y)):
        path.write_text(text) if isinstance(text, str) else np.save(path, text)
    return load_tables(*paths, split=split)


@pytest.mark.parametrize("change, problem", [
    (dict(x="0,1.0\n1,2.0\n"), r"x.csv: holds rows for 2 of the 3 vertices: vertex 2 \(e.csv line 2\) has none; give"),
    (dict(x="0,1.0\n1,2.0\n1,2.5\n2,3.0\n"), r"x.csv: lists vertex 1 more than once \(lines 2, 3\)"),
    (dict(x="0,1.0\n1,oops\n2,3.0\n"), r"x.csv: line 2, column 2: 'oops' is not a number"),
    # Past the lines that set the width and header: the line as an editor numbers it, after a header and a comment.
    (dict(x="id,a,b\n# c\n" + "".join(f"{i},1.0,2.0\n" for i in range(60)) + "60,1.0\n"),
     r"x.csv: line 63 holds 2 column\(s\), and the lines before it 3"),
    (dict(x="".join(f"{i},1.0,2.0\n" for i in range(55)) + "55,1.0,abc\n"), r"x.csv: line 56, column 3: 'abc'"),
    (dict(edges="0,1\n1,2,3\n"), r"e.csv: line 2 holds 3 column\(s\), and the lines before it 2"),
    (dict(edges="# nothing\n\n"), r"e.csv: holds no rows"),
    (dict(y="id,label\n"), r"y.csv: holds a header \(id,label\) and no rows below it"),
    (dict(edges="0\n1\n"), r"e.csv: holds one column"),
    (dict(x=np.ones((2, 3)), names=("e.csv", "x.npy", "y.csv")), r"e.csv: line 2 uses vertex id 2, but .*x.npy holds "
                                                                  r"rows for vertices 0..1"),
    (dict(edges="a,b\nb,c\n", x=np.ones((3, 1)), names=("e.csv", "x.npy", "y.csv")), r"x.npy: lists its rows in id "
                                                                                      r"order, but the ids are names "
                                                                                      r"\(such as 'a', e.csv line 1\)"),
    (dict(split="s.csv"), None),
    (dict(edges=np.zeros((2, 2), np.int64), names=("e.npy", "x.csv", "y.csv")), r"e.npy: .*2 x 2 is ambiguous"),
    (dict(y="0,0\n1,1\n1,0\n2,0\n"), r"y.csv: lists vertex 1 more than once \(lines 2, 3\); give each vertex one"),
])
def test_a_bad_table_is_refused_naming_the_file_and_the_problem(tmp_path, change, problem):
    if problem is None:  # a split table naming a set that does not exist
        (tmp_path / "s.csv").write_text("0,train\n1,dev\n2,test\n")
        change["split"], problem = str(tmp_path / "s.csv"), r"s.csv: line 2 names set 'dev'; the sets are train, val"
    with pytest.raises(DataError, match=problem):
        _bad(tmp_path, **change)


def test_convert_from_the_command_line_and_what_it_refuses(tmp_path, capsys):
    edges, x, y = _write_named(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(edges), str(out), "--features", str(x), "--labels", str(y), "--name", "mine"]) == 0
    graph = load_native(out)
    assert graph.name == "mine" and graph.num_nodes == N and graph.num_classes == 3
    assert list(np.load(out / "node_ids.npy")) == sorted(_world()[0])
    assert "header src,dst" in capsys.readouterr().out
    # Again over it: --overwrite replaces the dataset and what it keeps beside it.
    assert main(["convert", str(edges), str(out), "--features", str(x), "--labels", str(y), "--overwrite"]) == 0
    for argv, message in (
            ([str(edges), str(tmp_path / "o2"), "--split", "ratio:0.5,0.2"], "--split ratio:0.5,0.2: splits the "
                                                                              "labelled vertices of a node task, and "
                                                                              "no labels are given"),
            ([str(edges), str(tmp_path / "o2"), "--features", str(x), "--split", "edges:0.8,0.1"],
             "--split edges:0.8,0.1: an edge split, drawn as a link task trains, not stored with the data"),
            ([str(edges), str(tmp_path / "o2"), "--seed", "3"], "--seed 3: draws the split of the labelled vertices, "
                                                                "and no --labels are given"),
            ([str(edges), str(tmp_path / "o2"), "--label-column", "2"], "--label-column '2': picks the labels' column "
                                                                        "of a label table, and none is given"),
            ([str(out), str(tmp_path / "o2"), "--directed"], "--directed, --header and --label-column read")):
        assert main(["convert", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert not (tmp_path / "o2").exists()
    with pytest.raises(DataError, match="a table, not a dataset; make one of your tables with `neutronorch convert"):
        load_dataset(str(edges))
    with pytest.raises(ConfigError, match="`header` 'maybe'"):
        load_tables(edges, x, y, header="maybe")


def test_an_edge_table_without_labels_is_a_link_tasks_graph_and_without_features_a_typed_one(tmp_path, capsys):
    edges, x, _ = _write_named(tmp_path)
    featured, alone = tmp_path / "featured", tmp_path / "alone"
    assert main(["convert", str(edges), str(featured), "--features", str(x)]) == 0
    assert main(["convert", str(edges), str(alone)]) == 0
    assert main(["convert", str(edges), str(alone), "--overwrite"]) == 0  # a typed folder with its node_ids
    printed = capsys.readouterr().out
    assert "no labels to" in printed and "target vertex (no labels) to" in printed
    graph, typed = load_native(featured), load_typed_dataset(str(alone))
    assert graph.num_classes == 0 and (graph.labels == -1).all() and graph.feature_dim == 4 and graph.num_nodes == N
    assert not any(len(part) for part in (graph.train_idx, graph.val_idx, graph.test_idx))
    assert typed.features == {} and typed.labels is None and typed.num_nodes == {"vertex": N}
    for folder in (featured, alone):
        assert list(np.load(folder / "node_ids.npy")) == sorted(_world()[0])
        assert NO_LABELS in dataset_info(str(folder))["notes"] and dataset_info(str(folder))["classes"] == 0
    assert FEATURELESS in dataset_info(str(alone))["notes"]
    assert ": 1 vertex type, 1 relation, " in typed.describe().splitlines()[0]  # singular for one
    # A node task is refused saying why and how to add labels; a link task trains on either.
    assert main(["train", "--dataset", str(featured), "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "featured: has no labels, so a node task has nothing to learn" in err  # named after OUT_DIR
    assert "convert them again with their labels" in err and "Traceback" not in err
    with pytest.raises(DataError, match="has no labels, so a node task has nothing to learn"):
        train(TrainConfig(dataset=str(alone), epochs=1, progress=False, stage_table=False))
    for folder in (featured, alone):
        summary = train(TrainConfig(dataset=str(folder), task="link", epochs=1, fanouts=[5, 5], hidden=16,
                                    eval_negatives=20, progress=False, stage_table=False, device="cpu"))
        assert summary["status"] == "completed" and summary["link"]["edges"]["val"] > 0
    assert summary["model"]["typed"] and summary["embedding_tables"]["tables"] == {"vertex": [N, 16]}


def test_predict_and_embed_read_your_tables_ids_on_a_renumbered_dataset(tmp_path, capsys):
    edges, x, y = _write_named(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(edges), str(out), "--features", str(x), "--labels", str(y)]) == 0
    small = dict(dataset=str(out), fanouts=[5, 5], hidden=8, epochs=1, progress=False, stage_table=False, device="cpu")
    train(TrainConfig(**small, checkpoint_dir=str(tmp_path / "node")))
    train(TrainConfig(**small, task="link", eval_negatives=20, checkpoint_dir=str(tmp_path / "link")))
    node, link, graph = tmp_path / "node" / "best.pt", tmp_path / "link" / "best.pt", load_native(out)
    asked = ["v013", "v002", "v013", "v041"]  # as the tables write them, one twice; their vertices in this order:
    vertices = np.searchsorted(np.load(out / "node_ids.npy"), asked)
    assert sorted(set(vertices)) != sorted(set(range(4))) and list(np.load(out / "node_ids.npy")[vertices]) == asked
    (tmp_path / "nodes.txt").write_text("# mine\nv013\nv002, v013 v041\n")
    np.save(tmp_path / "nodes.npy", np.array(asked))
    (tmp_path / "pairs.txt").write_text("v013 v002\nv041,v013\n")
    np.save(tmp_path / "pairs.npy", np.array([["v013", "v041", "v002"], ["v002", "v013", "v002"]]))  # (2, P)
    base = ["--dataset", str(out), "--device", "cpu", "--no-progress", "--out"]
    capsys.readouterr()
    for name in ("nodes.txt", "nodes.npy"):
        assert main(["predict", "--checkpoint", str(node), *base, str(tmp_path / f"p-{name}.npy"), "--nodes",
                     str(tmp_path / name)]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"p-{name}.npy"), predict(str(node), graph, vertices))
        assert main(["embed", "--checkpoint", str(node), *base, str(tmp_path / f"e-{name}.npy"), "--nodes",
                     str(tmp_path / name), "--layer", "1"]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"e-{name}.npy"), embed(str(node), graph, 1, vertices))
    assert f"read 4 ids of {tmp_path / 'nodes.txt'} as your tables' ids" in capsys.readouterr().out
    for name, pairs in (("pairs.txt", [[0, 1], [3, 0]]), ("pairs.npy", [[0, 1], [3, 0], [1, 1]])):
        assert main(["predict", "--checkpoint", str(link), *base, str(tmp_path / f"s-{name}.npy"), "--pairs",
                     str(tmp_path / name)]) == 0
        np.testing.assert_array_equal(np.load(tmp_path / f"s-{name}.npy"),
                                      score_pairs(str(link), graph, vertices[np.array(pairs)], layout="rows"))
    # Ids the tables do not hold are refused, named with their lines; vertex numbers are not read as ids.
    (tmp_path / "bad.txt").write_text("v013\nv999 7\n")
    (tmp_path / "numbers.txt").write_text("0 1\n")
    for flag, name, checkpoint, message in (
            ("--nodes", "bad.txt", node, "bad.txt: 2 ids not among your tables' ids (" + str(out / "node_ids.npy")
             + "), such as 'v999' (line 2), '7' (line 2); give ids as your tables write them."),
            ("--pairs", "numbers.txt", link, "numbers.txt: 2 ids not among your tables' ids"),
            ("--pairs", "bad.txt", link, "bad.txt: line 1 holds 1 id; give two per line")):
        assert main(["predict", "--checkpoint", str(checkpoint), *base, str(tmp_path / "x.npy"), flag,
                     str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "x.npy").exists()


def test_ids_that_hold_spaces_are_read_a_line_each_or_apart_by_commas_or_tabs(tmp_path, capsys):
    names, src, dst, classes, x = _world()
    names = np.array([f"person {name}" for name in names])  # "person v013"
    (tmp_path / "e.csv").write_text("src,dst\n" + "".join(f"{names[a]},{names[b]}\n" for a, b in zip(src, dst)))
    (tmp_path / "x.csv").write_text("".join(f"{names[i]}," + ",".join(map(str, x[i])) + "\n" for i in range(N)))
    (tmp_path / "y.csv").write_text("".join(f"{names[i]},{'abc'[classes[i]]}\n" for i in range(N)))
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "e.csv"), str(out), "--features", str(tmp_path / "x.csv"), "--labels",
                 str(tmp_path / "y.csv")]) == 0
    small = dict(dataset=str(out), fanouts=[5, 5], hidden=8, epochs=1, progress=False, stage_table=False, device="cpu")
    train(TrainConfig(**small, checkpoint_dir=str(tmp_path / "node")))
    train(TrainConfig(**small, task="link", eval_negatives=20, checkpoint_dir=str(tmp_path / "link")))
    asked = ["person v013", "person v002", "person v041"]
    vertices = np.searchsorted(np.load(out / "node_ids.npy"), asked)
    assert list(np.load(out / "node_ids.npy")[vertices]) == asked and load_native(out).name == "out"  # OUT_DIR's
    (tmp_path / "nodes.txt").write_text('# mine\nperson v013\n  person v002 ,"person v041"\n')  # quoted too
    (tmp_path / "pairs.txt").write_text("person v013,person v002\nperson v041\tperson v013\n")
    base = ["--dataset", str(out), "--device", "cpu", "--no-progress", "--out"]
    node, link, graph = tmp_path / "node" / "best.pt", tmp_path / "link" / "best.pt", load_native(out)
    assert main(["predict", "--checkpoint", str(node), *base, str(tmp_path / "p.npy"), "--nodes",
                 str(tmp_path / "nodes.txt")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), predict(str(node), graph, vertices))
    assert main(["predict", "--checkpoint", str(link), *base, str(tmp_path / "s.npy"), "--pairs",
                 str(tmp_path / "pairs.txt")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"),
                                  score_pairs(str(link), graph, vertices[np.array([[0, 1], [2, 0]])], layout="rows"))
    (tmp_path / "bad.txt").write_text("person v013 person v002\n")  # two ids apart by a space: one unknown id
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(link), *base, str(tmp_path / "x.npy"), "--pairs",
                 str(tmp_path / "bad.txt")]) == 2
    err = capsys.readouterr().err
    assert "line 1 holds 1 id; give two per line, 'u,v' or u and v apart by a tab (your ids hold spaces)" in err


@pytest.mark.parametrize("name, first", [("h.tsv", "src\tdst\n"), ("n.txt", ""), ("h.tsv.gz", "# c\nsrc dst\n")])
def test_an_edge_list_with_snaps_suffix_and_a_header_or_names_is_your_table(tmp_path, capsys, name, first):
    names, src, dst, classes, x = _world()
    ids = names if name.startswith("n") else np.arange(N)
    text = first + "".join(f"{ids[a]}\t{ids[b]}\n" for a, b in zip(src, dst))
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode())) if name.endswith(".gz") else path.write_text(text)
    assert main(["train", "--dataset", str(path), "--epochs", "1", "--no-progress"]) == 2
    assert "a table, not a dataset; make one of your tables with `neutronorch convert" in capsys.readouterr().err
    assert main(["convert", str(path), str(tmp_path / "out")]) == 0  # an edge table alone: every vertex embedded
    typed = load_typed_dataset(str(tmp_path / "out"))
    assert typed.features == {} and typed.num_nodes == {"vertex": N}
    (tmp_path / "numbers.txt").write_text("# a SNAP list\n\n1 2 0.5\nsrc dst\n")
    assert not only_a_table(tmp_path / "numbers.txt")  # numbers first: a SNAP edge list, as before


def test_a_byte_order_mark_that_spreadsheets_write_is_no_part_of_the_first_id_or_header(tmp_path):
    bom = "\ufeff"
    edges, x, y = _write_named(tmp_path)
    for path in (edges, x, y):  # the edges with their header, the features without one, the labels without one
        path.write_text(bom + path.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "bare.csv").write_text(bom + edges.read_text(encoding="utf-8-sig").split("\n", 1)[1], encoding="utf-8")
    graph, kept = load_tables(edges, x, y)
    assert list(kept["node_ids"]) == sorted(_world()[0]) and any("header src,dst" in note for note in graph.notes)
    bare, kept_bare = load_tables(tmp_path / "bare.csv", x, y)
    assert list(kept_bare["node_ids"]) == sorted(_world()[0])  # its first line is an edge, not a header
    np.testing.assert_array_equal(bare.indices, graph.indices)
    (tmp_path / "ids.txt").write_text(bom + "v013\n")
    from neutronorch.train.prediction_io import read_ids
    assert list(read_ids(tmp_path / "ids.txt", "ids")[0]) == ["v013"]


def test_whole_number_ids_with_gaps_are_read_as_ids_and_vertex_numbers_are_refused_saying_why(tmp_path, capsys):
    names, src, dst, classes, x = _world()
    big = np.arange(N) * 1000 + 7  # whole numbers, not 0..n-1
    (tmp_path / "e.csv").write_text("".join(f"{big[a]},{big[b]}\n" for a, b in zip(src, dst)))
    (tmp_path / "x.csv").write_text("".join(f"{big[i]}," + ",".join(map(str, x[i])) + "\n" for i in range(N)))
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "e.csv"), str(out), "--features", str(tmp_path / "x.csv")]) == 0
    np.testing.assert_array_equal(np.load(out / "node_ids.npy"), big)
    train(TrainConfig(dataset=str(out), task="link", fanouts=[5, 5], hidden=8, epochs=1, eval_negatives=20,
                      checkpoint_dir=str(tmp_path / "link"), progress=False, stage_table=False, device="cpu"))
    link = str(tmp_path / "link" / "best.pt")
    np.save(tmp_path / "pairs.npy", np.array([[1007, 7], [59007, 2007], [7, 7]], dtype=np.uint32))  # (P, 2)
    (tmp_path / "numbers.txt").write_text("1 0\n")
    base = ["predict", "--checkpoint", link, "--dataset", str(out), "--device", "cpu", "--no-progress", "--pairs"]
    assert main([*base, str(tmp_path / "pairs.npy"), "--out", str(tmp_path / "s.npy")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "s.npy"), score_pairs(link, load_native(out), [[1, 0], [59, 2], [0, 0]]))
    assert main([*base, str(tmp_path / "numbers.txt"), "--out", str(tmp_path / "t.npy")]) == 2
    err = capsys.readouterr().err
    assert "numbers.txt: 2 ids not among your tables' ids" in err and "such as '1' (line 1), '0' (line 1)" in err
    assert "reads your ids, not vertex numbers: vertex k's id is row k of node_ids.npy" in err


# ----- a label table of several columns, labels that look like ids, notes that stay short ----------------------

def _pages(tmp_path, header: bool = True):
    """A label table as Facebook Page-Page ships it: the id, then a page id, a name (quoted, with commas, in the
    first lines) and the class, the last column."""
    rng = np.random.default_rng(1)
    kinds = np.array(["company", "government", "politician", "tvshow"])[rng.integers(0, 4, N)]
    (tmp_path / "e.csv").write_text("id_1,id_2\n" + "".join(f"{i},{(i + 1) % N}\n" for i in range(N)))
    np.save(tmp_path / "x.npy", rng.standard_normal((N, 3)).astype(np.float32))
    (tmp_path / "y.csv").write_text("id,facebook_id,page_name,page_type\n" * header + "".join(
        f'{i},{10**14 + 7919 * i},"Page {i}, the {kinds[i]}",{kinds[i]}\n' for i in range(N)))
    return [tmp_path / "e.csv", tmp_path / "x.npy", tmp_path / "y.csv"], kinds


def test_a_label_table_of_several_columns_is_read_only_with_its_labels_column_named(tmp_path):
    paths, kinds = _pages(tmp_path)
    with pytest.raises(DataError, match=r"y.csv: holds 3 columns after the id \(1 facebook_id, 2 page_name, "
                                        r"3 page_type\); .*`label_column`.* such as `label_column`=page_type"):
        load_tables(*paths)  # never the first of them (22,470 classes of ids, in the real table) unsaid
    for pick in ("page_type", 3, "3"):
        graph, kept = load_tables(*paths, label_column=pick)
        assert list(kept["class_names"][graph.labels]) == list(kinds) and graph.num_classes == 4
        assert any("labels: column 3, page_type" in note for note in graph.notes)
        assert not any(note.startswith(LIKE_IDS) for note in graph.notes)
    for pick, problem in (("type", r"`label_column` 'type' names no column of the header id,facebook_id,page_name,"
                                   r"page_type; give the header name or the index from 0 of one of the columns after "
                                   r"the id \(1 facebook_id, 2 page_name, 3 page_type\)"),
                          (4, r"`label_column` 4 is not one of its 4 columns \(0..3\)"),
                          ("id", r"`label_column` 'id' is column 0, the vertex ids"), (0, "is column 0")):
        with pytest.raises(DataError, match=problem):
            load_tables(*paths, label_column=pick)
    paths, _ = _pages(tmp_path, header=False)  # no header: by index, the columns shown by their first values
    with pytest.raises(DataError, match=r"holds 3 columns after the id \(index and first value: 1 '100000000000000', "
                                        r"2 'Page 0, the \w+', 3 '\w+'\); .* such as `label_column`=3"):
        load_tables(*paths)
    with pytest.raises(DataError, match="'page_type' is no index, and the table has no header naming its columns"):
        load_tables(*paths, label_column="page_type")
    assert list(load_tables(*paths, label_column=3)[1]["class_names"]) == sorted(set(kinds))


def test_a_label_column_with_no_table_to_pick_from_is_refused(tmp_path, capsys):
    paths, _ = _pages(tmp_path)
    np.save(tmp_path / "y.npy", np.arange(N) % 3)
    (tmp_path / "y.json").write_text(json.dumps({str(i): [i % 3, 1] for i in range(N)}))
    for labels, problem in (("y.npy", "a .npy array"), ("y.json", "a JSON file")):
        with pytest.raises(ConfigError, match=rf"`label_column` 1: picks the labels' column of a text label table, "
                                              rf"and .*{labels} is {problem}, whose labels are read as they are"):
            load_tables(paths[0], paths[1], tmp_path / labels, label_column=1)
    with pytest.raises(DataError, match=r"y.json: gives 2 values per id \(such as \('0', \[0, 1\]\)\); a label is one"):
        load_tables(paths[0], paths[1], tmp_path / "y.json")  # not the first of them, unsaid
    with pytest.raises(DataError, match=r"y.csv: `label_column` 1 is not one of its 1 columns \(0..0\); .*\(none: its "
                                        r"one column is 0\)"):
        (tmp_path / "y.csv").write_text("".join(f"{i % 3}\n" for i in range(N)))
        load_tables(*paths, label_column=1)
    assert load_tables(*paths, label_column=0)[0].num_classes == 3  # a one-column table's one column
    assert main(["convert", "synthetic:nodes=300", str(tmp_path / "o"), "--label-column", "2"]) == 2
    assert "--directed, --header and --label-column read your own tables" in capsys.readouterr().err
    assert main(["convert", "synthetic:nodes=300", str(tmp_path / "o"), "--name", "small"]) == 0  # any source's name
    assert load_native(tmp_path / "o").name == "small"


def test_labels_that_look_like_ids_are_warned_of_on_the_console_and_in_the_notes(tmp_path, capsys):
    paths, _ = _pages(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", *map(str, paths[:1]), str(out), "--features", str(paths[1]), "--labels", str(paths[2]),
                 "--label-column", "page_name"]) == 0
    said = capsys.readouterr()
    warning = (f"{LIKE_IDS}: y.csv gives {N} classes to {N} labelled vertices (one a class); if that column holds "
               f"ids or names, not classes, pick the labels' column (convert's --label-column)")
    assert f"warning: {warning}" in said.err.splitlines() and warning in load_native(out).notes
    # Numbers that cannot be classes (more than a class a vertex, which a dataset cannot hold) are refused.
    with pytest.raises(DataError, match=r"y.csv: line 61 gives class 100000000467221, and 60 vertices have classes "
                                        r"0..59 at most: that is an id, not a class number. Give the labels' column"):
        load_tables(*paths, label_column="facebook_id")
    half = np.where(np.arange(N) < N // 2, np.arange(N), -1)  # 30 classes, one vertex each: ids, a class left out
    np.save(tmp_path / "y.npy", half)
    notes = load_tables(paths[0], paths[1], tmp_path / "y.npy")[0].notes
    assert [n for n in notes if n.startswith(LIKE_IDS)] == [f"{LIKE_IDS}: y.npy gives {N // 2} classes to {N // 2} "
                                                            f"labelled vertices (one a class); if that column holds "
                                                            f"ids or names, not classes, pick the labels' column "
                                                            f"(convert's --label-column)"]
    np.save(tmp_path / "y.npy", np.arange(N) // 2)  # two vertices a class: half as many classes, no warning
    graph = load_tables(paths[0], paths[1], tmp_path / "y.npy")[0]
    assert not any(n.startswith(LIKE_IDS) for n in graph.notes)
    np.testing.assert_array_equal(graph.labels, np.arange(N) // 2)  # a 1-D .npy of labels, in id order
    np.save(tmp_path / "y.npy", np.minimum(np.arange(N) // 2, N // 2 - 2))  # one class fewer... and one more vertex
    assert not any(n.startswith(LIKE_IDS) for n in load_tables(paths[0], paths[1], tmp_path / "y.npy")[0].notes)
    np.save(tmp_path / "y.npy", np.arange(N) * 2 // 3)  # 40 classes for 60 vertices: over half
    assert any(n.startswith(f"{LIKE_IDS}: y.npy gives 40 classes to 60 labelled vertices (under 2 a class)")
               for n in load_tables(paths[0], paths[1], tmp_path / "y.npy")[0].notes)


def test_a_wide_header_is_quoted_by_a_few_names_and_ignored_columns_and_renumbering_are_said(tmp_path, capsys):
    names, src, dst, classes, x = _world()
    wide = np.repeat(x, 25, axis=1)  # 100 features
    (tmp_path / "x.csv").write_text("id," + ",".join(f"f{j}" for j in range(100)) + "\n" + "".join(
        f"{names[i]}," + ",".join(map(str, wide[i])) + "\n" for i in range(N)))
    (tmp_path / "e.tsv").write_text("src\tdst\tweight\ttime\n" + "".join(
        f"{names[a]}\t{names[b]}\t0.5\t{k}\n" for k, (a, b) in enumerate(zip(src, dst))))
    (tmp_path / "y.csv").write_text("".join(f"{names[i]},{classes[i]}\n" for i in range(N)))
    out = tmp_path / "out"
    assert main(["convert", str(tmp_path / "e.tsv"), str(out), "--features", str(tmp_path / "x.csv"),
                 "--labels", str(tmp_path / "y.csv")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert max(map(len, printed)) < 300, printed
    assert "features x.csv (','-separated, header id, f0, f1, ..., f99 (101 columns))" in printed[0]
    assert "e.tsv: 2 columns after the first two (weight,time) not used" in printed
    assert (f"{N} vertex ids renumbered 0..{N - 1} in sorted order; node_ids.npy keeps each vertex's id in the "
            f"files" in printed)
    graph = load_native(out)
    assert graph.notes[:len(printed) - 1] == printed[:-1]  # info and train say what convert said
    np.testing.assert_array_equal(graph.features[np.searchsorted(np.load(out / "node_ids.npy"), names)], wide)
    (tmp_path / "h.csv").write_text("id," + ",".join(f"f{j}" for j in range(100)) + "\n")
    with pytest.raises(DataError, match=r"h.csv: holds a header \(id, f0, f1, ..., f99 \(101 columns\)\) and no rows"):
        load_tables(tmp_path / "e.tsv", tmp_path / "h.csv", tmp_path / "y.csv", header="yes")


def test_counts_in_what_convert_and_info_say_have_thousands_separators(tmp_path, capsys):
    n = 1200
    ring = lambda step: "".join(f"{i * step},{(i + 1) % n * step}\n" for i in range(n))  # noqa: E731
    (tmp_path / "gaps.csv").write_text(ring(10))  # ids 0, 10, ...: renumbered
    (tmp_path / "plain.csv").write_text(ring(1))  # ids 0..n-1
    np.save(tmp_path / "x.npy", np.ones((n, 1001), np.float32))
    (tmp_path / "y.txt").write_text("".join(f"{i % 2}\n" for i in range(n)))
    assert main(["convert", str(tmp_path / "gaps.csv"), str(tmp_path / "a")]) == 0
    assert main(["convert", str(tmp_path / "plain.csv"), str(tmp_path / "b"), "--features", str(tmp_path / "x.npy"),
                 "--labels", str(tmp_path / "y.txt")]) == 0
    printed = capsys.readouterr().out.replace(str(tmp_path), "TMP")
    assert "1,200 vertex ids renumbered 0..1199 in sorted order" in printed
    assert "features x.npy (1,200 x 1,001 array)" in printed and "2,400 edges, 1,001 features, 2 classes" in printed
    said = printed + "\n".join(dataset_info(str(tmp_path / "b"))["notes"] + dataset_info(str(tmp_path / "a"))["notes"])
    assert re.findall(r"(?<![\d.,])\d{4,}", said) == [], said  # whole counts of 4 digits or more: none (0..1199 aside)


def test_a_snap_edge_list_says_the_columns_it_does_not_use(tmp_path, capsys):
    (tmp_path / "g.txt").write_text("# weighted\n" + "".join(f"{i} {(i * 7 + 1) % 40} 0.5\n" for i in range(40)))
    assert main(["convert", str(tmp_path / "g.txt"), str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "g.txt: 1 column after the first two not used" in printed
    assert "features and labels are synthetic" in printed[0]


@pytest.mark.parametrize("tables, problem", [
    # the first vertex without a feature row, as written, where it first appears
    (dict(edges=[[10, 11], [11, 12], [12, 13]], x={10: [1.0], 11: [1.0], 12: [1.0]}, y={10: 0, 11: 1}),
     r"x.json: holds rows for 3 of the 4 vertices: vertex 13 \(e.json item 2 \(from 0\)\) has none; give every"),
    (dict(edges=[[10, 11], [11, 12]], x={10: [1.0], 11: [1.0]}, y={10: 0, 11: 1, 12: 0, 14: 1}),
     r"x.json: holds rows for 2 of the 4 vertices: vertex 12 \(e.json item 1 \(from 0\)\) has none, and 1 more lack"),
    (dict(edges=[[0, 1], [1, 2]], x={0: [1.0], 1: [1.0], 2: [1.0]}, y=[0, 1, 0, 1]),
     r"x.json: holds rows for 3 of the 4 vertices: vertex 3 has none"),  # a vertex of the labels in id order
    (dict(split="0,train\n1,test\n\n# again\n0,val\n"), r"s.csv: lists vertex 0 more than once \(lines 1, 5\); a "),
    (dict(split="0,train\n1,test\n2,Dev\n"), r"s.csv: line 3 names set 'Dev'"),
])
def test_a_bad_table_names_the_id_and_where_it_is(tmp_path, tables, problem):
    paths = []
    for role, default in (("edges", [[0, 1], [1, 2]]), ("x", [[1.0], [2.0], [3.0]]), ("y", {0: 0, 1: 1, 2: 0})):
        paths.append(tmp_path / f"{role[0]}.json")
        paths[-1].write_text(json.dumps(tables.get(role, default)))
    if "split" in tables:
        (tmp_path / "s.csv").write_text(tables["split"])
    with pytest.raises(DataError, match=problem):
        load_tables(*paths, split=str(tmp_path / "s.csv") if "split" in tables else None)


def test_the_real_facebook_page_table_needs_its_label_column(tmp_path):
    folder = Path(os.environ.get("NEUTRONORCH_DATASETS", ROOT.parent / "shared" / "datasets")) / "facebook_pagepage"
    if not (folder / "facebook_target.csv").is_file():
        pytest.skip(f"{folder} is absent: point NEUTRONORCH_DATASETS at the real datasets")
    np.save(tmp_path / "x.npy", np.zeros((22470, 2), np.float32))
    paths = [folder / "facebook_edges.csv", tmp_path / "x.npy", folder / "facebook_target.csv"]
    with pytest.raises(DataError, match=r"facebook_target.csv: holds 3 columns after the id \(1 facebook_id, "
                                        r"2 page_name, 3 page_type\)"):
        load_tables(*paths)
    graph, kept = load_tables(*paths, label_column="page_type")
    assert list(kept["class_names"]) == ["company", "government", "politician", "tvshow"]
    assert graph.num_nodes == 22470 and np.bincount(graph.labels).min() > 3000


# ----- a header of words over columns of words ---------------------------------------------------------------

_FIELDS = ("cs.AI", "cs.LG", "math.CO")


@pytest.mark.parametrize("head, cell, named", [
    # A header of words over columns of words: a cell of another kind of characters, or a word the column's
    # repeated values never hold.
    ("node,category", lambda i, names: f"{names[i]},{_FIELDS[i % 3]}", True),      # p17 and cs.AI: other kinds
    ("paper,subject", lambda i, names: f"{names[i]},{('physics', 'math', 'art')[i % 3]}", True),  # words recur
    ("subject", lambda i, names: ("physics", "math", "art")[i % 3], True),          # labels alone, in id order
    ("Id;Field of study", lambda i, names: f"{names[i]};{_FIELDS[i % 3]}", True),  # spaces, capitals, ';'
    ("id,category", lambda i, names: f"{i},{_FIELDS[i % 3]}", True),               # numbers below a word
    # No header: a first row of data, whose class comes again below, or a number.
    ("p999,cs.LG", lambda i, names: f"{names[i]},{_FIELDS[i % 3]}", False),
    ("math", lambda i, names: ("physics", "math", "art")[i % 3], False),
    ("p999,1", lambda i, names: f"{names[i]},{i % 3}", False),
    ("alice,bob", lambda i, names: f"{('bob', 'carol', 'alice')[i % 3]},{('dave', 'alice', 'erin')[i % 4 % 3]}",
     False),                                                                        # vertices named again below
])
def test_a_header_of_words_is_told_from_a_first_row_of_data(tmp_path, head, cell, named):
    names = [f"p{i}" for i in range(N)]
    path = tmp_path / "y.csv"
    path.write_text(f"{head}\n" + "".join(f"{cell(i, names)}\n" for i in range(N)))
    table = from_text(path, "labels", "auto")
    assert ("no header" not in table.said) == named, table.said
    rows = (table.ids if table.ids is not None else table.values).shape[0]
    assert rows == N + (not named)  # the first line read as a row exactly when it is no header
    assert ("no header" in from_text(path, "labels", "no").said and
            "no header" not in from_text(path, "labels", "yes").said)  # --header overrides


def test_a_label_table_of_words_under_a_header_of_words_converts_with_its_classes(tmp_path):
    names, src, dst, classes, x = _world()
    edges, xfile, _ = _write_named(tmp_path)
    (tmp_path / "y.csv").write_text("paper,field\n" + "".join(f"{names[i]},{_FIELDS[classes[i]]}\n" for i in range(N)))
    graph, kept = load_tables(edges, xfile, tmp_path / "y.csv")
    assert graph.num_nodes == N and list(kept["class_names"]) == list(_FIELDS)
    assert any("labels y.csv (','-separated, header paper,field)" in note for note in graph.notes)
