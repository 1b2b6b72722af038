"""Training on the parts of a typed graph (`train --partitions DIR` on a folder `neutronorch partition` made of a
typed graph): one part in one process trains as the whole graph bit for bit; two gloo ranks give the step losses
and accuracy of the full-copy data-parallel run dealt by the same parts (`deal_by`), bit for bit, and a run
stopped mid-epoch resumes bit for bit; what the parts cannot train yet is refused with the reason."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.data import load_dataset
from neutronorch.data.partition import assign, write_partition
from neutronorch.data.partition_typed import assign_typed, write_typed_partition
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.errors import CheckpointError, ConfigError, Interrupted
from neutronorch.train.checkpoint import load_checkpoint
from neutronorch.train.heterogeneous import TypedOptions
from neutronorch.train import typed_tables
from neutronorch.train.part_tables import draw_owned
from test_partitioned_training import _env, _step_losses, spawned

SETTINGS = dict(hidden=16, fanouts=[4, 3], batch_size=40, threads=1, sampler_threads=1, device="cpu", dropout=0.3,
                log_every=1)


def typed_graph():
    return synthetic_typed(3000, features=16, seed=3)


def _partition(graph, folder: Path, parts: int, method: str = "random") -> Path:
    whole = graph.with_reverse()
    write_typed_partition(whole, assign_typed(whole, parts, method, 0), parts, folder, method, 0, "synthetic-typed")
    return folder


@pytest.mark.parametrize("model", ["rgcn", "sage", "rgat"])
def test_one_part_in_one_process_trains_as_the_whole_typed_graph(tmp_path, model):
    graph = typed_graph()
    folder = _partition(graph, tmp_path / "p1", 1)
    settings = dict(SETTINGS, model=model, epochs=2)
    whole = neutronorch.train(neutronorch.TrainConfig(log_jsonl=str(tmp_path / "a.jsonl"), **settings,
                                                      checkpoint_dir=str(tmp_path / "ca")), graph=graph)
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings, checkpoint_dir=str(tmp_path / "cb")))
    losses = _step_losses(tmp_path / "a.jsonl")
    assert len(losses) == 6 and _step_losses(tmp_path / "b.jsonl") == losses  # bit for bit
    for key in ("val_acc", "test_acc"):
        assert parted[key] == whole[key], key
    assert parted["dataset"]["node_types"] == whole["dataset"]["node_types"]
    assert parted["dataset"]["edges"] == whole["dataset"]["edges"]
    assert parted["model"]["parameters"] == whole["model"]["parameters"]  # the featureless types' tables, whole
    assert parted["epochs"][0]["exchange"][0]["exchanges"] > 0
    # Rank 0's checkpoint holds the whole model, tables included: predict reads it with the source graph.
    got, expected = (neutronorch.predict(str(tmp_path / name / "last.pt"), graph) for name in ("cb", "ca"))
    np.testing.assert_array_equal(got, expected)


def test_typed_options_apply_on_the_parts_and_are_refused_on_a_homogeneous_folder(tmp_path):
    graph = typed_graph()
    folder = _partition(graph, tmp_path / "p1", 1)
    options = TypedOptions(fanouts={"writes": [3, 2], "default": [4, -1]}, embed_dim=8)
    settings = dict(SETTINGS, model="rgcn", epochs=1)
    whole = neutronorch.train(neutronorch.TrainConfig(log_jsonl=str(tmp_path / "a.jsonl"), **settings), graph=graph,
                              options=options)
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings), options=options)
    assert _step_losses(tmp_path / "b.jsonl") == _step_losses(tmp_path / "a.jsonl")
    assert parted["fanouts"] == whole["fanouts"] and parted["fanouts"]["(author, writes, paper)"] == [3, 2]
    assert parted["model"]["parameters"] == whole["model"]["parameters"]
    plain = load_dataset("synthetic:nodes=300")
    write_partition(plain, assign(plain, 1, "random", 0), 1, tmp_path / "h1", "random", 0, "synthetic")
    with pytest.raises(ConfigError, match="typed graph's settings.*homogeneous graph's parts"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(tmp_path / "h1"), **settings), options=options)
    with pytest.raises(ConfigError, match="`graph` or `model` given with `partitions`"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), **settings), graph=graph)


def test_a_parts_rows_of_a_table_are_drawn_as_the_whole_table_is(monkeypatch):
    monkeypatch.setattr(typed_tables, "CHUNK_BYTES", 64 * 24 * 4)  # chunks of 64 rows: many
    ids = np.array([0, 5, 16, 17, 900, 4095, 4099], dtype=np.int64)
    torch.manual_seed(7)
    whole = torch.nn.Embedding(4100, 24, sparse=True).weight.detach()  # drawn in one call
    after = torch.rand(3)
    torch.manual_seed(7)
    part = draw_owned(4100, 24, ids)
    assert torch.equal(part, whole[torch.from_numpy(ids)]) and torch.equal(torch.rand(3), after)


@pytest.mark.parametrize("settings, message", [
    (dict(normalize_features="row"), "normalize_features"),
    (dict(embedding_storage="mmap"), "embedding_storage"),
])
def test_what_a_typed_graphs_parts_cannot_train_yet_is_refused_with_the_reason(tmp_path, settings, message):
    folder = _partition(typed_graph(), tmp_path / "p1", 1)
    why = "memory-mapped tables are not split by owner" if "embedding" in message else \
        "typed graph's parts train on rows as written"
    with pytest.raises(ConfigError, match=f"{message}.*{why}"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), **dict(SETTINGS, epochs=1), **settings))
    assert not (tmp_path / "runs").exists()


def _ranks(rank: int, directory: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=2)
    d = Path(directory)
    graph = typed_graph()
    run = lambda name, resume=False, **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        **dict(SETTINGS, batch_size=20), epochs=2, dist_timeout=60, log_jsonl=str(d / f"{name}.jsonl"), summary_json=str(d / f"{name}.json"),
        resume=resume, **({"partitions": str(d / "parts")} if name != "full" else {"deal_by": str(d / "parts")}),
        **({"checkpoint_dir": str(d / {"ck": "ck", "full": "cf"}[name])} if name in ("ck", "full") else {})), **given)
    run("full", graph=graph)
    run("parts")
    stop = threading.Event()
    try:  # asked on rank 0 alone, in epoch 1 after its step 2: every rank stops after that step
        run("ck", progress=lambda epoch, done, total: epoch == 1 and done == 2 and rank == 0 and stop.set(), stop=stop)
        raise AssertionError("the run was not stopped")
    except Interrupted:
        pass
    torch.distributed.barrier()
    run("ck", resume=True)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_on_typed_parts_reproduce_the_full_copy_run_and_resume_bit_for_bit(tmp_path, monkeypatch):
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    _partition(typed_graph(), tmp_path / "parts", 2, "metis")
    spawned(_ranks, (str(tmp_path),), 240)
    full, parts, resumed = (_step_losses(tmp_path / f"{name}.jsonl") for name in ("full", "parts", "ck"))
    assert len(full) == 6 and parts == full and resumed == full  # bit for bit
    a, b, c = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("full", "parts", "ck"))
    for key in ("val_acc", "test_acc"):  # each rank's vertices sampled as the whole graph samples them
        assert b[key] == pytest.approx(a[key], abs=1e-9) and c[key] == b[key], key
    assert c["epochs"][1]["resumed_at_step"] == 3
    # Each rank held its part's rows of the featureless types' tables, and rank 0's file holds only its own.
    tables = b["embedding_tables"]
    whole = typed_graph().num_nodes
    assert tables["reason"] == "split by owner on the parts"
    assert 0 < tables["tables"]["author"][0] < whole["author"] and tables["tables"]["author"][1] == 16
    assert sum(t[0] for t in tables["tables"].values()) < sum(whole[t] for t in tables["tables"]) * 0.75
    # Prediction reads the tables whole from both ranks' files: the full-copy run's model, bit for bit.
    for name in ("last.pt", "best.pt"):
        whole, parted = (load_checkpoint(tmp_path / f / name).model.state_dict() for f in ("cf", "ck"))
        assert whole.keys() == parted.keys() and all(torch.equal(whole[k], parted[k]) for k in whole), name
    graph = typed_graph()
    assert np.array_equal(*(neutronorch.predict(str(tmp_path / f / "last.pt"), graph, probabilities=True)
                            for f in ("ck", "cf")))
    (tmp_path / "alone").mkdir()
    for name in ("last.pt", "last.rank-1.pt"):
        (tmp_path / "alone" / name.replace("last", "model")).write_bytes((tmp_path / "ck" / name).read_bytes())
    with pytest.raises(CheckpointError, match="rank 1's checkpoint is missing"):
        (tmp_path / "alone" / "model.pt").rename(tmp_path / "alone" / "last.pt")
        load_checkpoint(tmp_path / "alone" / "last.pt")
    with pytest.raises(CheckpointError, match="written by rank 1 of a typed run on 2 parts.*not named as its rank"):
        load_checkpoint(tmp_path / "alone" / "model.rank-1.pt")
    traffic = b["epochs"][0]["exchange"]
    assert len(traffic) == 2 and all(t["sent_bytes"] > 0 and t["received_bytes"] > 0 for t in traffic)
    assert np.isfinite(b["final_test_acc"])
