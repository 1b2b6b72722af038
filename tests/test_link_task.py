"""Link prediction: seed edges in mini-batches, negatives, no seed edge visible in its own batch, the loss,
exact evaluation against stored or drawn negatives, checkpoints, and the errors of a misplaced split."""

import dataclasses
import logging

import numpy as np
import pytest
import torch

from test_neutronorch import lockstep

from neutronorch import TrainConfig, train
from neutronorch.config import SamplingConfig
from neutronorch.data import SyntheticSpec, generate
from neutronorch.data.links import LinkSplit
from neutronorch.errors import ConfigError, TrainingError
from neutronorch.features.store import FeatureStore
from neutronorch.nn.link import LinkModel
from neutronorch.nn.models import GNN
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.link_seeds import LinkSeeds, draw_negatives, pair_targets
from neutronorch.sampling.block import Block, SampledSubgraph
from neutronorch.sampling.exclude import exclude_edges
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key, mix_key
from neutronorch.train.checkpoint import load_checkpoint
from neutronorch.train.layerwise import layerwise
from neutronorch.train import layerwise as layerwise_module, link_task
from neutronorch.train.link_metrics import link_scores
from neutronorch.train.health import EvaluationCheck
from neutronorch.train.link_task import LinkTask, drawn_negatives, evaluate_links, link_graph

SPEC = "synthetic:nodes=2000,degree=10,features=16,classes=4,homophily=0.9"


def config(**overrides):
    values = dict(dataset=SPEC, task="link", fanouts=[5, 5], hidden=32, batch_size=256, epochs=2, lr=0.01,
                  dropout=0.0, weight_decay=0.0, progress=False, stage_table=False, device="cpu")
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def graph():
    return link_graph(generate(SyntheticSpec.parse(SPEC)), config())


def test_link_batches_are_keyed_and_their_targets_point_at_each_pair(graph):
    sampling = SamplingConfig([5, 5], 100, seed=3, prefetch=1)
    seeds = LinkSeeds(graph.links.train, graph.num_nodes, sampling, negatives=4)
    first, again = seeds.epoch(1), seeds.epoch(1)
    assert len(first) == seeds.num_batches == -(-graph.links.train.shape[1] // 100)
    batch = first[0]
    assert torch.equal(batch.seeds, again[0].seeds) and torch.equal(batch.targets, again[0].targets)
    assert not torch.equal(batch.exclude, seeds.epoch(2)[0].exclude)  # another epoch, another order
    assert torch.equal(batch.seeds, torch.unique(batch.seeds))  # distinct, sorted
    assert torch.equal(batch.seeds[batch.targets[:, 0]], batch.exclude[0])
    assert torch.equal(batch.seeds[batch.targets[:, 1]], batch.exclude[1])
    assert batch.targets.shape == (100, 6)
    # Data parallel: the ranks' parts are the global batch's, with the same negatives.
    parts = [LinkSeeds(graph.links.train, graph.num_nodes, dataclasses.replace(sampling, batch_size=50, rank=r,
                                                                                world=2), 4).epoch(1)[0]
             for r in range(2)]
    assert torch.equal(torch.cat([p.seeds[p.targets[:, :2]].T for p in parts], 1), batch.exclude)
    assert all(torch.equal(p.exclude, batch.exclude) for p in parts)  # each rank leaves out the global batch's
    negatives = [p.seeds[p.targets[:, 2:]] for p in parts]
    assert torch.equal(torch.cat(negatives), batch.seeds[batch.targets[:, 2:]])


def test_link_batches_dealt_by_owner_give_each_rank_the_positives_whose_source_it_owns(graph):
    sampling = SamplingConfig([5, 5], 60, seed=3, prefetch=1)
    owner = np.random.default_rng(0).integers(0, 2, graph.num_nodes).astype(np.int32)
    whole = LinkSeeds(graph.links.train, graph.num_nodes, dataclasses.replace(sampling, batch_size=120), 4)
    ranks = [LinkSeeds(graph.links.train, graph.num_nodes, dataclasses.replace(sampling, rank=r, world=2), 4,
                       owner=owner) for r in range(2)]
    batch, parts = whole.epoch(1)[2], [seeds.epoch(1)[2] for seeds in ranks]
    pairs = [p.seeds[p.targets[:, :2]].T for p in parts]
    assert all((owner[pair[0].numpy()] == r).all() for r, pair in enumerate(pairs))
    assert 0 < pairs[0].shape[1] < batch.exclude.shape[1]  # uneven shares: not the tensor_split halves
    mine = torch.from_numpy(owner[batch.exclude[0].numpy()] == 0)
    # Each rank's positives in the global batch's order, with the negatives one process draws for them.
    assert torch.equal(pairs[0], batch.exclude[:, mine]) and torch.equal(pairs[1], batch.exclude[:, ~mine])
    negatives = batch.seeds[batch.targets[:, 2:]]
    assert torch.equal(parts[0].seeds[parts[0].targets[:, 2:]], negatives[mine])
    assert all(torch.equal(p.exclude, batch.exclude) for p in parts)  # every rank leaves out the global batch's
    shares = [seeds.rank_shares(1) for seeds in ranks]
    assert shares[0][2] == 2 * pairs[0].shape[1] / batch.exclude.shape[1]
    np.testing.assert_allclose(shares[0] + shares[1], 2.0)


def test_pair_targets_of_repeated_ends():
    seeds, targets = pair_targets(torch.tensor([[5, 5], [2, 9]]), torch.tensor([[2], [7]]))
    assert seeds.tolist() == [2, 5, 7, 9]
    assert targets.tolist() == [[1, 0, 0], [1, 3, 2]]


def test_exclude_edges_drops_seed_pairs_both_ways_and_keeps_the_rest():
    # frontier [10, 11, 12, 13]: destinations 10 and 11; 10 <- 11, 12; 11 <- 10, 13.
    block = Block(2, 4, torch.tensor([0, 2, 4]), torch.tensor([1, 2, 0, 3], dtype=torch.int32))
    subgraph = SampledSubgraph(torch.tensor([10, 11]), [block], [torch.tensor([10, 11, 12, 13]),
                                                                torch.tensor([10, 11])])
    out = exclude_edges(subgraph, torch.tensor([[10], [11]]), num_nodes=20).blocks[0]
    assert out.indptr.tolist() == [0, 1, 2] and out.indices.tolist() == [2, 3]
    assert out.indices.dtype == torch.int32 and out.indptr.dtype == block.indptr.dtype
    kept = exclude_edges(subgraph, torch.tensor([[12], [13]]), num_nodes=20).blocks[0]
    assert torch.equal(kept.indices, block.indices)


def test_the_host_kernel_and_the_device_ops_exclude_the_same_edges(graph):
    from neutronorch.sampling.exclude import _host_without, _torch_without, pair_keys

    sampler = NeighborSampler(graph.indptr, graph.indices, [6, 4], False)
    seeds = LinkSeeds(graph.links.train, graph.num_nodes, SamplingConfig([6, 4], 200, 1, 1), 1).epoch(0)[0]
    subgraph = sampler.sample(seeds.seeds.numpy(), batch_key(1, 0, 0))
    keys = pair_keys(seeds.exclude, graph.num_nodes)
    dropped = 0
    for layer, block in enumerate(subgraph.blocks):
        sources = subgraph.frontiers[layer]
        destinations = sources[:block.num_dst]
        by_torch = _torch_without(block, sources, destinations, keys, graph.num_nodes)
        ptr, idx = _host_without(block.indptr.numpy(), block.indices.numpy(), sources.long().numpy(),
                                 destinations.long().numpy(), block.num_dst, keys.numpy(), graph.num_nodes)
        assert np.array_equal(ptr, by_torch.indptr.numpy()) and np.array_equal(idx, by_torch.indices.numpy())
        dropped += block.num_edges - idx.shape[0]
    assert dropped > 0


def _global_edges(subgraph):
    """Every sampled edge of every block as a set of (source, destination) global ids."""
    edges = set()
    for layer, block in enumerate(subgraph.blocks):
        sources = subgraph.frontiers[layer].cpu()
        counts = (block.indptr[1:] - block.indptr[:-1]).cpu()
        destination = torch.repeat_interleave(sources[:block.num_dst], counts)
        edges |= set(zip(sources[block.indices.cpu().long()].tolist(), destination.tolist()))
    return edges


@pytest.mark.parametrize("mode", ["exact", "device"])
def test_no_seed_edge_is_visible_in_its_own_mini_batch(graph, mode):
    cfg = config(mode=mode, fanouts=[-1, -1], batch_size=64).validate()  # every neighbour: nothing left to chance
    built = build_mode(cfg, graph, torch.device("cpu"))
    seen_before_exclusion = 0
    try:
        with built.batches(0) as batches:
            for index, batch in enumerate(batches):
                edges = _global_edges(batch.subgraph)
                batch.release()
                seed_batch = built.seeds.epoch(0)[index]
                for u, v in seed_batch.exclude.T.tolist():
                    assert (u, v) not in edges and (v, u) not in edges
                # Without the exclusion the same batch shows its seed edges: the check above can fail.
                unfiltered = _global_edges(built_sampler(graph, cfg).sample(seed_batch.seeds.numpy(),
                                                                            batch_key(cfg.seed, 0, index)))
                seen_before_exclusion += sum((u, v) in unfiltered or (v, u) in unfiltered
                                             for u, v in seed_batch.exclude.T.tolist())
                if index == 3:
                    break
    finally:
        built.close()
    assert seen_before_exclusion > 0


def built_sampler(graph, cfg):
    return NeighborSampler(graph.indptr, graph.indices, cfg.fanouts, cfg.sampling.degrees)


def test_link_training_learns_in_exact_and_device_mode_alike():
    exact = train(config(epochs=4))
    device = train(config(epochs=4, mode="device"))
    assert [e["train_loss"] for e in exact["epochs"]] == [e["train_loss"] for e in device["epochs"]]
    assert exact["epochs"][-1]["train_loss"] < exact["epochs"][0]["train_loss"]
    # 100 drawn negatives per positive: a random scorer's MRR is H(101) / 101, about 0.05. (On this block
    # model, links within a class are random: knowing the classes and degrees is what there is to learn.)
    assert exact["final_val_mrr"] > 0.1 and exact["final_test_mrr"] > 0.1
    record = exact["epochs"][-1]
    assert {"val_hits_50", "test_hits_10", "val_rocauc", "test_mrr"} <= set(record)
    assert record["val_rocauc"] > 0.7


@pytest.mark.parametrize("kind", ["per-source", "shared"])
def test_evaluation_scores_stored_negatives_as_ogb_does(graph, kind):
    links = graph.links
    rng = np.random.default_rng(0)
    val, test = links.val[:, :40], links.test[:, :30]
    if kind == "shared":
        val_neg, test_neg = rng.integers(0, graph.num_nodes, (2, 200)), rng.integers(0, graph.num_nodes, (2, 150))
    else:
        val_neg, test_neg = rng.integers(0, graph.num_nodes, (40, 20)), rng.integers(0, graph.num_nodes, (30, 20))
    stored = dataclasses.replace(graph, links=LinkSplit(links.train, val, test, val_neg, test_neg, links.undirected,
                                                        negatives=kind, metric="hits@20"))
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 16, 16, 2), "mlp")
    task = LinkTask.of(stored, model)
    assert task.metric == "hits@20" and task.key == "hits_20"
    store = FeatureStore(graph.features, graph.labels)
    scores = evaluate_links(model, stored, store, torch.device("cpu"), 512, 0, 100, task)
    embeddings = layerwise(model.encoder, graph, store, torch.arange(graph.num_nodes), torch.device("cpu"))
    with torch.no_grad():
        positive = model.score(embeddings[test[0]], embeddings[test[1]])
        negative = (model.score(embeddings[test_neg[0]], embeddings[test_neg[1]]) if kind == "shared" else
                    model.score(embeddings[test[0]][:, None], embeddings[test_neg]))
    assert scores["test"] == pytest.approx(link_scores(positive, negative).hits_at_k(20), abs=1e-6)
    assert scores["test_mrr"] == pytest.approx(link_scores(positive, negative).mrr(), abs=1e-6)


def test_drawn_evaluation_negatives_are_the_same_at_every_evaluation(graph):
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 16, 16, 2), "dot")
    store = FeatureStore(graph.features, graph.labels)
    task = LinkTask.of(graph, model)
    first = evaluate_links(model, graph, store, torch.device("cpu"), 512, 0, 50, task)
    assert first == evaluate_links(model, graph, store, torch.device("cpu"), 512, 0, 50, task)
    assert first != evaluate_links(model, graph, store, torch.device("cpu"), 512, 1, 50, task)


@pytest.mark.parametrize("rows", [1, 7, 655, 5000])
def test_negatives_drawn_in_chunks_are_the_numbers_of_one_draw(rows):
    for count, per_positive, num_nodes in ((3000, 100, 1_000_000), (777, 3, 5), (64, 2, 1 << 33)):
        key = mix_key(3, 0x4556_414C)
        chunks = list(drawn_negatives(key, count, per_positive, (0, num_nodes), rows))
        assert [start for start, _ in chunks] == list(range(0, count, rows))
        whole = draw_negatives(key, count, per_positive, num_nodes)
        assert torch.equal(torch.cat([chunk for _, chunk in chunks]), whole)


@pytest.mark.parametrize("head", ["dot", "mlp"])
def test_chunked_evaluation_equals_the_whole_arrays_whatever_the_chunk(graph, head, monkeypatch):
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 16, 16, 2), head)
    store = FeatureStore(graph.features, graph.labels)
    task = LinkTask.of(graph, model)
    scores = evaluate_links(model, graph, store, torch.device("cpu"), 512, 0, 50, task)
    # The whole arrays, as evaluation held them before it was chunked: every negative drawn at once.
    embeddings = layerwise(model.encoder, graph, store, torch.arange(graph.num_nodes), torch.device("cpu"))
    for offset, name in enumerate(("val", "test")):
        edges = torch.from_numpy(np.asarray(getattr(graph.links, name), dtype=np.int64))
        negatives = draw_negatives(mix_key(0, 0x4556_414C + offset), edges.shape[1], 50, graph.num_nodes)
        with torch.no_grad():
            positive = model.score(embeddings[edges[0]], embeddings[edges[1]])
            negative = model.score(embeddings[edges[0]][:, None], embeddings[negatives])
        whole = link_scores(positive, negative)
        want = {"mrr": whole.mrr(), "hits_10": whole.hits_at_k(10), "rocauc": whole.roc_auc()}
        for metric, value in want.items():
            assert scores[f"{name}_{metric}"] == pytest.approx(value, abs=1e-6), (name, metric)
        assert scores[name] == scores[f"{name}_mrr"]
    monkeypatch.setattr(link_task, "SCORE_CHUNK", 37)  # 37 positive pairs, or one positive's 50 negatives, a chunk
    small = evaluate_links(model, graph, store, torch.device("cpu"), 512, 0, 50, task)
    assert small.keys() == scores.keys()
    assert all(small[k] == pytest.approx(scores[k], abs=1e-6) for k in scores)


def test_evaluation_memory_maps_its_embeddings_where_the_layers_would_not_fit(graph, tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 16, 16, 2), "dot")
    store = FeatureStore(graph.features, graph.labels)
    task = LinkTask.of(graph, model)
    in_memory = evaluate_links(model, graph, store, torch.device("cpu"), 512, 0, 20, task)
    buffers = []
    make = layerwise_module._buffer
    monkeypatch.setattr(layerwise_module, "_buffer", lambda *a: buffers.append(a[2:]) or make(*a))
    monkeypatch.setattr(link_task, "scratch_folder", lambda *_: str(tmp_path))  # as when they would not fit
    assert evaluate_links(model, graph, store, torch.device("cpu"), 512, 0, 20, task) == in_memory
    assert [name for _, name in buffers] == ["last", "layer1"]  # the last layer's rows, then the layer below
    assert all(folder is not None and folder.startswith(str(tmp_path)) for folder, _ in buffers)
    assert not any(tmp_path.iterdir())  # the temporary folders are gone


@pytest.mark.slow
def test_a_link_run_resumes_exactly_and_its_checkpoint_embeds(tmp_path):
    straight = train(config(epochs=2))
    train(config(epochs=1, checkpoint_dir=str(tmp_path)))
    resumed = train(config(epochs=2, checkpoint_dir=str(tmp_path), resume=True))
    assert resumed["epochs"][-1]["train_loss"] == straight["epochs"][-1]["train_loss"]
    assert resumed["final_test_mrr"] == straight["final_test_mrr"]
    assert straight["link"]["direction"].startswith("undirected: 100.0% of the edges have their reverse")
    assert straight["link"]["issues"] == {}
    checkpoint = load_checkpoint(tmp_path / "last.pt")
    assert isinstance(checkpoint.model, LinkModel) and checkpoint.model.arguments["link_head"] == "dot"


@pytest.mark.slow
def test_a_link_run_records_its_tasks_defaults_and_resumes_with_them(tmp_path):
    from neutronorch.config import TASK_DEFAULTS
    from neutronorch.errors import CheckpointError

    unset = dict(dropout=None, lr=None, batch_size=None, weight_decay=None)  # as a run that does not give them
    first = train(config(epochs=1, checkpoint_dir=str(tmp_path), **unset))
    defaults = TASK_DEFAULTS["link"]
    assert {name: first["config"][name] for name in defaults} == defaults
    saved = load_checkpoint(tmp_path / "last.pt").config
    assert {name: getattr(saved, name) for name in defaults} == defaults
    resumed = train(config(epochs=2, checkpoint_dir=str(tmp_path), resume=True, **unset))
    assert len(resumed["epochs"]) == 2 and resumed["config"]["lr"] == defaults["lr"]
    node = TASK_DEFAULTS["node"]["lr"]
    with pytest.raises(CheckpointError, match=f"`lr` {defaults['lr']} then, {node} now"):
        train(config(epochs=3, checkpoint_dir=str(tmp_path), resume=True, **dict(unset, lr=node)))


def test_a_misplaced_split_or_mode_is_a_clear_error(graph):
    with pytest.raises(ConfigError, match="give `task` link"):
        train(config(task="node", split="edges:0.8,0.1"))
    with pytest.raises(ConfigError, match="a link task splits edges"):
        train(config(split="ratio:0.6,0.2"))
    with pytest.raises(ConfigError, match="carries its own link split"):
        train(config(split="edges:0.8,0.1"), graph=graph)
    with pytest.raises(ConfigError, match="give `task` link"):
        train(config(task="node"), graph=graph)
    with pytest.raises(ConfigError, match="give `task` link"):
        config(task="node", metric="mrr").validate()
    with pytest.raises(ConfigError, match="hits@K"):
        config(metric="accuracy").validate()
    with pytest.raises(ConfigError, match="`negatives` 0"):
        config(negatives=0).validate()
    with pytest.raises(ConfigError, match="`link_direction` directed: a link task's setting .* give `task` link, or leave it out"):
        train(config(task="node", link_direction="directed"))
    with pytest.raises(ConfigError, match="`link_head` mlp, `eval_negatives` 7: a link task's settings .*`task` is "
                                          "node; give `task` link, or leave them out"):
        train(config(task="node", link_head="mlp", eval_negatives=7))
    with pytest.raises(ConfigError, match="`link_direction` undirected: .* carries its own link split"):
        link_graph(graph, config(link_direction="undirected"))



def test_negatives_and_a_hits_metric_that_the_graph_cannot_give_are_refused_naming_both_numbers(graph):
    for name in ("eval_negatives", "negatives"):
        with pytest.raises(ConfigError, match=f"`{name}` 2,001: more negative destinations per positive than the "
                                              f"2,000 vertices they are drawn from; give at most 2,000"):
            link_graph(graph, config(**{name: 2001}))
    link_graph(graph, config(eval_negatives=2000, metric="hits@50"))
    with pytest.raises(ConfigError, match=r"`metric` hits@50: `eval_negatives` draws 20 per positive, fewer than "
                                          r"K = 50, so every positive would be a hit; choose hits@K with K at most "
                                          r"20, mrr or rocauc, or `eval_negatives` 50 or more"):
        link_graph(graph, config(eval_negatives=20, metric="hits@50"))
    stored = dataclasses.replace(graph.links, val_neg=graph.links.val[:, :30], test_neg=graph.links.test[:, :40],
                                 negatives="shared")
    with pytest.raises(ConfigError, match=r"stored negatives number 30 \(validation\) and 40 \(test\) per "
                                          r"positive, fewer than K = 50"):
        link_graph(dataclasses.replace(graph, links=stored), config(metric="hits@50"))
    link_graph(dataclasses.replace(graph, links=stored), config(metric="hits@30"))
    with pytest.raises(ConfigError, match="`eval_fanouts` 5,5, `eval_max_nodes` 100: a link task evaluates every "
                                          "vertex .* they would be ignored; leave them out"):
        link_graph(graph, config(eval_fanouts=[5, 5], eval_max_nodes=100))
    with pytest.raises(ConfigError, match=r"`eval_negatives` 50: .* stores its own evaluation negatives \(shared\), "
                                          r"which are scored instead; leave `eval_negatives` out"):
        link_graph(dataclasses.replace(graph, links=stored), config(eval_negatives=50))


@pytest.mark.slow
@pytest.mark.parametrize("planned", ["host", "device"])
def test_neutronorch_lockstep_equals_exact_mode_on_a_link_task(graph, planned):
    # P = 1, S = 0: the hot rows are computed for each mini-batch from the current weights with its own key,
    # their bottom hop without the batch's seed edges, as exact mode's: the same losses and gradients.
    common = dict(fanouts=[4, 3], batch_size=128, epochs=1, dropout=0.5, link_head="mlp", negatives=2)
    exact = config(mode="exact", **common).validate()
    orch = config(mode="neutronorch", super_batch=1, staleness_bound=0, hot_grad="cpu", hot_ratio=0.3,
                  device_sampling="on" if planned == "device" else "off", **common).validate()
    exact.batch_size = orch.batch_size = 128
    hot_rows = steps = 0
    model = lambda: LinkModel(GNN("sage", graph.feature_dim, 32, 32, 2, dropout=0.5), "mlp")  # noqa: E731
    loss_of = lambda m: LinkTask(m, "mrr").loss  # noqa: E731
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch, model=model,
                                                                       loss_of=loss_of):
        assert torch.equal(batch_a.labels, batch_b.labels)  # the same pairs and negatives
        hot_rows += int(batch_b.splice.index.hot_pos.numel())
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
        for (name, p_a), p_b in zip(model_a.named_parameters(), model_b.parameters()):
            torch.testing.assert_close(p_b.grad, p_a.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        steps += 1
        if steps == 12:
            break
    assert hot_rows > 0


def test_neutronorch_mode_trains_a_link_task_close_to_exact_mode():
    exact = train(config(epochs=4))
    orch = train(config(epochs=4, mode="neutronorch", super_batch=4, hot_ratio=0.2))
    # Hot vertices recur among a super-batch's pairs: each hot embedding serves several mini-batches.
    assert orch["hot"]["reuse_rate"] > 0.1 and orch["hot"]["uses_per_hot_embedding"] > 2
    assert abs(orch["final_test_mrr"] - exact["final_test_mrr"]) < 0.03


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["device", "neutronorch"])
def test_a_link_task_on_cuda_trains_as_exact_mode_does(mode):
    # On the GPU the seed edges leave the sampled graph through torch ops (device mode) or the cold sampler's
    # device blocks (NeutronOrch, planned on the device); the batches are exact mode's.
    exact = train(config(epochs=2))
    other = train(config(epochs=2, device="cuda", mode=mode,
                         **({"super_batch": 1, "staleness_bound": 0, "hot_ratio": 0.3} if mode == "neutronorch" else {})))
    torch.testing.assert_close(torch.tensor([e["train_loss"] for e in other["epochs"]]),
                               torch.tensor([e["train_loss"] for e in exact["epochs"]]), rtol=1e-4, atol=1e-5)
    assert abs(other["final_test_mrr"] - exact["final_test_mrr"]) < 1e-3


@pytest.mark.slow
def test_an_ogb_link_dataset_trains_with_its_own_split_negatives_and_metric(tmp_path, capsys):
    import json

    from test_ogb_link import make_citation2_like, make_collab_like

    from neutronorch.cli import main

    make_collab_like(tmp_path / "ogbl_collab")
    assert main(["info", str(tmp_path / "ogbl_collab")]) == 0
    assert "links 700/40/40 undirected" in json.loads(capsys.readouterr().out)["links"]
    summary = train(config(dataset=str(tmp_path / "ogbl_collab"), batch_size=64))
    assert summary["metric"] == "hits@50" and summary["link"]["negatives"] == "shared"
    assert summary["link"]["direction"] == "undirected: OGB's own split"
    assert summary["link"]["issues"]["train_repeated"] >= 1  # make_collab_like repeats a collaboration
    assert summary["final_test_hits_50"] == summary["link"]["final"]["test_hits_50"]
    make_citation2_like(tmp_path / "ogbl_citation2", negatives=20)
    summary = train(config(dataset=str(tmp_path / "ogbl_citation2"), batch_size=64, link_head="mlp"))
    assert summary["metric"] == "mrr" and summary["link"]["negatives"] == "per-source"
    assert 0 < summary["final_test_mrr"] <= 1 and "test_hits_10" in summary["link"]["final"]


class _StepLosses:
    """A ``train`` progress callback that keeps the running mean loss after every step, bit for bit."""

    def __init__(self):
        self.means = []

    def __call__(self, epoch, done, total):
        pass

    def loss(self, epoch, mean):
        self.means.append(float(mean).hex())


def test_a_link_run_with_two_threads_repeats_itself_bit_for_bit():
    # Each seed's embedding is picked many times by a batch's pairs. Picked by advanced indexing, its
    # gradient was summed by torch's CPU index_put_ with atomic additions from both threads (at 512 pairs x 64
    # columns, over torch's grain of 32,768 elements): the order of the sums followed the threads' timing, and
    # two identical runs parted in their last bits from the first step on (nn/rows.py).
    runs = []
    for _ in range(2):
        steps = _StepLosses()
        summary = train(config(dataset="synthetic:nodes=2000,degree=8,features=16,classes=4,seed=0",
                               split="edges:0.85,0.05", hidden=64, batch_size=512, epochs=2, threads=2),
                        progress=steps)
        runs.append((steps.means, [float(e["train_loss"]).hex() for e in summary["epochs"]], summary["link"]["final"]))
    assert len(runs[0][0]) > 20
    assert runs[0] == runs[1]


@pytest.mark.parametrize("kind", ["drawn", "per-source", "shared"])
def test_evaluation_scores_that_are_not_numbers_are_an_error_naming_the_split(graph, kind):
    links = graph.links
    rng = np.random.default_rng(0)
    stored = graph
    if kind != "drawn":
        shape = lambda edges: (2, 200) if kind == "shared" else (edges.shape[1], 20)  # noqa: E731
        negatives = [rng.integers(0, graph.num_nodes, shape(edges)) for edges in (links.val, links.test)]
        stored = dataclasses.replace(graph, links=LinkSplit(links.train, links.val, links.test, *negatives,
                                                            links.undirected, negatives=kind))
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 16, 16, 2), "dot")
    with torch.no_grad():
        next(model.encoder.layers[-1].parameters()).fill_(float("nan"))
    store = FeatureStore(graph.features, graph.labels)
    with pytest.raises(TrainingError, match=r"evaluation after epoch 4 gave NaN or infinite scores for "
                                            rf"{links.val.shape[1]:,} of the {links.val.shape[1]:,} validation "
                                            r"positive pairs.*eval mode"):
        evaluate_links(model, stored, store, torch.device("cpu"), 512, 0, 20, LinkTask.of(stored, model),
                       check=EvaluationCheck(4))


@pytest.mark.slow
def test_a_collapsed_link_run_says_so_and_a_learning_one_does_not(graph, caplog):
    # Every vertex's features equal (zero): the encoder gives every vertex one embedding, every pair one
    # score, and the MRR is the tie level 1 / (1 + K/2) at every epoch. The epoch line, one warning and the
    # summary say so; the run goes on.
    flat = dataclasses.replace(graph, features=np.zeros_like(graph.features))
    with caplog.at_level(logging.INFO, logger="neutronorch"):
        summary = train(config(epochs=2, eval_negatives=50), graph=flat)
    assert summary["status"] == "completed"
    assert [e["val_mrr"] for e in summary["epochs"]] == [pytest.approx(1 / 26)] * 2
    assert all(e["collapsed"][0] == "every score equal" for e in summary["epochs"])
    assert len(summary["warnings"]) == 1 and "lower `lr`" in summary["warnings"][0]
    assert sum("training has collapsed" in r.getMessage() for r in caplog.records) == 1
    assert "collapsed: every score equal" in next(r.getMessage() for r in caplog.records
                                                   if r.getMessage().startswith("epoch   1"))
    learning = train(config(epochs=2), graph=graph)
    assert learning["warnings"] == [] and not any("collapsed" in e for e in learning["epochs"])


@pytest.mark.slow
@pytest.mark.parametrize("head", ["dot", "mlp"])
def test_raw_bag_of_words_rows_train_at_the_defaults(head):
    # Amazon Photo's shape in small: 0/1 rows of about 240 ones among 600 words (L2 norm about 15), many words
    # common to every row. Before the first layer learnt at a rate divided by the rows' norm and started
    # centred, one Adam step at the default lr moved its outputs by lr times the rows' L1 norm, the dot head's
    # logits reached the hundreds and every ReLU died: a loss near 2 ln 2 and ties at MRR 1/51, flagged.
    bag = generate(SyntheticSpec.parse("synthetic:nodes=1500,degree=10,features=8,classes=4,homophily=0.9"))
    rng = np.random.default_rng(0)
    likely = np.where(rng.random((4, 600)) < 0.5, 0.15, 0.65)
    rows = (rng.random((1500, 600)) < likely[bag.labels]).astype(np.float32)
    assert 14 < np.sqrt((rows * rows).sum(axis=1)).mean() < 17
    summary = train(TrainConfig(dataset="bag", task="link", link_head=head, epochs=2, threads=1, device="cpu",
                                progress=False, stage_table=False), graph=dataclasses.replace(bag, features=rows))
    assert summary["warnings"] == [] and not any("collapsed" in e for e in summary["epochs"])
    assert summary["epochs"][-1]["train_loss"] < 1.3 and summary["final_val_mrr"] > 3 / 51


@pytest.mark.slow
def test_embeddings_dead_to_one_row_for_most_vertices_are_a_collapse():
    # The issue's shape in small: raw 0/1 bag-of-words rows and too large a step leave most vertices'
    # embeddings at one row, so that nearly every pair ties and the MRR sits at 1 / (1 + K/2) = 1/51; most
    # scores differ from none, but ties decide the ranks. The same rows at a small step learn, unflagged.
    bag = generate(SyntheticSpec.parse("synthetic:nodes=1500,degree=10,features=8,classes=4"))
    rows = (np.random.default_rng(0).random((1500, 200)) < 0.05).astype(np.float32)
    bag = dataclasses.replace(bag, features=rows)
    settings = dict(fanouts=[10, 10], hidden=64, batch_size=512, epochs=2, dropout=0.5)
    # lr 0.05, ten times the learning one: larger steps kill every vertex's embedding by the second epoch.
    dead = train(config(lr=0.05, **settings), graph=bag)
    assert [e["collapsed"] for e in dead["epochs"]] == [["most pairs scored alike (ties decide the ranks)"]] * 2
    assert dead["epochs"][0]["val_mrr"] == pytest.approx(1 / 51, abs=0.005)
    learning = train(config(lr=0.005, **settings), graph=bag)
    assert learning["warnings"] == [] and not any("collapsed" in e for e in learning["epochs"])


def test_a_typed_block_of_no_vertices_has_no_edges_to_leave_out():
    """A rank that computes no hot rows draws a bottom hop of no vertex types: nothing to leave out, no error."""
    from neutronorch.sampling.block import TypedBlock
    from neutronorch.sampling.exclude import exclude_from_typed_block

    empty = TypedBlock(num_dst={}, num_src={}, blocks={})
    assert exclude_from_typed_block(empty, torch.tensor([[0, 1], [2, 3]]), ends=None) is empty
