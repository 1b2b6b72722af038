"""Checkpoints of a partitioned run (`train --partitions DIR --checkpoint-dir CK`): every rank writes its own
file (rank 0 `last.pt`, the model prediction reads, rank r `last.rank-r.pt`) naming the partition; a run
stopped mid-epoch and resumed gives the uninterrupted run's per-step losses and accuracy bit for bit; a resume
on another partition or part count, or with a rank's file missing, is refused on every rank before training;
and a rank that is killed makes the others fail with a message, not hang."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.data import load_dataset
from neutronorch.errors import CheckpointError, Interrupted
from neutronorch.train.part_checkpoint import misfit
from test_partitioned_training import GRAPH, _env, _partition, _step_losses, spawned

SPLIT = "ratio:0.10034,0.05"  # 301 training vertices: 4 global batches of 2 x 50, the last of one seed
SETTINGS = dict(hidden=16, fanouts=[4, 4], batch_size=50, threads=1, sampler_threads=1, device="cpu", dropout=0.4,
                log_every=1)


def test_a_one_part_runs_checkpoint_predicts_as_the_full_copy_runs(tmp_path):
    """The model rank 0 writes is the full-copy run's: predict and embed read it with the source graph."""
    graph = load_dataset(GRAPH)
    folder = _partition(graph, tmp_path / "p1", 1, "random")
    runs = {"parts": dict(partitions=str(folder)), "full": dict(dataset=GRAPH)}
    for name, source in runs.items():
        neutronorch.train(neutronorch.TrainConfig(**source, **SETTINGS, epochs=1, checkpoint_dir=str(tmp_path / name)))
    state = torch.load(tmp_path / "parts" / "last.pt", weights_only=True)
    manifest = json.loads((folder / "partition.json").read_text())
    assert state["partition"] == {"id": manifest["id"], "part": 0, "parts": 1}
    assert sorted(p.name for p in (tmp_path / "parts").glob("*.pt")) == ["best.pt", "last.pt"]
    for read in (neutronorch.predict, lambda path, graph: neutronorch.embed(path, graph, layer=1)):
        got, expected = (read(str(tmp_path / name / "best.pt"), graph) for name in runs)
        np.testing.assert_array_equal(got, expected)


def test_an_earlier_runs_rank_files_are_never_replaced_silently(tmp_path):
    earlier = tmp_path / "ck" / "last.rank-1.pt"
    earlier.parent.mkdir()
    earlier.write_bytes(b"an earlier partitioned run's rank 1")
    config = dict(dataset="synthetic:nodes=300", epochs=1, hidden=8, fanouts=[3, 3], threads=1, device="cpu",
                  checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(neutronorch.ConfigError, match="last.rank-1.pt: already exists"):
        neutronorch.train(neutronorch.TrainConfig(**config))
    assert earlier.is_file()
    neutronorch.train(neutronorch.TrainConfig(**config, overwrite=True))  # set aside, deleted once replaced
    assert sorted(p.name for p in earlier.parent.iterdir()) == ["best.pt", "last.pt"]


def test_a_checkpoint_of_another_partition_or_part_is_named():
    saved = {"partition": {"id": "a" * 16, "part": 1, "parts": 2}, "config": {}}
    assert misfit(saved, {"id": "a" * 16, "part": 1, "parts": 2}, Path("ck/last.rank-1.pt"), "parts") is None
    message = misfit(saved, {"id": "b" * 16, "part": 1, "parts": 3}, Path("ck/last.rank-1.pt"), "parts")
    assert "part count 2 then, 3 now" in message and f"partition id {'a' * 16} then, {'b' * 16} now" in message
    assert "2 ranks" in message
    assert "part 1's state" in misfit(saved, {"id": "a" * 16, "part": 0, "parts": 2}, Path("ck/last.pt"), "parts")
    full = misfit({"config": {"dataset": GRAPH}}, {"id": "a" * 16, "part": 0, "parts": 1}, Path("last.pt"), "p")
    assert "written by a full-copy run" in full


def _stop_and_resume_ranks(rank: int, directory: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=2)
    d = Path(directory)
    run = lambda folder, name, resume=False, **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        partitions=str(d / folder), **SETTINGS, epochs=3, dist_timeout=60, checkpoint_dir=str(d / name),
        log_jsonl=str(d / f"{name}.jsonl"), summary_json=str(d / f"{name}.json"), resume=resume), **given)
    run("parts", "whole")
    stop = threading.Event()
    try:  # asked on rank 0 alone, in epoch 1 after its step 2: every rank stops after that step
        run("parts", "ck", progress=lambda epoch, done, total: epoch == 1 and done == 2 and rank == 0 and stop.set(),
            stop=stop)
        raise AssertionError("the run was not stopped")
    except Interrupted:
        pass
    torch.distributed.barrier()
    if rank == 0:  # rank 1's file of the stop, kept to be put back below
        shutil.copy(d / "ck" / "last.rank-1.pt", d / "stale.pt")
    run("parts", "ck", resume=True)
    refusals = []
    for folder, change in (("metis", None), ("parts", "missing"), ("parts", "stale")):
        torch.distributed.barrier()
        if change == "missing" and rank == 0:
            (d / "ck" / "last.rank-1.pt").rename(d / "aside.pt")
        if change == "stale" and rank == 0:
            shutil.copy(d / "stale.pt", d / "ck" / "last.rank-1.pt")
        torch.distributed.barrier()
        try:
            run(folder, "ck", resume=True)
        except CheckpointError as exc:
            refusals.append(str(exc))
    torch.distributed.destroy_process_group()
    (d / f"refusals-{rank}.json").write_text(json.dumps(refusals))


@pytest.mark.slow
def test_ranks_stopped_mid_epoch_resume_bit_for_bit_and_refuse_what_does_not_fit(tmp_path, monkeypatch):
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    graph = load_dataset(GRAPH, SPLIT, 0)
    _partition(graph, tmp_path / "parts", 2, "random")
    _partition(graph, tmp_path / "metis", 2, "metis")  # the same graph and part count, another partition
    spawned(_stop_and_resume_ranks, (str(tmp_path),), 300)
    whole, resumed = (_step_losses(tmp_path / f"{name}.jsonl") for name in ("whole", "ck"))
    assert len(whole) == 12 and resumed == whole  # the stopped run's steps, then the resumed run's: bit for bit
    a, b = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("whole", "ck"))
    assert [b[k] for k in ("val_acc", "test_acc", "final_test_acc")] == [a[k] for k in ("val_acc", "test_acc",
                                                                                        "final_test_acc")]
    assert b["epochs"][1]["resumed_at_step"] == 3  # asked after step 2: agreed on in step 3's all-reduce
    for rank in range(2):  # every rank refused, naming what differs
        other, missing, stale = json.loads((tmp_path / f"refusals-{rank}.json").read_text())
        assert other.startswith("rank 0: ") and "partition id" in other and "then," in other, other
        assert missing.startswith("rank 1: ") and "last.rank-1.pt: rank 1's checkpoint is missing" in missing
        assert "written at different steps (rank 0's at epoch 2 step 4; rank 1's at epoch 1 step 3)" in stale
    for name, rank in (("last.pt", 0), ("aside.pt", 1)):
        folder = tmp_path / "ck" / name if rank == 0 else tmp_path / name
        assert torch.load(folder, weights_only=True)["partition"]["part"] == rank
    # One process on one part of the same graph cannot continue the 2 ranks' run: refused, saying so.
    one = _partition(graph, tmp_path / "one", 1, "random")
    with pytest.raises(CheckpointError, match="part count 2 then, 1 now.*2 ranks"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(one), **SETTINGS, epochs=3, resume=True,
                                                  checkpoint_dir=str(tmp_path / "ck")))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--mode", "neutronorch", "--super-batch", "2"]])
def test_a_killed_rank_makes_the_other_fail_with_a_message_not_hang(tmp_path, mode):
    # NeutronOrch mode (its hot ratio auto: the ranks fetch their drift probes' rows as they start): its planner's,
    # cold sampler's and host's exchanges fail too, and none waits for the dead.
    graph = load_dataset(GRAPH)
    folder = _partition(graph, tmp_path / "parts", 2, "random")
    log = tmp_path / "log.jsonl"
    args = [sys.executable, "-m", "neutronorch", "train", "--partitions", str(folder), "--hidden", "16", "--fanouts",
            "4,4", "--threads", "1", "--sampler-threads", "1", "--no-progress", "--device", "cpu", "--log-every", "1",
            "--epochs", "100", "--batch-size", "16", "--dist-timeout", "60", "--log-jsonl", str(log),
            "--checkpoint-dir", str(tmp_path / "ck"), *mode]
    env = {**_env(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2"}
    ranks = [subprocess.Popen(args, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 25):
            time.sleep(0.1)  # past the first epoch and its checkpoints: into the second
        assert ranks[0].poll() is None and ranks[1].poll() is None
        ranks[1].send_signal(signal.SIGKILL)  # mid-epoch, amid its producer's exchanges and the all-reduces
        start = time.monotonic()
        _, err = ranks[0].communicate(timeout=120)
        assert ranks[0].returncode != 0
        assert time.monotonic() - start < 60  # well within --dist-timeout: the peer's socket closed
        assert "neutronorch: error (rank 0): rank 0 of 2:" in err, err[-3000:]
        assert "Another rank failed or stopped answering within --dist-timeout (60 s)" in err, err[-3000:]
        assert "Traceback" not in err, err[-3000:]  # no thread's
    finally:
        for rank in ranks:
            if rank.poll() is None:
                rank.kill()
            rank.communicate()


def test_a_link_run_on_parts_stopped_mid_epoch_resumes_bit_for_bit(tmp_path):
    from test_partitioned_training import LINK, _link_partition  # noqa: PLC0415
    folder = _link_partition(tmp_path / "p1", 1)
    run = lambda name, resume=False, **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        partitions=str(folder), **{**LINK, "batch_size": 2000}, epochs=2, dropout=0.4, log_every=1,
        checkpoint_dir=str(tmp_path / name), log_jsonl=str(tmp_path / f"{name}.jsonl"), resume=resume), **given)
    whole = run("whole")
    stop = threading.Event()
    with pytest.raises(Interrupted):  # stopped in epoch 1 after its step 2
        run("ck", progress=lambda epoch, done, total: epoch == 1 and done == 2 and stop.set(), stop=stop)
    assert torch.load(tmp_path / "ck" / "last.pt", weights_only=True)["partition"]["parts"] == 1
    resumed = run("ck", resume=True)
    assert _step_losses(tmp_path / "ck.jsonl") == _step_losses(tmp_path / "whole.jsonl")  # 10 steps, bit for bit
    assert resumed["test_mrr"] == whole["test_mrr"] and resumed["epochs"][1]["resumed_at_step"] == 2
