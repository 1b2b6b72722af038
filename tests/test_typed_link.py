"""Link prediction on a typed graph's relation (``typed_link_graph``, the homogeneous link task's path over
``LinkEnds``' stacked ids): the split leaves the relation and its reverse, batches hold no seed edge of either,
negatives are of the destination type, runs learn, device mode trains as exact mode does, and what a typed link
run cannot do is refused naming it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data import load_dataset, synthetic_typed
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.link_seeds import EndsSampler, LinkSeeds
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.link_task import typed_link_graph

WRITES, CITES = ("author", "writes", "paper"), ("paper", "cites", "paper")


@pytest.fixture(scope="module")
def mag() -> TypedGraph:
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=2)


def config(**settings) -> TrainConfig:
    base = dict(dataset="-", task="link", epochs=2, batch_size=64, fanouts=[4, 3], hidden=16, lr=0.01,
                dropout=0.0, threads=1, seed=5, device="cpu", eval_negatives=20)
    return TrainConfig(**{**base, **settings})


def edge_set(relation) -> set[tuple[int, int]]:
    src, dst = relation.edges()
    return set(zip(src.tolist(), dst.tolist()))


@pytest.mark.parametrize("relation", [WRITES, CITES])
def test_the_held_out_edges_leave_the_relation_and_its_reverse(mag, relation):
    graph = typed_link_graph(mag, config(link_relation="/".join(relation)).validate())
    ends, links = graph.links.ends, graph.links
    assert ends.relation == relation and ends.reverse == (relation[2], "rev_" + relation[1], relation[0])
    first = ends.offsets[relation[0]]
    held = {(u - first, v - ends.offsets[relation[2]]) for part in (links.val, links.test) for u, v in part.T.tolist()}
    train_pairs = {(u - first, v - ends.offsets[relation[2]]) for u, v in links.train.T.tolist()}
    kept, reverse = edge_set(graph.relations[relation]), edge_set(graph.relations[ends.reverse])
    assert kept == train_pairs and not held & kept and not {(v, u) for u, v in held} & reverse
    assert len(kept | held) == mag.relations[relation].num_edges
    assert graph.relations[("paper", "has_topic", "field")] is mag.relations[("paper", "has_topic", "field")]


@pytest.mark.parametrize("relation", [WRITES, CITES])
def test_no_sampled_block_holds_a_seed_edge_and_negatives_are_destinations(mag, relation):
    """With every neighbour sampled, a batch's seed edges would be in its blocks; they are in none of the
    relation's or its reverse's, in either direction, while the same batch sampled without the removal has some."""
    cfg = config(link_relation="/".join(relation), fanouts=[-1, -1], negatives=3).validate()
    graph = typed_link_graph(mag, cfg)
    ends = graph.links.ends
    seeds = LinkSeeds(graph.links.train, ends.num_nodes, cfg.sampling, 3, ends)
    sampler = EndsSampler(TypedNeighborSampler(graph, [-1, -1]), ends)
    batch = seeds.epoch(0)[0]
    first, count = ends.destinations
    negatives = batch.seeds[batch.targets[:, 2:]]
    assert ((negatives >= first) & (negatives < first + count)).all()
    whole = sampler.sample(batch.seeds.numpy(), batch_key(cfg.seed, 0, 0))
    pairs = {(int(u), int(v)) for u, v in batch.exclude.T}
    pairs |= {(v, u) for u, v in pairs}

    def seed_edges(subgraph) -> int:
        found = 0
        for tblock in subgraph.blocks:
            for r in (ends.relation, ends.reverse):
                block, (s, _, d) = tblock.blocks[r], r
                src = tblock.src_ids[s][block.indices.long()] + ends.offsets[s]
                dst = torch.repeat_interleave(tblock.src_ids[d][:tblock.num_dst[d]], block.indptr.diff())
                dst = dst + ends.offsets[d]
                found += sum((u, v) in pairs for u, v in zip(src.tolist(), dst.tolist()))
        return found

    assert seed_edges(whole) > 0
    assert seed_edges(seeds.exclude(whole, batch.exclude)) == 0


def test_the_typed_sampler_takes_seeds_by_type(mag):
    graph = mag.with_reverse()
    sampler = TypedNeighborSampler(graph, [3, 2])
    ids = np.array([4, 9, 30])
    one, by_type = sampler.sample(ids, 7), sampler.sample({"paper": ids}, 7)
    assert torch.equal(one.seeds, by_type.seeds)
    for a, b in zip(one.blocks, by_type.blocks):
        assert all(torch.equal(a.blocks[r].indices, b.blocks[r].indices) for r in a.blocks)
    both = sampler.sample({"author": np.array([1, 2]), "paper": ids}, 7)
    assert both.seeds.tolist() == [4, 9, 30, 1, 2]
    assert {t for t, n in both.blocks[-1].num_dst.items() if n} == {"paper", "author"}


def test_a_typed_link_run_learns_well_above_an_untrained_model():
    """A homogeneous graph seen as a typed one (two relations: the graph's and its reverse): the test MRR after
    training is far above the untrained model's (a run whose learning rate, 1e-9, leaves its weights as they
    started)."""
    graph = TypedGraph.of(load_dataset("synthetic:nodes=1500,degree=10,features=16,classes=4,homophily=0.9"))
    trained = train(config(epochs=3, batch_size=256, fanouts=[8, 8], hidden=32, lr=0.01, model="sage"), graph=graph)
    untrained = train(config(epochs=1, batch_size=256, fanouts=[8, 8], hidden=32, lr=1e-9, model="sage"), graph=graph)
    losses = [e["train_loss"] for e in trained["epochs"]]
    assert losses[-1] < losses[0]
    assert 0 <= untrained["test_mrr"] <= 1 and trained["test_mrr"] > 1.5 * untrained["test_mrr"]
    assert {"test_hits_10", "test_rocauc"} <= set(trained["link"]["final"])


def test_device_mode_trains_a_typed_link_task_as_exact_mode(mag):
    a = train(config(link_relation="writes", model="rgcn"), graph=mag)
    b = train(config(link_relation="writes", model="rgcn", mode="device"), graph=mag)
    assert (a["mode"], b["mode"]) == ("exact", "device")
    assert [e["train_loss"] for e in a["epochs"]] == [e["train_loss"] for e in b["epochs"]]
    assert a["test_mrr"] == b["test_mrr"] and 0 < a["test_mrr"] <= 1


def test_a_typed_link_plan_never_serves_a_batchs_own_seeds_hot(mag):
    """A link batch's seeds are of both end types (the authors and papers of its pairs and negatives): each
    type's leads its bottom frontier and none is served hot in its own batch, while other vertices are."""
    cfg = config(link_relation="writes", fanouts=[4, 3]).validate()
    graph = typed_link_graph(mag, cfg)
    ends = graph.links.ends
    seeds = LinkSeeds(graph.links.train, ends.num_nodes, cfg.sampling, 2, ends)
    sampler = EndsSampler(TypedNeighborSampler(graph, [4, 3]), ends)
    epoch = seeds.epoch(0)
    uppers = [(i, batch_key(cfg.seed, 0, i), sampler.sample_hops(epoch[i].seeds.numpy(), batch_key(cfg.seed, 0, i), 1))
              for i in range(4)]
    plan = Planner(graph, {r: 3 for r in graph.relations}).plan(0, 0, uppers, 1.0)
    served = 0
    for item, (_, _, upper) in zip(plan.batches, uppers):
        assert set(upper.frontiers[-1]) == {"author", "paper"}
        for t, own in upper.frontiers[-1].items():
            assert not (item.hot_pos[t] < own.shape[0]).any()
            served += int(item.hot_pos[t].shape[0])
    assert served > 0


def test_neutronorch_trains_a_typed_link_task(mag):
    """At ratio 0 the steps of exact mode; with hot rows, reuse within the staleness bound and a falling loss."""
    exact = train(config(link_relation="writes", model="rgcn"), graph=mag)
    cold = train(config(link_relation="writes", model="rgcn", mode="neutronorch", hot_ratio=0.0), graph=mag)
    assert [e["train_loss"] for e in cold["epochs"]] == [e["train_loss"] for e in exact["epochs"]]
    hot = train(config(link_relation="writes", model="rgcn", mode="neutronorch", hot_ratio=0.3, super_batch=4),
                graph=mag)
    assert hot["hot"]["reuse_rate"] > 0.1 and hot["staleness"]["max_observed"] <= hot["staleness"]["bound"]
    assert hot["epochs"][-1]["train_loss"] < hot["epochs"][0]["train_loss"] and 0 < hot["test_mrr"] <= 1


@pytest.mark.parametrize("settings, message", [
    (dict(), "has 8 relations: give `link_relation`.*author/writes/paper, paper/cites/paper"),
    (dict(link_relation="nope"), "`link_relation` 'nope': .*no relation is named 'nope'"),
    (dict(link_relation="writes", link_direction="undirected"), "links author to paper, so an edge has no reverse"),
    (dict(link_relation="writes", eval_max_nodes=10), "`eval_max_nodes` 10: a link task evaluates every vertex"),
    (dict(link_relation="writes", negatives=5000), "`negatives` 5,000: more negative destinations"),
])
def test_what_a_typed_link_run_cannot_do_is_refused(mag, settings, message):
    with pytest.raises(ConfigError, match=message):
        train(config(**settings), graph=mag.with_reverse() if not settings else mag)


def test_a_node_run_refuses_the_relation_setting(mag):
    with pytest.raises(ConfigError, match="`link_relation` writes: a link task's settings, and `task` is node"):
        train(config(task="node", link_relation="writes"), graph=mag)
    with pytest.raises(ConfigError, match="`link_relation` cites: a typed graph's relation to predict"):
        train(config(link_relation="cites", fanouts=[2]),
              graph=load_dataset("synthetic:nodes=300,degree=4,features=4,classes=2"))


def test_a_typed_link_run_resumed_at_an_epoch_boundary_ends_as_one_run(mag, tmp_path):
    """A typed link checkpoint (a LinkModel over a TypedGNN) is read back to resume: the resumed run's epochs
    repeat the uninterrupted run's losses to the bit."""
    whole = train(config(link_relation="writes", epochs=3), graph=mag)
    train(config(link_relation="writes", epochs=2, checkpoint_dir=str(tmp_path)), graph=mag)
    resumed = train(config(link_relation="writes", epochs=3, checkpoint_dir=str(tmp_path), resume=True), graph=mag)
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]


def test_patience_stops_a_typed_link_run_and_its_scores_are_the_best_epochs(mag, tmp_path):
    """A learning rate too small to change a score: the first evaluation stays the best, the run stops after
    `patience` evaluations more, and the summary's scores and best.pt are the best epoch's."""
    from neutronorch.train.checkpoint import load_checkpoint

    summary = train(config(link_relation="writes", epochs=8, lr=1e-12, patience=2, checkpoint_dir=str(tmp_path)),
                    graph=mag)
    assert summary["status"] == "stopped_early" and [e["epoch"] for e in summary["epochs"]] == [0, 1, 2]
    assert summary["best_epoch"] == 0 and load_checkpoint(tmp_path / "best.pt").epoch == 0
    first = summary["epochs"][0]
    assert (summary["val_mrr"], summary["test_mrr"]) == (first["val_mrr"], first["test_mrr"])


RAW = (("author", "writes", "paper"), ("paper", "cites", "paper"), ("paper", "rev_writes", "author"))


def raw_rows_model(kind: str, **given):
    """A 2-layer typed link model over raw 12-wide paper rows and a featureless author type (a 16-wide table)."""
    from neutronorch.nn.link import LinkModel
    from neutronorch.nn.typed_models import TypedGNN, TypedSpec

    spec = TypedSpec({"paper": 50, "author": 40}, {"paper": 12, "author": 0}, RAW, "paper",
                     outputs=("author", "paper"))
    torch.manual_seed(0)
    return LinkModel(TypedGNN(kind, spec, 16, 16, 2), "dot", **given)


@pytest.mark.parametrize("kind", ["sage", "rgcn"])
def test_a_typed_link_encoder_on_raw_rows_starts_each_types_input_scaled_and_learning_slower(kind):
    """Paper rows of RMS norm 5 and an author table of standard normal rows (norm 4 at width 16): the weights
    reading each type's rows start divided by its norm (R-GCN's author table, read by weights every type shares,
    is divided instead) and learn at the rate divided by it; every bias starts at zero but the centring ones.
    Without the norms the typed encoder keeps its own start."""
    from neutronorch.nn.link import optimizer_groups

    plain, mean = raw_rows_model(kind), torch.rand(12) + 1
    scaled = raw_rows_model(kind, input_norm={"paper": 5.0}, input_mean={"paper": mean})
    divisor = {}
    for name, _ in plain.named_parameters():
        key = name.split(".")[-2]
        if kind == "sage" and name.startswith("encoder.layers.0.") and name.endswith("weight"):
            source, _, target = key.split("__")
            divisor[name] = 5.0 if (source if ".neigh." in name else target) == "paper" else 4.0
        elif kind == "rgcn" and name in ("encoder.projections.paper.weight", "encoder.embeddings.author.weight"):
            divisor[name] = 5.0 if "paper" in name else 4.0
    assert len(divisor) == (6 if kind == "sage" else 2)
    for (name, a), b in zip(plain.named_parameters(), scaled.parameters()):
        if name.endswith("bias"):
            assert not b.any() or name.startswith(("encoder.layers.0.root", "encoder.projections")), name
        else:
            torch.testing.assert_close(b, a / divisor.get(name, 1.0), rtol=1e-6, atol=0, msg=name)
    groups = optimizer_groups(scaled, 0.001, scaled.dense_parameters())
    rates = sorted((g.get("lr", 0.001), len(g["params"])) for g in groups)
    assert rates == ([(0.001 / 5, 4), (0.001 / 4, 2), (0.001, len(scaled.dense_parameters()) - 6)] if kind == "sage"
                     else [(0.001 / 5, 1), (0.001, len(scaled.dense_parameters()) - 1)])
    assert [len(g["params"]) for g in optimizer_groups(plain, 0.001)] == [len(list(plain.parameters()))]


def test_a_typed_link_encoders_first_outputs_start_centred():
    """Every row the mean row (tables' rows zero, their mean): the bottom layer's outputs are zero, for every
    destination type (relational SAGE), or the projection's (R-GCN)."""
    from neutronorch.sampling.block import Block, TypedBlock

    mean = torch.rand(12) + 1
    one = Block(2, 2, torch.tensor([0, 1, 2]), torch.tensor([1, 0], dtype=torch.int32))
    tblock = TypedBlock({"paper": 2, "author": 2}, {"paper": 2, "author": 2}, dict.fromkeys(RAW, one))
    sage = raw_rows_model("sage", input_norm={"paper": 3.0}, input_mean={"paper": mean})
    out = sage.encoder.layers[0](tblock, {"paper": mean.expand(2, 12).contiguous(), "author": torch.zeros(2, 16)})
    for rows in out.values():
        torch.testing.assert_close(rows, torch.zeros_like(rows), atol=1e-5, rtol=0)
    rgcn = raw_rows_model("rgcn", input_norm={"paper": 3.0}, input_mean={"paper": mean})
    torch.testing.assert_close(rgcn.encoder.projections["paper"](mean), torch.zeros(16), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["sage", "rgcn"])
def test_a_typed_link_run_on_raw_rows_learns(kind):
    """An author-writes-paper link task (authors featureless, papers' rows raw: RMS norm about 2.2) at the link
    defaults but hidden 32: the first epoch's loss starts near 2 ln 2, not at the 2.7 and 8.2 of large initial
    logits, and the test MRR over 100 negatives (about 0.05 for random scores, within 0.005 over the graph's
    ~840 test positives) ends above 0.1 (0.131 and 0.110; 0.091 and 0.045 with the typed encoder's own start)."""
    graph = synthetic_typed(nodes=3000, degree=8, features=16, seed=1)
    summary = train(TrainConfig(dataset="-", task="link", link_relation="writes", model=kind, epochs=6, hidden=32,
                                batch_size=256, threads=1, seed=0, eval_negatives=100, device="cpu"), graph=graph)
    assert summary["epochs"][0]["train_loss"] < 1.45
    assert summary["test_mrr"] > 0.1


def test_a_typed_link_checkpoint_scores_pairs_and_embeds_both_end_types(mag, tmp_path, capsys):
    """predict --pairs and embed of a typed link checkpoint: a pair is an author and a paper (ids of their
    types); its score is the head on the two types' last-layer rows that embed gives."""
    from neutronorch import embed, score_pairs
    from neutronorch.cli import main
    from neutronorch.data import write_typed
    from neutronorch.train.checkpoint import load_checkpoint

    assert mag.num_classes != 24  # the encoder's width is no class count: a link checkpoint fits any
    train(config(link_relation="writes", epochs=1, hidden=24, checkpoint_dir=str(tmp_path / "ck")), graph=mag)
    checkpoint = str(tmp_path / "ck" / "best.pt")
    pairs = np.array([[0, 5, 7, mag.num_nodes["author"] - 1, 3], [3, 9, mag.num_nodes["paper"] - 1, 0, 3]])
    scores = score_pairs(checkpoint, mag, pairs)
    authors, papers = (embed(checkpoint, mag, layer=2, node_type=t) for t in ("author", "paper"))
    head = load_checkpoint(checkpoint).model
    with torch.no_grad():
        expected = head.score(torch.from_numpy(authors[pairs[0]]), torch.from_numpy(papers[pairs[1]])).numpy()
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    with pytest.raises(ConfigError, match=r"out of range \(a pair.s first id is one of the [\d,]+ author vertices, its "
                                          r"second one of the [\d,]+ paper vertices\)"):
        score_pairs(checkpoint, mag, np.array([[0, mag.num_nodes["author"], 1], [1, 2, 3]]))
    write_typed(mag, tmp_path / "mag")
    np.savetxt(tmp_path / "pairs.txt", pairs.T, fmt="%d")
    assert main(["predict", "--checkpoint", checkpoint, "--dataset", str(tmp_path / "mag"), "--pairs",
                 str(tmp_path / "pairs.txt"), "--out", str(tmp_path / "scores.npy"), "--no-progress"]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "scores.npy"), scores)
