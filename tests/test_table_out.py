"""predict and embed with --out FILE.csv or .tsv: a text table of your ids and class names, equal to the
arrays the Python API gives."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from neutronorch import TrainConfig, embed, predict, score_pairs, train
from neutronorch.cli import main
from neutronorch.data import load_native

N = 48


def _tables(tmp_path):
    """Named vertices ("user 7": ids with a space), two-word class names, edges, features."""
    rng = np.random.default_rng(3)
    names = np.array([f"user {i}" for i in rng.permutation(N)])
    classes = rng.integers(0, 3, N)
    x = (rng.standard_normal((N, 4)) + classes[:, None]).round(3)
    src, dst = rng.integers(0, N, 300), rng.integers(0, N, 300)
    (tmp_path / "e.csv").write_text("src,dst\n" + "".join(f"{names[a]},{names[b]}\n" for a, b in zip(src, dst)))
    (tmp_path / "x.csv").write_text("".join(f"{names[i]}," + ",".join(map(str, x[i])) + "\n" for i in range(N)))
    (tmp_path / "y.csv").write_text("node,category\n" + "".join(
        f"{names[i]},{['big cat', 'small dog', 'bird'][classes[i]]}\n" for i in range(N)))
    out = tmp_path / "data"
    assert main(["convert", str(tmp_path / "e.csv"), str(out), "--features", str(tmp_path / "x.csv"), "--labels",
                 str(tmp_path / "y.csv")]) == 0
    return out


def _read(path, delimiter=","):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f, delimiter=delimiter))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("table_out")
    out = _tables(tmp_path)
    small = dict(dataset=str(out), fanouts=[5, 5], hidden=8, epochs=1, progress=False, stage_table=False, device="cpu")
    train(TrainConfig(**small, checkpoint_dir=str(tmp_path / "node")))
    train(TrainConfig(**small, task="link", eval_negatives=10, checkpoint_dir=str(tmp_path / "link")))
    return tmp_path, out


def test_predictions_as_a_table_of_your_ids_and_class_names(trained, tmp_path):
    folder, out = trained
    node, graph = str(folder / "node" / "best.pt"), load_native(out)
    ids, names = np.load(out / "node_ids.npy"), np.load(out / "class_names.npy")
    asked = ["user 5", "user 11", "user 5"]
    (tmp_path / "nodes.txt").write_text("\n".join(asked) + "\n")
    vertices = np.searchsorted(ids, asked)
    base = ["predict", "--checkpoint", node, "--dataset", str(out), "--device", "cpu", "--no-progress"]
    assert main([*base, "--nodes", str(tmp_path / "nodes.txt"), "--out", str(tmp_path / "p.csv")]) == 0
    rows = _read(tmp_path / "p.csv")
    assert rows[0] == ["id", "class"]
    assert rows[1:] == [[a, str(names[c])] for a, c in zip(asked, predict(node, graph, vertices))]
    assert main([*base, "--probabilities", "--out", str(tmp_path / "p.tsv")]) == 0  # the test vertices
    rows = _read(tmp_path / "p.tsv", "\t")
    assert rows[0] == ["id", *names] and [r[0] for r in rows[1:]] == list(ids[graph.test_idx])
    np.testing.assert_array_equal(np.array([r[1:] for r in rows[1:]], dtype=np.float32),
                                  predict(node, graph, "test", probabilities=True))  # exact: 9 digits


def test_pair_scores_and_embeddings_as_tables(trained, tmp_path):
    folder, out = trained
    link, node, graph = str(folder / "link" / "best.pt"), str(folder / "node" / "best.pt"), load_native(out)
    ids = np.load(out / "node_ids.npy")
    (tmp_path / "pairs.txt").write_text("user 1,user 2\nuser 30\tuser 1\n")
    base = ["--dataset", str(out), "--device", "cpu", "--no-progress"]
    assert main(["predict", "--checkpoint", link, *base, "--pairs", str(tmp_path / "pairs.txt"), "--out",
                 str(tmp_path / "s.csv")]) == 0
    rows = _read(tmp_path / "s.csv")
    pairs = np.searchsorted(ids, [["user 1", "user 2"], ["user 30", "user 1"]])
    assert rows[0] == ["source", "destination", "logit"] and [r[:2] for r in rows[1:]] == [
        ["user 1", "user 2"], ["user 30", "user 1"]]
    np.testing.assert_array_equal(np.array([r[2] for r in rows[1:]], dtype=np.float32),
                                  score_pairs(link, graph, pairs, layout="rows"))
    assert main(["embed", "--checkpoint", node, *base, "--layer", "1", "--out", str(tmp_path / "e.csv")]) == 0
    rows = _read(tmp_path / "e.csv")
    expected = embed(node, graph, 1)
    assert rows[0] == ["id", *(f"e{k}" for k in range(expected.shape[1]))] and [r[0] for r in rows[1:]] == list(ids)
    np.testing.assert_array_equal(np.array([r[1:] for r in rows[1:]], dtype=np.float32), expected)


def test_vertex_numbers_and_class_numbers_without_your_tables_and_other_suffixes_refused(tmp_path, capsys):
    assert main(["generate", "synthetic", "--nodes", "300", "--out", str(tmp_path / "g")]) == 0
    train(TrainConfig(dataset=str(tmp_path / "g"), fanouts=[5, 5], hidden=8, epochs=1, progress=False,
                      stage_table=False, device="cpu", checkpoint_dir=str(tmp_path / "run")))
    graph = load_native(tmp_path / "g")
    base = ["predict", "--checkpoint", str(tmp_path / "run" / "best.pt"), "--dataset", str(tmp_path / "g"),
            "--device", "cpu", "--no-progress", "--nodes", "all", "--out"]
    assert main([*base, str(tmp_path / "p.csv")]) == 0
    rows = _read(tmp_path / "p.csv")
    predicted = predict(str(tmp_path / "run" / "best.pt"), graph, "all")
    assert rows[1:] == [[str(v), str(c)] for v, c in enumerate(predicted)]
    capsys.readouterr()
    assert main([*base, str(tmp_path / "p.txt")]) == 2
    err = capsys.readouterr().err
    assert "written as a .npy array, or .csv or .tsv for a text table of your ids" in err
    assert main([*base, str(tmp_path / "p.csv")]) == 2  # never replaced silently
    assert "already exists" in capsys.readouterr().err
