"""Data-parallel typed runs (``train/distributed.py``): two CPU ranks with gloo, launched by
``torch.multiprocessing.spawn`` into a process group the test makes (the ``train(config, graph=typed)`` path)
and by torchrun (the command line).

Two ranks with ``batch_size`` B train what one process trains with 2B: a vertex draws the same neighbours and
dropout masks whichever rank holds it, the dense gradients are averaged by loss terms, the embedding tables'
rows gathered, weighted and applied alike on every rank. So the ranks end with identical weights, tables and
table moments, bit for bit, equal to one process's up to the order of float sums; and a stop asked of one
rank stops both after the same step, rank 0's checkpoint resuming exactly."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data import synthetic_typed, write_typed
from neutronorch.errors import Interrupted
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.orchestration.factory import build_mode
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.task import Task
from neutronorch.train.table_grads import combine_rows, own_rows
from neutronorch.train.step import step_masks
from neutronorch.features.store import TypedInputs

LOSS_RTOL = 1e-5  # as the homogeneous tests: the same arithmetic up to the order of float sums
# 121 training papers in global batches of 2 x 30: 60, 60, then one seed, of which rank 1 has no part.
TRAIN, BATCH, STOP_AFTER = 121, 30, 4


def small_graph():
    graph = synthetic_typed(nodes=1200, train=0.3, val=0.1, seed=0)
    return dataclasses.replace(graph, train_idx=np.asarray(graph.train_idx[:TRAIN]))


def settings(**extra) -> TrainConfig:
    base = dict(epochs=2, fanouts=[3, 3], hidden=16, batch_size=BATCH, lr=0.01, dropout=0.5, threads=1,
                sampler_threads=1, device="cpu", log_every=1, progress=False)
    return TrainConfig(**{**base, **extra})


def _env() -> dict:
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _step_losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "step"]


def _trained(config: TrainConfig, graph, stop=None, progress=None) -> tuple[dict | str, dict]:
    """``train``, and the run's weights, tables and table moments at its end (caught where the run is made)."""
    trainer = importlib.import_module("neutronorch.train.trainer")  # the package's name is train()'s
    runs, original = [], trainer.build_run
    trainer.build_run = lambda *args: (lambda run: (runs.append(run), run)[1])(original(*args))
    try:
        summary = train(config, graph=graph, stop=stop, progress=progress)
    except Interrupted as exc:
        summary = str(exc)
    finally:
        trainer.build_run = original
    run = runs[0]
    tables = run.typed.sparse.state_dict()["tables"]
    state = {**{k: v.detach().clone() for k, v in run.model.state_dict().items()},
             **{f"table{i}.{k}": t[k].clone() for i, t in enumerate(tables) for k in ("exp_avg", "exp_avg_sq")},
             **{f"table{i}.step": torch.tensor(t["step"]) for i, t in enumerate(tables)}}
    return summary, state


def _rank(rank: int, folder: str) -> None:
    """One rank: an uninterrupted run, a run that rank 1 alone asks to stop, and its resume."""
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    graph, out = small_graph(), Path(folder)
    whole, state = _trained(settings(log_jsonl=f"{folder}/two.jsonl", summary_json=f"{folder}/two.json",
                                     checkpoint_dir=f"{folder}/whole"), graph)
    torch.save(state, out / f"whole-{rank}.pt")
    stop = __import__("threading").Event()
    asked = (lambda epoch, done, total: stop.set() if epoch * 3 + done == STOP_AFTER else None) if rank == 1 else None
    stopped, _ = _trained(settings(checkpoint_dir=f"{folder}/stopped", summary_json=f"{folder}/stopped.json"),
                          graph, stop, asked)
    (out / f"stopped-{rank}.txt").write_text(stopped if isinstance(stopped, str) else "completed")
    if rank == 0:  # what the stop left, before the resume writes over it
        shutil.copy(out / "stopped" / "last.pt", out / "stopped-last.pt")
    _, state = _trained(settings(checkpoint_dir=f"{folder}/stopped", resume=True,
                                 log_jsonl=f"{folder}/resumed.jsonl"), graph)
    torch.save(state, out / f"resumed-{rank}.pt")
    assert torch.distributed.is_initialized()  # the caller's group: left for the caller
    torch.distributed.destroy_process_group()


def _spawn(rank_function, folder: Path) -> None:
    """``rank_function(rank, folder)`` on two spawned ranks."""
    before = {name: os.environ.get(name) for name in _env()}
    os.environ.update(_env())  # before the children start: numba reads its thread count at import
    try:
        torch.multiprocessing.spawn(rank_function, args=(str(folder),), nprocs=2)
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """The runs of ``_rank`` on two spawned ranks, and one process with twice the batch (``one-*``)."""
    folder = tmp_path_factory.mktemp("typed-ranks")
    _spawn(_rank, folder)
    summary, state = _trained(settings(batch_size=2 * BATCH, log_jsonl=str(folder / "one.jsonl"),
                                       summary_json=str(folder / "one.json")), small_graph())
    torch.save(state, folder / "one.pt")
    return folder


@pytest.mark.slow
def test_two_ranks_end_identical_and_equal_one_process_with_twice_the_batch(two_ranks):
    ranks = [torch.load(two_ranks / f"whole-{r}.pt") for r in range(2)]
    one = torch.load(two_ranks / "one.pt")
    assert ranks[0].keys() == ranks[1].keys() == one.keys() and any(k.startswith("embeddings.") for k in one)
    for key in one:
        assert torch.equal(ranks[0][key], ranks[1][key]), key  # bit for bit
        torch.testing.assert_close(ranks[0][key], one[key], rtol=1e-4, atol=1e-5, msg=key)
    assert int(one["table0.step"]) == 6  # every step moved the tables, the one with an empty part too
    two, single = _step_losses(two_ranks / "two.jsonl"), _step_losses(two_ranks / "one.jsonl")
    assert len(two) == len(single) == 6  # rank 0's log alone: not both ranks' lines
    torch.testing.assert_close(torch.tensor(two), torch.tensor(single), rtol=LOSS_RTOL, atol=0)
    s2, s1 = (json.loads((two_ranks / f"{n}.json").read_text()) for n in ("two", "one"))
    assert s2["test_acc"] == pytest.approx(s1["test_acc"], abs=1e-9)  # sharded evaluation, gathered
    assert s2["distributed"]["world_size"] == 2 and s2["distributed"]["global_batch_size"] == 2 * BATCH
    assert len(s2["distributed"]["peak_rss_mb_per_rank"]) == 2 and s1["distributed"] is None


@pytest.mark.slow
def test_a_stop_asked_of_one_rank_stops_both_and_rank_0s_checkpoint_resumes_exactly(two_ranks):
    """Rank 1 alone is asked to stop after the run's step 4 (epoch 1, step 1): the ranks agree on it in the next
    step's reduction and both stop after it (epoch 1, step 2), where rank 0 writes last.pt; resumed from it on
    both ranks, the run ends as the uninterrupted one, to the bit."""
    stopped = [(two_ranks / f"stopped-{r}.txt").read_text() for r in range(2)]
    assert stopped[0] == stopped[1] == "stopped on request in epoch 1 after step 2 of 3", stopped
    assert json.loads((two_ranks / "stopped.json").read_text())["status"] == "interrupted"
    state = torch.load(two_ranks / "stopped-last.pt", weights_only=False)
    assert (state["epoch"], state["position"]["step"]) == (1, 2)
    whole = torch.load(two_ranks / "whole-0.pt")
    resumed = [torch.load(two_ranks / f"resumed-{r}.pt") for r in range(2)]
    for key in whole:
        assert torch.equal(resumed[0][key], whole[key]) and torch.equal(resumed[1][key], whole[key]), key
    assert _step_losses(two_ranks / "resumed.jsonl") == _step_losses(two_ranks / "two.jsonl")[STOP_AFTER + 1:]
    assert {"best.pt", "last.pt"} <= {p.name for p in (two_ranks / "whole").iterdir()}


@pytest.mark.slow
def test_torchrun_trains_a_typed_folder_on_two_ranks_in_device_mode(two_ranks, tmp_path):
    """The command line under torchrun, in device mode (on the CPU, exact mode's batches to the bit): the
    losses of one process with twice the batch in exact mode."""
    folder = write_typed(small_graph(), tmp_path / "mag")
    args = ["--dataset", str(folder), "--mode", "device", "--epochs", "2", "--fanouts", "3,3", "--hidden", "16",
            "--batch-size", str(BATCH), "--lr", "0.01", "--dropout", "0.5", "--threads", "1", "--sampler-threads",
            "1", "--device", "cpu", "--log-every", "1", "--no-progress", "--no-stage-table",
            "--log-jsonl", str(tmp_path / "cli.jsonl"), "--summary-json", str(tmp_path / "cli.json")]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "neutronorch", "train", *args], capture_output=True, text=True, timeout=240,
                          env=_env())
    assert done.returncode == 0, done.stderr
    assert "[rank 1]" not in done.stderr  # the other ranks log warnings and errors only
    torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / "cli.jsonl")),
                               torch.tensor(_step_losses(two_ranks / "one.jsonl")), rtol=LOSS_RTOL, atol=0)
    summary = json.loads((tmp_path / "cli.json").read_text())
    assert summary["mode"] == "device" and summary["distributed"]["world_size"] == 2


def test_a_vertex_draws_the_same_neighbours_and_masks_whichever_rank_holds_it():
    """A global batch sampled whole and in two parts with its key: every (hop, relation, destination) draws
    the same sources; a training forward under the batch's dropout stream gives each seed the same logits,
    an empty part none, and leaves torch's generator alone."""
    graph = small_graph().with_reverse()
    sampler = TypedNeighborSampler(graph, [3, 3])
    seeds = np.asarray(epoch_order(torch.from_numpy(np.asarray(graph.train_idx)), 0, 1)[:61])
    parts = [seeds[:31], seeds[31:], seeds[:0]]
    key = batch_key(0, 1, 2)
    drawn = [neighbours(sampler.sample(s, key)) for s in (seeds, *parts)]
    assert set(drawn[0]) == set(drawn[1]) | set(drawn[2]) and not drawn[3]
    for part in drawn[1:3]:
        assert all(drawn[0][k] == sources for k, sources in part.items())
    torch.manual_seed(0)
    model = TypedGNN("sage", TypedSpec.of(graph), 16, graph.num_classes, 2, dropout=0.5).train()
    before = torch.get_rng_state()
    logits = [forward(model, graph, sampler, s, key) for s in (seeds, *parts)]
    torch.testing.assert_close(torch.cat(logits[1:]), logits[0], rtol=1e-5, atol=1e-6)
    assert logits[3].shape == (0, graph.num_classes) and torch.equal(torch.get_rng_state(), before)
    assert not torch.equal(logits[0], forward(model, graph, sampler, seeds, key, epoch=2))  # other masks


def neighbours(subgraph) -> dict[tuple, tuple]:
    """(hop from the seeds, relation, destination's global id) -> its drawn sources' global ids, sorted."""
    found = {}
    for layer, tblock in enumerate(subgraph.blocks):
        for (s, name, d), block in tblock.blocks.items():
            dst, src = tblock.dst_ids(d), tblock.src_ids[s]
            for i in range(block.num_dst):
                drawn = src[block.indices[block.indptr[i]:block.indptr[i + 1]]]
                found[(len(subgraph.blocks) - 1 - layer, name, int(dst[i]))] = tuple(sorted(drawn.tolist()))
    return found


def forward(model, graph, sampler, seeds, key, epoch=1):
    subgraph = sampler.sample(seeds, key)
    features, ids = TypedInputs(graph)(subgraph.input_nodes, torch.device("cpu"))
    with step_masks(0, epoch, 2):
        return model(subgraph.blocks, features, ids)


@pytest.mark.parametrize("mode", ["exact", "device"])
def test_typed_modes_train_their_ranks_part_of_each_global_batch(mode):
    graph = small_graph().with_reverse()
    model = TypedGNN("sage", TypedSpec.of(graph), 8, graph.num_classes, 2)
    cpu = torch.device("cpu")

    def seeds(batch_size, shard):
        made = build_mode(TrainConfig(mode=mode, batch_size=batch_size, fanouts=[2, 2], device="cpu"), graph, cpu,
                          shard=shard)
        made.start(model)
        with made.batches(1) as produced:
            return [b.blocks[-1].dst_ids(graph.target) if b.blocks[-1].blocks else torch.zeros(0, dtype=torch.int64)
                    for b in produced]

    one, parts = seeds(2 * BATCH, (0, 1)), [seeds(BATCH, (r, 2)) for r in range(2)]
    assert [s.shape[0] for s in parts[0]] == [30, 30, 1] and [s.shape[0] for s in parts[1]] == [30, 30, 0]
    for k, batch in enumerate(one):
        assert torch.equal(torch.cat([parts[0][k], parts[1][k]]), batch)


def test_the_ranks_table_rows_combine_into_the_global_batchs_gradient():
    """Each part's sparse gradient of its mean loss, weighted by its loss terms and combined, is the global
    batch's (rows both parts looked up summed); and combining is deterministic."""
    graph = small_graph().with_reverse()
    sampler, task = TypedNeighborSampler(graph, [3, 3]), Task.of(graph)
    torch.manual_seed(0)
    model = TypedGNN("rgcn", TypedSpec.of(graph), 16, graph.num_classes, 2, dropout=0.5).train()
    seeds = np.asarray(graph.train_idx[:50])

    def gradients(part):
        model.zero_grad(set_to_none=True)
        subgraph = sampler.sample(part, 7)
        features, ids = TypedInputs(graph)(subgraph.input_nodes, torch.device("cpu"))
        with step_masks(0, 0, 0):
            logits = model(subgraph.blocks, features, ids)
        labels = torch.from_numpy(np.asarray(graph.labels[part], dtype=np.int64))
        task.loss(logits, labels).backward()
        return [own_rows(t) for t in model.embedding_parameters()], float(task.loss_weight(labels))

    whole, _ = gradients(seeds)
    (first, w0), (second, w1) = gradients(seeds[:20]), gradients(seeds[20:])
    for k, table in enumerate(model.embedding_parameters()):
        ranks = [first[k][:2], second[k][:2]]
        combined = combine_rows(ranks, [w0, w1], tuple(table.shape))
        assert combined.is_coalesced() and torch.equal(combined._indices()[0], whole[k][0].sort().values)
        expected = torch.zeros(table.shape).index_put_((whole[k][0],), whole[k][1])
        torch.testing.assert_close(combined.to_dense(), expected, rtol=1e-5, atol=1e-7)
        assert torch.equal(combine_rows(ranks, [w0, w1], tuple(table.shape)).to_dense(), combined.to_dense())
        assert set(first[k][0].tolist()) & set(second[k][0].tolist())  # some rows both parts looked up


# Every bottom-layer destination but the global batch's seeds hot, so that both ranks and one process serve
# every such row from the host, computed from the same snapshots.
NEUTRONORCH = dict(mode="neutronorch", hot_ratio=1.0, super_batch=2, snapshot_lead=2, host_threads=1)


def _neutronorch_rank(rank: int, folder: str) -> None:
    os.environ["GROUP_RANK"] = "0"  # both ranks on one node, which can share hot rows
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    for hot_set in ("rank", "node"):
        _, state = _trained(settings(**NEUTRONORCH, hot_set=hot_set, log_jsonl=f"{folder}/{hot_set}.jsonl",
                                     summary_json=f"{folder}/{hot_set}.json"), small_graph())
        torch.save(state, Path(folder) / f"{hot_set}-{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_neutronorch_on_two_ranks_trains_as_one_process_with_twice_the_batch(tmp_path):
    """Data-parallel NeutronOrch on a typed graph: each rank keeps the other's seeds of a global batch cold,
    and the hot rows' gradient (bottom layer and embedding-table rows) is averaged over the ranks, weighed as
    one process weighs it where the last global batch is uneven (rank 1 has no part of it): the ranks end
    identical, and as one process with twice the batch up to the order of float sums; whether each rank
    computes its hot rows or the node computes a row hot on both once (``hot_set``)."""
    _spawn(_neutronorch_rank, tmp_path)
    summary, one = _trained(settings(**NEUTRONORCH, batch_size=2 * BATCH, log_jsonl=str(tmp_path / "one.jsonl")),
                            small_graph())
    hot = {}
    for hot_set in ("rank", "node"):
        ranks = [torch.load(tmp_path / f"{hot_set}-{r}.pt") for r in range(2)]
        assert ranks[0].keys() == one.keys() and any(k.startswith("embeddings.") for k in one)
        for key in one:
            assert torch.equal(ranks[0][key], ranks[1][key]), key  # bit for bit
            torch.testing.assert_close(ranks[0][key], one[key], rtol=1e-4, atol=1e-5, msg=key)
        torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / f"{hot_set}.jsonl")),
                                   torch.tensor(_step_losses(tmp_path / "one.jsonl")), rtol=LOSS_RTOL, atol=0)
        two = json.loads((tmp_path / f"{hot_set}.json").read_text())
        assert two["distributed"]["world_size"] == 2 and two["neutronorch"]["hot_set"] == hot_set
        hot[hot_set] = two["hot"]
    # The same hot sets either way, each rank's fewer than the one process's; per node, rank 0 computed only
    # part of its rows, the others coming from rank 1.
    assert hot["node"]["mean_hot_per_super_batch"] == hot["rank"]["mean_hot_per_super_batch"]
    assert 0 < hot["rank"]["mean_hot_per_super_batch"] < summary["hot"]["mean_hot_per_super_batch"]
    assert hot["rank"]["mean_computed_per_super_batch"] == hot["rank"]["mean_hot_per_super_batch"]
    assert (hot["node"]["mean_hot_per_super_batch"] / 2 < hot["node"]["mean_computed_per_super_batch"]
            < hot["node"]["mean_hot_per_super_batch"])


def test_a_vertex_keeps_its_masks_when_its_part_of_the_batch_reaches_fewer_types():
    """Papers 2 and 3 have no author, so the part holding paper 2 never reaches an institution, which the whole
    batch does: the types that come after it (field) still get the whole batch's masks."""
    from neutronorch.data.typed import Relation, TypedGraph  # noqa: PLC0415

    edges = {("author", "writes", "paper"): ([0, 1], [0, 1], 2, 4), ("paper", "cites", "paper"): ([0, 2, 3], [1, 3, 2], 4, 4),
             ("author", "affiliated_with", "institution"): ([0, 1], [0, 0], 2, 1),
             ("paper", "has_topic", "field"): ([0, 2, 3], [0, 1, 1], 4, 2)}
    graph = TypedGraph(
        name="tiny", num_nodes={"paper": 4, "institution": 1, "author": 2, "field": 2},
        relations={r: Relation.from_edges(*e) for r, e in edges.items()},
        features={"paper": np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)}, target="paper",
        labels=np.array([0, 1, 0, 1]), train_idx=np.arange(4), val_idx=np.arange(4), test_idx=np.arange(4),
        num_classes=2).with_reverse()
    sampler = TypedNeighborSampler(graph, [-1, -1, -1])
    torch.manual_seed(0)
    model = TypedGNN("sage", TypedSpec.of(graph), 8, 2, 3, dropout=0.5).train()
    whole, alone = (sampler.sample(np.array(s), 5) for s in ([0, 2], [2]))
    assert "institution" in whole.blocks[0].num_dst and "institution" not in alone.blocks[0].num_dst
    assert alone.blocks[0].num_dst["field"] > 0
    logits = [forward(model, graph, sampler, np.array(s), 5) for s in ([0, 2], [0], [2])]
    torch.testing.assert_close(torch.cat(logits[1:]), logits[0], rtol=1e-5, atol=1e-6)


TYPED_LINK = dict(task="link", link_relation="writes", model="rgcn", eval_negatives=20, epochs=1, hot_set="node",
                  **NEUTRONORCH)


def _typed_link_rank(rank: int, folder: str) -> None:
    os.environ["GROUP_RANK"] = "0"
    torch.distributed.init_process_group("gloo", init_method=f"file://{folder}/rendezvous", rank=rank, world_size=2)
    train(settings(**TYPED_LINK, log_jsonl=f"{folder}/two.jsonl"), graph=small_graph())
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_typed_link_task_in_neutronorch_mode_on_two_ranks_trains_as_one_process(tmp_path):
    """A link batch's seeds are of both end types: each rank keeps the other's seeds of the global batch
    cold, type by type, so two ranks (sharing the node's hot rows) take the steps of one process with twice
    the batch."""
    _spawn(_typed_link_rank, tmp_path)
    train(settings(**TYPED_LINK, batch_size=2 * BATCH, log_jsonl=str(tmp_path / "one.jsonl")), graph=small_graph())
    torch.testing.assert_close(torch.tensor(_step_losses(tmp_path / "two.jsonl")),
                               torch.tensor(_step_losses(tmp_path / "one.jsonl")), rtol=LOSS_RTOL, atol=0)
