"""NeutronOrch mode on a partition folder (`train --partitions DIR --mode neutronorch`): each rank plans its hot
sets as the full-copy data-parallel rank dealt by the same parts does, and a hot vertex's bottom-layer row is
computed by its owner for every rank holding it hot. The step losses are the full-copy run's up to the
order of float sums: the owner back-propagates the sum of its holders' dL/dY, where each full-copy rank
back-propagates its own and the ranks then average (in bfloat16 that sum is rounded once, where each rank rounds
its own: docs/distributed.md says by how much they then differ). The rows reach every rank that holds them,
their gradient returns to their owners, and the threads' exchanges stop together wherever a stop leaves them."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.data import load_dataset
from neutronorch.data.partition import assign, write_partition
from neutronorch.errors import ConfigError, Interrupted
from neutronorch.orchestration.neutronorch.parts import OwnerHotSet
from neutronorch.sampling.exchange import Lane, LaneStopped, ThreadExchange
from test_partitioned_sampling import run_threads
from test_partitioned_training import COMMON, GRAPH, _both_runs, _env, _link_partition, _step_losses, spawned

HOT = ["--mode", "neutronorch", "--hot-ratio", "0.5", "--snapshot-lead", "1", "--super-batch", "2",
       "--host-threads", "1"]


def _partition(graph, folder: Path, parts: int, method: str) -> Path:
    write_partition(graph, assign(graph, parts, method, seed=0), parts, folder, method, 0, GRAPH)
    return folder


def test_one_part_in_one_process_trains_as_the_whole_graph_in_neutronorch_mode(tmp_path):
    graph = load_dataset(GRAPH)
    folder = _partition(graph, tmp_path / "p1", 1, "random")
    settings = dict(hidden=16, fanouts=[4, 4], epochs=2, batch_size=100, threads=1, sampler_threads=1, host_threads=1,
                    device="cpu", dropout=0.3, mode="neutronorch", hot_ratio=0.5, snapshot_lead=1, super_batch=2)
    whole = neutronorch.train(neutronorch.TrainConfig(dataset=GRAPH, log_jsonl=str(tmp_path / "a.jsonl"), **settings))
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings))
    assert _step_losses(tmp_path / "b.jsonl") == _step_losses(tmp_path / "a.jsonl")  # bit for bit
    assert parted["test_acc"] == whole["test_acc"]
    assert parted["neutronorch"]["hot_set"] == "owner" and parted["hot"]["reuse_rate"] > 0.3
    assert set(parted["exchange"]["training"]["lanes"]) == {"plan", "cold", "host", "gradient"}


def test_a_hot_set_setting_is_refused_on_parts(tmp_path):
    with pytest.raises(ConfigError) as caught:
        neutronorch.train(neutronorch.TrainConfig(partitions=str(tmp_path / "none"), device="cpu", epochs=1,
                                                  mode="neutronorch", hot_set="node",
                                                  log_jsonl=str(tmp_path / "log.jsonl")))
    assert "Leave `hot_set` out" in str(caught.value), str(caught.value)
    assert not (tmp_path / "log.jsonl").exists()


def test_the_auto_hot_ratio_on_parts_probes_a_parts_hubs_and_tunes(tmp_path):
    folder = _partition(load_dataset(GRAPH), tmp_path / "p1", 1, "random")
    summary = neutronorch.train(neutronorch.TrainConfig(
        partitions=str(folder), hidden=16, fanouts=[4, 4], epochs=4, batch_size=100, threads=1, sampler_threads=1,
        host_threads=1, device="cpu", mode="neutronorch", super_batch=2))
    decisions = [e["hot_ratio_auto"]["decision"] for e in summary["epochs"]]
    assert decisions[0] == "warm-up" and len(decisions) == 4  # the tuner's walk, as on the whole graph
    assert summary["hot"]["drift_per_step"] > 0  # the probe measured the bottom layer's drift
    assert summary["neutronorch"]["hot_ratio_setting"] == "auto"


class _Part:
    """What ``OwnerHotSet`` reads of a part: vertex v is owned by part v % parts."""

    def __init__(self, part: int, parts: int, num_nodes: int = 40):
        self.part, self.parts = part, parts
        self.part_of = (np.arange(num_nodes) % parts).astype(np.int32)


def test_hot_rows_come_from_their_owners_and_their_gradient_goes_back():
    # Three ranks whose hot sets overlap; the owner of v computes its row as [v, -v] (float32 and bfloat16 rows).
    hot = [np.array([7, 3, 12, 0]), np.array([3, 5]), np.array([], np.int64)]
    for dtype in (torch.float32, torch.bfloat16):
        grad_ex = ThreadExchange.group(3)
        results = [None] * 3

        def rank(r, exchange):
            owner = OwnerHotSet(_Part(r, 3), Lane(exchange, "rows"), grad_ex[r], lambda t: t)
            plan = owner.exchange(hot[r])
            computed = owner.computed(hot[r], plan)
            assert (computed % 3 == r).all() and np.unique(computed).shape[0] == computed.shape[0]  # its own, once
            rows = torch.tensor(np.stack([computed, -computed], 1), dtype=dtype)
            table = owner.assemble(rows, plan, len(hot[r]), version=4)
            grad_acc = torch.ones((len(hot[r]), 2)) * (r + 1)  # rank r's dL/dY: r + 1 on each of its rows
            results[r] = (computed, table, owner.gradient_by_type({None: grad_acc}, plan, {}, 2)[None])

        run_threads(rank, 3)
        for r in range(3):
            computed, table, grad = results[r]
            assert table.dtype == dtype and table.float().tolist() == [[v, -v] for v in hot[r].tolist()]
            holders = {v: [k + 1 for k in range(3) if v in hot[k]] for v in computed.tolist()}
            assert grad[:, 0].tolist() == [float(sum(holders[v])) for v in computed.tolist()]
        # In the order first asked, a rank's own asks first (3: held by ranks 0 and 1).
        assert results[0][0].tolist() == [3, 12, 0] and results[1][0].tolist() == [7]


def test_a_rank_that_leaves_its_lane_stops_the_others_at_their_next_unit():
    exchanges = ThreadExchange.group(2, timeout=20)
    lanes = [Lane(e, "the test's lane") for e in exchanges]
    outcome, began = {}, threading.Event()

    def worker():  # rank 0: units until the others stop it
        try:
            for _ in range(100):
                with lanes[0].unit():
                    lanes[0].all_to_all([np.zeros(1)] * 2)
                began.set()
        except LaneStopped as exc:
            outcome["stopped"] = str(exc)

    thread = threading.Thread(target=worker)
    thread.start()
    with lanes[1].unit():  # rank 1 takes part in one unit, then leaves (closed early, say)
        lanes[1].all_to_all([np.zeros(1)] * 2)
    assert began.wait(20)
    t0 = time.monotonic()
    lanes[1].finish()
    thread.join(20)
    assert not thread.is_alive() and time.monotonic() - t0 < 10
    assert "another rank's stopped" in outcome["stopped"]
    calls = lanes[0].calls
    lanes[0].finish()  # stopped already: no agreement follows, so nothing waits for rank 1
    assert lanes[0].calls == calls and lanes[1].state == lanes[0].state == "stopped"


def test_a_unit_that_failed_within_is_followed_by_no_agreement():
    lane = Lane(ThreadExchange.group(1)[0], "the test's lane")
    with pytest.raises(ValueError), lane.unit():
        raise ValueError("failed within the unit")
    calls = lane.calls
    lane.finish()
    assert lane.state == "broken" and lane.calls == calls


@pytest.mark.slow
@pytest.mark.parametrize("task", ["node", "link"])
def test_ranks_on_parts_reproduce_the_full_copy_neutronorch_run(tmp_path, task):
    # Node: 301 training vertices in global batches of 100 (GCN). Link: 9,645 training edges in global batches of
    # 2,000, dealt by their source's owner; the owner of a hot vertex draws its bottom hop without the super-batch's
    # positives, as the ranks holding it hot would. Every rank plans the hot sets of its share, and the owner of
    # each hot vertex computes its row for all of them.
    if task == "node":
        split = "ratio:0.10034,0.05"
        folder = _partition(load_dataset(GRAPH, split, 0), tmp_path / "parts", 2, "metis")
        args, full_args = ["--model", "gcn", "--batch-size", "50"], ["--split", split]
    else:
        folder, full_args = _link_partition(tmp_path / "parts", 2, "metis"), []
        args = ["--task", "link", "--batch-size", "1000", "--eval-negatives", "20"]
    args = [*COMMON, *HOT, *args, "--epochs", "3", "--dropout", "0.4", "--dist-timeout", "60", "--lr", "0.05",
            "--eval-every", "0"]
    (parted, summary), (full, expected) = _both_runs(tmp_path, 2, args, folder, full_args)
    assert len(parted) == len(full) >= 12
    assert parted == pytest.approx(full, rel=1e-5)
    metric = "test_acc" if task == "node" else "test_mrr"
    assert summary[metric] == pytest.approx(expected[metric], abs=0.01)
    assert summary["neutronorch"]["hot_set"] == "owner"
    lanes = summary["exchange"]["training"]["lanes"]
    assert lanes["host"]["received_bytes"] > 0 and lanes["gradient"]["received_bytes"] > 0
    assert summary["hot_rows_exchanged"]["received"] > 0
    record = summary["epochs"][0]["exchange"]
    assert len(record) == 2 and all(set(r["lanes"]) == {"plan", "cold", "host", "gradient"} for r in record)
    assert summary["hot"]["reuse_rate"] > 0.1


def _stop_and_resume(rank: int, directory: str, ranks: int) -> None:
    """Rank ``rank`` of ``ranks`` (one process when 1): the uninterrupted run, then one stopped within a
    super-batch (after step 3 of epoch 1, asked on rank 0 alone: of 2 ranks after step 2, agreed on in the
    next) and resumed."""
    if ranks > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                             world_size=ranks)
    d = Path(directory)
    run = lambda name, resume=False, **given: neutronorch.train(neutronorch.TrainConfig(  # noqa: E731
        partitions=str(d / "parts"), hidden=16, fanouts=[4, 4], batch_size=100 // ranks, threads=1, sampler_threads=1,
        host_threads=1, device="cpu", dropout=0.4, log_every=1, epochs=3, dist_timeout=60, mode="neutronorch",
        hot_ratio=0.5, snapshot_lead=1, super_batch=2, checkpoint_dir=str(d / name), log_jsonl=str(d / f"{name}.jsonl"),
        summary_json=str(d / f"{name}.json"), resume=resume), **given)
    run("whole")
    stop = threading.Event()
    with pytest.raises(Interrupted):
        run("ck", progress=lambda epoch, done, total: epoch == 1 and done == 4 - ranks and rank == 0 and stop.set(),
            stop=stop)
    run("ck", resume=True)
    if ranks > 1:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_neutronorch_run_on_parts_stopped_within_a_super_batch_resumes_as_it_was(tmp_path, monkeypatch, ranks):
    # 301 training vertices, 4 global batches an epoch in super-batches of 2: stopped after step 3 of epoch 1,
    # the resume plans that super-batch again with the hot set its first step used, and the ranks' threads, left
    # anywhere by the stop, stopped together.
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    graph = load_dataset(GRAPH, "ratio:0.10034,0.05", 0)
    _partition(graph, tmp_path / "parts", ranks, "random")
    if ranks == 1:
        _stop_and_resume(0, str(tmp_path), 1)
    else:
        spawned(_stop_and_resume, (str(tmp_path), ranks), 300, ranks)
    whole, resumed = (_step_losses(tmp_path / f"{name}.jsonl") for name in ("whole", "ck"))
    assert len(whole) == 12 and resumed == whole  # bit for bit
    a, b = (json.loads((tmp_path / f"{name}.json").read_text()) for name in ("whole", "ck"))
    assert b["test_acc"] == a["test_acc"] and b["epochs"][1]["resumed_at_step"] == 3
