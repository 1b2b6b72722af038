"""Checkpoints of typed runs (train/checkpoint.py, one layout for both kinds): last.pt and best.pt, an exact resume at an epoch
boundary, mid-epoch after a stop and from a checkpoint_every write, refusals naming what differs, and
predict/embed per vertex type (train/predict.py) from the Python API and the command line."""

from __future__ import annotations

import dataclasses
import shutil
import threading

import numpy as np
import pytest
import torch

from neutronorch import (CheckpointError, ConfigError, Interrupted, TrainConfig, embed, load_checkpoint,
                         load_typed_checkpoint, predict, train)
from neutronorch.cli import main
from neutronorch.data import synthetic_typed, write_typed
from neutronorch.train import checkpoint as checkpoint_module
from neutronorch.train.heterogeneous import TypedOptions


@pytest.fixture(scope="module")
def mag():
    """1,200 papers (360 for training: 6 batches of 64), 1,500 authors, 60 institutions, 240 fields."""
    return synthetic_typed(nodes=3000, train=0.3, val=0.1, seed=0)


def config(directory, **settings) -> TrainConfig:
    base = dict(epochs=3, fanouts=[4, 4], hidden=16, batch_size=64, lr=0.01, dropout=0.3, threads=1, device="cpu",
                checkpoint_dir=str(directory), progress=False)
    return TrainConfig(**{**base, **settings})


def outcome(summary: dict, directory) -> tuple:
    """What a resumed run must repeat to the bit: every epoch's loss and scores, the best, the final weights."""
    epochs = [(e["epoch"], e["train_loss"], e.get("val_acc"), e.get("test_acc")) for e in summary["epochs"]]
    weights = load_typed_checkpoint(directory / "last.pt").model.state_dict()
    return epochs, (summary["val_acc"], summary["test_acc"], summary["best_epoch"]), weights


def assert_same(a: tuple, b: tuple) -> None:
    assert a[0] == b[0] and a[1] == b[1]
    assert a[2].keys() == b[2].keys() and all(torch.equal(a[2][k], b[2][k]) for k in a[2]), \
        [k for k in a[2] if not torch.equal(a[2][k], b[2][k])]


@pytest.fixture(scope="module")
def whole(mag, tmp_path_factory):
    """An uninterrupted run of 4 epochs, evaluated after each: (summary, its checkpoint folder)."""
    directory = tmp_path_factory.mktemp("whole")
    return train(config(directory, epochs=4), graph=mag), directory


def test_a_typed_run_writes_last_and_best_which_load_and_say_what_they_are(mag, whole, tmp_path):
    summary, directory = whole
    assert summary["checkpoints"] == {"last": str(directory / "last.pt"), "best": str(directory / "best.pt")}
    assert all("checkpoint_seconds" in e for e in summary["epochs"])
    last, best = load_typed_checkpoint(directory / "last.pt"), load_typed_checkpoint(directory / "best.pt")
    assert last.epoch == 3 and [e["epoch"] for e in last.history] == [0, 1, 2, 3]
    assert best.epoch == summary["best_epoch"] and not best.model.training
    assert last.dataset["num_nodes"] == {"paper": 1200, "author": 1500, "institution": 60, "field": 240}
    assert "(paper, rev_writes, author)" in last.dataset["edges"] and last.dataset["target"] == "paper"
    assert set(last.model.embeddings) == {"author", "institution", "field"}
    assert last.fanouts[("author", "writes", "paper")] == [4, 4]
    # What it weighs: 12 bytes per parameter (the weights and Adam's or RowAdam's two moments), and a little.
    parameters = sum(p.numel() for p in last.model.parameters())
    size = (directory / "last.pt").stat().st_size
    assert 12 * parameters < size < 12 * parameters + 200_000, (size, parameters)
    # load_checkpoint reads either kind; a reader asking for one kind says what the other's file is.
    assert load_checkpoint(directory / "last.pt").typed
    with pytest.raises(CheckpointError, match="last.pt: the checkpoint of a typed graph's run \\(model sage, dataset "
                                              "synthetic-typed.*not of a homogeneous graph's run; predict, embed or "
                                              "resume it with its typed graph"):
        load_checkpoint(directory / "last.pt", kind="homogeneous")
    homogeneous = tmp_path / "h"
    train(TrainConfig(dataset="synthetic:nodes=300,degree=4,features=4,classes=3", fanouts=[2], hidden=8, epochs=1,
                      checkpoint_dir=str(homogeneous), progress=False))
    assert not load_checkpoint(homogeneous / "last.pt").typed
    with pytest.raises(CheckpointError, match="the checkpoint of a homogeneous graph's run \\(model sage.*resume it "
                                              "with a homogeneous graph"):
        load_typed_checkpoint(homogeneous / "last.pt")


def test_resumed_at_an_epoch_boundary_the_run_ends_bit_identical(mag, whole, tmp_path):
    train(config(tmp_path, epochs=2), graph=mag)
    resumed = train(config(tmp_path, epochs=4, resume=True), graph=mag)
    assert resumed["status"] == "completed" and [e["epoch"] for e in resumed["epochs"]] == [0, 1, 2, 3]
    assert_same(outcome(resumed, tmp_path), outcome(*whole))


def old_layout(path) -> None:
    """Rewrite the checkpoint at ``path`` as format 3 wrote typed ones: the mode's state as
    ``typed_mode_state``, no ``world_size`` and no ``mode_choice``."""
    state = torch.load(path, weights_only=True)
    state["typed_mode_state"] = state.pop("mode_state") or None
    del state["world_size"], state["mode_choice"]
    torch.save({**state, "format_version": 3}, path)


def test_a_typed_checkpoint_of_format_3_loads_predicts_and_resumes(mag, whole, tmp_path):
    train(config(tmp_path, epochs=2), graph=mag)
    old_layout(tmp_path / "last.pt")
    assert load_typed_checkpoint(tmp_path / "last.pt").epoch == 1
    assert predict(tmp_path / "last.pt", mag, "test").shape == (len(mag.test_idx),)
    resumed = train(config(tmp_path, epochs=4, resume=True), graph=mag)
    assert_same(outcome(resumed, tmp_path), outcome(*whole))


@pytest.mark.parametrize("step", [2, 6], ids=["mid-epoch", "after-the-epochs-last-step"])
def test_stopped_mid_epoch_and_resumed_the_run_ends_bit_identical(mag, whole, tmp_path, step):
    stop = threading.Event()

    def progress(epoch, done, total):
        assert total == 6
        if (epoch, done) == (1, step):
            stop.set()  # as a SIGTERM handler would: the step finishes, last.pt is written, the run stops

    with pytest.raises(Interrupted, match=f"epoch 1 after step {step}"):
        train(config(tmp_path, epochs=4), graph=mag, progress=progress, stop=stop)
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert (state["epoch"], state["position"]["step"]) == (1, step) and len(state["history"]) == 1
    resumed = train(config(tmp_path, epochs=4, resume=True), graph=mag)
    assert_same(outcome(resumed, tmp_path), outcome(*whole))


def test_checkpoint_every_writes_positions_a_killed_run_resumes_from_exactly(mag, whole, tmp_path):
    saved = tmp_path / "saved.pt"

    def progress(epoch, done, total):
        if (epoch, done) == (2, 5):  # last.pt holds step 4 of epoch 2: what a run killed now leaves
            shutil.copy(tmp_path / "run" / "last.pt", saved)

    train(config(tmp_path / "run", epochs=4, checkpoint_every=2), graph=mag, progress=progress)
    shutil.copy(saved, tmp_path / "run" / "last.pt")
    assert torch.load(saved, weights_only=True)["position"]["step"] == 4
    resumed = train(config(tmp_path / "run", epochs=4, checkpoint_every=2, resume=True), graph=mag)
    assert_same(outcome(resumed, tmp_path / "run"), outcome(*whole))


def test_resuming_on_another_graph_or_with_other_settings_is_refused_naming_the_difference(mag, tmp_path):
    train(config(tmp_path, epochs=1), mag)
    resume = dict(epochs=2, resume=True)
    with pytest.raises(CheckpointError, match="last.pt: written for another typed graph.*the topology of "
                                              "\\(author, writes, paper\\).*differ"):
        train(config(tmp_path, **resume), graph=synthetic_typed(nodes=3000, train=0.3, val=0.1, seed=1))
    fewer = dataclasses.replace(mag, num_nodes={**mag.num_nodes, "institution": 59})
    fewer.relations = {r: rel for r, rel in mag.relations.items() if "institution" not in r}
    with pytest.raises(CheckpointError, match="the vertex counts \\(institution 60 then, 59 now\\)"):
        train(config(tmp_path, **resume), graph=fewer)
    with pytest.raises(CheckpointError, match="`hidden` 16 then, 32 now"):
        train(config(tmp_path, hidden=32, **resume), graph=mag)
    with pytest.raises(CheckpointError, match="other settings: `model` 'sage' then, 'rgcn' now"):  # named first
        train(config(tmp_path, model="rgcn", **resume), graph=fewer)
    with pytest.raises(CheckpointError, match="the model's `embed_dim` None then, 8 now"):
        train(config(tmp_path, **resume), mag, options=TypedOptions(embed_dim=8))
    with pytest.raises(CheckpointError, match="the fanouts of \\(author, writes, paper\\) \\[4, 4\\] then, \\[2, 2\\]"):
        train(config(tmp_path, **resume), mag, options=TypedOptions(fanouts={"writes": [2, 2], "default": [4, 4]}))
    with pytest.raises(CheckpointError, match="no checkpoint to resume from"):
        train(config(tmp_path / "empty", **resume), graph=mag)
    with pytest.raises(ConfigError, match="already exists.*`resume`"):
        train(config(tmp_path, epochs=1), graph=mag)  # a new run never replaces another's checkpoints
    train(config(tmp_path, **resume), graph=mag)  # the same graph and settings, two epochs now


def test_resuming_on_other_edge_features_is_refused(tmp_path):
    weighted = synthetic_typed(nodes=1000, train=0.3, val=0.1, edge_weights=True)
    train(config(tmp_path, epochs=1), graph=weighted)
    cites = ("paper", "cites", "paper")
    heavier = dataclasses.replace(weighted.relations[cites], edge_features=weighted.relations[cites].edge_features * 2)
    other = dataclasses.replace(weighted, relations={**weighted.relations, cites: heavier})
    with pytest.raises(CheckpointError, match="the edge features of \\(paper, cites, paper\\)"):
        train(config(tmp_path, epochs=2, resume=True), graph=other)
    train(config(tmp_path, epochs=2, resume=True), graph=weighted)


def test_a_damaged_typed_checkpoint_is_refused_naming_the_part(whole, tmp_path):
    state = torch.load(whole[1] / "last.pt", weights_only=True)
    for damage, words in ((lambda s: s.pop("fanouts"), "`fanouts` is missing"),
                          (lambda s: s["dataset"].pop("num_nodes"), "`dataset.num_nodes` is None"),
                          (lambda s: s["model_args"].update(hidden=8), "weights do not fit the model")):
        odd = {**state, "dataset": dict(state["dataset"]), "model_args": dict(state["model_args"])}
        damage(odd)
        torch.save(odd, tmp_path / "odd.pt")
        with pytest.raises(CheckpointError, match=f"odd.pt: .*{words}"):
            load_typed_checkpoint(tmp_path / "odd.pt")


def test_predicting_the_test_papers_gives_the_runs_test_score(mag, whole, tmp_path, capsys):
    summary, directory = whole
    classes = predict(directory / "best.pt", mag, "test")
    assert float((classes == mag.labels[mag.test_idx]).mean()) == summary["test_acc"]
    # A vertex's prediction depends on it alone: not on the chunk or the other vertices asked for.
    everything = predict(directory / "best.pt", mag, "all", probabilities=True, chunk_size=100)
    assert everything.shape == (1200, 16) and np.allclose(everything.sum(1), 1, atol=1e-5)
    assert np.array_equal(everything.argmax(1)[mag.test_idx], classes)
    assert np.array_equal(predict(directory / "best.pt", mag, [5, 0, 5]), everything.argmax(1)[[5, 0, 5]])
    folder = write_typed(mag, tmp_path / "mag")
    out = tmp_path / "preds.npy"
    flags = ["--checkpoint", str(directory / "best.pt"), "--dataset", str(folder), "--device", "cpu"]
    assert main(["predict", *flags, "--out", str(out)]) == 0
    assert np.array_equal(np.load(out), classes)
    assert f"test accuracy {summary['test_acc']:.4f}" in capsys.readouterr().out
    # Outputs are checked before any work: never an input, never an existing file unless asked.
    assert main(["predict", *flags, "--out", str(out)]) == 2
    assert "--out " + str(out) + ": already exists" in capsys.readouterr().err
    assert main(["predict", *flags, "--out", str(folder / "nodes" / "paper" / "labels.npy"), "--overwrite"]) == 2
    assert "lies inside" in capsys.readouterr().err
    np.save(tmp_path / "pairs.npy", np.array([[0, 1], [2, 3], [4, 5]]))
    assert main(["predict", *flags, "--out", str(tmp_path / "p.npy"), "--pairs", str(tmp_path / "pairs.npy")]) == 2
    assert "this checkpoint classifies vertices" in capsys.readouterr().err


def test_a_typed_checkpoint_that_does_not_fit_the_graph_is_refused(whole):
    _, directory = whole
    wider = synthetic_typed(nodes=3000, train=0.3, val=0.1, seed=0, features=32)
    with pytest.raises(CheckpointError, match="does not fit this graph: paper feature width 64 \\(checkpoint\\) vs 32"):
        predict(directory / "best.pt", wider, "test")
    more = synthetic_typed(nodes=4000, train=0.3, val=0.1, seed=0)
    with pytest.raises(CheckpointError, match="author embedding table of 1,500 rows \\(checkpoint\\) vs 2,000"):
        predict(directory / "best.pt", more, "test")
    homogeneous = TrainConfig(dataset="synthetic:nodes=300,degree=4,features=4,classes=3")
    with pytest.raises(ConfigError, match="a typed graph's checkpoint .* is homogeneous; give the typed graph"):
        from neutronorch.data import load_dataset
        predict(load_typed_checkpoint(directory / "best.pt"), load_dataset(homogeneous.dataset), "test")


def test_embeddings_are_the_rows_the_layer_above_reads(mag, whole):
    """The default: the target's rows at the last hidden layer, which the top layer reads for it."""
    _, directory = whole
    checkpoint = load_typed_checkpoint(directory / "best.pt")
    rows = embed(checkpoint, mag, nodes=[7, 3, 11])
    assert rows.shape == (3, 16) and rows.dtype == np.float32
    from neutronorch.sampling.typed_sampler import TypedNeighborSampler
    from neutronorch.features.store import TypedInputs
    from neutronorch.train.evaluate import inference_key

    graph, model, read = mag.with_reverse(), checkpoint.model, {}
    subgraph = TypedNeighborSampler(graph, checkpoint.fanouts).sample(np.array([7, 3, 11]), inference_key(0))
    handle = model.layers[1].register_forward_pre_hook(lambda module, args: read.update(args[1]))
    with torch.no_grad():
        model(subgraph.blocks, *TypedInputs(graph)(subgraph.input_nodes, torch.device("cpu")))
    handle.remove()
    # The seeds lead their type's frontier; the same neighbourhoods, the products over chunks of other sizes.
    assert torch.allclose(read["paper"][:3], torch.from_numpy(rows), rtol=0, atol=1e-5)
    authors = embed(checkpoint, mag, node_type="author")
    assert authors.shape == (1500, 16)
    assert np.allclose(authors[[4, 9]], embed(checkpoint, mag, 1, [4, 9], node_type="author"), rtol=0, atol=1e-5)
    logits = embed(checkpoint, mag, 2, "test")
    assert np.array_equal(logits.argmax(1), predict(checkpoint, mag, "test"))
    # Layer 0: what the model reads, a featureless type's learned table or a featured type's features.
    table = checkpoint.model.embeddings["institution"].weight.detach().numpy()
    assert np.array_equal(embed(checkpoint, mag, 0, node_type="institution", chunk_size=7), table)
    assert np.array_equal(embed(checkpoint, mag, 0, [5, 2]), np.asarray(mag.features["paper"])[[5, 2]])
    for kwargs, words in ((dict(node_type="institution"), "layer 1 computes rows of paper, author, field only.*the "
                                                          "model only reads institution's rows.*embedding table"
                                                          ".*`layer` 0"),
                          (dict(layer=2, node_type="author"), "layers 1..1 compute its rows: give `layer` 1"),
                          (dict(node_type="author", nodes="test"), "the splits hold vertices of the target type"),
                          (dict(node_type="venue"), "no such vertex type"),
                          (dict(layer=3), "the model has layers 1..2")):
        with pytest.raises(ConfigError, match=words):
            embed(checkpoint, mag, **kwargs)


def test_embed_writes_a_vertex_types_rows_from_the_command_line(mag, whole, tmp_path, capsys):
    _, directory = whole
    folder = write_typed(mag, tmp_path / "mag")
    out = tmp_path / "authors.npy"
    assert main(["embed", "--checkpoint", str(directory / "best.pt"), "--dataset", str(folder), "--node-type",
                 "author", "--out", str(out), "--device", "cpu", "--no-progress"]) == 0
    assert "1,500 x 16 embeddings (the last hidden layer, vertex type author)" in capsys.readouterr().out
    assert np.array_equal(np.load(out), embed(directory / "best.pt", mag, node_type="author"))
    assert main(["embed", "--checkpoint", str(directory / "best.pt"), "--dataset", str(folder), "--node-type",
                 "institution", "--out", str(tmp_path / "i.npy"), "--device", "cpu"]) == 2
    assert "--node-type institution: layer 1 computes" in capsys.readouterr().err
    assert not (tmp_path / "i.npy").exists()
    # Its learned embedding table, from the command line: layer 0.
    assert main(["embed", "--checkpoint", str(directory / "best.pt"), "--dataset", str(folder), "--node-type",
                 "institution", "--layer", "0", "--out", str(tmp_path / "i.npy"), "--device", "cpu",
                 "--no-progress"]) == 0
    assert "embeddings (layer 0, vertex type institution)" in capsys.readouterr().out
    assert np.array_equal(np.load(tmp_path / "i.npy"),
                          load_checkpoint(directory / "best.pt").model.embeddings["institution"].weight.detach())
    # A homogeneous graph's embed still needs --layer, and has one vertex type: said before anything is read.
    homogeneous = ["embed", "--checkpoint", str(tmp_path / "absent.pt"), "--dataset", "synthetic:nodes=300", "--out",
                   str(tmp_path / "h.npy")]
    assert main(homogeneous) == 2
    assert "--layer: give the layer whose output to write" in capsys.readouterr().err
    assert main([*homogeneous, "--layer", "1", "--node-type", "author"]) == 2
    assert "--node-type author: for a typed graph's checkpoint" in capsys.readouterr().err
    # A typed graph's rows stay in memory: a scratch folder is refused, before anything is read.
    assert main(["embed", "--checkpoint", str(tmp_path / "absent.pt"), "--dataset", str(folder), "--out",
                 str(tmp_path / "t.npy"), "--scratch-dir", str(tmp_path)]) == 2
    assert f"--scratch-dir {tmp_path}: a typed graph's predictions hold their rows in memory" in capsys.readouterr().err


ORCH = dict(mode="neutronorch", super_batch=4, hot_ratio=0.5)  # 6 batches an epoch: super-batches of 4 and 2


@pytest.fixture(scope="module")
def whole_orch(mag, tmp_path_factory):
    """An uninterrupted NeutronOrch run of 3 epochs: (summary, its checkpoint folder)."""
    directory = tmp_path_factory.mktemp("whole-orch")
    return train(config(directory, **ORCH), graph=mag), directory


@pytest.mark.parametrize("step", [1, 4, 6], ids=["mid-super-batch", "at-a-super-batch-boundary", "epoch-end"])
def test_a_stopped_neutronorch_run_resumes_bit_identical(mag, whole_orch, tmp_path, step):
    """Stopped inside a super-batch (its hot rows' gradient half summed, the next one's snapshot perhaps
    taken), at its end, or at the epoch's: the resumed run ends with the uninterrupted run's losses, scores
    and weights to the bit, and states what it reused."""
    stop = threading.Event()

    def progress(epoch, done, total):
        if (epoch, done) == (1, step):
            stop.set()

    with pytest.raises(Interrupted):
        train(config(tmp_path, **ORCH), graph=mag, progress=progress, stop=stop)
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["mode_state"]["snapshots"] or step == 6
    resumed = train(config(tmp_path, **ORCH, resume=True), graph=mag)
    assert_same(outcome(resumed, tmp_path), outcome(*whole_orch))
    assert resumed["staleness"]["max_observed"] == whole_orch[0]["staleness"]["max_observed"]
    assert resumed["hot"] == whole_orch[0]["hot"]  # the checkpoint keeps the hot sets' totals
    assert predict(tmp_path / "last.pt", mag, "test").shape == (len(mag.test_idx),)


def test_an_extended_neutronorch_run_resumes_within_its_bound(mag, whole_orch, tmp_path):
    """A run extended past the epochs it planned: its last epoch took no snapshot for super-batches it did
    not have, so the added epoch's first one is snapshot when it starts (fresher than the longer run's lead
    would have made it). The epochs before are the longer run's to the bit; the rest stays within the bound."""
    train(config(tmp_path, **{**ORCH, "epochs": 2}), graph=mag)
    resumed = train(config(tmp_path, **ORCH, resume=True), graph=mag)
    assert resumed["status"] == "completed" and [e["epoch"] for e in resumed["epochs"]] == [0, 1, 2]
    assert outcome(resumed, tmp_path)[0][:2] == outcome(*whole_orch)[0][:2]
    assert resumed["staleness"]["max_observed"] <= 7
    assert checkpoint_module.CHECKPOINT_PARTS.keys() >= {"tables_optimizer", "fanouts", "rng"}
