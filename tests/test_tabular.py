"""Your own tables to a dataset (``load_tables``, ``neutronorch convert EDGES OUT --features F --labels L``):
each layout reads to the graph the tables describe, row for row, and each kind of bad table is a DataError
naming the file and the problem."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from neutronorch.cli import main
from neutronorch.data import load_dataset, load_native, load_tables
from neutronorch.errors import ConfigError, DataError

N = 60


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
    (dict(x="0,1.0\n1,2.0\n"), r"x.csv: holds rows for 2 of the 3 vertices"),
    (dict(x="0,1.0\n1,2.0\n1,2.5\n2,3.0\n"), r"x.csv: lists vertex 1 more than once"),
    (dict(x="0,1.0\n1,oops\n2,3.0\n"), r"x.csv: line 2, column 2: 'oops' is not a number"),
    # Past the lines that set the width and header: the line as an editor numbers it, after a header and a comment.
    (dict(x="id,a,b\n# c\n" + "".join(f"{i},1.0,2.0\n" for i in range(60)) + "60,1.0\n"),
     r"x.csv: line 63 holds 2 column\(s\), and the lines before it 3"),
    (dict(x="".join(f"{i},1.0,2.0\n" for i in range(55)) + "55,1.0,abc\n"), r"x.csv: line 56, column 3: 'abc'"),
    (dict(edges="0,1\n1,2,3\n"), r"e.csv: line 2 holds 3 column\(s\), and the lines before it 2"),
    (dict(edges="# nothing\n\n"), r"e.csv: holds no rows"),
    (dict(y="id,label\n"), r"y.csv: holds a header \(id,label\) and no rows below it"),
    (dict(edges="0\n1\n"), r"e.csv: holds one column"),
    (dict(x=np.ones((2, 3)), names=("e.csv", "x.npy", "y.csv")), r"e.csv: uses vertex id 2, but .*x.npy holds rows "
                                                                  r"for vertices 0..1"),
    (dict(edges="a,b\nb,c\n", x=np.ones((3, 1)), names=("e.csv", "x.npy", "y.csv")), r"x.npy: lists its rows in id "
                                                                                      r"order, but the ids are names "
                                                                                      r"\(such as 'a'\)"),
    (dict(split="s.csv"), None),
    (dict(edges=np.zeros((2, 2), np.int64), names=("e.npy", "x.csv", "y.csv")), r"e.npy: .*2 x 2 is ambiguous"),
    (dict(y="0,0\n1,1\n1,0\n2,0\n"), r"y.csv: lists a vertex more than once"),
])
def test_a_bad_table_is_refused_naming_the_file_and_the_problem(tmp_path, change, problem):
    if problem is None:  # a split table naming a set that does not exist
        (tmp_path / "s.csv").write_text("0,train\n1,dev\n2,test\n")
        change["split"], problem = str(tmp_path / "s.csv"), r"s.csv: names set 'dev'; the sets are train, val"
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
            ([str(edges), str(tmp_path / "o2")], "an edge table; give its vertices' --features and --labels"),
            ([str(edges), str(tmp_path / "o2"), "--features", str(x)], "give both --features and --labels"),
            ([str(out), str(tmp_path / "o2"), "--directed"], "--directed, --header and --name read your own tables")):
        assert main(["convert", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err
    assert not (tmp_path / "o2").exists()
    with pytest.raises(DataError, match="a table, not a dataset; make one of your tables with `neutronorch convert"):
        load_dataset(str(edges))
    with pytest.raises(ConfigError, match="`header` 'maybe'"):
        load_tables(edges, x, y, header="maybe")


def test_pairs_given_by_the_tables_names_are_refused_saying_how_to_number_them(tmp_path, capsys):
    edges, x, y = _write_named(tmp_path)
    out = tmp_path / "out"
    assert main(["convert", str(edges), str(out), "--features", str(x), "--labels", str(y)]) == 0
    (tmp_path / "pairs.txt").write_text("v001 v002\n")
    capsys.readouterr()
    assert main(["predict", "--checkpoint", str(tmp_path / "best.pt"), "--dataset", str(out), "--pairs",
                 str(tmp_path / "pairs.txt"), "--out", str(tmp_path / "s.npy")]) == 2
    err = capsys.readouterr().err
    assert "numbered the ids of your tables 0..n-1 in sorted order: give those numbers" in err
    assert f"np.searchsorted(np.load('{out / 'node_ids.npy'}'), your_ids)" in err and "Traceback" not in err
    ids = np.load(out / "node_ids.npy")
    assert list(np.searchsorted(ids, ["v001", "v002"])) == [1, 2] and list(ids[[1, 2]]) == ["v001", "v002"]
