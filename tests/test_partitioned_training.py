"""Training on a partition folder (`train --partitions DIR`), rank r holding part r only: the per-step losses
are those of the full-copy data-parallel run with as many ranks and the same seeds, dealt to the ranks by the
same parts (`--deal-by`), bit for bit (the same blocks, rows, labels and dropout keys give the same gradients,
reduced the same way), and evaluation, the full-neighbour inference run across the parts, gives the full-copy
run's accuracy. What is not built yet is refused with the reason."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.data import load_dataset
from neutronorch.data.partition import assign, write_partition
from neutronorch.data.partition_files import dealing_owners, load_partition
from neutronorch.errors import ConfigError, DataError, TrainingError
from neutronorch.features.store import FeatureStore
from neutronorch.nn.models import GNN
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.train.distributed import World
from neutronorch.train.evaluate import scored
from neutronorch.train.health import EvaluationCheck
from neutronorch.train.layerwise import layerwise, sampled_logits
from neutronorch.train.link_task import link_graph
from neutronorch.train.part_eval import PartEvaluation, SplitCounts
from neutronorch.train.task import Task
from test_partitioned_sampling import run_threads

GRAPH = "synthetic:nodes=3000,features=16,degree=8"
COMMON = ["--hidden", "16", "--fanouts", "4,4", "--threads", "1", "--sampler-threads", "1", "--no-progress",
          "--no-stage-table", "--device", "cpu", "--log-every", "1", "--no-save"]


@pytest.fixture(scope="module")
def graph():
    return load_dataset(GRAPH)


def _partition(graph, folder: Path, parts: int, method: str = "metis") -> Path:
    write_partition(graph, assign(graph, parts, method, seed=0), parts, folder, method, 0, GRAPH)
    return folder


def _env() -> dict:
    return {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _step_losses(path: Path) -> list[float]:
    return [r["loss"] for r in map(json.loads, path.read_text().splitlines()) if r["kind"] == "step"]


@pytest.mark.parametrize("model", ["sage", "gat"])
@pytest.mark.parametrize("parts", [2, 4])
def test_inference_across_parts_gives_the_whole_graphs_logits(graph, tmp_path, parts, model):
    folder = _partition(graph, tmp_path / "p", parts, "random")
    torch.manual_seed(0)
    net = GNN(model, graph.feature_dim, 12, graph.num_classes, 3, heads=2).eval()
    nodes = np.concatenate([graph.val_idx, graph.test_idx]).astype(np.int64)
    whole = layerwise(net, graph, FeatureStore(graph.features, graph.labels), torch.from_numpy(nodes),
                      torch.device("cpu"), chunk_size=300)

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        mine = nodes[np.asarray(part.part_of[nodes]) == r]
        evaluation = PartEvaluation(part, exchange, World())
        return mine, evaluation.logits(net, mine, torch.device("cpu"), 256 + 50 * r)  # chunks differ by rank

    got = run_threads(rank, parts)
    mine = np.concatenate([got[r][0] for r in range(parts)])
    logits = torch.cat([got[r][1] for r in range(parts)])
    expected = whole[torch.from_numpy(_positions(nodes, mine))]
    # The same rows of the same neighbours: equal up to the order of float32 sums in the matrix products.
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("parts", [2, 3])
def test_sampled_inference_across_parts_gives_the_whole_graphs_logits(graph, tmp_path, parts):
    folder = _partition(graph, tmp_path / "p", parts, "random")
    torch.manual_seed(0)
    net = GNN("sage", graph.feature_dim, 12, graph.num_classes, 2).eval()
    nodes = np.concatenate([graph.val_idx, graph.test_idx]).astype(np.int64)
    logits = sampled_logits(net, graph, FeatureStore(graph.features, graph.labels), [4, 3], torch.device("cpu"))
    with torch.no_grad():
        whole = torch.cat([logits(torch.from_numpy(nodes[start:start + 300]), batch_key(5, -1, index))
                           for index, start in enumerate(range(0, nodes.shape[0], 300))])

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        positions = np.flatnonzero(np.asarray(part.part_of[nodes]) == r)
        chunks = PartEvaluation(part, exchange, World()).sampled(net, nodes, positions, [4, 3], torch.device("cpu"),
                                                                 300, 5)
        return positions, torch.cat([torch.zeros(0, graph.num_classes), *chunks])

    got = run_threads(rank, parts)
    positions = np.concatenate([got[r][0] for r in range(parts)])
    assert sorted(positions.tolist()) == list(range(nodes.shape[0]))
    # Each vertex draws the neighbours it draws in the whole graph's chunk: equal up to float32 sum order.
    torch.testing.assert_close(torch.cat([got[r][1] for r in range(parts)]), whole[torch.from_numpy(positions)],
                               rtol=1e-5, atol=1e-6)


def _positions(nodes: np.ndarray, ids: np.ndarray) -> np.ndarray:
    where = {int(v): i for i, v in enumerate(nodes)}
    return np.array([where[int(v)] for v in ids], dtype=np.int64)


class _ThreadWorld:
    """The two collectives of ``SplitCounts.scores`` among threads: a rank's view of a shared world."""

    def __init__(self, rank: int, shared: dict):
        self.rank, self.shared = rank, shared

    def _swap(self, value) -> list:
        self.shared["slots"][self.rank] = value
        self.shared["barrier"].wait()
        every = list(self.shared["slots"])
        self.shared["barrier"].wait()
        return every

    def all_gather_rows(self, rows, what):
        return self._swap(rows)

    def all_reduce_(self, tensor, what):
        return tensor.copy_(sum(self._swap(tensor.clone())))


def _counted_on_ranks(task, logits, labels, split, ranks=3):
    """Each of ``ranks`` threads scores its share (vertices dealt at random) with ``SplitCounts``, its logits
    counted in chunks of a size of its own: per rank its scores (or its ``TrainingError``) and the collapse
    reasons its check kept."""
    owner = np.random.default_rng(1).integers(0, ranks, logits.shape[0])
    shared, results = {"slots": [None] * ranks, "barrier": threading.Barrier(ranks, timeout=30)}, [None] * ranks

    def one(rank):
        mine, check = torch.from_numpy(np.flatnonzero(owner == rank)), EvaluationCheck(1)
        counts = SplitCounts(task.num_classes, logits.shape[1], mine, mine < split, labels[mine])
        for chunk in torch.split(logits[mine], 5 + 17 * rank):
            counts.add(chunk)
        try:
            results[rank] = counts.scores(_ThreadWorld(rank, shared), task.metric, check)
        except TrainingError as exc:
            results[rank] = exc
        results[rank] = (results[rank], check.reasons)

    threads = [threading.Thread(target=one, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


@pytest.mark.parametrize("metric", ["accuracy", "f1-macro", "f1-micro"])
def test_ranks_adding_up_their_counts_score_as_one_process_scores_all_logits(metric):
    generator = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(500, 5, generator=generator), torch.randint(-1, 5, (500,), generator=generator)
    labels[:3] = 4  # one class only in a few labels: macro-F1 averages over the classes that occur
    task, split = Task(False, 5, metric), 200
    expected = scored(task, {"val": (logits[:split], labels[:split]), "test": (logits[split:], labels[split:])},
                      EvaluationCheck(1))
    assert all(result == expected for result, _ in _counted_on_ranks(task, logits, labels, split))
    assert task.counted and not Task(True, 5, "accuracy").counted and not Task(False, 5, "rocauc").counted


@pytest.mark.parametrize("make, reason", [
    (lambda logits: logits[:1].expand(logits.shape[0], -1), "every vertex given the same scores"),
    (lambda logits: logits[:1] + 1e-7 * torch.rand(logits.shape), "every vertex given the same scores"),
    (lambda logits: logits[:1] + torch.tensor([0.0, 0.0, 50.0, 0.0]) + 1e-3 * torch.rand(logits.shape),
     "one class (2) predicted for every vertex"),
    (lambda logits: logits + torch.tensor([0.0, 0.0, 50.0, 0.0]), "one class (2) predicted for every vertex"),
])
def test_a_collapse_is_found_from_the_counts_as_from_all_logits(make, reason):
    generator = torch.Generator().manual_seed(0)
    logits, labels = make(torch.randn(300, 4, generator=generator)), torch.randint(0, 4, (300,), generator=generator)
    task, check = Task(False, 4, "accuracy"), EvaluationCheck(1)
    scored(task, {"val": (logits[:100], labels[:100]), "test": (logits[100:], labels[100:])}, check)
    assert check.reasons == [reason]
    assert [reasons for _, reasons in _counted_on_ranks(task, logits, labels, 100)] == [[reason]] * 3


def test_non_finite_logits_on_one_rank_stop_every_rank():
    logits, labels = torch.randn(90, 3), torch.randint(0, 3, (90,))
    logits[7, 1] = float("nan")
    results = _counted_on_ranks(Task(False, 3, "accuracy"), logits, labels, 50)
    assert all(isinstance(r, TrainingError) and "1 of the 50 validation vertices" in str(r) for r, _ in results)


class _Item:
    def release(self) -> None:
        pass


def test_a_close_on_one_rank_before_the_other_leaves_no_producer_waiting_for_exchanges(monkeypatch):
    """A stop agreed on at step 3 closes the ranks' batches at different times. Their producers, the slower
    stage here, exchange once a batch: without aligning the close, rank 1's producer begins a batch rank 0's
    never begins and waits for it until the exchange's timeout."""
    from neutronorch.orchestration.pipeline import Prefetcher  # noqa: PLC0415
    from neutronorch.train.part_mode import AlignedBatches, limited  # noqa: PLC0415
    timeout, depth = 4.0, 2
    exchanges = ThreadExchange.group(2, timeout=timeout)
    made, spent, errors = [[], []], [0.0, 0.0], []

    def produce(rank):
        for i in range(50):
            exchanges[rank].all_to_all([np.array([i])] * 2)
            time.sleep(0.02)
            made[rank].append(i)
            yield _Item()

    def rank(r):
        try:
            limit: dict = {}
            batches = AlignedBatches(Prefetcher(lambda: limited(produce(r), limit), depth=depth), limit, depth)
            for _ in range(3):
                next(batches)
            time.sleep(0.3 * r)  # rank 1 reaches the close later
            t0 = time.perf_counter()
            batches.close()
            spent[r] = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    assert made[0] == made[1] == list(range(3 + depth + 1))  # the same batches made on both ranks
    assert max(spent) < timeout / 2, spent  # no producer waited for an exchange its peer never began


def test_one_part_in_one_process_trains_as_the_whole_graph(graph, tmp_path):
    folder = _partition(graph, tmp_path / "p1", 1, "random")
    settings = dict(hidden=16, fanouts=[4, 4], epochs=1, batch_size=100, threads=1, sampler_threads=1,
                    device="cpu", dropout=0.3)
    whole = neutronorch.train(neutronorch.TrainConfig(dataset=GRAPH, log_jsonl=str(tmp_path / "a.jsonl"),
                                                      **settings))
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings))
    assert _step_losses(tmp_path / "b.jsonl") == _step_losses(tmp_path / "a.jsonl")  # bit for bit
    assert parted["test_acc"] == whole["test_acc"] and parted["val_acc"] == whole["val_acc"]
    assert parted["config"]["partitions"] == str(folder) and parted["dataset"]["nodes"] == graph.num_nodes
    assert parted["epochs"][0]["exchange"][0]["exchanges"] > 0
    assert parted["exchange"]["evaluation"]["exchanges"] > 0  # one process: its own rows, through the exchange


def test_rows_normalised_part_by_part_train_as_the_whole_graphs(graph, tmp_path):
    positive = dataclasses.replace(graph, features=np.abs(graph.features) * 3)  # row sums above 1, normalised
    folder = _partition(positive, tmp_path / "p1", 1, "random")
    settings = dict(hidden=16, fanouts=[4, 4], epochs=1, batch_size=100, threads=1, sampler_threads=1,
                    device="cpu", normalize_features="row")
    whole = neutronorch.train(neutronorch.TrainConfig(log_jsonl=str(tmp_path / "a.jsonl"), **settings), positive)
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings))
    assert _step_losses(tmp_path / "b.jsonl") == _step_losses(tmp_path / "a.jsonl")  # bit for bit
    assert parted["test_acc"] == whole["test_acc"]
    negative = _partition(graph, tmp_path / "n1", 1, "random")  # rows with negative values: no sums to divide by
    with pytest.raises(ConfigError, match="negative"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(negative), **settings))


@pytest.mark.parametrize("settings, message", [
    (dict(link_direction="directed"), "`link_direction` directed"),
    (dict(mode="device"), "`mode` device"),
    (dict(split="ratio:0.5,0.2"), "`split` ratio:0.5,0.2"),
    (dict(dataset="synthetic:nodes=100"), "give one of them"),
    (dict(deal_by="parts"), "a partitioned run deals by its own parts"),
    (dict(task="link", eval_fanouts=[4, 4]), "with `task` link"),
    (dict(task="link", normalize_features="row"), "`normalize_features` row with `task` link"),
])
def test_what_is_not_built_yet_is_refused_with_the_reason(tmp_path, settings, message):
    with pytest.raises(ConfigError) as caught:
        neutronorch.train(neutronorch.TrainConfig(partitions=str(tmp_path / "none"), device="cpu", epochs=1,
                                                  log_jsonl=str(tmp_path / "log.jsonl"), **settings))
    assert message in str(caught.value), str(caught.value)
    assert not (tmp_path / "log.jsonl").exists()  # refused before any output is made


LINK = dict(task="link", hidden=16, fanouts=[4, 4], batch_size=256, eval_negatives=20, threads=1,
            sampler_threads=1, device="cpu")


def _link_partition(folder: Path, parts: int, method: str = "random", seed: int = 0) -> Path:
    link = link_graph(load_dataset(GRAPH), neutronorch.TrainConfig(dataset=GRAPH, task="link", seed=seed))
    write_partition(link, assign(link, parts, method, seed=seed), parts, folder, method, seed, GRAPH)
    return folder


def test_a_partitions_task_is_its_own(graph, tmp_path):
    nodes, links = _partition(graph, tmp_path / "n", 1, "random"), _link_partition(tmp_path / "l", 1)
    for folder, task, message in ((nodes, "link", "holds no link split"), (links, "node", "give `task` link")):
        with pytest.raises(ConfigError, match=message):
            neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), task=task, device="cpu", epochs=1,
                                                      log_jsonl=str(tmp_path / "log.jsonl")))
    assert not (tmp_path / "log.jsonl").exists()
    with pytest.raises(ConfigError, match="`negatives` 3: a link task"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(nodes), negatives=3, device="cpu", epochs=1))


def test_a_link_task_on_one_part_in_one_process_trains_as_the_whole_graph(tmp_path):
    folder = _link_partition(tmp_path / "p1", 1)
    settings = dict(LINK, epochs=1, dropout=0.3, metric="hits@10")
    whole = neutronorch.train(neutronorch.TrainConfig(dataset=GRAPH, log_jsonl=str(tmp_path / "a.jsonl"),
                                                      **settings))
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), log_jsonl=str(tmp_path / "b.jsonl"),
                                                       **settings))
    assert _step_losses(tmp_path / "b.jsonl") == _step_losses(tmp_path / "a.jsonl")  # bit for bit
    assert parted["test_hits_10"] == whole["test_hits_10"] and parted["val_hits_10"] == whole["val_hits_10"]
    for key in ("val_mrr", "test_mrr", "val_rocauc", "test_rocauc"):  # every metric reported
        assert parted["epochs"][0][key] == whole["epochs"][0][key], key
    assert parted["link"]["edges"] == whole["link"]["edges"]


def test_stored_negatives_are_scored_on_parts_as_in_the_full_copy_run(tmp_path):
    import dataclasses  # noqa: PLC0415
    from neutronorch.data.partition_links import split_for_partition  # noqa: PLC0415
    link = link_graph(load_dataset(GRAPH), neutronorch.TrainConfig(dataset=GRAPH, task="link"))
    negatives = np.random.default_rng(0).integers(0, link.num_nodes, (2, 300)).astype(np.int64)
    stored = dataclasses.replace(link.links, val_neg=negatives, test_neg=negatives[:, ::-1].copy(), negatives="shared",
                                 metric="hits@20", issues=None, checked=None)
    own = split_for_partition(dataclasses.replace(link, links=stored), None, 0, GRAPH)  # kept, and checked
    write_partition(own, assign(own, 1, "random", 0), 1, tmp_path / "p", "random", 0, GRAPH)
    settings = dict(LINK, batch_size=2000, epochs=1)
    del settings["eval_negatives"]  # the stored ones are scored
    whole = neutronorch.train(neutronorch.TrainConfig(**settings), graph=own)
    parted = neutronorch.train(neutronorch.TrainConfig(partitions=str(tmp_path / "p"), **settings))
    assert parted["metric"] == whole["metric"] and parted["test_hits_20"] == whole["test_hits_20"]
    assert parted["val_hits_20"] == whole["val_hits_20"] and parted["link"]["negatives"] == "shared"


class _GatheringWorld(_ThreadWorld):
    distributed = True

    def broadcast_module(self, module, what, buffers_only=False):
        pass


@pytest.mark.parametrize("negatives, metric", [("drawn", "mrr"), ("drawn", "rocauc"), ("shared", "hits@20")])
def test_link_metrics_across_parts_are_the_whole_graphs(tmp_path, negatives, metric):
    import dataclasses  # noqa: PLC0415
    from neutronorch.data.partition_links import split_for_partition  # noqa: PLC0415
    from neutronorch.nn.link import LinkModel  # noqa: PLC0415
    from neutronorch.train.link_task import LinkTask, eval_sets, evaluate_links, named_vertices  # noqa: PLC0415
    from neutronorch.train.part_links import PartLinkEvaluation  # noqa: PLC0415
    from neutronorch.train.partitioned import PartGraph  # noqa: PLC0415
    link, ranks = link_graph(load_dataset(GRAPH), neutronorch.TrainConfig(dataset=GRAPH, task="link")), 3
    if negatives == "shared":  # stored negative pairs, shared by every positive (OGB's kind), dealt in shares too
        pairs = np.random.default_rng(0).integers(0, link.num_nodes, (2, 300)).astype(np.int64)
        stored = dataclasses.replace(link.links, val_neg=pairs, test_neg=pairs[:, ::-1].copy(), negatives="shared",
                                     metric="hits@20", issues=None, checked=None)
        link = split_for_partition(dataclasses.replace(link, links=stored), None, 0, GRAPH)
        folder = tmp_path / "p"
        write_partition(link, assign(link, ranks, "random", 0), ranks, folder, "random", 0, GRAPH)
    else:
        folder = _link_partition(tmp_path / "p", ranks)
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", link.feature_dim, 12, 12, 2), "dot").eval()
    task = LinkTask(model, metric)
    expected = evaluate_links(model, link, FeatureStore(link.features, link.labels), torch.device("cpu"), 300, 0,
                              20, task)
    named = named_vertices(eval_sets(link.links, 0, 20, (0, link.num_nodes)), link.num_nodes).shape[0]
    shared = {"slots": [None] * ranks, "barrier": threading.Barrier(ranks, timeout=60)}

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        run = types.SimpleNamespace(config=neutronorch.TrainConfig(eval_batch_size=200 + 70 * r, eval_negatives=20),
                                    model=model, device=torch.device("cpu"), graph=PartGraph.of(part), task=task)
        evaluation, fetched = PartLinkEvaluation(part, exchange, _GatheringWorld(r, shared)), []
        fetch = evaluation.fetcher.fetch
        evaluation.fetcher.fetch = lambda ids, **kw: fetched.append(len(ids)) or fetch(ids, **kw)
        return evaluation.evaluate(run, EvaluationCheck(1)), fetched[-1]  # the rows its shares name, once

    got = run_threads(rank, ranks)
    assert got[0][0] == got[1][0] == got[2][0]  # every rank reports the same metrics
    assert got[0][0].keys() == expected.keys()
    # The same rows up to the order of float32 sums in the layers' matrix products (chunks differ by rank).
    for key, value in expected.items():
        assert got[0][0][key] == pytest.approx(value, abs=1e-6), key
    if negatives == "shared":  # each rank holds the rows its share of the pairs names, not every named vertex's
        assert all(rows < 0.6 * named for _, rows in got), ([rows for _, rows in got], named)  # about half here


def test_dealing_by_a_partition_of_another_graph_or_part_count_is_refused(graph, tmp_path):
    folder = _partition(graph, tmp_path / "p", 2, "random")
    assert dealing_owners(folder, 2, graph.num_nodes).shape == (graph.num_nodes,)
    with pytest.raises(ConfigError, match="holds 2 parts, but the run has 3 ranks"):
        dealing_owners(folder, 3, graph.num_nodes)
    with pytest.raises(ConfigError, match="the run's graph has 2,999"):
        dealing_owners(folder, 2, graph.num_nodes - 1)


def test_a_link_run_deals_its_seed_edges_by_a_partition(graph, tmp_path):
    folder = _partition(graph, tmp_path / "p", 1, "random")
    settings = dict(dataset=GRAPH, task="link", hidden=8, fanouts=[3, 3], epochs=1, batch_size=256, threads=1,
                    sampler_threads=1, device="cpu", eval_negatives=5, metric="hits@5")
    neutronorch.train(neutronorch.TrainConfig(deal_by=str(folder), log_jsonl=str(tmp_path / "a.jsonl"), **settings))
    neutronorch.train(neutronorch.TrainConfig(log_jsonl=str(tmp_path / "b.jsonl"), **settings))
    assert _step_losses(tmp_path / "a.jsonl") == _step_losses(tmp_path / "b.jsonl")  # one rank: every positive
    with pytest.raises(ConfigError, match="holds 1 parts, but the run has 2 ranks"):
        dealing_owners(folder, 2, graph.num_nodes)


def test_the_command_line_keeps_a_partitioned_run_in_a_run_folder_named_after_the_parts(graph, tmp_path,
                                                                                         monkeypatch):
    from neutronorch.cli import main  # noqa: PLC0415
    folder = _partition(graph, tmp_path / "parts", 1, "random")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--partitions", str(folder), "--epochs", "1", "--hidden", "8", "--fanouts", "3,3",
                 "--threads", "1", "--no-progress", "--device", "cpu"]) == 0
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("-sage-parts"), run.name
    assert (run / "last.pt").is_file() and (run / "best.pt").is_file() and (run / "summary.json").is_file()


def test_a_world_size_other_than_the_part_count_is_refused(graph, tmp_path):
    folder = _partition(graph, tmp_path / "p2", 2, "random")
    with pytest.raises(ConfigError, match="holds 2 parts, but the run has 1 rank;"):
        neutronorch.train(neutronorch.TrainConfig(partitions=str(folder), device="cpu", epochs=1))
    with pytest.raises(DataError, match="a partition folder .*which `partitions` trains"):  # given as a dataset
        neutronorch.train(neutronorch.TrainConfig(dataset=str(folder), device="cpu", epochs=1))


def spawned(target, args: tuple, seconds: float, ranks: int = 2) -> None:
    """``target(rank, *args)`` in ``ranks`` spawned processes, joined; killed, and the test failed, after
    ``seconds``."""
    context = torch.multiprocessing.spawn(target, args=args, nprocs=ranks, join=False)
    deadline = time.monotonic() + seconds
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the ranks did not finish within {seconds} s")


def _train_parts_in_callers_group(rank: int, folder: str, directory: str) -> None:
    from torch.distributed import distributed_c10d  # noqa: PLC0415 - in the spawned process
    torch.distributed.init_process_group("gloo", init_method=f"file://{directory}/rendezvous", rank=rank,
                                         world_size=2)
    summary = neutronorch.train(neutronorch.TrainConfig(
        partitions=folder.format(rank=rank), hidden=16, fanouts=[4, 4], epochs=1, batch_size=64, threads=1,
        sampler_threads=1,
        device="cpu", dist_timeout=60, summary_json=f"{directory}/summary-{rank}.json"))
    assert torch.distributed.is_initialized()  # the caller's group: left for the caller
    assert len(distributed_c10d._world.pg_map) == 1  # the sampling exchange's own group was taken down
    torch.distributed.destroy_process_group()
    Path(directory, f"loss-{rank}").write_text(repr(summary["epochs"][0]["train_loss"]))


@pytest.mark.slow
def test_partitioned_training_in_a_process_group_the_caller_made(graph, tmp_path, monkeypatch):
    for name, value in _env().items():  # before the children start: numba reads its thread count at import
        monkeypatch.setenv(name, value)
    folder = _partition(graph, tmp_path / "parts", 2, "random")
    for rank in range(2):  # as on two machines: each holds the root's files and its own part only
        machine = tmp_path / f"machine-{rank}"
        shutil.copytree(folder, machine, ignore=lambda _, names: [n for n in names if n == f"part-{1 - rank}"])
        assert not (machine / f"part-{1 - rank}").exists()
    spawned(_train_parts_in_callers_group, (str(tmp_path / "machine-{rank}"), str(tmp_path)), 240)
    assert (tmp_path / "loss-0").read_text() == (tmp_path / "loss-1").read_text()  # the global loss on each
    assert (tmp_path / "summary-0.json").is_file() and not (tmp_path / "summary-1.json").exists()


def _both_runs(tmp_path, ranks: int, args: list[str], folder: Path, full_args=()) -> list:
    """(step losses, summary) of ``ranks`` gloo ranks launched on the parts in ``folder``, then of as many on
    the whole graph dealt by them (``--deal-by``)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks), "--standalone", "-m",
              "neutronorch", "train", *args]
    runs = []
    for name, source in (("parts", ["--partitions", str(folder)]),
                         ("full", ["--dataset", GRAPH, *full_args, "--deal-by", str(folder)])):
        done = subprocess.run([*launch, *source, "--log-jsonl", str(tmp_path / f"{name}.jsonl"), "--summary-json",
                               str(tmp_path / f"{name}.json")], capture_output=True, text=True, timeout=300,
                              env=_env())
        assert done.returncode == 0, done.stderr
        runs.append((_step_losses(tmp_path / f"{name}.jsonl"), json.loads((tmp_path / f"{name}.json").read_text())))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("method, ranks, model", [
    ("metis", 2, ["--model", "gcn"]), ("random", 2, ["--precision", "bf16"]),
    ("random", 4, ["--model", "gat", "--heads", "2", "--norm", "batch", "--residual"]),
])
def test_ranks_on_parts_reproduce_the_full_copy_run_bit_for_bit(tmp_path, method, ranks, model):
    # 301 training vertices in global batches of 2 x 50 (4 x 25): the last holds one seed, so the other ranks
    # have none of it. Each rank trains the seeds its part owns; the full-copy run deals them so (`--deal-by`).
    # bf16: the rows rounded as the whole graph's store rounds them.
    split = "ratio:0.10034,0.05"
    graph = load_dataset(GRAPH, split, 0)
    assert len(graph.train_idx) == 301
    folder = _partition(graph, tmp_path / "parts", ranks, method)
    args = [*COMMON, *model, "--epochs", "2", "--batch-size", str(100 // ranks), "--dropout", "0.4",
            "--dist-timeout", "60"]
    (parted, summary), (full, expected) = _both_runs(tmp_path, ranks, args, folder, ["--split", split])
    assert len(parted) == len(full) == 8
    assert parted == full  # bit for bit
    for key in ("val_acc", "test_acc", "final_val_acc", "final_test_acc"):
        assert summary[key] == expected[key], key
    assert summary["distributed"]["world_size"] == ranks
    assert summary["precision"]["name"] == expected["precision"]["name"] == ("bf16" if "bf16" in model else "fp32")
    traffic = summary["epochs"][0]["exchange"]
    assert len(traffic) == ranks and all(t["sent_bytes"] > 0 and t["received_bytes"] > 0 for t in traffic)
    seconds = summary["epochs"][0]["cpu_seconds_per_rank"]  # every rank's, rank 0's the record's own
    assert len(seconds) == ranks and all(s > 0 for s in seconds) and seconds[0] == summary["epochs"][0]["cpu_seconds"]
    assert sum(t["sent_bytes"] for t in traffic) == sum(t["received_bytes"] for t in traffic)
    if ranks == 2:
        assert traffic[0]["sent_bytes"] == traffic[1]["received_bytes"]


@pytest.mark.slow
def test_ranks_on_parts_of_a_link_split_reproduce_the_full_copy_run_bit_for_bit(tmp_path):
    # 9,645 training edges in global batches of 2 x 1,000: each rank trains the positives whose source its part
    # owns, with the negatives one process draws; the full-copy run deals them so (`--deal-by`).
    folder = _link_partition(tmp_path / "parts", 2, "metis")
    args = [*COMMON, "--task", "link", "--epochs", "2", "--batch-size", "1000", "--dropout", "0.4",
            "--eval-negatives", "20", "--dist-timeout", "60"]
    (parted, summary), (full, expected) = _both_runs(tmp_path, 2, args, folder)
    assert len(parted) == len(full) == 10
    assert parted == full  # bit for bit
    for key in ("val_mrr", "test_mrr", "final_val_mrr", "final_test_mrr"):  # up to float32 sum order
        assert summary[key] == pytest.approx(expected[key], abs=1e-6), key
    traffic = summary["epochs"][0]["exchange"]
    assert all(t["sent_bytes"] > 0 and t["received_bytes"] > 0 for t in traffic)
