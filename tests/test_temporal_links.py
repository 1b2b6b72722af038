"""A temporal link task in train() (docs/temporal.md, "Temporal link prediction"): the chronological split,
negatives as of each link's time, training and evaluation sampled strictly before each link, planted spoilers
that change nothing, and an exact resume."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data.graph import Graph
from neutronorch.data.time_split import Appearance, split_edges_by_time
from neutronorch.errors import ConfigError, DataError, Interrupted
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler
from neutronorch.train.link_metrics import PerPositiveScores
from neutronorch.train.temporal_nodes import split_vertices_by_time


def timed_graph(nodes=300, events=3000, seed=0, undirected=True, extra=None) -> Graph:
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, nodes, events), rng.integers(0, nodes, events)
    time = np.sort(rng.integers(0, 500, events))
    if extra is not None:  # (src, dst, time) edges added to the topology
        src, dst, time = (np.concatenate([a, b]) for a, b in zip((src, dst, time), extra))
    if undirected:
        src, dst, time = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([time, time])
    features = rng.normal(size=(nodes, 8)).astype(np.float32)
    return Graph.from_arrays(src, dst, features, rng.integers(0, 2, nodes), undirected=False, edge_time=time)


def settings(**extra) -> TrainConfig:
    base = dict(task="link", epochs=2, fanouts=[4, 4], hidden=16, batch_size=128, threads=1, sampler_threads=1,
                eval_negatives=20, progress=False, log_every=1)
    return TrainConfig(**{**base, **extra})


def test_the_chronological_split_trains_on_the_past_and_tests_on_the_future():
    graph = timed_graph()
    split = split_edges_by_time(graph, 0.7, 0.15).links
    assert split.timed and split.undirected
    sizes = [getattr(split, name).shape[1] for name in ("train", "val", "test")]
    total = sum(sizes)
    assert sizes[0] == round(0.7 * total) and sizes[1] == round(0.15 * total)
    assert split.train_time.max() <= split.val_time.min() and split.val_time.max() <= split.test_time.min()
    for name in ("train", "val", "test"):
        assert np.all(np.diff(getattr(split, f"{name}_time")) >= 0)
        pairs = getattr(split, name)
        assert np.all(pairs[0] < pairs[1])  # an undirected interaction is one link
    directed = split_edges_by_time(timed_graph(undirected=False), 0.7, 0.15).links
    assert not directed.undirected and sum(getattr(directed, n).shape[1] for n in ("train", "val", "test")) == total


def test_a_temporal_link_task_needs_edge_times_and_refuses_what_it_cannot_honour():
    graph = timed_graph()
    vertex_times = dataclasses.replace(graph, edge_time=None, node_time=np.zeros(graph.num_nodes, np.int64))
    with pytest.raises(DataError, match="needs edge times"):
        split_edges_by_time(vertex_times, 0.7, 0.15)
    with pytest.raises(ConfigError, match="temporal sampling: not yet in mode neutronorch"):
        train(settings(mode="neutronorch"), graph=graph)
    static = dataclasses.replace(graph, edge_time=None)
    with pytest.raises(ConfigError, match="`temporal_strategy` last: a setting of sampling by time"):
        train(settings(temporal_strategy="last"), graph=static)
    untimed = dataclasses.replace(split_edges_by_time(graph, 0.7, 0.15), links=None)
    untimed = dataclasses.replace(untimed, links=dataclasses.replace(
        split_edges_by_time(graph, 0.7, 0.15).links, train_time=None, val_time=None, test_time=None))
    with pytest.raises(ConfigError, match="its link split has none"):
        train(settings(), graph=untimed)
    with pytest.raises(ConfigError, match=r"the node task \(by vertex times\) of the built-in models"):
        train(settings(task="node"), graph=graph)


def test_negatives_are_drawn_among_the_vertices_that_exist_at_the_links_time():
    graph = timed_graph(nodes=400, events=800)
    appearance = Appearance(graph)
    first = np.full(graph.num_nodes, np.iinfo(np.int64).max)
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    np.minimum.at(first, dst, graph.edge_time)
    at = torch.tensor([0, 50, 200, 499])
    drawn = appearance.draw(torch.Generator().manual_seed(0), at, 500)
    for row, t in zip(drawn, at):
        assert np.all(first[row.numpy()] <= int(t))
    assert len(np.unique(drawn[-1].numpy())) > len(np.unique(drawn[1].numpy()))


def test_average_precision_pools_every_pair_as_scikit_learn_does():
    rng = np.random.default_rng(1)
    positive, negative = rng.integers(0, 6, 40).astype(np.float32), rng.integers(0, 6, (40, 7)).astype(np.float32)
    scores = PerPositiveScores(positive, pooled=True)
    scores.add(0, negative[:13])
    scores.add(13, negative[13:])
    pooled = np.concatenate([positive, negative.reshape(-1)])
    labels = np.concatenate([np.ones(40), np.zeros(280)])
    expected = 0.0  # sum over thresholds, highest first, of (recall gained) x precision, ties one threshold
    for threshold in np.unique(pooled)[::-1]:
        chosen = pooled >= threshold
        gained = np.count_nonzero(labels[pooled == threshold]) / 40
        expected += gained * labels[chosen].mean()
    assert scores.average_precision() == pytest.approx(expected, abs=1e-12)


@pytest.fixture
def strict_sampling(monkeypatch):
    """Every temporal sample (training's and evaluation's) checked: each edge strictly before its destination
    entry's time, each source entry at its destination's time. Counts the samples checked."""
    checked, original = [], TemporalNeighborSampler.sample

    def sample(self, seeds, seed_time, key, fanouts=None):
        subgraph = original(self, seeds, seed_time, key, fanouts)
        for block in subgraph.blocks:
            dst = torch.repeat_interleave(torch.arange(block.num_dst), torch.diff(block.indptr))
            dst_time = block.src_time[block.dst_offset + dst]
            assert torch.all(torch.from_numpy(self.edge_time)[block.edge_ids] < dst_time)
            assert torch.equal(block.src_time[block.indices], dst_time)
        checked.append(len(subgraph.blocks))
        return subgraph

    monkeypatch.setattr(TemporalNeighborSampler, "sample", sample)
    return checked


def test_training_and_evaluation_sample_only_before_each_links_time(strict_sampling):
    summary = train(settings(epochs=1, temporal_strategy="last", mode="auto"), graph=timed_graph())
    assert summary["mode"] == "exact"
    assert len(strict_sampling) > 10  # every training batch and every evaluation batch
    assert {"val_mrr", "test_mrr"} <= set(summary)
    epoch = summary["epochs"][-1]
    assert 0 < epoch["test_ap"] <= 1 and 0 < epoch["test_rocauc"] <= 1


@pytest.mark.slow
def test_planted_spoilers_after_every_link_change_nothing_and_before_them_they_do():
    """Every test link copied to a time after all links: the topology holds the answers, but no sample can
    reach them, so the run is the same to the bit. Copied to just before its own time (the control), the
    same links are history the sampler must use: the test score moves."""
    graph = split_edges_by_time(timed_graph(), 0.7, 0.15)
    test, times = graph.links.test, graph.links.test_time
    late = (test[0], test[1], np.full(test.shape[1], times.max() + 1))
    early = (test[0], test[1], times - 1)
    runs = {}
    for name, extra in (("plain", None), ("late", late), ("early", early)):
        planted = timed_graph(extra=extra)
        runs[name] = train(settings(), graph=dataclasses.replace(planted, links=graph.links))
    plain, late, early = (runs[n]["epochs"] for n in ("plain", "late", "early"))
    assert [e["train_loss"] for e in late] == [e["train_loss"] for e in plain]
    assert [(e["test_mrr"], e["test_ap"]) for e in late] == [(e["test_mrr"], e["test_ap"]) for e in plain]
    assert early[-1]["test_mrr"] > plain[-1]["test_mrr"]


def stopped_and_resumed(make, graph, folder, at: tuple[int, int], score: str) -> None:
    """A run of ``make()`` on ``graph`` stopped after step ``at`` = (epoch, step), resumed: its losses and
    final ``score`` are an uninterrupted run's, to the bit."""
    straight = train(make(), graph=graph)
    stop = threading.Event()
    with pytest.raises(Interrupted):
        train(make(checkpoint_dir=str(folder)), graph=graph, stop=stop,
              progress=lambda epoch, done, total: stop.set() if (epoch, done) == at else None)
    resumed = train(make(checkpoint_dir=str(folder), resume=True), graph=graph)
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in straight["epochs"]]
    assert resumed[score] == straight[score]


@pytest.mark.slow
def test_a_temporal_link_run_stopped_mid_epoch_resumes_bit_identical(tmp_path):
    stopped_and_resumed(settings, timed_graph(), tmp_path, (1, 5), "final_test_mrr")


# A node task by vertex times (train/temporal_nodes.py).

def dated_graph(nodes=600, seed=0, extra: int = 0, extra_time: int = 10_000) -> Graph:
    """A homophilous graph whose vertices have times (0..99); ``extra`` vertices more at ``extra_time``, each
    linked both ways to a test vertex (the first ``extra`` of the test split)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, nodes)
    src, dst = rng.integers(0, nodes, 6 * nodes), rng.integers(0, nodes, 6 * nodes)
    keep = labels[src] == labels[dst]
    src, dst = src[keep], dst[keep]
    features = (np.eye(3)[labels] + rng.normal(scale=1.0, size=(nodes, 3))).astype(np.float32)
    times = rng.integers(0, 100, nodes)
    split = split_vertices_by_time(Graph.from_arrays(src, dst, features, labels, node_time=times), 0.6, 0.2)
    splits = (split.train_idx, split.val_idx, split.test_idx)
    if extra:
        new = np.arange(nodes, nodes + extra)
        targets = split.test_idx[:extra]
        src, dst = np.concatenate([src, new]), np.concatenate([dst, targets])
        features = np.concatenate([features, np.eye(3, dtype=np.float32)[labels[targets]] * 50])
        labels, times = np.concatenate([labels, labels[targets]]), np.concatenate([times, np.full(extra, extra_time)])
    return Graph.from_arrays(src, dst, features, labels, splits=splits, node_time=times)


def node_settings(**extra) -> TrainConfig:
    base = dict(epochs=4, fanouts=[5, 5], hidden=16, batch_size=32, lr=0.01, threads=1, sampler_threads=1,
                progress=False, log_every=1)
    return TrainConfig(**{**base, **extra})


def test_the_chronological_vertex_split_trains_on_the_earliest_vertices():
    graph = dated_graph()
    times = graph.node_time
    assert times[graph.train_idx].max() <= times[graph.val_idx].min()
    assert times[graph.val_idx].max() <= times[graph.test_idx].min()
    assert len(graph.train_idx) == round(0.6 * graph.num_nodes)


def test_a_node_task_samples_every_vertex_as_of_its_own_time(monkeypatch):
    checked, original = [], TemporalNeighborSampler.sample

    def sample(self, seeds, seed_time, key, fanouts=None):
        subgraph = original(self, seeds, seed_time, key, fanouts)
        for block in subgraph.blocks:  # by vertex times an edge's time is its source's: at most its seed's
            dst = torch.repeat_interleave(torch.arange(block.num_dst), torch.diff(block.indptr))
            seed_time = block.src_time[block.dst_offset + dst]
            assert torch.all(torch.from_numpy(self.edge_time)[block.edge_ids] <= seed_time)
        checked.append(1)
        return subgraph

    monkeypatch.setattr(TemporalNeighborSampler, "sample", sample)
    summary = train(node_settings(mode="auto"), graph=dated_graph())
    assert summary["mode"] == "exact" and len(checked) > 10 and summary["test_acc"] > 0.5
    with pytest.raises(ConfigError, match="not yet in mode neutronorch"):
        train(node_settings(mode="neutronorch"), graph=dated_graph())
    edge_times_only = timed_graph()
    with pytest.raises(ConfigError, match="by vertex times"):
        train(node_settings(), graph=edge_times_only)


@pytest.mark.slow
def test_vertices_that_appear_later_change_nothing_and_earlier_they_do():
    """New vertices, each linked to a test vertex and carrying its label loudly: at a time after every vertex
    no sample reaches them (the run is the same to the bit); at time 0 (the control) they raise the test score."""
    later_change_nothing(dated_graph)


def later_change_nothing(make) -> None:
    """``make()``'s graph, ``make(extra=60)`` (late vertices) and ``make(extra=60, extra_time=0)`` (the
    control) trained alike: the late ones change no loss and no score, to the bit; the early ones raise it."""
    plain = train(node_settings(), graph=make())
    late = train(node_settings(), graph=make(extra=60))
    early = train(node_settings(), graph=make(extra=60, extra_time=0))
    assert [e["train_loss"] for e in late["epochs"]] == [e["train_loss"] for e in plain["epochs"]]
    assert late["final_test_acc"] == plain["final_test_acc"]
    assert early["final_test_acc"] > plain["final_test_acc"]


@pytest.mark.slow
def test_a_node_task_by_time_resumes_bit_identical(tmp_path):
    stopped_and_resumed(node_settings, dated_graph(), tmp_path, (1, 2), "final_test_acc")


def test_the_command_line_trains_a_folder_with_times_and_refuses_the_strategy_without_them(tmp_path, capsys):
    from neutronorch.cli import main
    from neutronorch.data.native import save_native

    save_native(timed_graph(), tmp_path / "timed")
    common = ["--epochs", "1", "--fanouts", "3,3", "--hidden", "8", "--threads", "1", "--no-save", "--no-progress"]
    assert main(["train", "--dataset", str(tmp_path / "timed"), "--task", "link", "--temporal-strategy", "last",
                 "--eval-negatives", "10", *common]) == 0
    assert "test mrr" in capsys.readouterr().out
    save_native(dataclasses.replace(dated_graph(), node_time=None), tmp_path / "static")
    assert main(["train", "--dataset", str(tmp_path / "static"), "--temporal-strategy", "last", *common]) == 2
    assert "--temporal-strategy last: a setting of sampling by time" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["link", "node"])
def test_device_mode_trains_by_time_as_exact_mode_does(task):
    """Device mode samples with TorchTemporalSampler (its torch ops on the CPU here), which draws the host
    sampler's blocks: the same losses and scores."""
    graph, make = (timed_graph(), settings) if task == "link" else (dated_graph(), node_settings)
    runs = {mode: train(make(mode=mode, epochs=2), graph=graph) for mode in ("exact", "device")}
    losses = {mode: [e["train_loss"] for e in run["epochs"]] for mode, run in runs.items()}
    assert losses["device"] == pytest.approx(losses["exact"], rel=1e-6)
    key = "final_test_mrr" if task == "link" else "final_test_acc"
    assert runs["device"][key] == pytest.approx(runs["exact"][key], abs=1e-6)


def test_a_timed_split_with_shared_negatives_or_missing_times_is_a_clear_error():
    graph = split_edges_by_time(timed_graph(), 0.7, 0.15)
    links = graph.links
    shared = dataclasses.replace(links, val_neg=np.zeros((2, 5), np.int64), test_neg=np.zeros((2, 5), np.int64),
                                 negatives="shared", checked=None)
    with pytest.raises(DataError, match=r"the val links' times \(val_time\): span .*, and the split's negatives are "
                                        r"shared pairs"):  # scored at the set's time only where it has one
        train(settings(), graph=dataclasses.replace(graph, links=shared))
    short = dataclasses.replace(links, test_time=links.test_time[1:], checked=None)
    with pytest.raises(DataError, match=r"the test links' times \(test_time\): expected one per test link"):
        train(settings(), graph=dataclasses.replace(graph, links=short))


def test_negatives_compare_a_fractional_clock_with_whole_vertex_times():
    graph = dataclasses.replace(timed_graph(nodes=50, events=100), node_time=np.arange(50, dtype=np.int64))
    count = Appearance(graph).existing(torch.tensor([4.5, 0.0, 49.0], dtype=torch.float64))
    assert count.tolist() == [5, 1, 50]


def test_a_time_split_re_splits_the_vertices_by_their_times_from_the_command_line(tmp_path, capsys):
    from neutronorch.cli import main
    from neutronorch.data.native import save_native
    from neutronorch.data.splits import make_split

    graph = dated_graph()
    save_native(graph, tmp_path / "dated")
    summary = tmp_path / "summary.json"
    common = ["--epochs", "1", "--fanouts", "3,3", "--hidden", "8", "--threads", "1", "--no-save", "--no-progress"]
    assert main(["train", "--dataset", str(tmp_path / "dated"), "--split", "time:0.5,0.25", "--summary-json",
                 str(summary), *common]) == 0
    import json
    assert json.loads(summary.read_text())["config"]["split"] == "time:0.5,0.25"
    resplit = split_vertices_by_time(graph, 0.5, 0.25)
    assert len(resplit.train_idx) == 300 and graph.node_time[resplit.train_idx].max() <= graph.node_time[
        resplit.test_idx].min()
    capsys.readouterr()
    assert main(["train", "--dataset", str(tmp_path / "dated"), "--split", "time:0.5,0.25", "--task", "link",
                 *common]) == 2
    assert "a link task splits its links" in capsys.readouterr().err
    save_native(dataclasses.replace(graph, node_time=None), tmp_path / "undated")
    assert main(["train", "--dataset", str(tmp_path / "undated"), "--split", "time:0.5,0.25", *common]) == 2
    assert "needs vertex times" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="a chronological split orders the vertices by their times"):
        make_split(np.zeros(10, np.int64), 2, "time:0.5,0.2")


def test_temporal_link_scores_do_not_depend_on_the_evaluation_batch_size():
    """The evaluation samples every batch of a set with one key (a draw depends on its vertex and time only),
    and counts its batch size in entries: the same scores for any size."""
    graph = timed_graph()
    scores = [train(settings(epochs=1, eval_batch_size=size), graph=graph)["epochs"][-1] for size in (30, 4096)]
    assert {k: v for k, v in scores[0].items() if k.startswith(("val_", "test_"))} == \
        {k: v for k, v in scores[1].items() if k.startswith(("val_", "test_"))}
