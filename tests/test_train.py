"""End to end: the trainer, the CLI contract, the summary JSON and the errors users see."""

import dataclasses
import json
import logging
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch

from neutronorch import ConfigError, TrainConfig, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.errors import DataError
from neutronorch.orchestration.pipeline import Prefetcher

SMALL = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"


def small_config(**overrides):
    values = dict(dataset=SMALL, fanouts=[5, 5], hidden=32, batch_size=128, epochs=3, lr=0.01, dropout=0.5,
                  weight_decay=0.0,
                  progress=False)
    values.update(overrides)
    return TrainConfig(**values)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_training_learns_the_synthetic_graph(model):
    # GAT's attention starts near uniform and needs a few more steps.
    summary = train(small_config(model=model, epochs=12 if model == "gat" else 3))
    assert summary["test_acc"] > 0.8, summary["test_acc"]
    losses = [e["train_loss"] for e in summary["epochs"]]
    assert losses[-1] < losses[0]


@pytest.mark.slow
def test_gnn_clearly_beats_a_feature_only_model_on_synthetic_graphs():
    graph = generate(SyntheticSpec.parse(SMALL))
    x = torch.from_numpy(graph.features)
    y = torch.from_numpy(graph.labels)
    train_idx, test_idx = torch.from_numpy(graph.train_idx), torch.from_numpy(graph.test_idx)
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.Adam(mlp.parameters(), lr=0.01)
    for _ in range(300):
        loss = torch.nn.functional.cross_entropy(mlp(x[train_idx]), y[train_idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    mlp_acc = float((mlp(x[test_idx]).argmax(1) == y[test_idx]).float().mean())
    gnn_acc = train(small_config(), graph=graph)["test_acc"]
    assert gnn_acc > mlp_acc + 0.15, (gnn_acc, mlp_acc)


@pytest.mark.slow
def test_same_seed_gives_the_same_run():
    a = train(small_config(epochs=2))
    b = train(small_config(epochs=2))
    assert [e["train_loss"] for e in a["epochs"]] == [e["train_loss"] for e in b["epochs"]]


@pytest.mark.slow
def test_summary_json_holds_the_contract_keys(tmp_path):
    out = tmp_path / "summary.json"
    code = main(["train", "--dataset", SMALL, "--model", "sage", "--fanouts", "5,5", "--hidden", "16",
                 "--batch-size", "256", "--epochs", "2", "--lr", "0.01", "--seed", "3", "--device", "cpu",
                 "--mode", "exact", "--summary-json", str(out), "--no-progress"])
    assert code == 0
    summary = json.loads(out.read_text())
    for key in ("mode", "config", "dataset", "epochs", "epoch_seconds_median", "val_acc", "test_acc",
                "peak_rss_mb"):
        assert key in summary
    assert summary["config"]["seed"] == 3 and summary["config"]["fanouts"] == [5, 5]
    assert set(summary["dataset"]) >= {"name", "nodes", "edges"}
    for epoch in summary["epochs"]:
        assert set(epoch) >= {"epoch", "seconds", "train_loss", "stage_seconds", "lane_busy", "utilisation",
                              "moved"}
        assert set(epoch["stage_seconds"]) >= {"sample", "gather", "wait", "forward", "backward", "step"}
    assert summary["moved"]["feature_rows"] > 0


def test_data_read_in_file_order_trains_exactly_as_in_batch_order(tmp_path):
    # The order rows and adjacency are read in changes nothing but the reads: the same seed, the same losses.
    from neutronorch.data.native import save_native

    directory = save_native(generate(SyntheticSpec(nodes=2000, degree=8, features=12, classes=4)), tmp_path / "g")
    runs = {}
    for order in ("file", "batch"):
        out = tmp_path / f"{order}.json"
        assert main(["train", "--dataset", str(directory), "--fanouts", "5,5", "--hidden", "16", "--epochs", "2",
                     "--batch-size", "256", "--seed", "5", "--device", "cpu", "--read-order", order, "--eval-fanouts", "4,4",
                     "--summary-json", str(out), "--no-progress"]) == 0
        runs[order] = json.loads(out.read_text())
        assert runs[order]["read_order"] == {"features": order, "topology": order}
    assert [e["train_loss"] for e in runs["file"]["epochs"]] == [e["train_loss"] for e in runs["batch"]["epochs"]]
    assert runs["file"]["test_acc"] == runs["batch"]["test_acc"]  # sampled evaluation: the same samples


@pytest.mark.parametrize("mode", ["exact", "neutronorch", "device"])
def test_a_host_feature_cache_serves_rows_and_changes_nothing_else(tmp_path, mode):
    # Memory-mapped features with a host cache of a third of the rows (the other rows copied to a file of
    # their own): the same losses as without, its hit rate reported, and no file left behind. In device
    # mode the device cache (a few rows) sits above it: the host cache serves the device cache's misses.
    from neutronorch.data.native import save_native

    directory = save_native(generate(SyntheticSpec(nodes=2000, degree=8, features=12, classes=4)), tmp_path / "g")
    before = sorted(p.name for p in directory.iterdir())
    runs = {}
    for size in ("0", str(700 * 12 * 4 / 2**30)):
        out = tmp_path / f"{size}.json"
        extra = ["--gpu-cache-gb", str(300 * 12 * 4 / 2**30)] if mode == "device" else []
        assert main(["train", "--dataset", str(directory), "--mode", mode, "--fanouts", "5,5", "--hidden", "16",
                     "--epochs", "2", "--batch-size", "256", "--seed", "5", "--device", "cpu", "--read-order", "file",
                     "--host-cache-gb", size, "--summary-json", str(out), "--no-progress"] + extra) == 0
        runs[size] = json.loads(out.read_text())
    off, on = runs.values()
    assert [e["train_loss"] for e in on["epochs"]] == [e["train_loss"] for e in off["epochs"]]
    assert off["host_cache"] is None and off["moved"]["host_cache_hits"] == 0
    cache = on["host_cache"]
    assert cache["rows"] == 700 and cache["cold_file"] and 0 < cache["hit_rate"] < 1
    assert on["moved"]["host_cache_hits"] == round(cache["hit_rate"] * on["moved"]["host_rows"])
    if mode == "device":
        assert on["moved"]["cache_hits"] > 0 and on["moved"]["host_rows"] < on["moved"]["feature_rows"]
    assert sorted(p.name for p in directory.iterdir()) == before


@pytest.mark.slow
@pytest.mark.parametrize("suffix,text", [
    (".yaml", "model: gcn\nfanouts: [4, 4]\nhidden: 16\nepochs: 1\nbatch-size: 512\n"),
    (".toml", 'model = "gcn"\nfanouts = "4,4"\nhidden = 16\nepochs = 1\nbatch_size = 512\n'),
])
def test_config_file_sets_options_and_command_line_wins(tmp_path, suffix, text):
    cfg = tmp_path / f"run{suffix}"
    cfg.write_text(text)
    out = tmp_path / "s.json"
    assert main(["train", "--config", str(cfg), "--dataset", SMALL, "--hidden", "8", "--no-progress",
                 "--summary-json", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["model"] == "gcn" and config["fanouts"] == [4, 4] and config["hidden"] == 8
    assert config["batch_size"] == 512


@pytest.mark.parametrize("args,message", [
    (["--fanouts", "10,x"], "fanouts"),
    (["--fanouts", "0,5"], "fanout"),
    (["--batch-size", "-1"], "batch-size"),
    (["--dropout", "1.5"], "dropout"),
    (["--model", "gat", "--hidden", "30", "--heads", "4"], "divisible"),
    (["--dataset", "/nonexistent/graph"], "no such file"),
    (["--dataset", "synthetic:nodes=abc"], "not a number"),
    (["--dataset", "synthetic:bogus=1"], "KEY=VALUE"),
    (["--split", "ratio:0.9,0.2", "--dataset", "synthetic:nodes=500"], "sum to less than 1"),
    (["--host-cache-gb", "-1"], "--host-cache-gb '-1': must be 'auto' or zero or more GiB"),
    (["--host-cache-gb", "lots"], "host feature cache off"),
])
def test_bad_options_give_one_clear_error(args, message, capsys):
    assert main(["train", "--epochs", "1", "--no-progress"] + args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_refused_clearly(capsys):
    assert main(["train", "--dataset", SMALL, "--device", "cuda", "--epochs", "1"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_errors_name_config_fields_in_the_api_and_flags_on_the_command_line(capsys):
    with pytest.raises(ConfigError, match=r"^`batch_size` -1: must be a positive number"):
        small_config(batch_size=-1).validate()
    assert main(["train", "--batch-size", "-1", "--epochs", "1"]) == 2
    assert "error: --batch-size -1: must be a positive number" in capsys.readouterr().err


def test_bad_config_file_key_is_named(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lerning_rate: 0.1\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "lerning_rate" in capsys.readouterr().err


@pytest.mark.slow
def test_the_evaluation_after_the_last_epoch_is_timed_in_its_record():
    summary = train(TrainConfig(dataset=SMALL, epochs=2, eval_every=0, fanouts=[3, 3], hidden=8, threads=1,
                                sampler_threads=1, device="cpu", progress=False))
    first, last = summary["epochs"]
    assert "eval_seconds" not in first and last["eval_seconds"] > 0 and "val_acc" in last


def test_sampled_inference_option_runs():
    summary = train(small_config(epochs=1, eval_fanouts=[5, 5]))
    assert 0 <= summary["test_acc"] <= 1
    with pytest.raises(ConfigError, match="`eval_fanouts`"):
        small_config(eval_fanouts=[5]).validate()


@pytest.mark.slow
def test_evaluation_on_a_seeded_sample_of_each_set(monkeypatch):
    from neutronorch.train import evaluate as evaluation

    seen = []
    real = evaluation.layerwise

    def spy(model, graph, store, nodes, *args, **options):
        seen.append(nodes.clone())
        return real(model, graph, store, nodes, *args, **options)

    monkeypatch.setattr(evaluation, "layerwise", spy)
    sampled = train(small_config(epochs=2, eval_max_nodes=100))
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])  # the same sample at every evaluation
    assert seen[0].shape[0] == 200 and seen[0].unique().shape[0] == 200
    full = train(small_config(epochs=2))
    assert abs(sampled["test_acc"] - full["test_acc"]) < 0.1  # 100 vertices: a rough estimate
    with pytest.raises(ConfigError, match="`eval_max_nodes`"):
        small_config(eval_max_nodes=-1).validate()


def test_producer_errors_reach_the_consumer_with_their_traceback():
    def produce():
        yield 1
        raise ValueError("sampler broke")

    with Prefetcher(produce, depth=1) as items:
        assert next(items) == 1
        with pytest.raises(ValueError, match="sampler broke") as info:
            next(items)
    assert any("produce" in str(entry.name) for entry in info.traceback)


def test_closing_the_prefetcher_stops_its_thread():
    import itertools

    prefetcher = Prefetcher(lambda: itertools.count(), depth=2, name="counting-prefetcher")
    next(prefetcher)
    prefetcher.close()
    assert not [t for t in threading.enumerate() if t.name == "counting-prefetcher"]


@pytest.mark.slow
def test_generate_convert_and_python_dash_m(tmp_path):
    out = tmp_path / "g"
    assert main(["generate", "synthetic", "--nodes", "500", "--features", "8", "--out", str(out)]) == 0
    assert (out / "meta.json").is_file()
    converted = tmp_path / "c"
    assert main(["convert", str(out), str(converted), "--float16"]) == 0
    assert np.load(converted / "features.npy", mmap_mode="r").dtype == np.float16
    result = subprocess.run([sys.executable, "-m", "neutronorch", "train", "--dataset", str(converted),
                             "--fanouts", "4,4", "--hidden", "8", "--epochs", "1", "--no-progress"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "test acc" in result.stdout


@pytest.mark.slow
def test_batch_size_zero_follows_the_training_set_size(tmp_path):
    from neutronorch.config import auto_batch_size

    assert auto_batch_size(140) == 32 and auto_batch_size(8251) == 257 and auto_batch_size(10**6) == 1024
    summary = train(small_config(batch_size=0, epochs=1))  # 300 training seeds
    assert summary["config"]["batch_size"] == 32
    assert summary["epochs"][0]["batches"] == 10


@pytest.mark.slow
def test_a_given_graph_is_what_the_summary_and_checkpoints_name(tmp_path):
    """train(config, graph=g) records the graph trained, never the configuration's (default) dataset."""
    from neutronorch.data import load_dataset, save_native
    from neutronorch.errors import DataError
    from neutronorch.train.checkpoint import load_checkpoint

    graph = generate(SyntheticSpec.parse("synthetic:nodes=400,degree=5,features=8,classes=3"))
    summary = train(small_config(dataset="synthetic", epochs=1, checkpoint_dir=str(tmp_path / "ckpt")), graph=graph)
    assert summary["config"]["dataset"] == f"graph:{graph.name}" and summary["dataset"]["name"] == graph.name
    assert summary["dataset"]["nodes"] == 400
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt").config.dataset == f"graph:{graph.name}"
    with pytest.raises(DataError, match="given to train\\(\\) in memory.*name the files it came from"):
        load_dataset(f"graph:{graph.name}")
    folder = save_native(graph, tmp_path / "native")  # memory-mapped from the folder configured: named so
    assert train(small_config(dataset=str(folder), epochs=1), graph=load_dataset(str(folder)))["config"][
        "dataset"] == str(folder)
    assert train(small_config(epochs=1), graph=load_dataset(str(folder)))["config"]["dataset"].startswith("graph:")


@pytest.mark.parametrize("text,message", [
    ('epochs: "three"', "`epochs` 'three': expected a whole number"),
    ('lr: "fast"', "`lr` 'fast': expected a finite number"),  # text that reads as a number is taken (test_config)
    ("hidden: [1, 2]", "`hidden` [1, 2]: expected a whole number"),
    ("epochs: 2.5", "`epochs` 2.5: expected a whole number"),
    ("batch_size: 64.7", "`batch_size` 64.7: expected a whole number"),
    ("fanouts: [10, 2.5]", "`fanouts`"),
    ("eval_fanouts: [0, 5]", "`eval_fanouts`"),
    ("model: gat\nheads: 0", "`heads` 0: must be positive"),
    ("lr: .inf", "`lr` inf: expected a finite number"),
])
def test_config_file_values_get_the_same_clear_errors_as_flags(tmp_path, text, message):
    from neutronorch.config_keys import load_config_file

    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as info:
        TrainConfig(**load_config_file(path)).validate()
    assert message in str(info.value)


def test_config_files_take_the_flags_no_spellings(tmp_path):
    from neutronorch.config_keys import load_config_file

    path = tmp_path / "c.yaml"
    path.write_text("no_progress: true\nno-stage-table: true\n")
    assert load_config_file(path) == {"progress": False, "stage_table": False}


def test_a_bad_eval_fanout_is_reported_under_its_own_flag(capsys):
    assert main(["train", "--eval-fanouts", "0,5", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "--eval-fanouts '0,5'" in err and "Traceback" not in err


def test_an_unwritable_summary_path_fails_before_any_data_is_loaded(tmp_path, capsys, monkeypatch):
    from neutronorch.train import trainer

    monkeypatch.setattr(trainer, "load_dataset", lambda *a, **k: pytest.fail("data loaded before the check"))
    (tmp_path / "file").write_text("x")
    assert main(["train", "--summary-json", str(tmp_path / "file" / "s.json"), "--epochs", "1"]) == 2
    assert "cannot be written" in capsys.readouterr().err


@pytest.mark.slow
def test_a_diverging_run_stops_with_a_clear_error(capsys):
    # A huge learning rate on unnormalised features: the loss overflows within a few steps.
    assert main(["train", "--dataset", SMALL, "--fanouts", "5,5", "--hidden", "16", "--lr", "1e30",
                 "--epochs", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "diverged" in err and "--lr" in err and "Traceback" not in err


def test_the_summary_is_strict_json(tmp_path):
    from neutronorch.train.outputs import write_json_atomically

    write_json_atomically(str(tmp_path / "s.json"), {"a": float("nan"), "b": [float("inf"), 1.5], "c": {"d": 2}})
    text = (tmp_path / "s.json").read_text()
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard {c}")) == \
        {"a": None, "b": [None, 1.5], "c": {"d": 2}}


def test_numbas_workqueue_threading_layer_is_refused_clearly(monkeypatch, capsys):
    import numba

    monkeypatch.setattr(numba.config, "THREADING_LAYER", "workqueue")
    assert main(["train", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "NUMBA_THREADING_LAYER=workqueue" in err and "Traceback" not in err


@pytest.mark.parametrize("name, value", [("NEUTRONORCH_DEVICE_SAMPLER", "bogus"), ("NUMBA_NUM_THREADS", "four"),
                                         ("NEUTRONORCH_EDGE_SOFTMAX", "fast")])
def test_a_bad_environment_variable_is_refused_by_train_and_the_loader(name, value, monkeypatch):
    """In Python as on the command line, before any data is read (the dataset here does not exist)."""
    from neutronorch import NeighborLoader

    graph = generate(SyntheticSpec(nodes=200))
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=f"{name}='{value}' is not"):
        train(TrainConfig(dataset="/no/such/dataset", epochs=1, progress=False))
    with pytest.raises(ConfigError, match=f"{name}='{value}' is not"):
        NeighborLoader(graph, [2], 16)


def test_layers_repeat_a_single_fanout_and_must_match_a_list():
    config = TrainConfig(layers=4, fanouts="10", eval_fanouts="20").validate()
    assert config.fanouts == [10] * 4 and config.eval_fanouts == [20] * 4
    assert TrainConfig(layers=2, fanouts="5,3").validate().fanouts == [5, 3]
    with pytest.raises(ConfigError, match="`layers` 3 but `fanouts` has 2 entries"):
        TrainConfig(layers=3, fanouts="5,3").validate()
    with pytest.raises(ConfigError, match="`norm` 'group'"):
        TrainConfig(norm="group").validate()
    with pytest.raises(ConfigError, match="graph blocks are residual already"):
        TrainConfig(architecture="blocks", residual=True).validate()
    with pytest.raises(ConfigError, match="`architecture` 'transformer'"):
        TrainConfig(architecture="transformer").validate()


@pytest.mark.slow
def test_a_deep_residual_normalised_model_trains_from_the_command_line(tmp_path):
    import json

    out = tmp_path / "s.json"
    assert main(["train", "--dataset", "synthetic:nodes=2000,features=16,classes=4", "--layers", "4", "--fanouts",
                 "4", "--residual", "--norm", "layer", "--hidden", "32", "--epochs", "3", "--no-progress",
                 "--summary-json", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["config"]["fanouts"] == [4, 4, 4, 4] and summary["config"]["residual"] is True
    losses = [e["train_loss"] for e in summary["epochs"]]
    assert losses[-1] < losses[0] and summary["test_acc"] > 0.3  # learning (chance is 0.25)


@pytest.mark.slow
def test_a_collapsed_node_run_says_so_and_a_learning_one_does_not(caplog):
    # Every vertex's features equal (zero): every vertex gets the same logits, one class for all. The epoch
    # line, one warning and the summary say so, and the run goes on; a tiny run that learns is not flagged.
    graph = generate(SyntheticSpec(nodes=600, degree=5, features=8, classes=3))
    flat = dataclasses.replace(graph, features=np.zeros_like(graph.features))
    with caplog.at_level(logging.INFO, logger="neutronorch"):
        summary = train(small_config(epochs=2, hidden=8, fanouts=[3, 3]), graph=flat)
    assert summary["status"] == "completed"
    said = ("every vertex given the same scores", "one class (")
    assert all(e["collapsed"][0].startswith(said) for e in summary["epochs"]), summary["epochs"]
    assert len(summary["warnings"]) == 1 and "normalise the features" in summary["warnings"][0]
    assert sum("training has collapsed" in r.getMessage() for r in caplog.records) == 1
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch   0"))
    assert any(f"| collapsed: {reason}" in line for reason in said)
    learning = train(small_config(epochs=1, hidden=8, fanouts=[3, 3]), graph=graph)
    assert learning["warnings"] == [] and "collapsed" not in learning["epochs"][0]


def test_a_loss_pinned_at_a_constant_outputs_value_is_a_collapse_two_epochs_running():
    from neutronorch.train.health import Health

    health = Health({"2 ln 2: one score for every pair": 2 * np.log(2)})
    records = [{"epoch": e, "train_loss": loss} for e, loss in enumerate([3.1, 1.38630, 1.38629, 1.2])]
    for record in records:
        health.after_epoch(record)
    # Only the epoch that sat there after one that did too; the first time near it may be passing through.
    assert [r.get("collapsed") for r in records] == [None, None, ["loss pinned at 1.3863 (2 ln 2: one score for "
                                                                  "every pair)"], None]
    assert len(health.warnings) == 1 and "epoch 2" in health.warnings[0]


def _relabelled(labels=None, **changes):
    graph = generate(SyntheticSpec(nodes=600, degree=5, features=8, classes=3))
    return dataclasses.replace(graph, labels=graph.labels if labels is None else labels(graph), **changes)


def _trained_without(graph, cls):
    labels = graph.labels.copy()
    train_idx = np.asarray(graph.train_idx)
    labels[train_idx[labels[train_idx] == cls]] = (cls + 1) % 3
    return labels


@pytest.mark.parametrize("graph, message", [
    (lambda: _relabelled(lambda g: np.zeros_like(g.labels)), r"every labelled vertex has class 0: there is "
                                                              r"nothing to learn"),
    (lambda: _relabelled(lambda g: np.where(np.isin(np.arange(600), g.train_idx), 1, g.labels)),
     r"every training vertex has class 1 \(of 3 classes labelled\): nothing to tell apart.*per-class"),
    (lambda: _relabelled(num_classes=40), r"num_classes is 40, but the labels use classes 0..2 only: 37 of the "
                                          r"model's outputs.*Set num_classes to 3"),
    (lambda: _relabelled(features=np.zeros((600, 0), np.float32)), r"no features \(feature_dim 0\).*own module"),
    (lambda: _relabelled(lambda g: np.where(g.labels == 2, 7, g.labels)), r"labels range over 0..7, outside "
                                                                           r"0..2.*fix num_classes"),
    (lambda: _relabelled(lambda g: np.where(np.isin(np.arange(600), g.test_idx), -1, g.labels)),
     r"no vertex of the test set has a label, so it cannot be scored"),
])
def test_settings_that_cannot_be_met_are_refused_before_training(graph, message):
    with pytest.raises(DataError, match=message):
        train(small_config(epochs=1, hidden=8, fanouts=[3, 3]), graph=graph())


@pytest.mark.slow
def test_a_class_without_a_training_vertex_is_a_warning_the_summary_keeps(caplog, tmp_path, capsys):
    graph = _relabelled(lambda g: _trained_without(g, 2))
    with caplog.at_level(logging.WARNING, logger="neutronorch"):
        summary = train(small_config(epochs=1, hidden=8, fanouts=[3, 3]), graph=graph)
    assert summary["status"] == "completed"
    assert len(summary["warnings"]) == 1 and "1 labelled class (2) has no training vertex" in summary["warnings"][0]
    assert any("has no training vertex" in r.getMessage() for r in caplog.records)
    # A native folder whose meta.json overstates num_classes: one line on the command line, exit 2.
    from neutronorch.data.native import save_native

    directory = save_native(_relabelled(), tmp_path / "g")
    meta = json.loads((directory / "meta.json").read_text())
    (directory / "meta.json").write_text(json.dumps({**meta, "num_classes": 12}))
    assert main(["train", "--dataset", str(directory), "--epochs", "1", "--no-save", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "neutronorch: error: " in err and "Set num_classes to 3" in err and "Traceback" not in err


@pytest.mark.parametrize("arguments, message", [
    ({"config": {"epochs": 1}}, "`config`: expected a neutronorch TrainConfig, not a dict"),
    ({"progress": 5}, "`progress`: expected a function progress.epoch, done, total., not a int"),
    ({"stop": True}, "`stop`: expected a threading.Event .*, not a bool"),
])
def test_trains_own_arguments_are_checked_before_any_work(arguments, message):
    given = {"config": TrainConfig(dataset="synthetic:nodes=300", epochs=1), **arguments}
    with pytest.raises(ConfigError, match=message):
        train(**given)
