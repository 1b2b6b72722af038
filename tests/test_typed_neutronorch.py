"""NeutronOrch on typed graphs: hot rows per destination type spliced into a relational model's bottom
layer, and the mode that plans, computes and reuses them."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import Interrupted
from neutronorch.orchestration.neutronorch.controller import RatioSetting
from neutronorch.orchestration.neutronorch.device_planner import DevicePlanner
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.nn.splice import HotRows, SpliceIndex
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.features.store import TypedInputs

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def mag():
    return synthetic_typed(nodes=3000, degree=8, features=8, seed=1).with_reverse()


def grads(model) -> dict[str, torch.Tensor]:
    return {name: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone()
            for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_a_spliced_forward_and_its_gradients_equal_the_whole_ones(mag, kind):
    """Every other bottom-layer destination of each type computed apart (as the host computes hot rows) and
    spliced in: the logits and every gradient (dense weights, embedding tables) are the whole batch's, with
    the hot rows' gradient taken through the accumulator back into the layer that computed them."""
    torch.manual_seed(3)
    model = TypedGNN(kind, TypedSpec.of(mag), 16, mag.num_classes, 2, dropout=0.5, heads=2)
    model.train()
    sampler = TypedNeighborSampler(mag, [4, 3])
    seeds = np.asarray(mag.train_idx[:64])
    whole = sampler.sample(seeds, 9)
    torch.manual_seed(0)
    reference = model(whole.blocks, *TypedInputs(mag)(whole.input_nodes, CPU))
    reference.square().sum().backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)

    upper = sampler.sample_hops(seeds, 9, 1)
    destinations = upper.frontiers[0]
    hot_pos = {t: np.arange(ids.shape[0])[1::2] for t, ids in destinations.items()}
    cold_pos = {t: np.arange(ids.shape[0])[0::2] for t, ids in destinations.items()}
    hot_block = sampler.sample_bottom({t: ids.numpy()[hot_pos[t]] for t, ids in destinations.items()}, 9)
    features, ids = TypedInputs(mag)(hot_block.src_ids, CPU)
    tables = model.bottom(hot_block, model.input_rows(features, ids))
    cold_block = sampler.sample_bottom({t: ids.numpy()[cold_pos[t]] for t, ids in destinations.items()}, 9)
    hot = {t: HotRows(tables[t].detach(), SpliceIndex.build(ids.shape[0], cold_pos[t], hot_pos[t],
                                                             np.arange(hot_pos[t].shape[0])),
                      torch.zeros(tables[t].shape))
           for t, ids in destinations.items() if hot_pos[t].shape[0]}
    assert hot, "the batch has hot rows to splice"
    torch.manual_seed(0)
    spliced = model([cold_block, *upper.blocks], *TypedInputs(mag)(cold_block.src_ids, CPU), hot)
    torch.testing.assert_close(spliced, reference, rtol=1e-5, atol=1e-6)
    spliced.square().sum().backward()
    torch.autograd.backward([tables[t] for t in hot], [hot[t].grad_acc for t in hot])
    got = grads(model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")


# -- the mode -----------------------------------------------------------------------------------------------

def small() -> TypedGraph:
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=2)


def run_config(**settings) -> TrainConfig:
    base = dict(dataset="-", epochs=3, batch_size=24, fanouts=[4, 3], hidden=16, lr=0.01, eval_every=1,
                threads=1, seed=5, device="cpu")
    return TrainConfig(**{**base, **settings})


class Losses:
    """A ``progress`` that keeps every step's loss (the trainer reports the epoch's running mean)."""

    def __init__(self):
        self.steps: list[float] = []
        self._last = (None, 0)

    def __call__(self, epoch, done, total):
        pass

    def loss(self, epoch, mean):
        last_epoch, count = self._last
        count = count + 1 if last_epoch == epoch else 1
        previous = sum(self.steps[len(self.steps) - count + 1:]) if count > 1 else 0.0
        self.steps.append(mean * count - previous)
        self._last = (epoch, count)


LOCKSTEP = dict(mode="neutronorch", super_batch=1, staleness_bound=0, hot_ratio=1.0, hot_grad="cpu", snapshot_lead=0)


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_lockstep_neutronorch_equals_exact_mode(kind):
    """P = 1, staleness 0, every reusable row hot and its gradient taken back through the host: every step's
    loss, the scores and the summary's counts are exact mode's, though nearly every bottom-layer row was
    computed by the host."""
    graph = small()
    exact, orch = Losses(), Losses()
    a = train(run_config(model=kind), graph=graph, progress=exact)
    b = train(run_config(model=kind, **LOCKSTEP), graph=graph, progress=orch)
    assert b["mode"] == "neutronorch" and a["mode"] == "exact"
    assert len(exact.steps) == len(orch.steps) > 10
    np.testing.assert_allclose(orch.steps, exact.steps, rtol=2e-4, atol=1e-5)
    assert b["hot"]["reuse_rate"] > 0.5  # most bottom-layer rows came from the host
    assert b["staleness"]["max_observed"] == 0
    assert b["test_acc"] == pytest.approx(a["test_acc"], abs=2e-3)


def test_without_the_hot_rows_gradient_lockstep_departs_from_exact_mode():
    """``hot_grad="stop"``: the bottom layer never learns through the rows the host computed, so from the
    second step on the losses differ (the gradient the lockstep test relies on is really taken)."""
    graph = small()
    exact, orch = Losses(), Losses()
    train(run_config(), graph=graph, progress=exact)
    train(run_config(**{**LOCKSTEP, "hot_grad": "stop"}), graph=graph, progress=orch)
    assert orch.steps[0] == pytest.approx(exact.steps[0], rel=1e-5)
    assert not np.allclose(orch.steps[1:], exact.steps[1:], rtol=1e-3)


# -- the plan ----------------------------------------------------------------------------------------------

def uppers_of(graph, sampler, batches):
    return [(i, 1000 + i, sampler.sample_hops(seeds, 1000 + i, 1)) for i, seeds in enumerate(batches)]


@pytest.mark.parametrize("ratio", ["auto", 0.0, 0.3, 1.0])
def test_the_device_planner_makes_the_host_planners_plan(mag, ratio):
    """``DevicePlanner`` on the typed device sampler's upper hops (the host sampler's draws): the host
    planner's plan, entry for entry, its positions on the device."""
    host = TypedNeighborSampler(mag, [4, 3])
    device = TypedDeviceSampler(mag, CPU, host.fanouts)
    batches = [np.asarray(mag.train_idx)[i * 40:(i + 1) * 40] for i in range(4)]
    setting = RatioSetting(1.0, True, 0.1, 0.02) if ratio == "auto" else RatioSetting(ratio)
    bottom = {r: f[-1] for r, f in host.fanouts.items()}
    a = Planner(mag, bottom).plan(7, 0, uppers_of(mag, host, batches), setting.ratio, setting.cap())
    indptrs = {r: indptr for r, (indptr, _) in device.relations.items()}
    on_device = uppers_of(mag, device, [torch.from_numpy(s) for s in batches])
    b = DevicePlanner(mag, bottom, indptrs).plan(7, 0, on_device, setting.ratio, setting.cap())
    assert a.hot.keys() == b.hot.keys() and all(np.array_equal(a.hot[t], b.hot[t]) for t in a.hot)
    assert a.probe.keys() == b.probe.keys() and all(np.array_equal(a.probe[t], b.probe[t]) for t in a.probe)
    assert vars(a.stats) == vars(b.stats)
    for x, y in zip(a.batches, b.batches):
        assert x.saved_edges == y.saved_edges
        for name in ("cold_pos", "hot_pos", "hot_rows"):
            assert all(np.array_equal(getattr(x, name)[t], getattr(y, name)[t].numpy()) for t in getattr(x, name))


@pytest.mark.parametrize("ratio", ["auto", 0.0, 0.3, 1.0])
def test_a_plan_splits_each_types_destinations_into_hot_and_cold(mag, ratio):
    """``auto``: every vertex may be hot, but the staleness-error cap (a measured error of 0.1 against a budget
    of 0.02) keeps the appearances served hot within a fifth of each type's."""
    sampler = TypedNeighborSampler(mag, [4, 3])
    train_idx = np.asarray(mag.train_idx)
    batches = [train_idx[i * 40:(i + 1) * 40] for i in range(4)]
    uppers = uppers_of(mag, sampler, batches)
    setting = RatioSetting(1.0, True, 0.1, 0.02) if ratio == "auto" else RatioSetting(ratio)
    plan = Planner(mag, {r: f[-1] for r, f in sampler.fanouts.items()}).plan(7, 0, uppers, setting.ratio,
                                                                               setting.cap())
    hot_sets = {t: set(ids.tolist()) for t, ids in plan.hot.items()}
    appearances = {}
    for (_, _, upper), batch in zip(uppers, plan.batches):
        for t, ids in upper.frontiers[0].items():
            seeds = set(upper.seeds.tolist()) if t == mag.target else set()
            for v in ids.tolist():
                if v not in seeds:
                    appearances[t, v] = appearances.get((t, v), 0) + 1
            cold, hot = batch.cold_pos[t], batch.hot_pos[t]
            assert sorted(np.concatenate([cold, hot]).tolist()) == list(range(ids.shape[0]))
            assert np.all(np.diff(cold) > 0) and np.all(np.diff(hot) > 0)
            if hot.shape[0]:
                np.testing.assert_array_equal(plan.hot[t][batch.hot_rows[t]], ids.numpy()[hot])
            assert not seeds & set(ids.numpy()[hot].tolist()), "a mini-batch's own seeds are never hot in it"
            # every destination of a hot vertex is served hot, unless it is the mini-batch's own seed
            served = set(ids.numpy()[hot].tolist())
            assert served == {v for v in ids.tolist() if v in hot_sets.get(t, set()) and v not in seeds}
    total = sum(len(s) for s in hot_sets.values())
    if ratio == 0.0:
        assert total == 0 and plan.stats.hot_appearances == 0
    elif ratio == "auto":
        for t, hot in hot_sets.items():
            served = sum(appearances[t, v] for v in hot)
            assert 0 < served <= 0.2 * sum(n for (u, _), n in appearances.items() if u == t)
        assert total > 0 and plan.stats.error_capped
    elif ratio == 1.0:
        assert total == len(appearances)
    assert plan.stats.hot == sum(len(s) for s in hot_sets.values())


def test_the_hottest_vertices_of_each_type_are_chosen(mag):
    sampler = TypedNeighborSampler(mag, [4, 3])
    train_idx = np.asarray(mag.train_idx)
    uppers = uppers_of(mag, sampler, [train_idx[i * 40:(i + 1) * 40] for i in range(4)])
    plan = Planner(mag, {r: f[-1] for r, f in sampler.fanouts.items()}).plan(0, 0, uppers, 0.1)
    for t, hot in plan.hot.items():
        counts = {}
        for _, _, upper in uppers:
            seeds = set(upper.seeds.tolist()) if t == mag.target else set()
            for v in upper.frontiers[0].get(t, torch.zeros(0, dtype=torch.int64)).tolist():
                if v not in seeds:
                    counts[v] = counts.get(v, 0) + 1
        chosen = [counts[v] for v in hot.tolist()]
        assert chosen == sorted(chosen, reverse=True)
        assert min(chosen) >= max((n for v, n in counts.items() if v not in set(hot.tolist())), default=0)


# -- the run -----------------------------------------------------------------------------------------------

def test_super_batches_keep_within_the_staleness_bound_and_say_what_they_reused():
    summary = train(run_config(mode="neutronorch", super_batch=4, hot_ratio=0.3), graph=small())
    staleness, hot = summary["staleness"], summary["hot"]
    assert summary["neutronorch"]["super_batch"] == 4 and staleness["bound"] == 7
    assert 0 < staleness["max_observed"] <= 7
    assert 0 < hot["reuse_rate"] < 1 and hot["mean_hot_per_super_batch"] > 0
    assert all(0 < e["hot_ratio"] < 1 for e in summary["epochs"])
    # the stage table's lanes: the producer's, the host's (its rows' seconds, in the epoch it computed them:
    # it runs ahead across epochs) and the trainer's
    assert {"sampler", "host", "trainer"} <= set().union(*(e["lane_busy"] for e in summary["epochs"]))
    assert sum(e["stage_seconds"].get("host_compute", 0.0) for e in summary["epochs"]) > 0
    assert summary["status"] == "completed"


def test_auto_is_the_homogeneous_controllers_with_its_error_budget():
    """``hot_ratio auto`` on a typed graph: the tuner decides each epoch's ratio, the drift probe measures the
    stale error, and the plans are capped by ``hot_error_budget`` (nothing is hot before the error is known)."""
    summary = train(run_config(mode="neutronorch", super_batch=2, hot_ratio="auto", hot_error_budget=0.05),
                    graph=small())
    hot, epochs = summary["hot"], summary["epochs"]
    assert summary["neutronorch"]["hot_ratio_setting"] == "auto"
    assert hot["error_budget"] == 0.05 and hot["stale_error"] > 0
    assert [e["hot_ratio_auto"]["decision"] for e in epochs][0] == "warm-up"
    assert epochs[0]["hot_ratio"] == 0.0  # the first plans come before any measured error
    assert summary["staleness"]["max_observed"] <= summary["staleness"]["bound"]


def test_a_failure_in_the_sampler_thread_reaches_the_trainer(monkeypatch):
    def broken(self, *args, **kwargs):
        raise RuntimeError("planner broke")

    monkeypatch.setattr(Planner, "plan", broken)
    with pytest.raises(RuntimeError, match="planner broke"):
        train(run_config(mode="neutronorch", super_batch=2), graph=small())
    assert not [t for t in threading.enumerate() if t.name.startswith("neutronorch")]


def test_a_stopped_run_ends_its_threads():
    stop = threading.Event()

    class StopAfterThree(Losses):
        def __call__(self, epoch, done, total):
            if epoch == 1 and done == 3:
                stop.set()

    with pytest.raises(Interrupted):
        train(run_config(mode="neutronorch", super_batch=2), graph=small(), progress=StopAfterThree(), stop=stop)
    assert not [t for t in threading.enumerate() if t.name.startswith("neutronorch")]


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["sage", "rgcn"])
def test_lockstep_neutronorch_equals_exact_mode_on_cuda(kind):
    """The host computes on the CPU, the trainer splices on the GPU: still exact mode's steps."""
    graph = small()
    exact, orch = Losses(), Losses()
    train(run_config(model=kind, device="cuda"), graph=graph, progress=exact)
    summary = train(run_config(model=kind, device="cuda", **LOCKSTEP), graph=graph, progress=orch)
    np.testing.assert_allclose(orch.steps, exact.steps, rtol=1e-3, atol=1e-4)
    assert summary["device"].startswith("cuda") and summary["hot"]["reuse_rate"] > 0.5


@pytest.mark.cuda
def test_super_batches_on_cuda_keep_within_the_bound():
    summary = train(run_config(device="cuda", mode="neutronorch", super_batch=4), graph=small())
    assert summary["status"] == "completed" and summary["staleness"]["max_observed"] <= 7


@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_a_typed_run_draws_its_timeline(mode, tmp_path):
    """The stages' spans of the second epoch's first steps, on their lanes: the producer's sampling and
    gathering, the trainer's steps, and in NeutronOrch mode its planning and host rows."""
    pytest.importorskip("matplotlib")
    path = tmp_path / "timeline.png"
    graph = synthetic_typed(nodes=8000, degree=6, features=8, seed=2)  # 16 batches an epoch
    orch = {"super_batch": 2} if mode == "neutronorch" else {}
    summary = train(run_config(mode=mode, timeline=str(path), timeline_steps=12, **orch), graph=graph)
    assert path.is_file() and summary["timeline"]["png"] == str(path)
    import json
    data = json.loads(path.with_suffix(".spans.json").read_text())
    lanes = {s["lane"] for s in data["spans"]}
    assert {"sampler", "trainer"} <= lanes
    if mode == "neutronorch":
        assert {"planner", "host"} <= lanes
    assert {s["stage"] for s in data["spans"] if s["lane"] == "trainer"} >= {"forward", "backward", "step"}
    assert data["utilisation"] and all("utilisation" in e for e in summary["epochs"])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_device_sampling_trains_host_samplings_steps(device):
    """``device_sampling on``: the mini-batches' hops are drawn on the training device (torch ops on the CPU)
    with the host sampler's draws, so the plans and the steps are host sampling's."""
    graph, host, drawn = small(), Losses(), Losses()
    settings = dict(mode="neutronorch", super_batch=4, hot_ratio=0.3, device=device)
    a = train(run_config(**settings, device_sampling="off"), graph=graph, progress=host)
    b = train(run_config(**settings, device_sampling="on"), graph=graph, progress=drawn)
    assert b["hot"]["mean_hot_per_super_batch"] == a["hot"]["mean_hot_per_super_batch"]
    assert b["hot"]["bottom_edges_saved"] == a["hot"]["bottom_edges_saved"] > 0
    if device == "cpu":
        assert drawn.steps == host.steps and b["test_acc"] == a["test_acc"]
    else:
        np.testing.assert_allclose(drawn.steps, host.steps, rtol=1e-3, atol=1e-4)


def test_device_sampling_on_cuda_needs_room_for_the_topology():
    """On CUDA the topology is placed whole: ``auto`` samples on the host where it would take more than half the
    free memory, and ``on`` is refused there, naming the sizes and what to set."""
    from neutronorch.errors import ConfigError
    from neutronorch.orchestration.factory import draws_on_device

    graph, cuda = small(), torch.device("cuda")
    assert draws_on_device("on", graph, CPU) and not draws_on_device("auto", graph, CPU)
    assert draws_on_device("auto", graph, cuda, free=1 << 40) and not draws_on_device("off", graph, cuda)
    assert not draws_on_device("auto", graph, cuda, free=1024)
    with pytest.raises(ConfigError, match="`device_sampling` on: typed NeutronOrch places .* `device_sampling` off"):
        draws_on_device("on", graph, cuda, free=1024)
