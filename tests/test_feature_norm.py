"""``normalize_features``: the rows PyG's ``NormalizeFeatures`` gives, read by training in every mode, by
evaluation, by ``predict``/``embed`` from a checkpoint and by the loaders; bad values and rows it cannot
normalise refused."""

import dataclasses

import ml_dtypes
import numpy as np
import pytest
import torch

from neutronorch import NeighborLoader, TrainConfig, embed, predict, train
from neutronorch.data import SyntheticSpec, generate, synthetic_typed
from neutronorch.data import feature_norm
from neutronorch.data.feature_norm import normalized, row_normalized
from neutronorch.errors import ConfigError


def bag_of_words(nodes: int = 600, width: int = 120, seed: int = 0):
    """A synthetic graph whose rows are 0/1 words (a class's words likelier), one row of zeros and one
    of a single word."""
    graph = generate(SyntheticSpec.parse(f"synthetic:nodes={nodes},degree=8,features=8,classes=4,seed={seed}"))
    rng = np.random.default_rng(seed)
    likely = np.where(rng.random((4, width)) < 0.3, 0.4, 0.05)
    rows = (rng.random((nodes, width)) < likely[graph.labels]).astype(np.float32)
    rows[0], rows[1] = 0, 0
    rows[1, 3] = 1
    return dataclasses.replace(graph, features=rows)


def by_hand(rows: np.ndarray) -> np.ndarray:
    sums = rows.sum(axis=1, dtype=np.float64, keepdims=True)
    return (rows / np.maximum(sums, 1.0)).astype(np.float32)


def config(**settings) -> TrainConfig:
    base = dict(dataset="bag", fanouts=[5, 5], hidden=32, batch_size=64, epochs=2, lr=0.01, dropout=0.2,
                threads=1, device="cpu", progress=False, stage_table=False)
    return TrainConfig(**{**base, **settings})


def losses(summary: dict) -> list[float]:
    return [e["train_loss"] for e in summary["epochs"]]


def test_rows_are_divided_by_their_sum_as_pygs_normalize_features_does():
    rows = np.array([[0, 2, 3], [0, 0, 0], [0.25, 0.25, 0], [1, 0, 0]], dtype=np.float32)
    out = row_normalized(rows, "rows")
    # Sums 5, 0, 0.5, 1: PyG clamps a sum at 1, so the last three rows stay as they are.
    np.testing.assert_array_equal(out, np.array([[0, 0.4, 0.6], [0, 0, 0], [0.25, 0.25, 0], [1, 0, 0]], np.float32))
    assert out.dtype == np.float32 and rows[0, 1] == 2  # a new array: the given rows are not changed
    ints = row_normalized(np.array([[1, 3]], dtype=np.int64), "rows")
    np.testing.assert_array_equal(ints, np.array([[0.25, 0.75]], np.float32))
    halves = row_normalized(rows.astype(ml_dtypes.bfloat16), "rows")
    np.testing.assert_array_equal(halves, out)


def test_bad_values_and_rows_that_cannot_be_normalised_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="normalize_features"):
        config(normalize_features="l2").validate()
    graph = bag_of_words()
    with pytest.raises(ConfigError, match=r"`normalize_features` 'l1': choose one of none, row"):
        normalized(graph, "l1")
    signed = dataclasses.replace(graph, features=graph.features - 0.5)
    with pytest.raises(ConfigError, match=r"needs non-negative features .* hold negative values \(the least -0.5\)"):
        train(config(normalize_features="row"), graph=signed)
    with pytest.raises(ConfigError, match=r"hold negative values \(the least -0.5\)"):
        row_normalized(signed.features.astype(ml_dtypes.bfloat16), "rows")
    mapped = np.lib.format.open_memmap(tmp_path / "x.npy", mode="w+", dtype=np.float32, shape=graph.features.shape)
    mapped[:] = graph.features
    # A mapped array within the limit is read and normalised in memory; over it, refused.
    np.testing.assert_array_equal(row_normalized(mapped, "rows"), row_normalized(np.asarray(graph.features), "rows"))
    monkeypatch.setattr(feature_norm, "MAPPED_LIMIT", mapped.nbytes - 1)
    with pytest.raises(ConfigError, match=r"memory-mapped .* Divide each row by its sum in the file beforehand"):
        train(config(normalize_features="row"), graph=dataclasses.replace(graph, features=mapped))
    assert normalized(graph, "none") is graph


@pytest.mark.parametrize("task", ["node", "link"])
@pytest.mark.parametrize("mode", ["exact", "device", "neutronorch"])
def test_a_run_normalising_its_rows_equals_a_run_on_rows_normalised_beforehand(mode, task):
    graph = bag_of_words()
    ahead = dataclasses.replace(graph, features=by_hand(graph.features))
    settings = dict(mode=mode, task=task, **(dict(super_batch=2, hot_ratio=0.2, snapshot_lead=1)
                                             if mode == "neutronorch" else {}))
    normalising = train(config(normalize_features="row", **settings), graph=graph)
    given = train(config(**settings), graph=ahead)
    raw = train(config(**settings), graph=graph)
    assert losses(normalising) == losses(given)  # bit for bit
    metric = "test_mrr" if task == "link" else "test_acc"
    assert normalising[metric] == given[metric]
    assert losses(raw) != losses(given)  # the setting did change what the model read


def test_predict_and_embed_apply_the_checkpoints_normalisation(tmp_path):
    graph = bag_of_words()
    summary = train(config(normalize_features="row", epochs=3, checkpoint_dir=str(tmp_path)), graph=graph)
    classes = predict(tmp_path / "best.pt", graph, "test")
    accuracy = float((classes == graph.labels[graph.test_idx]).mean())
    assert accuracy == pytest.approx(summary["test_acc"], abs=1e-6)
    # The raw graph is given; the checkpoint's setting normalises it, as a graph normalised beforehand would be.
    rows = embed(tmp_path / "best.pt", graph, layer=1)
    ahead = dataclasses.replace(graph, features=by_hand(graph.features))
    from neutronorch.train.checkpoint import load_checkpoint
    checkpoint = load_checkpoint(tmp_path / "best.pt")
    assert checkpoint.config.normalize_features == "row"
    checkpoint.config.normalize_features = "none"
    np.testing.assert_array_equal(rows, embed(checkpoint, ahead, layer=1))
    assert not np.array_equal(rows, embed(checkpoint, graph, layer=1))  # raw rows would give other embeddings


def test_the_loaders_hand_out_normalised_rows():
    graph = bag_of_words()
    expected = torch.from_numpy(by_hand(graph.features))
    with NeighborLoader(graph, [3, 3], 50, normalize_features="row", reuse_buffers=False) as loader:
        for batch in loader:
            assert torch.equal(batch.x, expected[batch.n_id])
    typed = synthetic_typed(nodes=600, train=0.3, val=0.1, seed=0)
    typed = dataclasses.replace(typed, features={t: np.abs(x) for t, x in typed.features.items()})
    with NeighborLoader(typed, [3, 3], 40, normalize_features="row") as loader:
        batch = next(iter(loader))
        for node_type, rows in batch.features.items():
            want = torch.from_numpy(by_hand(typed.features[node_type]))[batch.ids[node_type]]
            assert torch.equal(rows, want), node_type


def test_a_typed_graph_is_normalised_per_featured_type():
    typed = synthetic_typed(nodes=600, train=0.3, val=0.1, seed=0)
    typed = dataclasses.replace(typed, features={t: np.abs(x) * 3 for t, x in typed.features.items()})
    out = normalized(typed, "row")
    assert set(out.features) == set(typed.features)
    for node_type, rows in out.features.items():
        np.testing.assert_array_equal(rows, by_hand(typed.features[node_type]))
    summary = train(TrainConfig(fanouts=[3, 3], hidden=16, batch_size=64, epochs=1, threads=1, device="cpu",
                                normalize_features="row", progress=False, stage_table=False), graph=typed)
    assert summary["status"] == "completed"


def test_the_log_says_how_many_rows_were_divided_and_their_sums_before(tmp_path, caplog, capsys):
    import logging

    from neutronorch.cli import main
    from neutronorch.data.native import save_native

    from neutronorch.data import Graph

    rows = np.zeros((10, 3), np.float32)  # ten vertices: enough for the default split
    rows[:5] = [[0, 2, 3], [0, 0, 0], [0.25, 0.25, 0], [1, 0, 0], [4, 4, 2]]
    graph = Graph.from_arrays([0, 1, 2], [1, 2, 3], rows, np.arange(10) % 2)
    with caplog.at_level(logging.INFO, logger="neutronorch"):
        normalized(graph, "none")
        assert caplog.messages == []  # nothing done, nothing said
        normalized(graph, "row")
    assert caplog.messages == [f"`normalize_features` row: {graph.name}: 2 of 10 rows divided by their sum (sums 5 "
                               f"to 10, median 7.5), 8 summing to at most 1 kept as they were"]
    caplog.clear()
    typed = synthetic_typed(nodes=200, train=0.3, val=0.1, seed=0)
    typed = dataclasses.replace(typed, features={t: np.abs(x) * 3 + 1 for t, x in typed.features.items()})
    with caplog.at_level(logging.INFO, logger="neutronorch"):
        normalized(typed, "row")
    [line] = caplog.messages  # one line, each featured type's part
    for node_type, x in typed.features.items():
        assert f"{node_type}: {x.shape[0]:,} of {x.shape[0]:,} rows divided by their sum (sums " in line
    # On the command line, as the run's log shows it.
    bag = bag_of_words(nodes=300)
    save_native(bag, tmp_path / "bag")
    args = ["train", "--dataset", str(tmp_path / "bag"), "--fanouts", "3", "--hidden", "8", "--epochs", "1",
            "--eval-every", "-1", "--no-save", "--no-progress", "--normalize-features", "row"]
    assert main(args) == 0
    said = f"--normalize-features row: {bag.name}: 298 of 300 rows divided by their sum (sums "
    assert said in capsys.readouterr().err
