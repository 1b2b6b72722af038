"""Checkpoints: written atomically during training, read back for prediction, refused when damaged."""

import collections
import json
import os

import numpy as np
import pytest
import torch

from neutronorch import CheckpointError, OutputError, TrainConfig, load_checkpoint, predict, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.train import checkpoint as checkpoint_module
from neutronorch.train import run as run_module

SMALL = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    directory = tmp_path_factory.mktemp("run") / "ckpt"
    summary = train(TrainConfig(dataset=SMALL, fanouts=[5, 5], hidden=32, batch_size=128, epochs=4, lr=0.01,
                                progress=False, checkpoint_dir=str(directory)))
    return directory, summary


@pytest.mark.slow
def test_training_writes_last_and_best_and_the_summary_names_them(trained):
    directory, summary = trained
    assert summary["checkpoints"] == {"last": str(directory / "last.pt"), "best": str(directory / "best.pt")}
    last, best = load_checkpoint(directory / "last.pt"), load_checkpoint(directory / "best.pt")
    assert last.epoch == 3 and best.epoch == summary["best_epoch"]
    assert [e["epoch"] for e in last.history] == [0, 1, 2, 3]
    assert last.config.checkpoint_dir == str(directory) and last.dataset["nodes"] == 3000
    assert all("checkpoint_seconds" in e for e in summary["epochs"])
    # A plain module: its state dict loads into a freshly built model without any training state.
    fresh = type(best.model)(**best.model.arguments)
    fresh.load_state_dict(best.model.state_dict())


@pytest.mark.slow
def test_predicting_the_test_set_reproduces_the_reported_accuracy(trained, tmp_path, capsys):
    directory, summary = trained
    graph = generate(SyntheticSpec.parse(SMALL))
    classes = predict(directory / "best.pt", graph, "test")
    accuracy = float((classes == graph.labels[graph.test_idx]).mean())
    assert accuracy == pytest.approx(summary["test_acc"], abs=1e-6)
    probabilities = predict(directory / "best.pt", graph, "test", probabilities=True)
    assert probabilities.shape == (len(graph.test_idx), 4) and np.array_equal(probabilities.argmax(1), classes)
    np.testing.assert_allclose(probabilities.sum(1), 1.0, rtol=1e-5)
    out = tmp_path / "preds.npy"
    assert main(["predict", "--checkpoint", str(directory / "best.pt"), "--dataset", SMALL, "--out", str(out),
                 "--device", "cpu"]) == 0
    assert np.array_equal(np.load(out), classes)
    assert f"test accuracy {summary['test_acc']:.4f}" in capsys.readouterr().out
    ids = tmp_path / "ids.npy"
    np.save(ids, np.array([5, 0, 2999]))
    assert predict(directory / "best.pt", graph, str(ids)).shape == (3,)


@pytest.mark.slow
def test_a_model_that_does_not_fit_the_data_is_refused(trained, capsys):
    directory, _ = trained
    assert main(["predict", "--checkpoint", str(directory / "best.pt"), "--dataset",
                 "synthetic:nodes=500,features=8,classes=4", "--out", "unused.npy"]) == 2
    err = capsys.readouterr().err
    assert "does not fit this dataset: feature_dim 16 (checkpoint) vs 8 (data)" in err and "Traceback" not in err


def test_damaged_foreign_and_newer_checkpoints_are_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "absent.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointError, match="cannot be read as a neutronorch checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(CheckpointError, match="not a neutronorch checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    torch.save({"format_version": checkpoint_module.FORMAT_VERSION + 1}, tmp_path / "newer.pt")
    with pytest.raises(CheckpointError, match="newer neutronorch"):
        load_checkpoint(tmp_path / "newer.pt")


def _save(path, graph, model, epoch):
    config = TrainConfig(dataset="given").validate()
    optimizer = torch.optim.Adam(model.parameters())
    return checkpoint_module.save_checkpoint(path, config=config, graph=graph, model=model, optimizer=optimizer,
                                             epoch=epoch, history=[], position={"step": 0, "loss_sum": 0.0})


def test_a_truncated_checkpoint_is_refused_and_a_failed_write_keeps_the_previous_one(tmp_path, monkeypatch):
    from neutronorch.nn.models import GNN

    graph = generate(SyntheticSpec(nodes=300, degree=4, features=4, classes=3))
    model = GNN("sage", 4, 8, 3, 2)
    path = _save(tmp_path / "last.pt", graph, model, epoch=1)
    data = path.read_bytes()
    (tmp_path / "cut.pt").write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(tmp_path / "cut.pt")

    def full_disk(src, dst):
        raise OSError("No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OutputError, match="cannot write .*last.pt: No space left.*what was there is kept"):
        _save(tmp_path / "last.pt", graph, model, epoch=2)
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "last.pt").epoch == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cut.pt", "last.pt"]


def test_atomic_writes_get_the_usual_file_permissions(tmp_path):
    from neutronorch.atomic import write_atomically

    mask = os.umask(0o022)
    try:
        path = write_atomically(tmp_path / "out.bin", lambda f: f.write(b"x"))
    finally:
        os.umask(mask)
    assert (path.stat().st_mode & 0o777) == 0o644


def _run(mode, directory, epochs, resume=False, **overrides):
    values = dict(dataset=SMALL, mode=mode, fanouts=[5, 5], hidden=32, batch_size=128, epochs=epochs, lr=0.01,
                  dropout=0.5, progress=False, checkpoint_dir=str(directory), resume=resume)
    values.update(overrides)
    return train(TrainConfig(**values))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "device"])
def test_a_resumed_run_ends_bit_identical_to_an_uninterrupted_one(tmp_path, mode):
    whole = _run(mode, tmp_path / "whole", epochs=4)
    _run(mode, tmp_path / "split", epochs=2)
    resumed = _run(mode, tmp_path / "split", epochs=4, resume=True)
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]
    assert [e["epoch"] for e in resumed["epochs"]] == [0, 1, 2, 3]
    assert (resumed["val_acc"], resumed["test_acc"], resumed["best_epoch"]) == \
        (whole["val_acc"], whole["test_acc"], whole["best_epoch"])
    a = load_checkpoint(tmp_path / "whole" / "last.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "split" / "last.pt").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_resuming_with_other_settings_or_data_is_refused_with_the_differences(tmp_path, capsys):
    _run("exact", tmp_path / "d", epochs=1)
    for args, message in (
            (["--hidden", "16"], "`hidden` 32 then, 16 now"),
            (["--lr", "0.02", "--dropout", "0.4"], "--dropout 0.5 then, 0.4 now; --lr 0.01 then, 0.02 now"),
            (["--dataset", "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6,seed=5"],
             "written for another dataset"),
            (["--mode", "neutronorch"], "--mode 'exact' then, 'neutronorch' now")):
        base = ["train", "--dataset", SMALL, "--fanouts", "5,5", "--hidden", "32", "--batch-size", "128", "--lr",
                "0.01", "--dropout", "0.5", "--epochs", "3", "--checkpoint-dir", str(tmp_path / "d"), "--resume",
                "--no-progress"]
        assert main(base + args) == 2
        err = capsys.readouterr().err
        assert message.replace("`hidden`", "--hidden") in err and "Traceback" not in err, err
    assert main(["train", "--resume", "--epochs", "1"]) == 2
    assert "give --checkpoint-dir too" in capsys.readouterr().err
    assert main(["train", "--resume", "--checkpoint-dir", str(tmp_path / "empty"), "--epochs", "1"]) == 2
    assert "no checkpoint to resume from" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("hot_grad", ["stop", "cpu"])
def test_neutronorch_resumes_at_an_epoch_boundary_bit_identical(tmp_path, hot_grad):
    # A fixed ratio and lead: the automatic ones follow measured times, so no two runs repeat exactly.
    fixed = dict(hot_ratio=0.3, snapshot_lead=1, super_batch=2, hot_grad=hot_grad, batch_size=64)
    whole = _run("neutronorch", tmp_path / "whole", epochs=4, **fixed)
    _run("neutronorch", tmp_path / "split", epochs=2, **fixed)
    resumed = _run("neutronorch", tmp_path / "split", epochs=4, resume=True, **fixed)
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]
    a = load_checkpoint(tmp_path / "whole" / "last.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "split" / "last.pt").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed["hot"] == whole["hot"] and resumed["staleness"] == whole["staleness"]


@pytest.mark.slow
def test_neutronorch_with_auto_ratio_resumes_with_its_controller(tmp_path):
    whole = _run("neutronorch", tmp_path / "a", epochs=2, hot_error_budget=1e9, super_batch=1)
    resumed = _run("neutronorch", tmp_path / "a", epochs=4, resume=True, hot_error_budget=1e9, super_batch=1)
    history = resumed["neutronorch"]["auto_history"]
    assert len(history) == 4 and history[:2] == whole["neutronorch"]["auto_history"]
    assert resumed["hot"]["super_batches"] == 2 * whole["hot"]["super_batches"]


# NeutronOrch with a fixed ratio and lead, stopped inside a super-batch of 3 (its hot set, snapshot and
# accumulated hot gradient carried over); the automatic ones follow measured times and never repeat exactly.
NEUTRONORCH_FIXED = dict(hot_ratio=0.3, snapshot_lead=1, super_batch=3)


@pytest.mark.slow
@pytest.mark.parametrize("mode, extra", [
    ("exact", {}), ("device", {}), ("neutronorch", {**NEUTRONORCH_FIXED, "hot_grad": "stop"}),
    ("neutronorch", {**NEUTRONORCH_FIXED, "hot_grad": "cpu"}),
    ("neutronorch", {**NEUTRONORCH_FIXED, "hot_grad": "cpu", "device_sampling": "on"})],
    ids=["exact", "device", "neutronorch-stop", "neutronorch-cpu", "neutronorch-planned-on-the-device"])
def test_a_run_stopped_mid_epoch_and_resumed_ends_bit_identical(tmp_path, mode, extra):
    import threading

    from neutronorch.errors import Interrupted

    whole = _run(mode, tmp_path / "whole", epochs=3, batch_size=64, **extra)
    stop = threading.Event()

    def progress(epoch, done, total):
        if (epoch, done) == (1, 2):
            stop.set()  # as a SIGTERM handler would: the step finishes, last.pt is written, the run stops

    config = TrainConfig(dataset=SMALL, mode=mode, fanouts=[5, 5], hidden=32, batch_size=64, epochs=3, lr=0.01,
                         dropout=0.5, progress=False, checkpoint_dir=str(tmp_path / "split"),
                         summary_json=str(tmp_path / "s.json"), **extra)
    with pytest.raises(Interrupted, match="epoch 1 after step 2"):
        train(config, progress=progress, stop=stop)
    interrupted = json.loads((tmp_path / "s.json").read_text())
    assert interrupted["status"] == "interrupted" and len(interrupted["epochs"]) == 1
    resumed = _run(mode, tmp_path / "split", epochs=3, resume=True, batch_size=64, **extra)
    assert resumed["status"] == "completed"
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]
    a = load_checkpoint(tmp_path / "whole" / "last.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "split" / "last.pt").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    if mode == "neutronorch":
        assert resumed["hot"] == whole["hot"] and resumed["staleness"] == whole["staleness"]


@pytest.mark.slow
def test_neutronorch_with_auto_ratio_resumes_inside_a_super_batch(tmp_path):
    import threading

    from neutronorch.errors import Interrupted

    settings = dict(epochs=2, batch_size=64, hot_error_budget=1e9, super_batch=3, hot_grad="cpu")
    whole = _run("neutronorch", tmp_path / "whole", **settings)
    stop = threading.Event()
    with pytest.raises(Interrupted, match="epoch 1 after step 1"):
        train(TrainConfig(dataset=SMALL, mode="neutronorch", fanouts=[5, 5], hidden=32, lr=0.01, dropout=0.5,
                          progress=False,
                          checkpoint_dir=str(tmp_path / "split"), **settings),
              progress=lambda epoch, done, total: stop.set() if (epoch, done) == (1, 1) else None, stop=stop)
    # The super-batch in progress continues with the hot set it started with (checked at its first use),
    # and is counted once.
    resumed = _run("neutronorch", tmp_path / "split", resume=True, **settings)
    assert resumed["status"] == "completed" and len(resumed["epochs"]) == 2
    assert resumed["hot"]["super_batches"] == whole["hot"]["super_batches"]
    assert resumed["staleness"]["max_observed"] <= resumed["staleness"]["bound"]


@pytest.mark.slow
@pytest.mark.parametrize("mode, extra", [("exact", {}), ("device", {}),
                                         ("neutronorch", {**NEUTRONORCH_FIXED, "hot_grad": "cpu"})],
                         ids=["exact", "device", "neutronorch"])
def test_checkpoint_every_writes_mid_epoch_positions_that_resume_exactly(tmp_path, monkeypatch, mode, extra):
    whole = _run(mode, tmp_path / "whole", epochs=2, batch_size=64, **extra)
    positions = []
    real = checkpoint_module.save_checkpoint

    def spy(path, **kwargs):
        positions.append((kwargs["epoch"], kwargs["position"]["step"]))
        if (kwargs["epoch"], kwargs["position"]["step"]) == (1, 4):
            raise KeyboardInterrupt  # killed right after the checkpoint of step 4 of epoch 1 was written
        return real(path, **kwargs)

    from neutronorch.train import run
    monkeypatch.setattr(run, "save_checkpoint", spy)
    log = dict(log_jsonl=str(tmp_path / "m.jsonl"), log_every=3)
    with pytest.raises(KeyboardInterrupt):
        _run(mode, tmp_path / "split", epochs=2, batch_size=64, checkpoint_every=2, **log, **extra)
    monkeypatch.undo()
    steps = whole["epochs"][0]["batches"]
    assert positions[:3] == [(0, 2), (0, 4), (0, steps)] and positions[-1] == (1, 4)
    # The log holds steps past the checkpoint it resumes from (step 2 of epoch 1): cut, then logged once.
    logged = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "step"] == list(range(steps + 4))
    resumed = _run(mode, tmp_path / "split", epochs=2, resume=True, batch_size=64, checkpoint_every=2, **log,
                   **extra)
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]
    logged = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if r["kind"] == "step"] == list(range(2 * steps))
    assert [r["epoch"] for r in logged if r["kind"] == "epoch"] == [0, 1]
    assert resumed["epochs"][1]["resumed_at_step"] == 2
    assert resumed["epochs"][1]["moved"]["feature_rows"] == whole["epochs"][1]["moved"]["feature_rows"]
    a = load_checkpoint(tmp_path / "whole" / "last.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "split" / "last.pt").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("mode, extra", [("exact", []), ("device", []),
                                         ("neutronorch", ["--hot-ratio", "0.3", "--snapshot-lead", "1",
                                                          "--super-batch", "3", "--hot-grad", "cpu"])],
                         ids=["exact", "device", "neutronorch"])
def test_sigterm_finishes_the_step_saves_and_exits_promptly_and_the_run_resumes_exactly(tmp_path, mode, extra):
    import signal
    import subprocess
    import sys
    import time

    directory, summary_path = tmp_path / "ckpt", tmp_path / "s.json"
    data = "synthetic:nodes=16000"  # 50 steps per epoch: the signal lands mid-epoch
    args = ["--dataset", data, "--mode", mode, "--epochs", "3", "--batch-size", "32", "--eval-every", "-1",
            "--no-progress", *extra]
    log = ["--log-jsonl", str(tmp_path / "m.jsonl"), "--log-every", "5"]  # 7 is no multiple of 5
    command = [sys.executable, "-m", "neutronorch", "train", *args, "--checkpoint-dir", str(directory),
               "--checkpoint-every", "7", "--summary-json", str(summary_path), *log]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (directory / "last.pt").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # the first checkpoint, after step 7, is written: the run is mid-epoch
    process.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    assert time.monotonic() - sent < 10
    assert "interrupted" in err and "--resume" in err and "Traceback" not in err
    summary = json.loads(summary_path.read_text())
    assert summary["status"] == "interrupted"
    stopped = checkpoint_module.load_state(directory / "last.pt")
    stopped_log = (tmp_path / "m.jsonl").read_text()
    assert main(["train", *args, "--checkpoint-dir", str(directory), "--checkpoint-every", "7", "--resume",
                 "--summary-json", str(tmp_path / "resumed.json"), *log]) == 0
    assert main(["train", *args, "--checkpoint-dir", str(tmp_path / "whole"), "--checkpoint-every", "7",
                 "--summary-json", str(tmp_path / "whole.json")]) == 0
    resumed, whole = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("resumed", "whole"))
    # Where the signal landed depends on the machine's speed (usually mid-epoch 0); it was before the end.
    per_epoch = whole["epochs"][0]["batches"]
    assert (stopped["epoch"], stopped["position"]["step"]) < (2, per_epoch)
    # The log held every step to the stop; the resumed run continued it, each step once.
    steps_of = lambda text: [r["step"] for r in map(json.loads, text.splitlines()) if r["kind"] == "step"]  # noqa
    assert steps_of(stopped_log) == list(range(stopped["epoch"] * per_epoch + stopped["position"]["step"]))
    assert steps_of((tmp_path / "m.jsonl").read_text()) == list(range(3 * per_epoch))
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]
    a = load_checkpoint(directory / "last.pt").model.state_dict()
    b = load_checkpoint(tmp_path / "whole" / "last.pt").model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_patience_stops_a_run_that_no_longer_improves_and_keeps_the_best(tmp_path):
    # A learning rate too small to change any prediction: the first evaluation stays the best.
    summary = _run("exact", tmp_path / "p", epochs=10, lr=1e-12, patience=2)
    assert summary["status"] == "stopped_early"
    assert [e["epoch"] for e in summary["epochs"]] == [0, 1, 2] and summary["best_epoch"] == 0
    assert load_checkpoint(tmp_path / "p" / "best.pt").epoch == 0
    improving = _run("exact", tmp_path / "q", epochs=3, patience=5)
    assert improving["status"] == "completed" and len(improving["epochs"]) == 3


def test_a_format_1_gcn_checkpoint_loads_with_the_mean_normalisation_it_was_trained_with(tmp_path):
    from neutronorch.nn.models import GNN

    graph = generate(SyntheticSpec.parse(SMALL))
    model = GNN("gcn", graph.feature_dim, 8, graph.num_classes, 2, gcn_norm="mean")
    path = tmp_path / "old.pt"
    checkpoint_module.save_checkpoint(path, config=TrainConfig(model="gcn", gcn_norm="mean"), graph=graph,
                                      model=model, optimizer=torch.optim.Adam(model.parameters()), epoch=0,
                                      history=[], position={"step": 0, "loss_sum": 0.0})
    state = torch.load(path, weights_only=True)
    state["format_version"] = 1  # written before the setting existed: neither key is there
    del state["model_args"]["gcn_norm"], state["config"]["gcn_norm"]
    torch.save(state, path)
    loaded = load_checkpoint(path)
    assert loaded.model.layers[0].norm == "mean" and loaded.config.gcn_norm == "mean"


def test_patience_needs_evaluations():
    from neutronorch import ConfigError

    with pytest.raises(ConfigError, match="give `eval_every` 1 or more"):
        TrainConfig(patience=3, eval_every=-1).validate()


@pytest.mark.slow
def test_embeddings_of_each_layer_are_what_the_next_layer_reads(trained, tmp_path, capsys):
    from neutronorch import embed

    directory, _ = trained
    graph = generate(SyntheticSpec.parse(SMALL))
    model = load_checkpoint(directory / "best.pt").model
    hidden = embed(directory / "best.pt", graph, layer=1)
    assert hidden.shape == (graph.num_nodes, 32) and hidden.dtype == np.float32 and (hidden >= 0).all()  # ReLU
    # The last layer applied to the layer-1 embeddings over full neighbourhoods gives the logits.
    from neutronorch.sampling.block import Block

    block = Block(graph.num_nodes, graph.num_nodes, torch.from_numpy(graph.indptr.astype(np.int64)),
                  torch.from_numpy(graph.indices.astype(np.int64)))
    with torch.no_grad():
        logits = model.layers[1](block, torch.from_numpy(hidden)).numpy()
    np.testing.assert_allclose(embed(directory / "best.pt", graph, layer=2), logits, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(embed(directory / "best.pt", graph, layer=0, nodes=[3, 1]), graph.features[[3, 1]])
    out = tmp_path / "emb.npy"
    assert main(["embed", "--checkpoint", str(directory / "best.pt"), "--dataset", SMALL, "--layer", "1",
                 "--out", str(out), "--nodes", "test", "--device", "cpu"]) == 0
    np.testing.assert_array_equal(np.load(out), hidden[graph.test_idx])
    assert main(["embed", "--checkpoint", str(directory / "best.pt"), "--dataset", SMALL, "--layer", "3",
                 "--out", str(out), "--overwrite"]) == 2
    assert "--layer 3: the model has layers 1..2" in capsys.readouterr().err


def _valid_state(tmp_path):
    from neutronorch.nn.models import GNN

    graph = generate(SyntheticSpec(nodes=300, degree=4, features=4, classes=3))
    path = _save(tmp_path / "good.pt", graph, GNN("sage", 4, 8, 3, 2), epoch=1)
    return graph, torch.load(path, weights_only=True)


@pytest.mark.parametrize("damage, message", [
    (lambda s: s.update(format_version="2"), "format version '2'"),
    (lambda s: s.update(format_version=True), "format version True"),
    (lambda s: s.pop("model_args"), "`model_args` is missing"),
    (lambda s: s.pop("dataset"), "`dataset` is missing"),
    (lambda s: s.update(model_args=[4, 8, 3]), "`model_args` is list"),
    (lambda s: s.update(epoch="1"), "`epoch` is str"),
    (lambda s: s.update(epoch=1.5), "`epoch` is float"),
    (lambda s: s.update(history={}), "`history` is dict"),
    (lambda s: s.update(position={"step": "0"}), "`position` is dict"),
    (lambda s: s.update(world_size=0), "`world_size` is int"),
    (lambda s: s["dataset"].pop("feature_dim"), "`dataset.feature_dim` is None"),
    (lambda s: s["model"].update(extra=[1, 2]), "`model` holds entries that are not named tensors"),
    (lambda s: s["model_args"].update(unknown_option=1), "model arguments build no model"),
    (lambda s: s["model_args"].update(hidden=16), "weights do not fit the model"),
    (lambda s: s["model"].pop(next(iter(s["model"]))), "weights do not fit the model"),
])
def test_valid_pickles_that_are_not_our_checkpoints_are_refused_naming_the_file(tmp_path, damage, message):
    _, state = _valid_state(tmp_path)
    damage(state)
    torch.save(state, tmp_path / "odd.pt")
    for read in (load_checkpoint, checkpoint_module.load_state):
        with pytest.raises(CheckpointError, match="odd\\.pt: .*" + message.replace("(", "\\(")):
            read(tmp_path / "odd.pt")


def test_a_file_of_other_objects_is_refused_without_suggesting_an_unsafe_load(tmp_path):
    torch.save({"format_version": 2, "what": collections.OrderedDict, "f": os.path.join}, tmp_path / "code.pt")
    with pytest.raises(CheckpointError, match="holds objects other than tensors") as error:
        load_checkpoint(tmp_path / "code.pt")
    assert "weights_only" not in str(error.value) and "False" not in str(error.value)


def test_an_unreadable_checkpoint_says_permission_denied(tmp_path, monkeypatch):
    _, state = _valid_state(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "good.pt"))

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(CheckpointError, match="cannot read .*good\\.pt: permission denied"):
        load_checkpoint(tmp_path / "good.pt")


@pytest.mark.parametrize("array, words", [
    ("features", "the features"), ("labels", "the labels"), ("val_idx", "the validation split"),
    ("test_idx", "the test split"), ("train_idx", "the training split"), ("indices", "the topology")])
def test_resume_names_the_array_that_changed(tmp_path, array, words):
    graph, state = _valid_state(tmp_path)
    config = TrainConfig(dataset="given").validate()
    run_module.check_resumable(state, config, graph, "last.pt")  # the same data resumes
    changed = np.array(getattr(graph, array), copy=True)
    if array == "features":
        changed[0, 0] += 1
    elif array == "labels":
        changed[0] = (changed[0] + 1) % graph.num_classes
    elif array == "indices":
        changed[0] = (changed[0] + 1) % graph.num_nodes
    elif array == "val_idx":  # swap one validation vertex for a test vertex: sizes stay
        changed[0], graph.test_idx = graph.test_idx[0], np.concatenate([[changed[0]], graph.test_idx[1:]])
        words = "the validation split, the test split"
    else:  # a split's first vertex replaced by one of another split
        changed[0] = (graph.val_idx if array == "test_idx" else graph.test_idx)[0]
    setattr(graph, array, changed)
    with pytest.raises(CheckpointError, match=f"last\\.pt: written for another dataset.*: {words} differ"):
        run_module.check_resumable(state, config, graph, "last.pt")


def test_every_fixed_setting_that_differs_is_named_before_the_data(tmp_path):
    """Each setting that may not change on resume is named when it differs, even where the data a run
    trains on differs with it (`task` link removes the validation and test edges): never 'changed data'."""
    graph, state = _valid_state(tmp_path)
    other = generate(SyntheticSpec(nodes=300, degree=4, features=4, classes=3, seed=9))
    config = TrainConfig(dataset="given").validate()
    fixed = sorted(set(config.to_dict()) - TrainConfig.resume_may_change())
    assert {"task", "model", "split", "fanouts", "seed"} <= set(fixed)
    for key in fixed:
        saved = {**state, "config": {**state["config"], key: "<other>"}}
        with pytest.raises(CheckpointError, match=f"other settings: `{key}` '<other>' then, .* now\\. Resume with"):
            run_module.check_resumable(saved, config, other, "last.pt")
    for key in sorted(TrainConfig.resume_may_change() - {"resume", "checkpoint_dir"}):
        saved = {**state, "config": {**state["config"], key: "<other>"}}
        run_module.check_resumable(saved, config, graph, "last.pt")  # may change: resumes


@pytest.mark.slow
def test_resuming_a_link_run_as_a_node_task_names_the_task(tmp_path, capsys):
    base = ["train", "--dataset", "synthetic:nodes=400,degree=6,features=8,classes=3", "--fanouts", "3",
            "--batch-size", "64", "--epochs", "1", "--checkpoint-dir", str(tmp_path / "d"), "--no-progress"]
    assert main(base + ["--task", "link"]) == 0
    assert main(base + ["--task", "node", "--resume", "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert "--task 'link' then, 'node' now" in err and "another dataset" not in err and "Traceback" not in err, err


def test_an_older_checkpoint_without_the_newer_checksums_still_resumes(tmp_path):
    graph, state = _valid_state(tmp_path)
    for key in ("features_crc", "labels_crc", "val_crc", "test_crc"):
        del state["dataset"][key]  # as neutronorch wrote them before it fingerprinted these arrays
    run_module.check_resumable(state, TrainConfig(dataset="given").validate(), graph, "last.pt")
    graph.features = graph.features + 1  # and the checksums it has are still compared
    graph.indices = (np.asarray(graph.indices) + 1) % graph.num_nodes
    with pytest.raises(CheckpointError, match="the topology differ"):
        run_module.check_resumable(state, TrainConfig(dataset="given").validate(), graph, "last.pt")


def test_the_fingerprint_reads_samples_not_whole_arrays(tmp_path, monkeypatch):
    graph = generate(SyntheticSpec(nodes=20000, degree=4, features=8, classes=3))
    read = []
    original = np.ascontiguousarray
    monkeypatch.setattr(np, "ascontiguousarray", lambda a: read.append(a.shape[0]) or original(a))
    checkpoint_module.dataset_fingerprint(graph)
    assert read and max(read) <= 2 * 4096


@pytest.mark.parametrize("damage", ["optimizer", "position", "mode_state"])
def test_a_checkpoint_whose_saved_state_cannot_be_restored_is_refused_naming_the_file(tmp_path, damage):
    directory = tmp_path / "ckpt"
    extra = dict(mode="neutronorch", super_batch=2, hot_ratio=0.3) if damage == "mode_state" else {}
    config = TrainConfig(dataset=SMALL, fanouts=[3, 3], hidden=16, batch_size=256, epochs=1, progress=False,
                         checkpoint_dir=str(directory), **extra)
    train(config)
    state = torch.load(directory / "last.pt", weights_only=False)
    if damage == "optimizer":
        state["optimizer"]["param_groups"] = []  # another model's optimizer
    elif damage == "position":
        state["position"] = {}
    else:
        state["mode_state"] = {"what": "another program's state"}  # NeutronOrch's snapshots and controller
    torch.save(state, directory / "last.pt")
    config.epochs, config.resume = 2, True
    try:
        train(config)
    except CheckpointError as exc:
        assert str(directory / "last.pt") in str(exc)
    else:  # a damaged part the structure check already refuses is fine too; a silent resume is not
        pytest.fail("a damaged checkpoint resumed")


def test_the_resume_rule_is_declared_per_setting():
    # Declared where each setting is defined (config_parts.may_change), not in a list kept beside it by hand.
    from dataclasses import fields

    from neutronorch.config_parts import PARTS, settings_of

    may = TrainConfig.resume_may_change()
    assert {"epochs", "checkpoint_dir", "threads", "device", "precision", "eval_every", "prefetch"} <= may
    assert not may & {"model", "fanouts", "lr", "seed", "batch_size", "mode", "hot_ratio", "dropout"}
    declared = [f for f in fields(TrainConfig) if f.name not in PARTS]
    declared += [f for kind in PARTS.values() for f in settings_of(kind)]
    assert {f.metadata["resume"] for f in declared} == {"fixed", "may change"}  # every setting says which
    assert may == {f.name for f in declared if f.metadata["resume"] == "may change"}
