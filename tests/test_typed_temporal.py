"""A typed graph's temporal tasks (docs/temporal.md). The link task: one relation's links split by time in its
ends' stacked ids, every training and evaluation sample strictly before its link, negatives of the destination
type as of each link's time, spoilers that change nothing, an exact resume, and the JODIE file trained from the
command line. The node task by vertex times: every paper sampled as of its own year, papers that appear later
change nothing, an exact resume."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data.relation import Relation
from neutronorch.data.time_split import Appearance, split_edges_by_time
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError
from neutronorch.sampling.temporal_sampler import TemporalTypedSampler
from neutronorch.train.link_task import typed_link_graph

INTERACTS = ("user", "interacts", "item")


def bipartite(users=60, items=40, events=1500, seed=0, spoilers=None) -> TypedGraph:
    """Users interacting with items over time (JODIE's shape); the items have features, the users none.
    ``spoilers``: (users, items, times) of a second relation ``(user, spoils, item)``, empty by default."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, users, events), rng.integers(0, items, events)
    time = np.sort(rng.integers(0, 1000, events))
    spoilers = spoilers or (np.zeros(0, np.int64),) * 3
    relations = {INTERACTS: Relation.from_edges(src, dst, users, items, edge_time=time),
                 ("user", "spoils", "item"): Relation.from_edges(*spoilers[:2], users, items,
                                                                 edge_time=np.asarray(spoilers[2], np.int64))}
    return TypedGraph("interactions", {"user": users, "item": items}, relations,
                      {"item": rng.normal(size=(items, 6)).astype(np.float32)}, "user", None,
                      *(np.empty(0, np.int64),) * 3, 0).validate()


def settings(**extra) -> TrainConfig:
    base = dict(task="link", link_relation="interacts", epochs=2, fanouts=[4, 4], hidden=16, batch_size=128,
                threads=1, sampler_threads=1, eval_negatives=10, progress=False, log_every=1)
    return TrainConfig(**{**base, **extra})


def test_a_typed_relation_splits_by_time_and_keeps_every_edge():
    graph = bipartite()
    split = typed_link_graph(graph, settings(split="edges:0.7,0.15"))
    links = split.links
    assert links.timed and not links.undirected
    assert links.train_time.max() <= links.val_time.min() and links.val_time.max() <= links.test_time.min()
    users = graph.num_nodes["user"]
    for name in ("train", "val", "test"):  # stacked ids: users first, then items
        pairs = getattr(links, name)
        assert np.all(pairs[0] < users) and np.all(pairs[1] >= users)
    assert sum(getattr(links, n).shape[1] for n in ("train", "val", "test")) == graph.relations[INTERACTS].num_edges
    assert split.relations[INTERACTS].num_edges == graph.relations[INTERACTS].num_edges  # nothing held out
    reverse = split.relations[split.reverse_of(INTERACTS)]
    assert np.array_equal(np.sort(reverse.edge_time), np.sort(graph.relations[INTERACTS].edge_time))


def test_negatives_are_items_that_exist_at_the_links_time():
    split = typed_link_graph(bipartite(), settings())
    appearance = Appearance(split)
    users, relation = split.num_nodes["user"], split.relations[INTERACTS]
    first = np.full(split.num_nodes["item"], np.iinfo(np.int64).max)
    np.minimum.at(first, np.repeat(np.arange(first.shape[0]), np.diff(relation.indptr)), relation.edge_time)
    at = torch.tensor([0, 50, 400, 999])
    drawn = appearance.draw(torch.Generator().manual_seed(3), at, 200)
    assert torch.all(drawn >= users)
    for row, time in zip(drawn, at.tolist()):
        assert np.all(first[row.numpy() - users] <= time) or not np.any(first <= time)


def test_a_one_type_graph_draws_the_negatives_of_the_same_homogeneous_graph():
    from test_temporal_links import timed_graph

    graph = split_edges_by_time(timed_graph(), 0.7, 0.15)
    typed = typed_link_graph(TypedGraph.of(dataclasses.replace(graph, links=None)),
                             settings(link_relation=None, split="edges:0.7,0.15"))
    assert np.array_equal(typed.links.test, graph.links.test)
    at = torch.from_numpy(graph.links.test_time)
    assert torch.equal(Appearance(typed).draw(torch.Generator().manual_seed(1), at, 5),
                       Appearance(graph).draw(torch.Generator().manual_seed(1), at, 5))


@pytest.fixture
def strict_typed_sampling(monkeypatch):
    """Every typed temporal sample checked: each edge of a timed relation strictly before its destination
    entry's time, each source entry at its destination's time. Counts the samples checked."""
    checked, original = [], TemporalTypedSampler.sample

    def sample(self, seeds, seed_time, key):
        subgraph = original(self, seeds, seed_time, key)
        for typed_block in subgraph.blocks:
            for relation, block in typed_block.blocks.items():
                dst_time = typed_block.src_time[relation[2]][:block.num_dst]
                dst_time = dst_time.repeat_interleave(torch.diff(block.indptr))
                assert torch.equal(typed_block.src_time[relation[0]][block.indices.long()], dst_time)
                times = self.graph.relations[relation].edge_time
                assert torch.all(torch.from_numpy(times)[typed_block.edge_ids[relation]] < dst_time)
        checked.append(len(subgraph.blocks))
        return subgraph

    monkeypatch.setattr(TemporalTypedSampler, "sample", sample)
    return checked


def test_training_and_evaluation_sample_only_before_each_links_time(strict_typed_sampling):
    summary = train(settings(epochs=1, temporal_strategy="last", mode="auto"), graph=bipartite())
    assert summary["mode"] == "exact"
    assert len(strict_typed_sampling) > 10  # every training batch and every evaluation batch
    epoch = summary["epochs"][-1]
    assert 0 < epoch["test_ap"] <= 1 and 0 < epoch["test_rocauc"] <= 1 and 0 < epoch["test_mrr"] <= 1


@pytest.mark.parametrize("task", ["link", "node"])
def test_device_mode_trains_a_typed_graph_by_time_as_exact_mode_does(task, device="cpu"):
    """TypedTemporalDeviceSampler (torch ops, on the CPU here): the same losses and scores as exact mode."""
    graph, make = (bipartite(), settings) if task == "link" else (dated_papers(), node_settings)
    runs = {mode: train(make(mode=mode, epochs=2, device=device), graph=graph) for mode in ("exact", "device")}
    losses = {mode: [e["train_loss"] for e in run["epochs"]] for mode, run in runs.items()}
    if device == "cpu":
        assert losses["device"] == losses["exact"]
        assert runs["device"]["epochs"][-1]["test_acc"] == runs["exact"]["epochs"][-1]["test_acc"]
    else:
        assert losses["device"] == pytest.approx(losses["exact"], rel=1e-4)


def test_what_a_typed_temporal_link_task_cannot_honour_is_refused():
    graph = bipartite()
    with pytest.raises(ConfigError, match="temporal sampling: not yet in mode neutronorch"):
        train(settings(mode="neutronorch"), graph=graph)
    with pytest.raises(DataError, match=r"`link_relation` \(user, spoils, item\) has no edge times.*edge times on "
                                        r"\(user, interacts, item\)"):
        static = dataclasses.replace(graph, relations={
            **graph.relations, ("user", "spoils", "item"): Relation.from_edges([0, 1], [0, 1], 60, 40)})
        train(settings(link_relation="spoils"), graph=static)
    with pytest.raises(ConfigError, match="`link_direction` undirected"):
        train(settings(link_direction="undirected"), graph=graph)
    labelled = dataclasses.replace(graph, labels=np.arange(60) % 2, train_idx=np.arange(40), val_idx=np.arange(40, 50),
                                   test_idx=np.arange(50, 60), num_classes=2).validate()
    with pytest.raises(ConfigError, match="interactions carries times.*the node task .by vertex times. of the built-in "
                                          "models, on either"):
        train(TrainConfig(epochs=1, fanouts=[4, 4], progress=False), graph=labelled)


@pytest.mark.slow
def test_planted_spoilers_after_every_link_change_nothing_and_before_them_they_do():
    """Every test link copied into a second relation at a time after all links: no sample reaches them, so
    the run is the same to the bit as with as many spoilers between random pairs. Copied to just before
    their own times (the control), the same links are history the sampler reads: the test score moves."""
    graph = bipartite()
    links = typed_link_graph(graph, settings()).links
    users = graph.num_nodes["user"]
    test, times = links.test, links.test_time
    rng = np.random.default_rng(9)
    plantings = {"random late": (rng.integers(0, users, test.shape[1]), rng.integers(0, 40, test.shape[1]),
                                 np.full(test.shape[1], 5000)),
                 "late": (test[0], test[1] - users, np.full(test.shape[1], 5000)),
                 "early": (test[0], test[1] - users, times - 1)}
    runs = {name: train(settings(epochs=3), graph=bipartite(spoilers=planted))["epochs"]
            for name, planted in plantings.items()}
    plain, late, early = runs["random late"], runs["late"], runs["early"]
    assert [e["train_loss"] for e in late] == [e["train_loss"] for e in plain]
    assert [(e["test_mrr"], e["test_ap"]) for e in late] == [(e["test_mrr"], e["test_ap"]) for e in plain]
    assert early[-1]["test_mrr"] > plain[-1]["test_mrr"]


@pytest.mark.slow
def test_a_typed_temporal_link_run_stopped_mid_epoch_resumes_bit_identical(tmp_path):
    from test_temporal_links import stopped_and_resumed

    stopped_and_resumed(settings, bipartite(), tmp_path, (1, 5), "final_test_mrr")


def test_a_jodie_file_converts_and_trains_a_temporal_link_task_from_the_command_line(tmp_path, capsys):
    from neutronorch.cli.app import main

    rng = np.random.default_rng(2)
    lines = ["user_id,item_id,timestamp,state_label,comma_separated_list_of_features"]
    for user, item, time in zip(rng.integers(0, 30, 600), rng.integers(0, 25, 600), np.sort(rng.random(600)) * 1e5):
        lines.append(f"{user},{item},{time:.1f},0,{rng.random():.3f}")
    (tmp_path / "wiki.csv").write_text("\n".join(lines) + "\n")
    assert main(["convert", str(tmp_path / "wiki.csv"), str(tmp_path / "wiki")]) == 0
    summary = tmp_path / "summary.json"
    assert main(["train", "--dataset", str(tmp_path / "wiki"), "--task", "link", "--epochs", "1", "--fanouts", "3,3",
                 "--hidden", "8", "--eval-negatives", "10", "--threads", "1", "--no-save",
                 "--summary-json", str(summary)]) == 0
    result = json.loads(summary.read_text())
    assert result["link"]["relation"] == "user/interacts/item" and not result["link"]["undirected"]
    assert 0 < result["epochs"][-1]["test_ap"] <= 1
    assert "links split by time" in capsys.readouterr().err


def test_a_resume_on_other_edge_times_is_refused(tmp_path):
    from neutronorch.errors import CheckpointError

    train(settings(epochs=1, checkpoint_dir=str(tmp_path)), graph=bipartite())
    moved = bipartite()
    relation = moved.relations[INTERACTS]
    moved.relations[INTERACTS] = dataclasses.replace(relation, edge_time=relation.edge_time + 1)
    with pytest.raises(CheckpointError, match=r"the edge times of \(user, interacts, item\)"):
        train(settings(epochs=2, checkpoint_dir=str(tmp_path), resume=True), graph=moved.validate())


# A node task by vertex times (train/temporal_nodes.py).

def dated_papers(papers=500, authors=120, seed=0, extra: int = 0, extra_time: int = 10_000) -> TypedGraph:
    """Papers with years (0..99) citing papers of their own topic, written by authors (no times: static,
    no features), split by year; ``extra`` papers more at ``extra_time``, each citing a test paper and
    carrying its label loudly in its features."""
    from test_temporal_links import dated_graph

    homogeneous = dated_graph(papers, seed, extra, extra_time)
    rng = np.random.default_rng(seed + 1)
    total = homogeneous.num_nodes
    writes = Relation.from_edges(rng.integers(0, authors, 3 * papers), rng.integers(0, papers, 3 * papers),
                                 authors, total)
    cites = TypedGraph.of(homogeneous).relations
    return TypedGraph("dated", {"author": authors, "paper": total},
                      {("author", "writes", "paper"): writes,
                       ("paper", "cites", "paper"): next(iter(cites.values()))},
                      {"paper": homogeneous.features}, "paper", homogeneous.labels, homogeneous.train_idx,
                      homogeneous.val_idx, homogeneous.test_idx, 3,
                      node_time={"paper": homogeneous.node_time}).validate()


def node_settings(**extra) -> TrainConfig:
    from test_temporal_links import node_settings as homogeneous_settings

    return homogeneous_settings(**extra)


@pytest.mark.parametrize("model", ["sage", "rgcn", "rgat"])
def test_a_typed_node_task_samples_every_paper_as_of_its_own_year(monkeypatch, model):
    """By vertex times a cited paper exists from its year: every edge of a relation from papers is at its
    source's year, at most its destination entry's time; an author (no times) is valid at every time."""
    checked, original = [], TemporalTypedSampler.sample

    def sample(self, seeds, seed_time, key):
        subgraph = original(self, seeds, seed_time, key)
        paper_time = torch.from_numpy(self.graph.node_time["paper"]) if self.graph.node_time else None
        for typed_block in subgraph.blocks:
            for relation, block in typed_block.blocks.items():
                dst_time = typed_block.src_time[relation[2]][:block.num_dst].repeat_interleave(torch.diff(block.indptr))
                times = self.graph.relations[relation].edge_time
                if relation[0] == "paper":
                    assert times is not None
                    ids = typed_block.src_ids["paper"][block.indices.long()]
                    assert torch.equal(torch.from_numpy(times)[typed_block.edge_ids[relation]], paper_time[ids])
                    assert torch.all(paper_time[ids] <= dst_time)
                else:
                    assert times is None  # writes: static
        checked.append(1)
        return subgraph

    monkeypatch.setattr(TemporalTypedSampler, "sample", sample)
    summary = train(node_settings(mode="auto", model=model), graph=dated_papers())
    assert summary["mode"] == "exact" and len(checked) > 10 and summary["test_acc"] > 0.5
    assert summary["mode_choice"]["reason"].startswith("a graph with times is sampled by time")


def test_a_typed_node_task_needs_its_targets_times():
    graph = dated_papers()
    authors_only = dataclasses.replace(graph, node_time={"author": np.zeros(120, np.int64)}).validate()
    with pytest.raises(ConfigError, match="none of its target type paper, so its seeds have no time"):
        train(node_settings(), graph=authors_only)
    with pytest.raises(ConfigError, match="not yet in .*mode neutronorch"):
        train(node_settings(mode="neutronorch"), graph=graph)


@pytest.mark.slow
def test_papers_that_appear_later_change_nothing_and_earlier_they_do():
    from test_temporal_links import later_change_nothing

    later_change_nothing(dated_papers)


@pytest.mark.slow
def test_a_typed_node_task_by_time_resumes_bit_identical(tmp_path):
    from test_temporal_links import stopped_and_resumed

    stopped_and_resumed(node_settings, dated_papers(), tmp_path, (1, 2), "final_test_acc")
