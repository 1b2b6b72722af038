"""Data-parallel training with torch.distributed (gloo on the CPU), launched as users launch it: torchrun.

Two ranks with ``batch_size`` B train exactly what one process trains with 2B: the same seeds, neighbours
and dropout masks per global batch, gradients averaged by each rank's share. What differs is the order of
floating-point sums, so per-step losses agree to a few float32 ulps; the tests allow 1e-5 relative.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch.config import SamplingConfig
from neutronorch.orchestration.seeds import NodeSeeds

# Loss agreement between 2 ranks and 1 process: the same arithmetic up to the order of sums.
LOSS_RTOL = 1e-5

GRAPH = "synthetic:nodes=4000,features=16,degree=8"
COMMON = ["--dataset", GRAPH, "--hidden", "16", "--fanouts", "4,4", "--threads", "1", "--sampler-threads", "1",
          "--no-progress", "--no-stage-table", "--device", "cpu", "--log-every", "1"]

GAT_BLOCKS = ["--mode", "device", "--model", "gat", "--architecture", "blocks", "--norm", "layer"]


def _env() -> dict:
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(args: list[str], nproc: int = 2, extra: list[str] | None = None) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), *(extra or
            ["--standalone"]), "-m", "neutronorch", "train", *COMMON, *args]


def _run(command: list[str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env())


def _step_losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "step"]


def epoch_batches(train, sampling, epoch, owner=None):
    graph = types.SimpleNamespace(train_idx=train.numpy())
    return [batch.seeds for batch in NodeSeeds(graph, sampling, owner).epoch(epoch)]


def test_ranks_split_each_global_batch_in_order():
    train = torch.arange(103)
    one = epoch_batches(train, SamplingConfig([5], 20, 3, 1), epoch=2)
    parts = [epoch_batches(train, SamplingConfig([5], 10, 3, 1, rank=r, world=2), epoch=2) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == len(one) == 6
    for k, batch in enumerate(one):
        assert torch.equal(torch.cat([parts[0][k], parts[1][k]]), batch)
    assert [p.shape[0] for p in (parts[0][-1], parts[1][-1])] == [2, 1]  # the last batch: as even as can be
    # 7 seeds, 3 ranks of 2: a global batch of 6, then one of a single seed that two ranks have no part of.
    tiny = [epoch_batches(torch.arange(7), SamplingConfig([5], 2, 0, 1, rank=r, world=3), 0) for r in range(3)]
    assert [[b.shape[0] for b in t] for t in tiny] == [[2, 1], [2, 0], [2, 0]]


def test_ranks_dealt_by_owner_train_the_seeds_their_part_owns_in_the_global_batchs_order():
    train, owner = torch.arange(103), np.random.default_rng(0).integers(0, 3, 200).astype(np.int32)
    one = epoch_batches(train, SamplingConfig([5], 30, 3, 1), epoch=1)
    parts = [epoch_batches(train, SamplingConfig([5], 10, 3, 1, rank=r, world=3), 1, owner) for r in range(3)]
    for k, batch in enumerate(one):
        for rank in range(3):
            assert torch.equal(parts[rank][k], batch[torch.from_numpy(owner[batch.numpy()] == rank)])
    assert sorted(torch.cat([p[k] for p in parts for k in range(len(one))]).tolist()) == list(range(103))


def _train_in_callers_group(rank: int, directory: str) -> None:
    import neutronorch  # noqa: PLC0415 - in the spawned process
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=2)
    summary = neutronorch.train(neutronorch.TrainConfig(
        dataset=GRAPH, hidden=16, fanouts=[4, 4], epochs=1, batch_size=32, threads=1, sampler_threads=1,
        device="cpu", summary_json=f"{directory}/summary-{rank}.json"))
    assert torch.distributed.is_initialized()  # the caller's group: left for the caller
    torch.distributed.destroy_process_group()
    Path(directory, f"loss-{rank}").write_text(repr(summary["epochs"][0]["train_loss"]))


@pytest.mark.slow
def test_train_joins_a_process_group_the_caller_made(tmp_path, monkeypatch):
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    torch.multiprocessing.spawn(_train_in_callers_group, args=(str(tmp_path),), nprocs=2)
    assert (tmp_path / "summary-0.json").is_file() and not (tmp_path / "summary-1.json").exists()
    summary = json.loads((tmp_path / "summary-0.json").read_text())
    assert summary["distributed"]["world_size"] == 2
    assert (tmp_path / "loss-0").read_text() == (tmp_path / "loss-1").read_text()  # the global loss on each


@pytest.mark.slow
def test_two_ranks_reproduce_one_process_with_twice_the_batch(tmp_path):
    # 401 training vertices in global batches of 100: the last holds one seed, and rank 1 none of it.
    split = ["--split", "ratio:0.10025,0.05"]
    one = _run([sys.executable, "-m", "neutronorch", "train", *COMMON, *split, "--epochs", "2", "--batch-size", "100",
                "--log-jsonl", str(tmp_path / "one.jsonl"), "--summary-json", str(tmp_path / "one.json")])
    assert one.returncode == 0, one.stderr
    two = _run(_torchrun([*split, "--epochs", "2", "--batch-size", "50", "--log-jsonl", str(tmp_path / "two.jsonl"),
                          "--summary-json", str(tmp_path / "two.json")]))
    assert two.returncode == 0, two.stderr
    a, b = _step_losses(tmp_path / "one.jsonl"), _step_losses(tmp_path / "two.jsonl")
    assert len(a) == len(b) == 10
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=LOSS_RTOL, atol=0)
    s1, s2 = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert s2["test_acc"] == pytest.approx(s1["test_acc"], abs=1e-9)  # sharded evaluation, gathered
    assert s2["distributed"]["world_size"] == 2 and s2["distributed"]["global_batch_size"] == 100
    assert s2["distributed"]["batch_size_per_rank"] == 50 and len(s2["distributed"]["peak_rss_mb_per_rank"]) == 2
    assert s1["distributed"] is None
    assert "[rank 1]" not in two.stderr  # the other ranks log warnings and errors only


@pytest.mark.slow
def test_neutronorch_ranks_computing_shared_hot_rows_once_reproduce_one_process(tmp_path):
    """With every bottom-layer destination hot (ratio 1), one process and 2 ranks serve every bottom row
    from hot rows computed from the same snapshots, so 2 ranks reproduce one process: with each rank
    computing all of its hot rows and with rows hot on both ranks computed once (and exchanged), the hot
    rows' gradient included, and the uneven last batch (rank 1 has no part of it) weighed as one process
    weighs it."""
    args = ["--split", "ratio:0.10025,0.05", "--mode", "neutronorch", "--hot-ratio", "1.0", "--snapshot-lead", "2",
            "--host-threads", "1", "--epochs", "2"]
    one = _run([sys.executable, "-m", "neutronorch", "train", *COMMON, *args, "--batch-size", "100",
                "--log-jsonl", str(tmp_path / "one.jsonl"), "--summary-json", str(tmp_path / "one.json")])
    assert one.returncode == 0, one.stderr
    reference = json.loads((tmp_path / "one.json").read_text())
    hot = {}
    for hot_set in ("rank", "node"):
        two = _run(_torchrun([*args, "--batch-size", "50", "--hot-set", hot_set, "--log-jsonl",
                              str(tmp_path / f"{hot_set}.jsonl"), "--summary-json", str(tmp_path / f"{hot_set}.json")]))
        assert two.returncode == 0, two.stderr
        torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / f"{hot_set}.jsonl")),
                                   torch.tensor(_step_losses(tmp_path / "one.jsonl")), rtol=LOSS_RTOL, atol=0)
        summary = json.loads((tmp_path / f"{hot_set}.json").read_text())
        assert summary["test_acc"] == pytest.approx(reference["test_acc"], abs=1e-9)
        assert summary["neutronorch"]["hot_set"] == hot_set
        hot[hot_set] = summary["hot"]
    # The same hot sets either way (rank 0's own: fewer than the one process's); per node, rank 0 computed
    # only part of its rows, the others coming from rank 1.
    assert hot["node"]["mean_hot_per_super_batch"] == hot["rank"]["mean_hot_per_super_batch"]
    assert hot["rank"]["mean_hot_per_super_batch"] < reference["hot"]["mean_hot_per_super_batch"]
    assert hot["rank"]["mean_computed_per_super_batch"] == hot["rank"]["mean_hot_per_super_batch"]
    assert (hot["node"]["mean_hot_per_super_batch"] / 2 < hot["node"]["mean_computed_per_super_batch"]
            < hot["node"]["mean_hot_per_super_batch"])


@pytest.mark.slow
def test_two_nodes_on_loopback_train_as_one(tmp_path):
    """Two launchers, one per 'node', meeting at 127.0.0.1: the multi-node form; in device mode (the torch
    sampler, keyed by vertex too) with GAT graph blocks (attention dropout keyed by edge, the blocks'
    dropouts by vertex)."""
    port = str(_free_port())
    launch = lambda node: subprocess.Popen(  # noqa: E731
        _torchrun([*GAT_BLOCKS, "--epochs", "1", "--batch-size", "32",
                   "--log-jsonl", str(tmp_path / f"n{node}.jsonl")], nproc=1,
                  extra=["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                         "--master-port", port]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    nodes = [launch(0), launch(1)]
    outputs = [p.communicate(timeout=240) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outputs
    one = _run([sys.executable, "-m", "neutronorch", "train", *COMMON, *GAT_BLOCKS, "--epochs", "1",
                "--batch-size", "64", "--log-jsonl", str(tmp_path / "one.jsonl")])
    assert one.returncode == 0, one.stderr
    torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / "n0.jsonl")),
                               torch.tensor(_step_losses(tmp_path / "one.jsonl")), rtol=LOSS_RTOL, atol=0)


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_step_and_resume_continues_exactly(tmp_path):
    """In NeutronOrch mode with shared hot rows computed once per node: every rank's hot rows checked against
    the staleness bound at every use, each rank's pipeline state saved and resumed (a fixed ratio and
    snapshot lead make a resume exact; the super-batch in progress is exchanged again alike)."""
    args = ["--mode", "neutronorch", "--hot-ratio", "0.2", "--snapshot-lead", "2", "--host-threads", "1",
            "--hot-set", "node", "--dataset", "synthetic:nodes=20000,features=16,degree=8", "--epochs", "3", "--batch-size", "16",
            "--checkpoint-dir", str(tmp_path / "ck"), "--log-jsonl", str(tmp_path / "log.jsonl"),
            "--summary-json", str(tmp_path / "s.json")]
    job = subprocess.Popen(_torchrun(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                           start_new_session=True)
    log = tmp_path / "log.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 30):
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGTERM)  # a scheduler's SIGTERM reaches the launcher and every rank
    _, err = job.communicate(timeout=120)
    assert "interrupted: stopped on request" in err, err
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["status"] == "interrupted"
    state = torch.load(tmp_path / "ck" / "last.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["mode_state"]["ranks"]) == 2
    stopped = (state["epoch"], state["position"]["step"])
    # One process cannot continue a 2-rank run: a clear refusal.
    alone = _run([sys.executable, "-m", "neutronorch", "train", *COMMON, *args, "--resume"])
    assert alone.returncode == 2 and "data-parallel rank" in alone.stderr and "--nproc-per-node" in alone.stderr
    resumed = _run(_torchrun([*args, "--resume", "--log-jsonl", str(tmp_path / "resumed.jsonl")]))
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from" in resumed.stderr
    whole = _run(_torchrun([*args[:-6], "--log-jsonl", str(tmp_path / "whole.jsonl")]))
    assert whole.returncode == 0, whole.stderr
    reference = _step_losses(tmp_path / "whole.jsonl")
    steps_per_epoch = len(reference) // 3
    done = stopped[0] * steps_per_epoch + stopped[1]
    torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / "resumed.jsonl")),
                               torch.tensor(reference[done:]), rtol=LOSS_RTOL, atol=0)


@pytest.mark.slow
def test_a_rank_that_dies_makes_the_others_fail_with_a_message(tmp_path):
    port = str(_free_port())
    args = ["--dataset", "synthetic:nodes=20000,features=16,degree=8", "--epochs", "50", "--batch-size", "16",
            "--log-jsonl", str(tmp_path / "log.jsonl"), "--dist-timeout", "60"]
    launch = lambda node: subprocess.Popen(  # noqa: E731
        _torchrun(args, nproc=1, extra=["--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                                        "--master-port", port]),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), start_new_session=True)
    nodes = [launch(0), launch(1)]
    log = tmp_path / "log.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().splitlines()) < 5):
        time.sleep(0.2)
    for pid in _children(nodes[1].pid):  # node 1's rank dies (the launcher starts ranks in their own sessions)
        os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    _, err = nodes[0].communicate(timeout=120)
    assert nodes[0].returncode != 0
    assert time.monotonic() - start < 90  # not a hang
    assert "neutronorch: error (rank 0)" in err and "Another rank failed or stopped answering" in err, err[-3000:]
    nodes[1].wait(timeout=60)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="data parallel on CUDA needs 2 GPUs (NCCL, one per rank)")
def test_two_gpu_ranks_reproduce_one_gpu(tmp_path):
    on_gpu = [a if a != "cpu" else "cuda" for a in COMMON]
    one = _run([sys.executable, "-m", "neutronorch", "train", *on_gpu, "--epochs", "2", "--batch-size", "64",
                "--log-jsonl", str(tmp_path / "one.jsonl")])
    assert one.returncode == 0, one.stderr
    two = _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", "-m",
                "neutronorch", "train", *on_gpu, "--epochs", "2", "--batch-size", "32", "--log-jsonl",
                str(tmp_path / "two.jsonl")])
    assert two.returncode == 0, two.stderr
    assert "backend nccl" in two.stderr
    torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / "two.jsonl")),
                               torch.tensor(_step_losses(tmp_path / "one.jsonl")), rtol=1e-4, atol=0)


def test_more_ranks_than_gpus_is_refused_before_the_group_forms(monkeypatch):
    from neutronorch.errors import ConfigError
    from neutronorch.train.distributed import rank_device
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match="4 ranks on this machine but 2 GPU"):
        rank_device(torch.device("cuda"))
    assert rank_device(torch.device("cpu")) == torch.device("cpu")


@pytest.mark.slow
def test_two_ranks_reproduce_one_process_on_a_link_task(tmp_path):
    # Each rank trains its part of every global batch of seed edges, with the negatives the one process draws
    # for them; the losses are weighed by positives, and evaluation's embeddings are computed in shares.
    args = ["--task", "link", "--epochs", "2", "--negatives", "2"]
    one = _run([sys.executable, "-m", "neutronorch", "train", *COMMON, *args, "--batch-size", "256",
                "--log-jsonl", str(tmp_path / "one.jsonl"), "--summary-json", str(tmp_path / "one.json")])
    assert one.returncode == 0, one.stderr
    two = _run(_torchrun([*args, "--batch-size", "128", "--log-jsonl", str(tmp_path / "two.jsonl"),
                          "--summary-json", str(tmp_path / "two.json")]))
    assert two.returncode == 0, two.stderr
    a, b = _step_losses(tmp_path / "one.jsonl"), _step_losses(tmp_path / "two.jsonl")
    assert len(a) == len(b) > 4
    torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=LOSS_RTOL, atol=0)
    s1, s2 = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert s2["final_test_mrr"] == pytest.approx(s1["final_test_mrr"], abs=1e-6)
