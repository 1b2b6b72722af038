"""NeutronOrch mode: exactness against exact mode, the staleness bound, the pipeline and its errors."""

import copy
import itertools
import threading
import time

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.nn.aggregation import mean_aggregate_torch
from neutronorch.nn.models import GNN
from neutronorch.observe import Spans
from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.orchestration.neutronorch.controller import (HostScalar, HotRatioTuner, PublishedSetting,
                                                              RatioSetting, error_cap)
from neutronorch.orchestration.neutronorch.hot_rows import HotRowComputer
from neutronorch.orchestration.neutronorch.plan_loop import PlanLoop
from neutronorch.orchestration.neutronorch.device_planner import DevicePlanner
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.orchestration.neutronorch.versions import HotEmbeddings, Schedule, Snapshot, StalenessCheck
from neutronorch.sampling.device_sampler import triton_available
from neutronorch.sampling.neighbor_sampler import NeighborSampler, TorchNeighborSampler, layer_key
from neutronorch.train.step import train_step

SMALL = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"


@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))


def config(**overrides):
    values = dict(dataset="given", fanouts=[4, 3, 3], hidden=16, heads=2, batch_size=64, epochs=2, lr=0.01,
                  dropout=0.0, weight_decay=1e-3, progress=False, seed=3)
    values.update(overrides)
    cfg = TrainConfig(**values).validate()
    return cfg


def lockstep(graph, cfg_a, cfg_b, device=torch.device("cpu"), model=None, loss_of=None):
    """Train two modes side by side from the same initial model (``model()``, default the built-in one of
    ``cfg_a``), one ``train_step`` each per mini-batch with the loss ``loss_of(model)`` (default
    cross-entropy); yield per step (batch_a, batch_b, loss_a, loss_b, model_a, model_b), the gradients of the
    step still in the parameters."""
    torch.manual_seed(0)
    model_a = (model() if model is not None else GNN(
        cfg_a.model, graph.feature_dim, cfg_a.hidden, graph.num_classes, len(cfg_a.fanouts), dropout=cfg_a.dropout,
        heads=cfg_a.heads, gcn_norm=cfg_a.gcn_norm, residual=cfg_a.residual, norm=cfg_a.norm,
        architecture=cfg_a.architecture)).to(device)
    model_b = copy.deepcopy(model_a)
    opt_a = torch.optim.Adam(model_a.parameters(), lr=cfg_a.lr, weight_decay=cfg_a.weight_decay)
    opt_b = torch.optim.Adam(model_b.parameters(), lr=cfg_b.lr, weight_decay=cfg_b.weight_decay)
    mode_a, mode_b = build_mode(cfg_a, graph, device), build_mode(cfg_b, graph, device)
    mode_a.start(model_a)
    mode_b.start(model_b)
    step = 0
    try:
        for epoch in range(cfg_a.epochs):
            with mode_a.batches(epoch) as stream_a, mode_b.batches(epoch) as stream_b:
                for batch_a, batch_b in zip(stream_a, stream_b):
                    torch.manual_seed(1000 + step)  # the same dropout masks in both
                    loss_a = train_step(model_a, opt_a, mode_a, batch_a,
                                        loss_fn=loss_of(model_a) if loss_of else None)
                    torch.manual_seed(1000 + step)
                    loss_b = train_step(model_b, opt_b, mode_b, batch_b,
                                        loss_fn=loss_of(model_b) if loss_of else None)
                    yield batch_a, batch_b, loss_a, loss_b, model_a, model_b
                    step += 1
    finally:
        mode_a.close()
        mode_b.close()


@pytest.mark.slow
@pytest.mark.parametrize("model,dropout,deeper", [
    ("sage", 0.5, {}), ("gcn", 0.5, {}), ("gat", 0.0, {}), ("sage", 0.5, {"residual": True, "norm": "layer"}),
    ("gcn", 0.5, {"residual": True, "norm": "batch"}), ("gat", 0.0, {"residual": True, "norm": "layer"}),
    ("sage", 0.0, {"architecture": "blocks", "norm": "layer"}), ("gcn", 0.0, {"architecture": "blocks", "norm": "layer"})],
    ids=["sage", "gcn", "gat", "sage-residual-layer", "gcn-residual-batch", "gat-residual-layer", "sage-blocks",
         "gcn-blocks"])
def test_p1_s0_cpu_grad_equals_exact_mode_losses_and_gradients(graph, model, dropout, deeper):
    # GAT's attention dropout draws masks over the edges of the block the device computes, which the hot
    # rows leave; the ReLU dropout between layers is drawn per row of the full layer output in both modes.
    # Residuals and normalisation act on the spliced rows (the bottom layer's skip is part of a hot row).
    exact = config(model=model, mode="exact", dropout=dropout, **deeper)
    orch = config(model=model, mode="neutronorch", dropout=dropout, super_batch=1, staleness_bound=0,
                  hot_grad="cpu", hot_ratio=0.3, **deeper)
    steps = hot_rows = 0
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch):
        assert torch.equal(batch_a.subgraph.seeds, batch_b.subgraph.seeds)
        # Hot destinations' neighbours are neither sampled nor gathered on the device.
        assert batch_b.features.shape[0] <= batch_a.features.shape[0]
        hot_rows += int(batch_b.splice.index.hot_pos.numel())
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
        for (name, p_a), p_b in zip(model_a.named_parameters(), model_b.parameters()):
            torch.testing.assert_close(p_b.grad, p_a.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
        steps += 1
    assert steps == 2 * -(-len(graph.train_idx) // 64)
    assert hot_rows > 0


@pytest.mark.slow
@pytest.mark.parametrize("model, sampler", [("sage", "torch"), ("gcn", "torch"), ("sage", "triton")])
def test_planned_on_the_device_p1_s0_equals_exact_mode(graph, model, sampler, monkeypatch):
    # Device sampling (here on the CPU): every hop sampled and each super-batch planned in the cold sampler's
    # thread with the device sampler (torch ops, or the Triton kernels through Triton's interpreter); the
    # same draws, plans, losses and gradients as exact mode.
    if sampler == "triton" and not triton_available(torch.device("cuda" if torch.cuda.is_available() else "cpu")):
        pytest.skip("Triton is not installed")
    monkeypatch.setenv("NEUTRONORCH_DEVICE_SAMPLER", sampler)
    exact = config(model=model, mode="exact", dropout=0.5)
    orch = config(model=model, mode="neutronorch", dropout=0.5, super_batch=1, staleness_bound=0, hot_grad="cpu",
                  hot_ratio=0.3, device_sampling="on")
    hot_rows = 0
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch):
        assert torch.equal(batch_a.subgraph.seeds, batch_b.subgraph.seeds)
        hot_rows += int(batch_b.splice.index.hot_pos.numel())
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
        for (name, p_a), p_b in zip(model_a.named_parameters(), model_b.parameters()):
            torch.testing.assert_close(p_b.grad, p_a.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
    assert hot_rows > 0


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "gat"])
def test_hot_ratio_zero_is_exact_mode_whatever_the_super_batch(graph, model):
    exact = config(model=model, mode="exact")
    orch = config(model=model, mode="neutronorch", super_batch=4, hot_ratio=0.0)
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch):
        assert batch_b.splice.index.hot_pos.numel() == 0
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_stop_grad_leaves_hot_rows_out_of_the_bottom_gradient(graph):
    # P = 1, S = 0: identical forward; the bottom layer's gradient misses exactly the hot rows' share.
    exact = config(mode="exact")
    orch = config(mode="neutronorch", super_batch=1, staleness_bound=0, hot_grad="stop", hot_ratio=0.5)
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch):
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=1e-6)
        if batch_b.splice.index.hot_pos.numel():
            assert not torch.allclose(model_b.layers[0].lin_neigh.weight.grad, model_a.layers[0].lin_neigh.weight.grad)
        torch.testing.assert_close(model_b.layers[-1].lin_self.weight.grad, model_a.layers[-1].lin_self.weight.grad,
                                   rtol=1e-4, atol=1e-6)
        break


def _symmetric_reference(graph, block, frontier, x):
    """GCN's symmetric aggregation written out per destination, with graph degrees (D = in-degree + 1)."""
    degree = torch.from_numpy(np.diff(graph.indptr)[frontier.numpy()]).float()
    rows = []
    for v in range(block.num_dst):
        nbrs = block.indices[block.indptr[v]:block.indptr[v + 1]].long()
        dv = degree[v] + 1
        total = sum((x[u] / torch.sqrt((degree[u] + 1) * dv) for u in nbrs.tolist()), torch.zeros(x.shape[1]))
        scale = degree[v] / max(1, nbrs.shape[0])
        rows.append(x[v] / dv + scale * total)
    return torch.stack(rows)


def _host_planning(graph, cfg):
    """The planning loop's sampler and planner on the host."""
    sampling = cfg.sampling
    return (NeighborSampler(graph.indptr, graph.indices, sampling.fanouts, sampling.degrees, sampling.file_order),
            Planner(graph, sampling.fanouts[-1]))


def _host_plans(graph, cfg, schedule, producer, ratio=0.5):
    """The planning loop on the host, run here: room for every plan (no threads; the loops run in turn)."""
    producer.planned = Channel("plans")
    loop = PlanLoop(NodeSeeds(graph, cfg.sampling), cfg.sampling, schedule, PublishedSetting(RatioSetting(ratio)),
                    producer.planned, Spans())
    return loop.run(*_host_planning(graph, cfg))


@pytest.mark.parametrize("kind, norm", [("sage", None), ("gcn", "mean"), ("gcn", "symmetric")])
def test_host_hot_rows_equal_the_device_definition(graph, kind, norm):
    # The host's hot embeddings use the layer's own code; here they are compared to the plain torch
    # definition (the aggregation CUDA devices run) over the same sampled neighbours.
    cfg = config(model=kind, mode="neutronorch", super_batch=2, hot_ratio=0.5, epochs=1, gcn_norm=norm or "symmetric")
    torch.manual_seed(0)
    model = GNN(kind, graph.feature_dim, cfg.hidden, graph.num_classes, 3, gcn_norm=cfg.gcn_norm)
    batches = -(-len(graph.train_idx) // cfg.batch_size)
    schedule = Schedule(1, batches, 2, cfg.neutronorch.resolved_staleness)
    snapshots, hot = Channel("snapshots"), Channel("hot")
    weights = Snapshot(0, [p.detach().clone() for p in model.bottom.parameters()])
    for super_batch_id in range(schedule.total):
        snapshots.put(super_batch_id, weights)
    producer = HotRowComputer(build_mode(cfg, graph, torch.device("cpu")).kind, cfg.neutronorch,
                              schedule, model.bottom, snapshots, hot, Spans(), 1)
    plans = list(_host_plans(graph, cfg, schedule, producer))
    producer.compute()
    assert [p.super_batch_id for p in plans] == list(range(schedule.total))
    plan = plans[0]
    table = hot.take(0)
    block, frontier = NeighborSampler(graph.indptr, graph.indices, cfg.fanouts).sample_hop(
        plan.hot, cfg.fanouts[-1], layer_key(plan.batches[0].key, 2))
    x = torch.from_numpy(graph.features[frontier.numpy()]).float()
    layer = model.bottom
    if norm == "symmetric":
        aggregated = _symmetric_reference(graph, block, frontier, x)
    else:
        aggregated = mean_aggregate_torch(block, x, include_self=kind == "gcn")
    expected = layer.transform(block.dst_rows(x), aggregated)
    torch.testing.assert_close(table.table, expected.detach(), rtol=1e-5, atol=1e-5)
    assert table.version == 0 and table.host_edges == block.num_edges


def test_host_hot_rows_of_graph_blocks_draw_their_own_dropout_masks(graph):
    # The bottom graph block holds dropouts; the host computes hot rows in training mode, with masks keyed
    # by the super-batch and the vertex (so reproducible), drawn without touching torch's generator.
    cfg = config(model="sage", mode="neutronorch", super_batch=2, hot_ratio=0.5, epochs=1, dropout=0.3,
                 architecture="blocks", norm="layer")
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, cfg.hidden, graph.num_classes, 3, dropout=0.3, norm="layer",
                architecture="blocks")
    schedule = Schedule(1, -(-len(graph.train_idx) // cfg.batch_size), 2, cfg.neutronorch.resolved_staleness)

    def hot_rows():
        snapshots, hot = Channel("snapshots"), Channel("hot")
        snapshots.put(0, Snapshot(0, [p.detach().clone() for p in model.bottom.parameters()]))
        producer = HotRowComputer(build_mode(cfg, graph, torch.device("cpu")).kind,
                                  cfg.neutronorch, schedule, model.bottom, snapshots, hot, Spans(), 1)
        plan = next(_host_plans(graph, cfg, schedule, producer))
        producer._finish_hot(plan, *producer._gather_hot(plan, NeighborSampler(graph.indptr, graph.indices,
                                                                                cfg.fanouts)))
        return plan, hot.take(0).table

    state = torch.get_rng_state()
    plan, first = hot_rows()
    assert torch.equal(torch.get_rng_state(), state)  # torch's generator was not drawn from
    torch.manual_seed(5)
    assert torch.equal(hot_rows()[1], first)
    block, frontier = NeighborSampler(graph.indptr, graph.indices, cfg.fanouts).sample_hop(
        plan.hot, cfg.fanouts[-1], layer_key(plan.batches[0].key, 2))
    x = torch.from_numpy(graph.features[frontier.numpy()]).float()
    with torch.no_grad():
        model.bottom.eval()
        without = model.bottom(block, x)
        model.bottom.train()
    assert not torch.allclose(first, without)  # dropout acted
    assert (first - without).abs().mean() < without.abs().mean()  # ... on the same rows


def test_the_planner_makes_the_most_frequent_destinations_hot(graph):
    sampler = NeighborSampler(graph.indptr, graph.indices, [4, 3, 3])
    uppers = [(i, 100 + i, sampler.sample(np.asarray(graph.train_idx[i * 50:(i + 1) * 50]), 100 + i, [4, 3]))
              for i in range(3)]
    planner = Planner(graph, 3)
    plan = planner.plan(7, 0, uppers, ratio=0.5)
    # A mini-batch's seeds lead its bottom-layer destinations; only their other appearances can be served hot.
    for _, _, u in uppers:
        assert np.array_equal(u.frontiers[0][:u.seeds.shape[0]].numpy(), u.seeds.numpy())
    ids = np.unique(np.concatenate([u.frontiers[0].numpy() for _, _, u in uppers]))
    servable = np.concatenate([u.frontiers[0][u.seeds.shape[0]:].numpy() for _, _, u in uppers])
    by_id = dict(zip(*(a.tolist() for a in np.unique(servable, return_counts=True))))
    hot_freq = [by_id[v] for v in plan.hot.tolist()]
    assert hot_freq == sorted(hot_freq, reverse=True)
    assert min(hot_freq) >= max([by_id.get(v, 0) for v in set(ids.tolist()) - set(plan.hot.tolist())], default=0)
    assert len(plan.hot) == round(0.5 * len(ids)) == plan.stats.hot and plan.stats.reached == len(ids)
    for item, (_, _, upper) in zip(plan.batches, uppers):
        dst = upper.frontiers[0].numpy()
        assert sorted(np.concatenate([item.cold_pos, item.hot_pos]).tolist()) == list(range(dst.shape[0]))
        assert np.array_equal(plan.hot[item.hot_rows], dst[item.hot_pos])
        assert not np.isin(dst[item.cold_pos[item.cold_pos >= upper.seeds.shape[0]]], plan.hot).any()
        assert (item.hot_pos >= upper.seeds.shape[0]).all()  # never its own seeds
        assert np.isin(dst[:upper.seeds.shape[0]], plan.hot).any()  # though some are hot elsewhere
    assert plan.stats.hot_appearances == sum(b.hot_pos.shape[0] for b in plan.batches)
    assert plan.stats.appearances == sum(u.frontiers[0].shape[0] for _, _, u in uppers)
    # At ratio 1 only what a hot row can serve is hot: a vertex reached only as its own batch's seed is not.
    assert set(planner.plan(7, 0, uppers, ratio=1.0).hot.tolist()) == set(by_id)
    # Scratch arrays are left clean: a second plan of the same input is the same plan.
    again = planner.plan(7, 0, uppers, ratio=0.5)
    assert np.array_equal(again.hot, plan.hot)
    capped = planner.plan(7, 0, uppers, ratio=0.5, cap=lambda ranked: (3, True))
    assert len(capped.hot) == 3 and capped.stats.error_capped
    # A resumed super-batch is planned with the hot set it started with, whatever the ratio says now.
    kept = planner.plan(7, 0, uppers, ratio=0.9, hot=capped.hot)
    assert np.array_equal(kept.hot, capped.hot) and kept.stats.hot == 3
    assert all(np.array_equal(a.hot_rows, b.hot_rows) for a, b in zip(kept.batches, capped.batches))


@pytest.mark.parametrize("fanout", [3, -1])
def test_the_device_planner_plans_what_the_host_planner_plans(graph, fanout):
    # The same upper hops, sampled by the numba sampler and by the torch one (they draw the same neighbours),
    # planned on the host and on the device (here the CPU): the same hot set, positions, rows and counts.
    host_sampler = NeighborSampler(graph.indptr, graph.indices, [4, 3, fanout])
    device_sampler = TorchNeighborSampler(torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices),
                                          [4, 3, fanout])
    sizes = [50, 50, 17, 0]
    starts = np.cumsum([0] + sizes)
    seeds = [np.asarray(graph.train_idx[starts[i]:starts[i + 1]]) for i in range(len(sizes))]
    host_uppers = [(i, 100 + i, host_sampler.sample(s, 100 + i, [4, 3])) for i, s in enumerate(seeds)]
    device_uppers = [(i, 100 + i, device_sampler.sample(torch.from_numpy(s), 100 + i, [4, 3]))
                     for i, s in enumerate(seeds)]
    host, device = Planner(graph, fanout), DevicePlanner(graph, fanout, torch.from_numpy(graph.indptr))
    # ``fresh``: vertices kept cold besides each batch's own seeds (data parallel: the global batch's seeds).
    others = [None, np.asarray(graph.train_idx[:80]), None, np.asarray(graph.train_idx[200:210])]
    cases = [dict(ratio=0.5), dict(ratio=0.0), dict(ratio=1.0), dict(ratio=0.5, cap=lambda ranked: (3, True)),
             dict(ratio=1.0, fresh=others)]
    for case in cases:
        a, b = host.plan(7, 1, host_uppers, **case), device.plan(7, 1, device_uppers, **case)
        assert np.array_equal(a.hot, b.hot) and np.array_equal(a.probe, b.probe)
        for item, (_, _, upper), extra in zip(a.batches, host_uppers, case.get("fresh", [None] * len(sizes))):
            served = upper.frontiers[0].numpy()[item.hot_pos]
            assert not np.isin(served, upper.seeds.numpy()).any()
            assert extra is None or not np.isin(served, extra).any()
        assert vars(a.stats) == vars(b.stats)
        for x, y in zip(a.batches, b.batches):
            for name in ("cold_pos", "hot_pos", "hot_rows"):
                assert np.array_equal(getattr(x, name), getattr(y, name).numpy()), name
            assert x.saved_edges == y.saved_edges
    # A resumed super-batch keeps its hot set; a hot set the mini-batches do not reach is a bug.
    kept = device.plan(7, 1, device_uppers, ratio=0.9, hot=a.hot)
    assert np.array_equal(kept.hot, a.hot) and kept.stats.error_capped is False
    with pytest.raises(RuntimeError, match="do not reach"):
        device.plan(7, 1, device_uppers, ratio=0.9, hot=np.setdiff1d(np.arange(graph.num_nodes), a.hot)[:5])


def test_the_planner_kernels_rank_index_and_split_as_numpy_does():
    from neutronorch.orchestration.neutronorch.planner import (concatenated, fresh_entries, index_appearances,
                                                              rank_by_count, split_hot_cold)

    rng = np.random.default_rng(0)
    for n, top in [(0, 1), (1, 1), (500, 1), (5000, 8), (3000, 40)]:
        counts = rng.integers(1, top + 1, n).astype(np.int32)
        assert np.array_equal(rank_by_count(counts), np.argsort(-counts, kind="stable"))
    sizes = [0, 400, 1, 250]
    nodes = np.concatenate([rng.choice(1000, k, replace=False) for k in sizes])
    slot = np.full(1000, -1, np.int32)
    distinct, counts, index = index_appearances(nodes, slot)
    first = np.sort(np.unique(nodes, return_index=True)[1])
    assert np.array_equal(distinct, nodes[first]) and (slot == -1).all()
    assert np.array_equal(distinct[index], nodes)
    assert np.array_equal(counts, np.bincount(index, minlength=distinct.shape[0]))
    row_of = np.full(distinct.shape[0], -1, np.int32)
    hot = rng.choice(distinct.shape[0], distinct.shape[0] // 3, replace=False)
    row_of[hot] = np.arange(hot.shape[0])
    saved_of = rng.integers(0, 9, distinct.shape[0])
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    # Kept cold: each batch's leading entries (its seeds), and in batch 3 the vertices of a list (data parallel).
    own = np.array([0, 37, 1, 0], np.int64)
    extra, extra_offsets = concatenated([None, None, None, nodes[offsets[3]:offsets[3] + 60:3]])
    fresh = fresh_entries(nodes, offsets, own, extra, extra_offsets, slot)
    assert (slot == -1).all()
    expected = np.zeros(nodes.shape[0], bool)
    for b in range(len(sizes)):
        expected[offsets[b]:offsets[b] + own[b]] = True
    expected[offsets[3]:] |= np.isin(nodes[offsets[3]:], extra)
    assert np.array_equal(fresh, expected) and fresh[offsets[3]:].sum() == 20
    positions, rows, hot_counts, saved = split_hot_cold(index, offsets, row_of, saved_of, fresh)
    for b in range(len(sizes)):
        part = index[offsets[b]:offsets[b + 1]]
        is_hot = (row_of[part] >= 0) & ~fresh[offsets[b]:offsets[b + 1]]
        lo, mid, hi = offsets[b], offsets[b] + hot_counts[b], offsets[b + 1]
        assert np.array_equal(positions[lo:mid], np.flatnonzero(is_hot))
        assert np.array_equal(positions[mid:hi], np.flatnonzero(~is_hot))
        assert np.array_equal(rows[lo:mid], row_of[part[is_hot]])
        assert saved[b] == saved_of[part[is_hot]].sum()


def test_schedule_keeps_every_use_within_the_bound():
    for epochs, batches, p, s in [(2, 10, 4, 7), (3, 5, 4, 3), (1, 1, 8, 7), (2, 9, 1, 0), (2, 12, 3, 10)]:
        sched = Schedule(epochs, batches, p, s)
        for g, lead in itertools.product(range(sched.total), [None, 0, 1, 2, 100]):
            v = sched.snapshot_version(g, lead)
            assert v <= sched.first_step(g)
            assert sched.last_step(g) - v <= s
            epoch, first, end = sched.locate(g)
            assert first < end <= batches and (epoch, first) == divmod(sched.first_step(g), batches)
            for step in range(sched.first_step(g), sched.last_step(g) + 1):
                assert sched.at(step) == (g, step - sched.first_step(g))


@pytest.mark.slow
@pytest.mark.parametrize("p,bound,lead,worst", [(4, None, 4, 7), (3, 2, None, 2), (4, None, None, 5),
                                                 (4, None, 0, 3)])
def test_training_reports_observed_staleness_within_the_bound(p, bound, lead, worst):
    # The last mini-batch of a super-batch uses rows (P - 1) + lead steps old; the lead defaults to 2 and
    # is capped at S - P + 1, so the bound holds whatever the lead.
    summary = train(TrainConfig(dataset=SMALL, mode="neutronorch", fanouts=[5, 5], hidden=32, batch_size=64,
                                epochs=2, super_batch=p, staleness_bound=bound, snapshot_lead=lead,
                                hot_ratio=0.2, progress=False))
    staleness = summary["staleness"]
    assert staleness["bound"] == (2 * p - 1 if bound is None else bound)
    assert staleness["max_observed"] == worst <= staleness["bound"]
    assert 0 <= staleness["mean_observed"] <= worst
    hot = summary["hot"]
    assert 0 < hot["reuse_rate"] < 1 and hot["mean_hot_per_super_batch"] > 0 and hot["bottom_edges_saved"] > 0
    assert hot["uses_per_hot_embedding"] > 1


def test_a_staleness_violation_raises():
    check = StalenessCheck(bound=3)
    hot = HotEmbeddings(super_batch_id=0, version=0, table=torch.zeros(1, 1), num_hot=1)
    check.check(hot, 3)
    assert check.max_observed == 3
    with pytest.raises(RuntimeError, match="staleness bound violated"):
        check.check(hot, 4)
    with pytest.raises(RuntimeError, match="staleness bound violated"):
        check.check(HotEmbeddings(super_batch_id=1, version=5, table=torch.zeros(1, 1), num_hot=1), 4)  # from the future


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_neutronorch_mode_learns(model):
    summary = train(TrainConfig(dataset=SMALL, mode="neutronorch", model=model, fanouts=[5, 5], hidden=32,
                                batch_size=128, epochs=12 if model == "gat" else 3, lr=0.01, dropout=0.5,
                                weight_decay=0.0, super_batch=4, hot_ratio=0.3, progress=False))
    assert summary["test_acc"] > 0.8


@pytest.mark.slow
def test_every_destination_hot_and_auto_ratio_run(graph):
    # Ratio 1: every bottom-layer destination hot but each mini-batch's own seeds (the planner's test checks
    # which rows exactly): here about a tenth of the rows.
    summary = train(config(mode="neutronorch", hot_ratio=1.0, epochs=1), graph=graph)
    assert 0.8 < summary["hot"]["reuse_rate"] < 1.0
    # A huge error budget leaves r to the speed tuner, which moves it between epochs.
    summary = train(config(mode="neutronorch", hot_ratio="auto", hot_error_budget=1e9, epochs=4, super_batch=1),
                    graph=graph)
    ratios = [e["hot_ratio"] for e in summary["epochs"]]
    assert len(set(ratios[1:])) > 1 and summary["neutronorch"]["auto_history"]
    assert summary["hot"]["drift_per_step"] > 0


@pytest.mark.slow
def test_auto_ratio_is_capped_by_the_staleness_error_budget(graph):
    # lr 0.01 on a tiny graph moves the bottom layer a lot per step: a tight budget keeps nearly every row
    # exact; nothing is hot before the drift has been measured (3 epochs of 3 super-batches: planning runs
    # a few super-batches ahead of training, so the first measured drift reaches only later plans).
    tight = train(config(mode="neutronorch", hot_ratio="auto", hot_error_budget=1e-4, epochs=3, super_batch=1),
                  graph=graph)
    loose = train(config(mode="neutronorch", hot_ratio="auto", hot_error_budget=1e9, epochs=3, super_batch=1),
                  graph=graph)
    assert tight["hot"]["reuse_rate"] < 0.01 < loose["hot"]["reuse_rate"]
    assert tight["hot"]["error_capped_super_batches"] > 0
    counts = np.array([8, 4, 2, 1, 1])
    assert error_cap(counts, RatioSetting(0.2, True)) == (0, True)  # no drift measured yet
    # coverage <= 0.02 / 0.001: every row may be hot
    assert error_cap(counts, RatioSetting(0.2, True, torch.tensor(0.001))) == (5, False)
    # coverage <= 0.02 / 0.03: only the hottest vertex (8/16); that caps a ratio of 0.6 (3 vertices) but
    # not one of 0.2 (1 vertex)
    assert error_cap(counts, RatioSetting(0.2, True, torch.tensor(0.03))) == (1, False)
    assert error_cap(counts, RatioSetting(0.6, True, torch.tensor(0.03))) == (1, True)


def test_the_published_stale_error_is_read_without_waiting_for_the_device():
    class Pending:  # a copy still queued behind the trainer's work
        def query(self):
            return False

        def synchronize(self):
            pass

    counts = np.array([8, 4, 2, 1, 1])
    first = HostScalar(torch.tensor(0.001))
    assert first.value() == pytest.approx(0.001)
    assert error_cap(counts, RatioSetting(0.2, True, first)) == (5, False)
    second = HostScalar(torch.tensor(0.03), before=first)
    second._ready = Pending()
    assert second.value() == pytest.approx(0.001)  # the value published before, until the copy is done
    assert error_cap(counts, RatioSetting(0.2, True, second)) == (5, False)
    assert second.wait() == pytest.approx(0.03)  # a checkpoint waits for the value itself
    unmeasured = HostScalar(torch.tensor(0.03))
    unmeasured._ready = Pending()
    assert error_cap(counts, RatioSetting(0.2, True, unmeasured)) == (0, True)  # nothing measured yet


def _pipeline_threads():
    return [t for t in threading.enumerate() if t.name.startswith("neutronorch-")]


@pytest.mark.slow
def test_a_host_error_reaches_the_caller_and_no_thread_is_left(monkeypatch, graph):
    original = Planner.plan

    def failing(self, super_batch_id, *args, **kwargs):
        if super_batch_id == 3:
            raise ValueError("host stage broke")
        return original(self, super_batch_id, *args, **kwargs)

    monkeypatch.setattr(Planner, "plan", failing)
    with pytest.raises(ValueError, match="host stage broke") as info:
        train(config(mode="neutronorch", super_batch=2, hot_ratio=0.2, epochs=3), graph=graph)
    assert any(entry.name == "failing" for entry in info.traceback)
    deadline = time.monotonic() + 5
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pipeline_threads()


@pytest.mark.slow
def test_a_trainer_error_stops_the_pipeline(monkeypatch, graph):
    calls = {"n": 0}
    original = NeutronOrchMode.after_step

    def failing(self, batch):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyError("trainer broke")
        return original(self, batch)

    monkeypatch.setattr(NeutronOrchMode, "after_step", failing)
    with pytest.raises(KeyError, match="trainer broke"):
        train(config(mode="neutronorch", super_batch=2, hot_ratio=0.2, epochs=3), graph=graph)
    deadline = time.monotonic() + 5
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pipeline_threads()


def test_the_pipeline_runs_on_across_epochs(graph):
    cfg = config(mode="neutronorch", super_batch=2, hot_ratio=0.2, epochs=2)
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, 16, graph.num_classes, 3)
    optimizer = torch.optim.Adam(model.parameters())
    mode = build_mode(cfg, graph, torch.device("cpu"))
    mode.start(model)
    try:
        with mode.batches(0) as batches:
            for batch in batches:
                train_step(model, optimizer, mode, batch)
        # Without any call for epoch 1, its first mini-batches are prepared already.
        view = mode.batches(1)
        deadline = time.monotonic() + 10
        while view.pending == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert view.pending > 0
        assert next(view).epoch == 1
    finally:
        mode.close()


@pytest.mark.slow
def test_the_producers_leave_the_trainers_thread_count_alone(monkeypatch, graph):
    """torch's thread settings are partly process-wide (the BLAS pool): a producer thread that set them for
    itself would make the trainer's matrix products single-threaded."""
    callers = []
    real = torch.set_num_threads

    def spy(n):
        callers.append(threading.current_thread().name)
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", spy)
    before = torch.get_num_threads()
    try:
        train(config(mode="neutronorch", super_batch=2, hot_ratio=0.3, epochs=1, eval_every=-1, host_threads=1,
                     sampler_threads=1), graph)
    finally:
        real(before)
    assert callers and set(callers) == {threading.main_thread().name}


@pytest.mark.parametrize("args,message", [
    (["--mode", "neutronorch", "--super-batch", "4", "--staleness-bound", "2"], "at least 3"),
    (["--mode", "neutronorch", "--hot-ratio", "1.5"], "--hot-ratio"),
    (["--mode", "neutronorch", "--hot-ratio", "lots"], "'auto' or a fraction"),
    (["--mode", "neutronorch", "--super-batch", "0"], "--super-batch 0"),
])
def test_bad_neutronorch_options_give_one_clear_error(args, message, capsys):
    assert main(["train", "--dataset", SMALL, "--epochs", "1"] + args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_auto_ratio_walks_towards_the_fastest_epoch_on_shared_cores():
    tuner = HotRatioTuner(0.2, shared_cores=True)
    # fastest at r = 0.3; without hot rows (r = 0) slower than with any
    cost = lambda r: 30.0 if r == 0 else (np.log2(r) - np.log2(0.3)) ** 2 + 10  # noqa: E731
    ratio = tuner.update(99.0, 0, 0)  # warm-up epoch: ignored
    assert ratio == 0.2
    assert tuner.update(cost(ratio), 0, 0) == 0  # one epoch without hot rows: what they save
    for _ in range(14):
        ratio = tuner.update(cost(ratio), 0, 0)
    assert abs(np.log2(ratio) - np.log2(0.3)) < 0.5


def test_auto_ratio_balances_host_and_device_on_separate_processors():
    tuner = HotRatioTuner(0.2, shared_cores=False)
    tuner.update(1.0, 1.0, 1.0)
    assert tuner.update(1.0, host_seconds=2.0, device_seconds=1.0) == 0  # then one epoch without hot rows
    assert tuner.update(1.5, 0.0, 1.0) == 0.2  # and alternating: with, then without again
    assert tuner.update(1.0, host_seconds=2.0, device_seconds=1.0) == 0
    assert tuner.update(1.5, 0.0, 1.0) == pytest.approx(0.1)  # reuse paid; host slower: less hot
    assert tuner.update(1.0, host_seconds=1.0, device_seconds=10.0) == pytest.approx(0.2)  # at most 2x per epoch



@pytest.mark.slow
def test_neutronorch_runs_repeat_exactly_with_a_fixed_ratio_and_lead(graph):
    cfg = config(mode="neutronorch", super_batch=2, hot_ratio=0.3, snapshot_lead=1, epochs=3, dropout=0.5,
                 eval_every=-1)
    runs = [train(cfg, graph) for _ in range(2)]
    assert [e["train_loss"] for e in runs[0]["epochs"]] == [e["train_loss"] for e in runs[1]["epochs"]]
    assert runs[0]["hot"]["reuse_rate"] > 0


def test_each_plan_records_the_ratio_setting_it_followed(graph):
    # The trainer replaces the setting whole and numbers each publication; a plan says which it followed.
    cfg = config(mode="neutronorch", super_batch=2, hot_ratio=0.5, epochs=1)
    schedule = Schedule(1, -(-len(graph.train_idx) // cfg.batch_size), 2, cfg.neutronorch.resolved_staleness)
    published = PublishedSetting(RatioSetting(0.5))
    loop = PlanLoop(NodeSeeds(graph, cfg.sampling), cfg.sampling, schedule, published, Channel("plans"), Spans())
    plans = loop.run(*_host_planning(graph, cfg))
    first = next(plans)
    published.publish(RatioSetting(0.1))
    second = next(plans)
    assert (first.stats.setting, second.stats.setting) == (0, 1)
    assert second.stats.hot == round(0.1 * second.stats.reached) < first.stats.hot


def test_what_crosses_a_thread_is_frozen(graph):
    """Plans, snapshots, hot embeddings and the ratio setting cross between threads, so their types forbid
    changing them: frozen dataclasses, a plan's mini-batches a tuple and its hot set read-only (a typed plan's a
    read-only mapping of read-only sets), a snapshot's parameters copies outside autograd that later steps do
    not move."""
    import dataclasses

    from neutronorch.orchestration.neutronorch.controller import RatioSetting
    from neutronorch.orchestration.neutronorch.planner import Plan, PlannedBatch, PlanStats
    from neutronorch.data.synthetic_typed import synthetic_typed
    from neutronorch.sampling.typed_sampler import TypedNeighborSampler
    from neutronorch.orchestration.neutronorch.versions import SnapshotPublisher

    for kind in (Plan, PlannedBatch, PlanStats, Snapshot,
                 HotEmbeddings, RatioSetting):
        assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen, kind.__name__
    sampler = NeighborSampler(graph.indptr, graph.indices, [4, 3, 3])
    uppers = [(i, 100 + i, sampler.sample(np.asarray(graph.train_idx[i * 50:(i + 1) * 50]), 100 + i, [4, 3]))
              for i in range(3)]
    plan = Planner(graph, 3).plan(7, 0, uppers, ratio=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.hot = plan.hot[:1]
    with pytest.raises(ValueError, match="read-only"):
        plan.hot[0] = -1
    assert isinstance(plan.batches, tuple)
    typed = synthetic_typed(nodes=600, degree=4, features=4, seed=1)
    sampler = TypedNeighborSampler(typed, [3, 3])
    uppers = [(i, 100 + i, sampler.sample_hops(np.asarray(typed.train_idx[i * 20:(i + 1) * 20]), 100 + i, 1))
              for i in range(2)]
    plan = Planner(typed, {r: f[-1] for r, f in sampler.fanouts.items()}).plan(3, 0, uppers, ratio=0.5)
    assert plan.hot, "a typed plan with hot vertices"
    with pytest.raises(TypeError):
        plan.hot[typed.target] = np.empty(0, np.int64)  # its hot sets: a read-only mapping of read-only arrays
    with pytest.raises(ValueError, match="read-only"):
        next(iter(plan.hot.values()))[0] = -1
    publisher = SnapshotPublisher(Schedule(1, 4, 2, 3), on_cuda=False)
    layer = torch.nn.Linear(3, 2)
    publisher.publish_due(layer, 0, 0)
    snapshot = publisher.channel.take(0)
    before = [p.clone() for p in snapshot.params]
    with torch.no_grad():
        layer.weight.add_(1.0)
    assert all(not p.requires_grad for p in snapshot.params)
    assert all(torch.equal(p, q) for p, q in zip(snapshot.params, before))
