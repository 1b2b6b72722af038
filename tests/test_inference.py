"""Layer-wise inference in bounded memory: intermediate layers memory-mapped, results written as memory maps."""

import os

import numpy as np
import pytest
import torch

from neutronorch import ConfigError, TrainConfig, embed, predict
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.errors import CheckpointError
from neutronorch.features.store import FeatureStore
from neutronorch.nn.models import GNN
from neutronorch.train import predict as predict_module
from neutronorch.train import prediction_io
from neutronorch.train.checkpoint import Checkpoint, dataset_fingerprint, save_checkpoint
from neutronorch.train.layerwise import layerwise

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec(nodes=700, degree=6, features=5, classes=3))


def _checkpoint(graph, kind="sage"):
    torch.manual_seed(0)
    model = GNN(kind, graph.feature_dim, 8, graph.num_classes, 3, heads=2).eval()
    return Checkpoint(model, TrainConfig(model=kind), 0, dataset_fingerprint(graph), [])


@pytest.mark.parametrize("kind", ["sage", "gcn", "gat"])
def test_memory_mapped_layers_give_the_in_memory_result(graph, tmp_path, kind):
    model = _checkpoint(graph, kind).model
    store = FeatureStore(graph.features, graph.labels)
    nodes = torch.tensor([699, 3, 3, 250, 0, 512])  # unsorted, repeated
    seen = []
    want = layerwise(model, graph, store, nodes, CPU, chunk_size=64)
    got = layerwise(model, graph, store, nodes, CPU, chunk_size=64, scratch=str(tmp_path),
                    progress=lambda *args: seen.append(args))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert os.listdir(tmp_path) == []  # the scratch maps are removed
    assert seen[-1] == (3, 6, 6) and (1, 700, 700) in seen and (2, 700, 700) in seen
    every = layerwise(model, graph, store, torch.arange(700), CPU, chunk_size=64)
    torch.testing.assert_close(every[nodes], want, rtol=0, atol=0)
    # A chunk larger than the graph (`--eval-batch-size 2**62`) is the whole graph, never an allocation of it.
    whole = layerwise(model, graph, store, torch.arange(700), CPU, chunk_size=2**62)
    torch.testing.assert_close(whole, every, rtol=1e-5, atol=1e-6)


def test_predictions_and_embeddings_are_written_through_a_memory_map(graph, tmp_path, monkeypatch):
    checkpoint = _checkpoint(graph)
    classes = predict(checkpoint, graph, "all")
    probabilities = predict(checkpoint, graph, "test", probabilities=True)
    hidden = embed(checkpoint, graph, layer=2)
    # Too little memory for two layers of every vertex: the intermediate layers go to a scratch folder.
    monkeypatch.setattr(prediction_io, "available_memory_bytes", lambda: 1000)
    folders = []
    real = predict_module.layerwise
    monkeypatch.setattr(predict_module, "layerwise", lambda *a, **k: folders.append(k["scratch"]) or real(*a, **k))
    assert prediction_io.scratch_folder(checkpoint.model, graph, 3, "auto", tmp_path / "x.npy") == str(tmp_path)
    assert prediction_io.scratch_folder(checkpoint.model, graph, 1, "auto", None) is None  # no intermediate layer
    written = predict(checkpoint, graph, "all", out=tmp_path / "classes.npy")
    assert isinstance(written, np.memmap) and not written.flags.writeable
    np.testing.assert_array_equal(written, classes)
    assert written.dtype == np.int64
    written = predict(checkpoint, graph, "test", probabilities=True, out=tmp_path / "p.npy")
    np.testing.assert_array_equal(written, probabilities)
    np.testing.assert_array_equal(embed(checkpoint, graph, layer=2, out=tmp_path / "e.npy"), hidden)
    assert folders == [str(tmp_path)] * 3
    assert sorted(os.listdir(tmp_path)) == ["classes.npy", "e.npy", "p.npy"]  # no scratch or temporary left


def test_a_failure_mid_inference_leaves_the_previous_output(graph, tmp_path):
    checkpoint = _checkpoint(graph)
    out = tmp_path / "classes.npy"
    np.save(out, np.arange(3))

    def fail(layer, done, total):
        if layer == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        predict(checkpoint, graph, "all", out=out, progress=fail, overwrite=True)
    np.testing.assert_array_equal(np.load(out), np.arange(3))
    assert os.listdir(tmp_path) == ["classes.npy"]
    ids = tmp_path / "none.npy"
    np.save(ids, np.zeros(0, np.int64))
    assert predict(checkpoint, graph, str(ids), out=tmp_path / "empty.npy").shape == (0,)


def test_inference_outputs_are_checked_before_the_data_is_read(graph, tmp_path, capsys):
    path = tmp_path / "model.pt"
    checkpoint = _checkpoint(graph)
    save_checkpoint(path, config=checkpoint.config, graph=graph, model=checkpoint.model,
                    optimizer=torch.optim.Adam(checkpoint.model.parameters()), epoch=0, history=[],
                    position={"step": 0, "loss_sum": 0.0})
    base = ["predict", "--checkpoint", str(path), "--dataset", "synthetic:nodes=700,degree=6,features=5,classes=3",
            "--device", "cpu", "--no-progress"]
    assert main(base + ["--out", str(tmp_path)]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "p.npy"), "--scratch-dir", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "--scratch-dir" in err and "not a writable folder" in err and "Traceback" not in err
    assert main(base + ["--out", str(tmp_path / "p.npy"), "--scratch-dir", str(tmp_path), "--nodes", "all"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "p.npy"), predict(checkpoint, graph, "all"))
    with pytest.raises(ConfigError, match="not a writable folder"):
        prediction_io.check_output_path(tmp_path / "q.npy", str(tmp_path / "missing"))
    for name in ("p.txt", "p", "p.npy.txt"):  # a .npy array under another name would pass for text or nothing
        # (the command line writes .csv and .tsv as text tables: test_table_out.py; the Python API only .npy)
        assert main(base + ["--out", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert "give a path ending in .npy" in err and "Traceback" not in err and not (tmp_path / name).exists()
    with pytest.raises(ConfigError, match=r"ending in \.npy"):
        embed(checkpoint, graph, 1, out=tmp_path / "e.csv")


def test_vertex_ids_held_in_memory_are_taken_as_a_npy_file_is(graph, tmp_path):
    checkpoint = _checkpoint(graph)
    ids = np.array([699, 3, 3, 250, 0])
    path = tmp_path / "ids.npy"
    np.save(path, ids)
    want = predict(checkpoint, graph, str(path))
    rows = embed(checkpoint, graph, layer=2, nodes=path)  # a Path as well as a str
    for given in (ids, ids.astype(np.uint32), ids.tolist(), tuple(ids.tolist()), torch.from_numpy(ids)):
        np.testing.assert_array_equal(predict(checkpoint, graph, nodes=given), want)
        np.testing.assert_array_equal(embed(checkpoint, graph, layer=2, nodes=given), rows)
    assert predict(checkpoint, graph, nodes=[]).shape == (0,)
    assert predict_module.prediction_score(graph, ids, want, False)[0] == "accuracy"
    for bad, message in ((np.array([0.0, 1.0]), "1-D array of integer vertex ids, got float64"),
                         (np.array([[0, 1]]), r"got int64 \(1, 2\)"), (torch.tensor([True]), "got bool"),
                         ([0, 700], r"must be in 0\.\.699"), (torch.tensor([-1]), r"must be in 0\.\.699"),
                         ([[0], [1, 2]], "cannot be read as an array")):
        with pytest.raises(ConfigError, match=rf"`nodes` \(vertex ids given in memory\): .*{message}"):
            predict(checkpoint, graph, nodes=bad)
    with pytest.raises(ConfigError, match=r"an existing file of vertex ids \(.npy, or text\), or the ids"):
        predict(checkpoint, graph, nodes=tmp_path / "missing.npy")


def test_a_text_file_of_vertex_ids_is_read_as_a_npy_file_is(graph, tmp_path):
    checkpoint = _checkpoint(graph)
    ids = np.array([699, 3, 3, 250, 0])
    want = predict(checkpoint, graph, ids)
    for text in ("699\n3\n3\n250\n0\n", "# mine\n699, 3,3\n\n250 0  # two\n", "699 3 3 250 0"):
        (tmp_path / "ids.txt").write_text(text)
        np.testing.assert_array_equal(predict(checkpoint, graph, tmp_path / "ids.txt"), want)
        np.testing.assert_array_equal(embed(checkpoint, graph, layer=1, nodes=str(tmp_path / "ids.txt")),
                                      embed(checkpoint, graph, layer=1, nodes=ids))
    for text, message in (("1\n2\nv7\n", r"line 3 holds 'v7', not a vertex number"),
                          ("# none\n\n", "holds no ids"), ("1\n1.5\n", r"line 2 holds '1.5'"),
                          ("3\n700\n", r"1 vertex id out of range, the first 700 \(entry 1\); vertex ids must be "
                                        r"in 0\.\.699")):
        (tmp_path / "ids.txt").write_text(text)
        with pytest.raises(ConfigError, match=rf"`nodes` {tmp_path / 'ids.txt'}: {message}"):
            predict(checkpoint, graph, tmp_path / "ids.txt")


@pytest.mark.parametrize("kind, options", [("sage", {}), ("gcn", {}), ("gcn", {"gcn_norm": "mean"}),
                                           ("sage", {"residual": True})])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_the_input_layer_reads_features_in_place_with_the_gathered_result(graph, kind, options, layers):
    torch.manual_seed(0)
    model = GNN(kind, graph.feature_dim, 8, graph.num_classes, layers, **options).eval()
    nodes = torch.tensor([699, 3, 3, 250, 0, 512])
    in_place = FeatureStore(graph.features, graph.labels, ordered=False)
    gathered = []
    in_place.gather = lambda rows: gathered.append(rows) or FeatureStore.gather(in_place, rows)
    # Read in file order, the input layer gathers each chunk's sources instead (a file the page cache may
    # not keep is read that way).
    relabelled = FeatureStore(graph.features, graph.labels, ordered=True)
    got = layerwise(model, graph, in_place, nodes, CPU, chunk_size=64)
    want = layerwise(model, graph, relabelled, nodes, CPU, chunk_size=64)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    # Below the last layer no feature row is copied; as the last layer it computes the requested rows only.
    assert (gathered == []) == (layers > 1)


@pytest.mark.parametrize("kind", ["sage", "gat"])
def test_outputs_that_are_not_numbers_are_refused_and_nothing_is_written(graph, tmp_path, kind):
    # A checkpoint whose weights hold NaN (saved by a run that diverged) gives NaN logits: argmax would
    # turn them into class 0 for every vertex; predict and embed refuse instead, and write nothing.
    checkpoint = _checkpoint(graph, kind)
    with torch.no_grad():
        checkpoint.model.layers[-1].parameters().__next__().fill_(float("nan"))
    out = tmp_path / "classes.npy"
    with pytest.raises(CheckpointError, match=r"NaN or infinite logits for \d+ of a chunk of \d+ vertices; "
                                              r"nothing was written"):
        predict(checkpoint, graph, "all", out=out, chunk_size=100)
    assert os.listdir(tmp_path) == []
    with pytest.raises(CheckpointError, match="NaN or infinite layer 3 outputs"):
        embed(checkpoint, graph, 3, "test")
    # A layer below the NaN weights is finite: its rows are written.
    assert np.isfinite(embed(checkpoint, graph, 1, "test")).all()


@pytest.mark.parametrize("call, message", [
    (lambda ck, g: predict(ck, g, device="tpu"), "`device` 'tpu': give cpu, cuda, cuda:N or auto"),
    (lambda ck, g: predict(ck, g, probabilities="no"), "`probabilities` 'no': expected True or False"),
    (lambda ck, g: predict(ck, g, overwrite=1), "`overwrite` 1: expected True or False"),
    (lambda ck, g: predict(ck, "synthetic"), "`graph`: expected the neutronorch Graph or TypedGraph"),
    (lambda ck, g: embed(ck, g, 1.0), "`layer` 1.0: expected a whole number"),
    (lambda ck, g: embed(ck, g, True), "`layer` True: expected a whole number"),
    (lambda ck, g: embed(ck, g, 1, node_type=""), "`node_type` '': name a vertex type"),
    (lambda ck, g: predict(ck, g, chunk_size=0), "`chunk_size` 0: must be a positive whole number"),
    (lambda ck, g: embed(ck, g, 1, fanouts=-1), "`fanouts` -1: for a typed graph's checkpoint"),
])
def test_inference_arguments_that_mean_nothing_are_refused(graph, call, message):
    with pytest.raises(ConfigError, match=message):
        call(_checkpoint(graph), graph)


def test_a_graph_changed_by_hand_is_checked_before_inference_reads_it(graph):
    import dataclasses

    from neutronorch.errors import DataError

    indices = graph.indices.copy()
    indices[0] = graph.num_nodes + 5  # read past the features' end, were it trusted
    with pytest.raises(DataError, match="indices hold vertex id 705, out of range"):
        embed(_checkpoint(graph), dataclasses.replace(graph, indices=indices), 1)
