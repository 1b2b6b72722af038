"""Inference from a link checkpoint: the encoder's embeddings (embed), the head's score of given pairs
(score_pairs, predict --pairs), the pair forms read alike, the output rules of predict, and the errors of
malformed pairs or a checkpoint of the other task."""

import dataclasses

import numpy as np
import pytest
import torch

from neutronorch import ConfigError, TrainConfig, embed, load_dataset, predict, score_pairs, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.errors import CheckpointError
from neutronorch.nn.link import LinkModel
from neutronorch.nn.models import GNN
from neutronorch.train.checkpoint import Checkpoint, dataset_fingerprint, load_checkpoint
from neutronorch.train.link_predict import read_pairs

SMALL = "synthetic:nodes=700,degree=6,features=5,classes=3"
SPEC = "synthetic:nodes=2000,degree=10,features=16,classes=4"
PAIRS = np.array([[5, 699], [3, 3], [250, 0], [5, 699], [10, 11]])  # (P, 2), a repeated pair and a self pair


@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec.parse(SMALL))


def _link_checkpoint(graph, head="mlp"):
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 8, 8, 3), head).eval()
    return Checkpoint(model, TrainConfig(task="link"), 0, dataset_fingerprint(graph), [])


def _node_checkpoint(graph):
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, 8, graph.num_classes, 2).eval()
    return Checkpoint(model, TrainConfig(), 0, dataset_fingerprint(graph), [])


def _head_on_embeddings(checkpoint, graph, pairs):
    rows = torch.from_numpy(np.asarray(embed(checkpoint, graph, checkpoint.model.encoder.num_layers)))
    with torch.no_grad():
        return checkpoint.model.score(rows[pairs[:, 0]], rows[pairs[:, 1]]).numpy()


@pytest.mark.parametrize("head", ["mlp", "dot"])
def test_scores_are_the_head_on_the_embeddings_in_the_pairs_order(graph, head):
    checkpoint = _link_checkpoint(graph, head)
    expected = _head_on_embeddings(checkpoint, graph, PAIRS)
    scores = score_pairs(checkpoint, graph, PAIRS, chunk_size=2)  # several chunks, of layers and of pairs
    assert scores.dtype == np.float32 and scores.shape == (len(PAIRS),)
    np.testing.assert_allclose(scores, expected, rtol=1e-6, atol=1e-5)
    assert scores[0] == scores[3]
    order = np.array([4, 2, 0, 1, 3])
    # The same scores in any order (to the last bits a chunk's matrix product may round differently).
    np.testing.assert_allclose(score_pairs(checkpoint, graph, PAIRS[order], chunk_size=2), scores[order], rtol=1e-6)
    np.testing.assert_allclose(score_pairs(checkpoint, graph, PAIRS, probabilities=True),
                               torch.sigmoid(torch.from_numpy(expected)).numpy(), atol=1e-6)


def test_embed_of_a_link_checkpoint_runs_its_encoder(graph):
    checkpoint = _link_checkpoint(graph)
    encoder = checkpoint.model.encoder
    assert embed(checkpoint, graph, 3).shape == (graph.num_nodes, encoder.width(2))
    np.testing.assert_allclose(embed(checkpoint, graph, 1, nodes=[4, 2]), embed(checkpoint, graph, 1)[[4, 2]],
                               rtol=1e-6)
    with pytest.raises(ConfigError, match=r"layers 1\.\.3"):
        embed(checkpoint, graph, 4)


def test_every_form_of_the_pairs_gives_the_same_scores(graph, tmp_path):
    checkpoint = _link_checkpoint(graph)
    expected = score_pairs(checkpoint, graph, PAIRS)
    (tmp_path / "spaces.txt").write_text("# u v\n" + "\n".join(f"{u} {v}" for u, v in PAIRS) + "\n\n")
    (tmp_path / "commas.csv").write_text("\n".join(f"{u}, {v}" for u, v in PAIRS))
    np.save(tmp_path / "rows.npy", PAIRS.astype(np.int32))
    np.save(tmp_path / "columns.npy", PAIRS.T.copy())
    forms = [PAIRS.T, torch.from_numpy(PAIRS), torch.from_numpy(PAIRS.T), PAIRS.tolist(), PAIRS.astype(np.uint16),
             str(tmp_path / "spaces.txt"), tmp_path / "commas.csv", tmp_path / "rows.npy", tmp_path / "columns.npy"]
    for form in forms:
        np.testing.assert_array_equal(score_pairs(checkpoint, graph, form), expected)
    # One rule (data/pairs.py): 2 x 2 is ambiguous unless `layout` says which; a text file's lines are pairs.
    with pytest.raises(ConfigError, match=r"`pairs` \(given in memory\): a 2 x 2 array is ambiguous.*layout="):
        read_pairs([[1, 2], [3, 4]])
    np.testing.assert_array_equal(read_pairs([[1, 2], [3, 4]], layout="rows"), [[1, 3], [2, 4]])
    np.testing.assert_array_equal(read_pairs([[1, 2], [3, 4]], layout="columns"), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(score_pairs(checkpoint, graph, PAIRS[:2].T, layout="columns"), expected[:2])
    np.save(tmp_path / "square.npy", PAIRS[:2])
    with pytest.raises(ConfigError, match=r"square.npy: a 2 x 2 array is ambiguous.*a text file of 'u v' lines"):
        score_pairs(checkpoint, graph, tmp_path / "square.npy")
    (tmp_path / "two.txt").write_text("\n".join(f"{u} {v}" for u, v in PAIRS[:2]))
    np.testing.assert_array_equal(score_pairs(checkpoint, graph, tmp_path / "two.txt"), expected[:2])
    with pytest.raises(ConfigError, match="a text file holds a pair per line, so `layout` columns cannot apply"):
        score_pairs(checkpoint, graph, tmp_path / "two.txt", layout="columns")


def test_a_bad_id_in_a_pairs_file_names_the_file_and_its_line_and_shows_huge_ids_as_they_are(graph, tmp_path):
    checkpoint = _link_checkpoint(graph)
    path = tmp_path / "pairs.txt"
    path.write_text("# u v\n0 1\n\n2 700\n3 4\n")
    message = rf"`pairs` {path}: 1 vertex id out of range 0\.\.699 .*in line 4 \(2, 700\)\. Give ids"
    with pytest.raises(ConfigError, match=message):
        score_pairs(checkpoint, graph, path)
    # What the command line does: the file read first, its pairs scored once the data has loaded.
    with pytest.raises(ConfigError, match=message):
        score_pairs(checkpoint, graph, read_pairs(path), layout="columns", source=str(path))
    huge = tmp_path / "huge.npy"
    np.save(huge, np.array([[0, 1], [2, 3], [2**64 - 1, 5]], dtype=np.uint64))
    with pytest.raises(ConfigError, match=rf"`pairs` {huge}: 1 vertex id out of range of int64 .*pair 2 "
                                          r"\(18446744073709551615, 5\)"):
        read_pairs(huge)
    (tmp_path / "negative.txt").write_text("0 633\n-1 5\n")  # read before the graph is known: said as negative
    with pytest.raises(ConfigError, match=r"1 vertex id out of range \(negative: vertex numbers are whole numbers "
                                          r"from 0\), in line 2 \(-1, 5\)"):
        read_pairs(tmp_path / "negative.txt")
    with pytest.raises(ConfigError, match=r"`nodes` \(vertex ids given in memory\): 1 vertex id out of range, the "
                                          r"first 18446744073709551615 \(entry 1\)"):
        predict(_node_checkpoint(graph), graph, np.array([3, 2**64 - 1], dtype=np.uint64))


def test_a_link_checkpoint_embeds_and_scores_a_graph_of_other_classes_or_none(graph):
    checkpoint = _link_checkpoint(graph)
    link_only = dataclasses.replace(graph, num_classes=0, labels=np.full(graph.num_nodes, -1, np.int64))
    np.testing.assert_array_equal(embed(checkpoint, link_only, 2), embed(checkpoint, graph, 2))
    np.testing.assert_array_equal(score_pairs(checkpoint, link_only, PAIRS), score_pairs(checkpoint, graph, PAIRS))
    with pytest.raises(ConfigError, match="this checkpoint scores pairs: give --pairs"):
        predict(checkpoint, link_only, "all")


def test_scores_are_written_atomically_and_never_over_an_input_or_silently(graph, tmp_path):
    checkpoint = _link_checkpoint(graph)
    out = tmp_path / "scores.npy"
    written = score_pairs(checkpoint, graph, PAIRS, out=out, scratch=str(tmp_path))
    assert isinstance(written, np.memmap)
    np.testing.assert_array_equal(np.load(out), score_pairs(checkpoint, graph, PAIRS))
    with pytest.raises(ConfigError, match="already exists"):
        score_pairs(checkpoint, graph, PAIRS, out=out)
    score_pairs(checkpoint, graph, PAIRS[:2], out=out, overwrite=True, layout="rows")
    assert np.load(out).shape == (2,)
    np.save(tmp_path / "pairs.npy", PAIRS)
    with pytest.raises(ConfigError, match="`pairs`"):  # the output may never be the input it reads
        score_pairs(checkpoint, graph, tmp_path / "pairs.npy", out=tmp_path / "pairs.npy", overwrite=True)
    np.testing.assert_array_equal(np.load(tmp_path / "pairs.npy"), PAIRS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.npy", "scores.npy"]  # no scratch left


@pytest.mark.parametrize("pairs, message", [
    ([[0, 700], [3, -1], [5, 6]], r"2 vertex ids out of range 0\.\.699 .*pair 0 \(0, 700\), pair 1 \(3, -1\)"),
    (np.array([[2**63 + 5, 1]], dtype=np.uint64), r"1 vertex id out of range .*pair 0 \(9223372036854775813, 1\)"),
    ([], "holds no pairs"),
    (np.zeros((0, 2), np.int64), "holds no pairs"),
    (np.array([[0.0, 1.0]]), "expected integer vertex ids, got float64"),
    (np.array([[True, False]]), "expected integer vertex ids, got bool"),
    (torch.tensor([[0.5, 1.0]]), "expected integer vertex ids, got float32"),
    (["a", "b"], "expected integer vertex ids"),
    ([1, 2, 3], r"a \(P, 2\) or \(2, P\) array .*got shape \(3,\)"),
    (np.zeros((3, 3), np.int64), r"got shape \(3, 3\)"),
    (np.zeros((2, 2, 2), np.int64), r"got shape \(2, 2, 2\)"),
    ([[1, 2], [3]], "cannot be read as an array"),
])
def test_malformed_pairs_are_refused_saying_what_is_wrong(graph, pairs, message):
    with pytest.raises(ConfigError, match=message):
        score_pairs(_link_checkpoint(graph), graph, pairs)


@pytest.mark.parametrize("name, text, message", [
    ("empty.txt", "# nothing\n", "holds no pairs"),
    ("three.txt", "1 2 3\n4 5 6\n", "line 1 holds 3 ids; give two per line"),
    ("ragged.txt", "1 2\n3 4 5\n", "line 2 holds 3 ids; give two per line"),
    ("words.csv", "src,dst\n1,2\n", "line 1 holds 'src' and no number: a header"),
    ("names.txt", "# pairs\n1 2\nalice bob\n", "line 3 holds 'alice', not a vertex number.*node_ids.npy"),
    ("floats.txt", "1.5 2\n", "line 1 holds '1.5', not a vertex number. Vertex numbers are whole"),
    ("binary.txt", b"\xff\xfe\x00\x01", "cannot be read"),
    ("damaged.npy", b"\x93NUMPY garbage", "cannot be read as a .npy array"),
    ("pickled.npy", None, "cannot be read as a .npy array"),
])
def test_unreadable_pair_files_are_refused(graph, tmp_path, name, text, message):
    path = tmp_path / name
    if text is None:
        np.save(path, np.array([{"u": 1}], dtype=object), allow_pickle=True)  # never unpickled
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        score_pairs(_link_checkpoint(graph), graph, path)
    with pytest.raises(ConfigError, match="no such file; give a .npy file"):
        score_pairs(_link_checkpoint(graph), graph, tmp_path / "missing.txt")


def test_each_task_refuses_the_other_request(graph):
    with pytest.raises(ConfigError, match="this checkpoint classifies vertices: use predict --nodes"):
        score_pairs(_node_checkpoint(graph), graph, PAIRS)
    with pytest.raises(ConfigError, match="this checkpoint scores pairs: give --pairs"):
        predict(_link_checkpoint(graph), graph, "test")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny link model trained one epoch, its checkpoint, and the dataset as inference reads it."""
    folder = tmp_path_factory.mktemp("link-run")
    train(TrainConfig(dataset=SPEC, task="link", fanouts=[5, 5], hidden=16, epochs=1, batch_size=256,
                      checkpoint_dir=str(folder), progress=False, device="cpu"))
    return folder / "best.pt", load_dataset(SPEC)


@pytest.mark.slow
def test_a_trained_link_checkpoint_scores_pairs_as_its_head_scores_its_embeddings(trained):
    path, graph = trained
    checkpoint = load_checkpoint(path)
    assert isinstance(checkpoint.model, LinkModel)
    pairs = np.random.default_rng(0).integers(0, graph.num_nodes, (300, 2))
    expected = _head_on_embeddings(checkpoint, graph, pairs)
    np.testing.assert_allclose(score_pairs(path, graph, pairs), expected, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(score_pairs(checkpoint, graph, pairs.T, chunk_size=64), expected, rtol=1e-6, atol=1e-5)


@pytest.mark.slow
def test_the_command_line_scores_pairs_of_a_link_checkpoint(trained, tmp_path, capsys):
    path, graph = trained
    pairs = np.random.default_rng(1).integers(0, graph.num_nodes, (50, 2))
    (tmp_path / "pairs.txt").write_text("\n".join(f"{u},{v}" for u, v in pairs))
    (tmp_path / "bad.txt").write_text("1 2\n5 2000\n")
    out = tmp_path / "scores.npy"
    base = ["predict", "--checkpoint", str(path), "--dataset", SPEC, "--device", "cpu", "--no-progress"]
    command = base + ["--pairs", str(tmp_path / "pairs.txt"), "--out", str(out)]
    assert main(command) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("scored 50 pairs of ") and str(out) in last and "(logits)" in last
    np.testing.assert_array_equal(np.load(out), score_pairs(path, graph, pairs))
    assert main(command) == 2  # an existing output is not replaced without --overwrite
    err = capsys.readouterr().err
    assert "--out" in err and "already exists" in err and "--overwrite" in err and "Traceback" not in err
    assert main(command + ["--overwrite", "--probabilities"]) == 0
    assert "(probabilities)" in capsys.readouterr().out
    np.testing.assert_array_equal(np.load(out), score_pairs(path, graph, pairs, probabilities=True))
    for argv, message in [(base + ["--out", str(tmp_path / "p.npy")], "this checkpoint scores pairs"),
                          (command + ["--overwrite", "--nodes", "all"], "--nodes all and --pairs"),
                          (base + ["--pairs", str(tmp_path / "none.txt"), "--out", str(tmp_path / "p.npy")],
                           "no such file"),
                          (base + ["--pairs", str(tmp_path / "bad.txt"), "--out", str(tmp_path / "p.npy")],
                           f"--pairs {tmp_path / 'bad.txt'}: 1 vertex id out of range 0..1999 (the dataset has "
                           f"2,000 vertices), in line 2 (5, 2000)")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert not (tmp_path / "p.npy").exists()
    assert main(["embed", "--checkpoint", str(path), "--dataset", SPEC, "--layer", "2", "--device", "cpu",
                 "--no-progress", "--out", str(tmp_path / "emb.npy")]) == 0
    assert np.load(tmp_path / "emb.npy").shape == (graph.num_nodes, 16)


@pytest.mark.slow
def test_the_command_line_refuses_pairs_for_a_node_checkpoint(tmp_path, capsys):
    train(TrainConfig(dataset=SMALL, fanouts=[5, 5], hidden=8, epochs=1, batch_size=64,
                      checkpoint_dir=str(tmp_path), progress=False, device="cpu"))
    np.save(tmp_path / "pairs.npy", PAIRS)
    assert main(["predict", "--checkpoint", str(tmp_path / "best.pt"), "--dataset", SMALL, "--device", "cpu",
                 "--pairs", str(tmp_path / "pairs.npy"), "--out", str(tmp_path / "s.npy"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "this checkpoint classifies vertices: use predict --nodes" in err and "Traceback" not in err
    assert not (tmp_path / "s.npy").exists()


def test_scores_that_are_not_numbers_are_refused_and_nothing_is_written(graph, tmp_path):
    checkpoint = _link_checkpoint(graph, "dot")
    with torch.no_grad():
        next(checkpoint.model.encoder.layers[-1].parameters()).fill_(float("inf"))
    out = tmp_path / "scores.npy"
    with pytest.raises(CheckpointError, match=r"NaN or infinite scores for 5 of a chunk of 5 pairs; nothing was "
                                              r"written"):
        score_pairs(checkpoint, graph, PAIRS, out=out)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_names_given_for_vertex_numbers_and_a_link_models_layers_are_explained(graph):
    checkpoint = _link_checkpoint(graph)
    with pytest.raises(ConfigError, match=r"these look like names: .*node_ids.npy"):
        embed(checkpoint, graph, layer=2, nodes=np.array(["alice", "bob"]))
    with pytest.raises(ConfigError, match=r"`layer` 5: the model has layers 1..3 \(.*3 gives the embeddings the link "
                                          r"head scores"):
        embed(checkpoint, graph, layer=5)
