"""Training node classifiers on typed graphs, exact mode (``train/heterogeneous.py``, ``nn/typed_models.py``):
the loss falls, runs repeat, embedding tables move only where a batch looked, the relational models learn,
``train`` dispatches typed graphs and refuses what they cannot do yet; and ``collapse``, the type-blind view."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data import Graph, synthetic_typed, write_typed
from neutronorch.data.typed import Relation, TypedGraph
from neutronorch.data.typed import collapse, type_offsets
from neutronorch.errors import CheckpointError, ConfigError, DataError
from neutronorch.nn.typed_models import TypedGNN, TypedSpec, reachable_types
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

CHANCE = 1 / 16  # synthetic_typed's default 4 topics: 16 classes, balanced


@pytest.fixture(scope="module")
def mag() -> TypedGraph:
    """A MAG-like graph of 3,000 vertices (1,200 papers, 360 of them for training); one way only, as
    generated: training adds the reverses."""
    return synthetic_typed(nodes=3000, train=0.3, val=0.1, seed=0)


def config(**settings) -> TrainConfig:
    base = dict(epochs=3, fanouts=[5, 5], hidden=32, batch_size=64, lr=0.01, dropout=0.2, weight_decay=5e-4,
                threads=1, device="cpu")
    return TrainConfig(**{**base, **settings})


def losses(summary: dict) -> list[float]:
    return [e["train_loss"] for e in summary["epochs"]]


def test_typed_sage_lowers_the_loss_and_learns_above_chance(mag):
    summary = train(config(epochs=4), graph=mag)
    assert summary["status"] == "completed" and summary["mode"] == "exact"
    assert summary["model"]["kind"] == "sage" and summary["model"]["typed"]
    trained = losses(summary)
    assert trained[-1] < 0.8 * trained[0], trained
    assert summary["test_acc"] > 4 * CHANCE, summary["test_acc"]
    assert summary["best_epoch"] is not None and summary["final_test_accuracy"] == summary["final_test_acc"]
    assert summary["dataset"]["target"] == "paper" and summary["dataset"]["train"] == len(mag.train_idx)
    assert "(paper, rev_writes, author)" in summary["fanouts"]  # the reverses were added for training
    assert summary["model"]["parameters"]["embedding"] == 32 * (1500 + 60 + 240)  # author, institution, field


def test_the_same_seed_gives_the_same_losses(mag):
    first, again = (losses(train(config(epochs=2, eval_every=-1), mag)) for _ in range(2))
    other = losses(train(config(epochs=2, eval_every=-1, seed=1), mag))
    assert first == again
    assert other != first


@pytest.mark.parametrize("kind", ["rgcn", "rgat"])
def test_rgcn_and_rgat_train(mag, kind):
    summary = train(config(model=kind, epochs=2, heads=2, eval_every=0), graph=mag)
    trained = losses(summary)
    assert summary["model"]["kind"] == kind and trained[-1] < trained[0], trained
    assert summary["test_acc"] > CHANCE


def test_embedding_tables_change_only_in_the_rows_a_batch_touched(mag, monkeypatch):
    seeds = dataclasses.replace(mag, train_idx=np.asarray(mag.train_idx[:24]))
    cfg = config(epochs=1, batch_size=24, fanouts=[2, 2], eval_every=-1)  # one step
    trainer, runs, before = importlib.import_module("neutronorch.train.trainer"), [], {}
    build = trainer.build_run

    def building(*args):  # the run as built, its tables before the step
        runs.append(build(*args))
        before.update({t: table.weight.detach().clone() for t, table in runs[0].model.embeddings.items()})
        return runs[0]

    monkeypatch.setattr(trainer, "build_run", building)
    train(cfg, graph=seeds)
    run, model, seeds = runs[0], runs[0].model, seeds.with_reverse()
    order = epoch_order(torch.from_numpy(np.asarray(seeds.train_idx)), cfg.seed, 0)
    touched = TypedNeighborSampler(seeds, cfg.fanouts).sample(order.numpy(), batch_key(cfg.seed, 0, 0)).input_nodes
    for t, table in model.embeddings.items():
        changed = torch.nonzero((table.weight.detach() != before[t]).any(1)).flatten()
        assert set(changed.tolist()) == set(touched[t].tolist()), t
        assert 0 < changed.shape[0] < table.weight.shape[0], t  # some moved, some did not
    assert run.typed.sparse is not None and run.typed.parameters["embedding"] == sum(
        table.weight.numel() for table in model.embeddings.values())


def test_a_typed_folder_trains_through_the_dataset_setting(mag, tmp_path):
    folder = write_typed(mag, tmp_path / "mag")
    summary_path = tmp_path / "summary.json"
    summary = train(config(dataset=str(folder), epochs=1, summary_json=str(summary_path), model="rgcn"))
    assert summary["model"]["kind"] == "rgcn" and summary["test_acc"] is not None
    assert json.loads(summary_path.read_text())["mode"] == "exact"


@pytest.mark.slow
def test_a_given_typed_graph_is_what_the_summary_names(mag):
    summary = train(config(epochs=1, fanouts=[3]), graph=mag)  # `dataset` left at its default, synthetic
    assert summary["config"]["dataset"] == f"graph:{mag.name}" and summary["dataset"]["name"] == mag.name


@pytest.mark.slow
def test_a_typed_runs_log_on_a_full_disk_ends_it_with_an_error_after_the_summary(mag, tmp_path, monkeypatch):
    import errno
    import os

    from neutronorch import OutputError
    from neutronorch.train import summary as summary_module

    class Full:
        def __init__(self, file):
            self.file = file

        def write(self, text):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        flush = write

        def close(self):
            self.file.close()

    monkeypatch.setattr(summary_module, "open", lambda path, *a, **k: Full(open(path, *a, **k)), raising=False)
    log = tmp_path / "m.jsonl"
    with pytest.raises(OutputError, match=rf"cannot write {log}: No space left on device"):
        train(config(epochs=1, fanouts=[3], log_jsonl=str(log), log_every=1, summary_json=str(tmp_path / "s.json")),
              graph=mag)
    written = json.loads((tmp_path / "s.json").read_text())
    assert written["status"] == "completed" and str(log) in written["error"]


@pytest.mark.parametrize("settings, message", [
    (dict(model="gcn"), "`model` gcn: not available for typed graphs yet; choose one of sage, rgcn, rgat"),
    (dict(split="ratio:0.5,0.2"), "carries its own split"),
    (dict(negatives=4, link_head="mlp"), "`link_head` mlp, `negatives` 4: a link task's settings, and `task` is node"),
    (dict(mode="auto", hot_ratio=0.3), "`hot_ratio` 0.3: NeutronOrch mode's, and `mode` auto \\(which runs exact on a "
                                       "typed graph\\) would ignore it"),
])
def test_what_typed_graphs_cannot_do_yet_is_refused(mag, settings, message):
    with pytest.raises(ConfigError, match=message):
        train(config(**settings), graph=mag)


def test_auto_trains_a_typed_graph_in_exact_mode_and_says_so(mag):
    summary = train(config(epochs=1, mode="auto"), graph=mag)
    assert summary["mode"] == "exact" and summary["mode_choice"]["chosen"] == "exact"


def test_typed_options_are_refused_with_a_homogeneous_graph():
    from neutronorch import TypedOptions
    with pytest.raises(ConfigError, match="`options` \\(a TypedOptions\\) are a typed graph's settings"):
        train(config(epochs=1), graph=collapse(synthetic_typed(nodes=500)), options=TypedOptions(num_bases=2))


def test_relational_models_refuse_a_homogeneous_graph():
    graph = collapse(synthetic_typed(nodes=500))
    for settings in (dict(embedding_storage="mmap"), dict(embedding_dir="tables")):  # typed graphs' tables
        with pytest.raises(ConfigError, match="where a typed graph keeps its featureless types' embedding tables"):
            train(config(**settings), graph=graph)
    for kind in ("rgcn", "rgat"):
        with pytest.raises(ConfigError, match=f"`model` {kind}: a relational model, for typed graphs.*homogeneous"):
            train(config(model=kind), graph=graph)
    with pytest.raises(ConfigError, match="`model` 'rgcnn': choose one of sage, gcn, gat, rgcn, rgat"):
        config(model="rgcnn").validate()


def test_the_model_refuses_types_no_relation_leads_into():
    """One-way relations into the target: the authors feed the papers but nothing feeds the authors, so a
    second layer has no author rows; the reverses fix it."""
    graph = synthetic_typed(nodes=500)
    spec = TypedSpec.of(graph)
    assert reachable_types(spec, 2)[:2] == [["paper"], ["paper", "author"]]
    with pytest.raises(ValueError, match="author.*with_reverse"):
        TypedGNN("sage", spec, 16, 16, 2)
    TypedGNN("sage", spec, 16, 16, 1)  # one layer reads the authors' own rows
    model = TypedGNN("rgat", TypedSpec.of(graph.with_reverse()), 16, 16, 2)
    # The top layer holds only the relations into the target; tables only for featureless input types.
    assert {r[2] for r in model.layers[-1].relations} == {"paper"}
    assert set(model.embeddings) == {"author", "institution", "field"} and not model.projections


def test_rgcn_projects_featured_types_to_one_width():
    graph = synthetic_typed(nodes=500, field_features=8).with_reverse()
    model = TypedGNN("rgcn", TypedSpec.of(graph), 16, 16, 2)
    assert {t: p.in_features for t, p in model.projections.items()} == {"paper": 64, "field": 8}
    assert all(table.embedding_dim == 16 for table in model.embeddings.values())


def test_collapse_stacks_the_types_and_forgets_them():
    typed = TypedGraph(
        name="tiny", num_nodes={"paper": 3, "author": 2},
        relations={("author", "writes", "paper"): Relation.from_edges([0, 1, 1], [0, 0, 2], 2, 3),
                   ("paper", "cites", "paper"): Relation.from_edges([1, 2], [0, 0], 3, 3)},
        features={"paper": np.arange(6, dtype=np.float32).reshape(3, 2)}, target="paper",
        labels=np.array([0, 1, 1]), train_idx=np.array([0]), val_idx=np.array([1]), test_idx=np.array([2]),
        num_classes=2).with_reverse()
    graph = collapse(typed)
    assert isinstance(graph, Graph) and type_offsets(typed) == {"paper": 0, "author": 3}
    assert graph.num_nodes == 5 and graph.num_edges == 2 * (3 + 2)
    assert np.array_equal(graph.features, [[0, 1], [2, 3], [4, 5], [0, 0], [0, 0]])
    assert np.array_equal(graph.labels, [0, 1, 1, -1, -1])
    assert list(graph.train_idx) == [0] and list(graph.test_idx) == [2]
    # Paper 0's in-neighbours: authors 0 and 1 (3, 4) and papers 1 and 2, whichever relation brought them.
    assert sorted(graph.indices[graph.indptr[0]:graph.indptr[1]]) == [1, 2, 3, 4]


def test_the_command_line_trains_a_typed_folder(mag, tmp_path, capsys):
    from neutronorch.cli import main

    folder = write_typed(mag, tmp_path / "mag")
    flags = ["--epochs", "1", "--fanouts", "3,3", "--hidden", "16", "--threads", "1", "--no-progress"]
    assert main(["train", "--dataset", str(folder), "--model", "rgcn", "--run-name", "typed", *flags]) == 0
    out = capsys.readouterr().out
    assert "mode exact, model rgcn" in out and "results in runs/typed/" in out
    summary = json.loads(open("runs/typed/summary.json").read())  # the run folder, its checkpoints too
    assert summary["model"]["kind"] == "rgcn" and summary["config"]["checkpoint_dir"] == "runs/typed"
    assert summary["checkpoints"] == {"last": "runs/typed/last.pt", "best": "runs/typed/best.pt"}
    assert main(["train", "--model", "rgat", "--no-save", *flags]) == 2
    assert "error: --model rgat: a relational model, for typed graphs" in capsys.readouterr().err


@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_bf16_trains_a_typed_graph_under_autocast_and_evaluates_in_float32(mag, mode):
    """bf16: the forward pass under autocast (the layers' products in bfloat16, sums and the softmax in
    float32), the loss, embedding tables, optimizers and evaluation in float32; the losses track fp32's."""
    fp32 = train(config(mode=mode), graph=mag)
    bf16 = train(config(mode=mode, precision="bf16"), graph=mag)
    assert bf16["precision"]["name"] == "bf16" and fp32["precision"]["name"] == "fp32"
    assert bf16["config"]["precision"] == "bf16"
    np.testing.assert_allclose(losses(bf16), losses(fp32), rtol=0.05)
    assert losses(bf16)[-1] < losses(bf16)[0]
    assert abs(bf16["test_acc"] - fp32["test_acc"]) < 0.05


def test_threads_1_runs_torch_on_one_thread():
    """numba's first call starts its OpenMP pool and resets torch's count: entering numba's threads after
    torch's must keep torch's (a typed run at threads 1 ran torch's ops on two threads)."""
    import subprocess
    import sys
    code = ("import torch\nfrom neutronorch.train.resources import torch_threads, numba_threads\n"
            "with torch_threads(1), numba_threads(1):\n    print(torch.get_num_threads())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"


@pytest.mark.parametrize("change, message", [
    (lambda g: dict(num_classes=200), r"num_classes is 200, but the labels use classes 0..15 only.*Set num_classes "
                                      r"to 16 \(the dataset's meta.json"),
    (lambda g: dict(labels=np.where(np.asarray(g.labels) >= 0, 3, -1)), r"every labelled vertex has class 3"),
    (lambda g: dict(labels=np.where(np.isin(np.arange(g.labels.shape[0]), g.train_idx), 5, g.labels)),
     r"every training vertex has class 5"),
])
def test_typed_settings_that_cannot_be_met_are_refused_before_training(mag, change, message):
    with pytest.raises(DataError, match=message):
        train(config(epochs=1), graph=dataclasses.replace(mag, **change(mag)))


def test_the_loaded_line_gives_the_load_time_on_its_first_line_above_the_types(mag, tmp_path, caplog):
    folder = write_typed(mag, tmp_path / "mag")
    with caplog.at_level("INFO", logger="neutronorch"):
        train(config(epochs=1, eval_every=-1, dataset=str(folder)))
    lines = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("loaded ")).splitlines()
    assert re.search(r"target paper \(.*\) in \d+\.\ds$", lines[0]), lines[0]
    assert lines[-1].endswith(" edges") and len(lines) == 1 + len(mag.num_nodes) + len(mag.relations), lines


def test_the_mode_line_names_the_fanouts_the_run_samples_with(mag, caplog):
    from neutronorch.train.heterogeneous import TypedOptions

    with caplog.at_level("INFO", logger="neutronorch"):
        train(config(epochs=1, fanouts=[3, 3], eval_every=-1), graph=mag,
              options=TypedOptions(fanouts={"writes": [2, 2], "default": [4, 4]}))
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("mode "))
    assert "(author, writes, paper) [2, 2]" in line and "[4, 4]" in line and "fanouts [3, 3]" not in line
    caplog.clear()
    with caplog.at_level("INFO", logger="neutronorch"):
        train(config(epochs=1, fanouts=[3, 3], eval_every=-1), graph=mag)
    assert any(r.getMessage().startswith("mode ") and "fanouts [3, 3]," in r.getMessage() for r in caplog.records)


def test_the_tables_learn_at_typed_options_table_lr_else_at_lr(mag, tmp_path):
    """The summary's tables' rate is their optimizer's: a checkpoint holds it."""
    from neutronorch.train.heterogeneous import TypedOptions

    for given, expected in ((None, 0.01), (0.25, 0.25)):
        folder = tmp_path / str(given)
        summary = train(config(epochs=1, eval_every=-1, checkpoint_dir=str(folder)), graph=mag,
                        options=TypedOptions(table_lr=given))
        state = torch.load(folder / "last.pt", weights_only=False)
        assert state["tables_optimizer"]["state"]["lr"] == summary["embedding_tables"]["lr"] == expected
    resumed = dict(epochs=2, eval_every=-1, checkpoint_dir=str(tmp_path / "0.25"), resume=True)
    with pytest.raises(CheckpointError, match="the embedding tables' learning rate 0.25 then, 0.5 now"):
        train(config(**resumed), graph=mag, options=TypedOptions(table_lr=0.5))
    assert train(config(**resumed), graph=mag, options=TypedOptions(table_lr=0.25))["embedding_tables"]["lr"] == 0.25
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match=r"`TypedOptions.table_lr` .*: the embedding tables' learning rate"):
            train(config(epochs=1, eval_every=-1), graph=mag, options=TypedOptions(table_lr=bad))
