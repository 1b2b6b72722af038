"""NeutronOrch mode on a typed graph's parts (`train --partitions DIR --mode neutronorch` of a typed partition):
the owner of a hot vertex of any type computes its bottom-layer row for every rank holding it hot. One part in one
process trains as the whole graph bit for bit (the owner computes the rows in the order the whole graph's run
does), its embedding tables split by owner or not; two ranks give the full-copy run's losses dealt by the same
parts up to the order of float sums. With ``hot_ratio`` auto every rank measures the drift at every boundary, its
table rows fetched from their owners."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.errors import ConfigError, Interrupted
from test_partitioned_training import _env, _step_losses, spawned
from test_partitioned_typed import SETTINGS, _partition, typed_graph

HOT = dict(mode="neutronorch", hot_ratio=0.5, snapshot_lead=1, super_batch=2, host_threads=1)
AUTO = dict(HOT, hot_ratio="auto")


def featured_graph():
    """The tests' typed graph with rows for its featureless types too: no embedding tables."""
    graph = typed_graph()
    rng = np.random.default_rng(0)
    for t, n in graph.num_nodes.items():
        if t not in graph.features:
            graph.features[t] = rng.normal(size=(n, 8)).astype(np.float32)
    return graph


@pytest.mark.parametrize("model, tables", [("rgcn", False), ("sage", False), ("rgcn", True)])
def test_one_part_in_one_process_trains_as_the_whole_graph_in_neutronorch_mode(tmp_path, model, tables):
    graph = typed_graph() if tables else featured_graph()  # its authors, institutions and fields: tables
    folder = _partition(graph, tmp_path / "p1", 1)
    settings = dict(SETTINGS, **HOT, model=model, epochs=2)
    whole = neutronorch.train(neutronorch.TrainConfig(log_jsonl=str(tmp_path / "a.jsonl"), **settings), graph=graph)
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings))
    losses = _step_losses(tmp_path / "a.jsonl")
    assert len(losses) == 6 and _step_losses(tmp_path / "b.jsonl") == losses  # bit for bit
    assert parted["test_acc"] == whole["test_acc"]
    assert parted["neutronorch"]["hot_set"] == "owner" and parted["hot"]["reuse_rate"] > 0.3
    lanes = {"plan", "cold", "host", "gradient"} | ({"tables"} if tables else set())
    assert set(parted["exchange"]["training"]["lanes"]) == lanes


def test_a_run_on_one_part_stopped_within_a_super_batch_resumes_as_it_was(tmp_path):
    folder = _partition(typed_graph(), tmp_path / "p1", 1)  # a snapshot's table rows kept with the checkpoint
    run = lambda name, resume=False, **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        **dict(SETTINGS, **HOT, epochs=2), partitions=str(folder), checkpoint_dir=str(tmp_path / name),
        log_jsonl=str(tmp_path / f"{name}.jsonl"), resume=resume), **given)
    run("whole")
    stop = threading.Event()
    with pytest.raises(Interrupted):  # after step 1 of epoch 1: within the super-batch of steps 3 and 4
        run("ck", progress=lambda epoch, done, total: epoch == 1 and done == 1 and stop.set(), stop=stop)
    run("ck", resume=True)
    losses = _step_losses(tmp_path / "whole.jsonl")
    assert len(losses) == 6 and _step_losses(tmp_path / "ck.jsonl") == losses  # bit for bit


def test_auto_hot_ratio_with_embedding_tables_measures_the_drift_at_every_boundary(tmp_path):
    """The drift probe reads its table rows from their owners each time it measures (a collective): every rank
    measures from the first boundary on."""
    folder = _partition(typed_graph(), tmp_path / "p1", 1)  # its authors, institutions and fields: tables
    out = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), **dict(SETTINGS, **AUTO, epochs=2)))
    assert all(epoch["drift_per_step"] > 0 and epoch["stale_error"] > 0 for epoch in out["epochs"])
    assert out["neutronorch"]["hot_ratio_setting"] == "auto"


def _ranks(rank: int, directory: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=2)
    d = Path(directory)
    for name in ("full", "parts", "auto"):
        source = {"deal_by": str(d / "parts")} if name == "full" else {"partitions": str(d / "parts")}
        neutronorch.train(neutronorch.TrainConfig(
            **dict(SETTINGS, **(AUTO if name == "auto" else HOT), batch_size=20, dropout=0.4),
            epochs=2 if name == "auto" else 3, dist_timeout=60, **source,
            log_jsonl=str(d / f"{name}.jsonl"), summary_json=str(d / f"{name}.json")),
            **({"graph": typed_graph()} if name == "full" else {}))
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_on_typed_parts_reproduce_the_full_copy_neutronorch_run(tmp_path, monkeypatch):
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    _partition(typed_graph(), tmp_path / "parts", 2, "metis")  # featureless types: tables split by owner
    spawned(_ranks, (str(tmp_path),), 240)
    full, parts = (_step_losses(tmp_path / f"{name}.jsonl") for name in ("full", "parts"))
    assert len(full) == len(parts) >= 9
    assert parts == pytest.approx(full, rel=1e-5)  # the owner sums its holders' dL/dY: float-sum order
    a, b = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("full", "parts"))
    assert b["test_acc"] == pytest.approx(a["test_acc"], abs=0.01)
    assert b["neutronorch"]["hot_set"] == "owner" and b["hot_rows_exchanged"]["received"] > 0
    lanes = b["exchange"]["training"]["lanes"]
    assert lanes["host"]["received_bytes"] > 0 and lanes["gradient"]["received_bytes"] > 0
    assert lanes["tables"]["received_bytes"] > 0
    auto = json.loads((tmp_path / "auto.json").read_text())  # every rank measured at every boundary: no hang
    assert all(epoch["drift_per_step"] > 0 for epoch in auto["epochs"])
