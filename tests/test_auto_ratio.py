"""``--hot-ratio auto`` turning reuse off where it does not pay, and back on where it does: the tuner on
injected timings, the controller on epoch records, the planner's and host's empty hot sets, and runs."""


import numpy as np
import pytest

from neutronorch import TrainConfig, train
from neutronorch.config import NeutronOrchConfig
from neutronorch.data import SyntheticSpec, generate
from neutronorch.orchestration.neutronorch import controller as controller_module
from neutronorch.orchestration.neutronorch.controller import HotRatioTuner, RatioController
from neutronorch.orchestration.neutronorch.mode import STAGES
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.observe.report import reuse_line, reuse_summary
from neutronorch.orchestration.neutronorch.versions import Schedule
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.train.step import TRAINER_STAGES

HOST_WORK = ("host_sample", "host_gather", "host_aggregate", "host_matmul", "host_compute", "host_copy", "hot_grad")


@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))


def config(**overrides):
    values = dict(dataset="given", fanouts=[4, 3, 3], hidden=16, heads=2, batch_size=64, epochs=2, lr=0.01,
                  dropout=0.0, weight_decay=1e-3, progress=False, seed=3, eval_every=-1)
    values.update(overrides)
    return TrainConfig(**values)


class Timings:
    """Injected epoch times: ``without`` seconds without hot rows, ``with_`` seconds with them."""

    def __init__(self, without: float, with_: float):
        self.without, self.with_ = without, with_

    def __call__(self, ratio: float) -> float:
        return self.without if ratio == 0 else self.with_


def test_reuse_goes_off_where_it_does_not_pay_and_comes_back_where_it_does():
    tuner = HotRatioTuner(0.2, shared_cores=True)
    epoch = Timings(without=10.0, with_=11.0)  # the hot rows cost more than they save
    assert tuner.update(99.0, 0, 0) == 0.2  # warm-up: decides nothing
    assert tuner.update(epoch(0.2), 0.1, 1.0, cost_seconds=3.0) == 0  # then one epoch without hot rows
    assert tuner.history[-1]["decision"] == "baseline"
    # Two with and two without, alternating, decide.
    assert [tuner.update(epoch(tuner.ratio), 0.1, 1.0, 3.0) for _ in range(3)] == [0.2, 0, 0]
    assert [h["decision"] for h in tuner.history[-3:]] == ["confirm", "baseline", "off"]
    off = tuner.history[-1]
    assert off["reason"] == ("reuse does not pay: every epoch with hot rows was slower than every one without by more "
                             "than 10%: 11.000 and 11.000 CPU s per epoch with hot rows (r 0.2), 10.000 and 10.000 "
                             "without")
    ratios = [tuner.update(epoch(tuner.ratio), 0.1, 1.0, cost_seconds=3.0) for _ in range(2 * tuner.PROBE_EVERY + 1)]
    # Every PROBE_EVERY epochs without hot rows, a probe at a small ratio: two epochs at it, alternating with two
    # without (the first of them the epoch that started it); here it does not pay.
    p = tuner.PROBE_RATIO
    assert ratios == [0, 0, 0, p, 0, p, 0, 0, 0]
    decisions = [h["decision"] for h in tuner.history[-9:]]
    assert decisions == ["off", "off", "off", "probe", "baseline", "confirm", "off", "off", "off"]
    assert "a probe at r 0.05" in tuner.history[-6]["reason"]
    assert tuner.history[-3]["reason"].startswith("the probe did not pay: not every epoch with hot rows was faster")
    probed = tuner.history[-5]  # the probe's first epoch: 11 s with hot rows, 10 s without
    assert probed["ratio"] == p and probed["cost_s"] == 3.0 and probed["saved_s"] == 2.0  # cost > saved
    # The machine changes: hot rows now save more than they cost. The next probe finds it.
    epoch.with_ = 8.0
    assert tuner.update(epoch(0), 0.1, 1.0) == 0 and tuner.update(epoch(0), 0.1, 1.0) == p
    assert tuner.history[-1]["decision"] == "probe" and tuner.history[-1]["reason"].startswith("4 epochs without")
    for _ in range(3):
        ratio = tuner.update(epoch(tuner.ratio), 0.1, 1.0, cost_seconds=1.0)
    assert tuner.history[-1]["decision"] == "on" and "the probe paid" in tuner.history[-1]["reason"]
    assert ratio == pytest.approx(2 * p)  # and the walk goes on from there
    assert tuner.history[-1]["saved_s"] == 3.0
    for _ in range(4):
        ratio = tuner.update(epoch(ratio), 0.1, 1.0, cost_seconds=1.0)
        assert ratio > 0 and tuner.history[-1]["decision"] == "walk"


def decide(tuner: HotRatioTuner, with_hot: tuple, without: tuple) -> float:
    """A bracket after the warm-up: the epochs with hot rows and without them, alternating from ``with_hot``."""
    for a, b in zip(with_hot, without):
        tuner.update(a, 0, 0)
        tuner.update(b, 0, 0)
    return tuner.ratio


def test_reuse_that_pays_from_the_start_stays_on_after_the_baseline_epochs():
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0)
    assert decide(tuner, (9.0, 9.0), (10.0, 10.0)) == pytest.approx(0.4)  # reuse paid: the walk from r 0.2
    assert tuner.history[-1]["decision"] == "on" and "reuse pays" in tuner.history[-1]["reason"]
    for _ in range(6):
        assert tuner.update(9.0 if tuner.ratio > 0 else 10.0, 0, 0) > 0


@pytest.mark.parametrize("kind", ["first", "probe"])
@pytest.mark.parametrize("pays", [True, False])
@pytest.mark.parametrize("disturbed", range(4))
def test_a_load_on_any_one_epoch_of_four_never_makes_a_wrong_change(kind, pays, disturbed):
    """Noise and another program's load (which adds time, CPU time too where caches are shared or threads spin)
    on any one epoch of a bracket: reuse changes state only where every epoch with hot rows compares with every
    one without alike, so the disturbed epoch may keep reuse as it was (a recheck or the next probe decides
    again), never turn it off where it pays or on where it does not."""
    hot, cold = (9.0, 9.1) if pays else (11.5, 11.6), (10.0, 10.1)
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0)
    if kind == "probe":  # reuse turned off, then four epochs without hot rows open a probe's bracket
        decide(tuner, (11.5, 11.5), (10.0, 10.0))
        for _ in range(3):
            tuner.update(10.0, 0, 0)
        epochs = [cold[0], hot[0], cold[1], hot[1]]
    else:
        epochs = [hot[0], cold[0], hot[1], cold[1]]
    before = "off" if kind == "probe" else "on"
    epochs[disturbed] *= 1.35
    for seconds in epochs:
        tuner.update(seconds, 0, 0)
    decision, right = tuner.history[-1]["decision"], "on" if pays else "off"
    assert (tuner.ratio > 0) == (decision == "on")
    # Epochs 1 and 3 are the bracket's second kind (without hot rows in the first bracket, with them in a probe's):
    # slowing one of them can only hide a change, as the docstring says.
    delayed = before != right and disturbed in (1, 3)
    assert decision == (before if delayed else right), tuner.history[-1]


def test_epochs_the_error_cap_kept_cold_decide_nothing():
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0, hot_share=0.0)
    assert tuner.update(10.0, 0, 0, hot_share=0.0) == 0.2  # nothing was hot: no measure of reuse yet
    assert tuner.history[-1]["decision"] == "capped"
    # The first epoch with hot rows compiles their path: it decides nothing, whatever it took.
    assert tuner.update(30.0, 0, 0, hot_share=0.1) == 0.2
    assert tuner.history[-1]["decision"] == "warm-up" and "the first epoch with hot rows" in tuner.history[-1]["reason"]
    for seconds, share in ((9.0, 0.1), (10.0, 0.0), (9.5, 0.12)):
        tuner.update(seconds, 0, 0, hot_share=share)
    # Reuse pays, but the cap held the hot rows to half the ratio: a higher one would make no more hot.
    assert tuner.update(10.0, 0, 0, hot_share=0.0) == pytest.approx(0.2)
    assert tuner.history[-1]["decision"] == "on" and tuner.history[-1]["reason"].startswith("reuse pays")
    assert "r 0.2, a mean 10.0% of the vertices reached hot" in tuner.history[-1]["reason"]  # the faster's share
    assert tuner.history[-1]["reason"].endswith("the staleness-error cap held the hot rows to 10.0% of the vertices "
                                                "reached, below r 0.2: a higher ratio would make no more rows hot")
    tuner = HotRatioTuner(0.2, shared_cores=True)
    for seconds, share in ((99.0, 0.0), (10.0, 0.0), (30.0, 0.1), (11.5, 0.1), (10.0, 0.0), (11.5, 0.1)):
        tuner.update(seconds, 0, 0, hot_share=share)
    assert tuner.update(10.0, 0, 0, hot_share=0.0) == 0 and tuner.history[-1]["decision"] == "off"


def test_the_walk_never_goes_above_a_ratio_whose_hot_rows_the_error_cap_held():
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0, hot_share=0.2)
    tuner.update(30.0, 0, 0, hot_share=0.2)  # the hot rows' warm-up
    for seconds, share in ((9.0, 0.2), (10.0, 0.0), (9.0, 0.2)):
        tuner.update(seconds, 0, 0, hot_share=share)
    assert tuner.update(10.0, 0, 0, hot_share=0.0) == pytest.approx(0.4)  # not held at 0.2: the walk doubles r
    assert tuner.update(8.0, 0, 0, hot_share=0.22) == pytest.approx(0.4)  # faster, but held at 22%: stays
    assert "held the hot rows to 22.0% of the vertices reached, below r 0.4" in tuner.history[-1]["reason"]
    assert tuner.update(7.9, 0, 0, hot_share=0.39) == pytest.approx(0.8)  # the cap let go: the walk goes on


def test_the_first_epoch_with_hot_rows_is_a_warm_up_even_after_the_first_epoch():
    """As a run starts: the first epoch serves nothing hot (no snapshot yet), the second compiles the hot rows'
    path (slow), the third measures them; a verdict taken from the second would turn reuse off for nothing."""
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(0.5, 0, 0, hot_share=0.0)  # warm-up: nothing served hot yet
    assert tuner.update(0.53, 0, 0, hot_share=0.127) == 0.2 and tuner.history[-1]["decision"] == "warm-up"
    assert tuner.update(0.15, 0, 0, hot_share=0.2) == 0 and tuner.history[-1]["decision"] == "baseline"
    assert tuner.update(0.17, 0, 0, hot_share=0.0) == 0.2 and tuner.history[-1]["decision"] == "confirm"
    assert tuner.update(0.16, 0, 0, hot_share=0.21) == 0
    assert tuner.update(0.171, 0, 0, hot_share=0.0) > 0 and tuner.history[-1]["decision"] == "on"
    assert "0.150 and 0.160 CPU s per epoch with hot rows (r 0.2, a mean 20.0% of the vertices reached hot), " \
        "0.170 and 0.171 without" in tuner.history[-1]["reason"]
    restored = HotRatioTuner(0.2, shared_cores=True)
    restored.load_state_dict(tuner.state_dict())
    assert restored.state_dict() == tuner.state_dict()


def test_a_walk_that_gets_slower_than_no_hot_rows_goes_back_or_measures_again_and_off():
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0)
    assert decide(tuner, (9.0, 9.0), (10.0, 10.0)) == pytest.approx(0.4)  # r 0.2: 9 s; without: 10 s
    assert tuner.update(10.5, 0, 0) == pytest.approx(0.2 * 2 ** -0.5)  # r 0.4 slower than none: back below 0.2
    assert tuner.update(10.2, 0, 0) == pytest.approx(0.2 * 2 ** 0.25)  # still no better: turn round again
    # The best ratio measured again, now slower than no hot rows: nothing faster to return to.
    tuner._step = tuner.MIN_STEP / 2  # converged on r 0.2
    tuner.ratio = 0.2
    assert tuner.update(10.2, 0, 0) == 0.2  # within the noise margin of no hot rows: kept
    assert tuner.update(10.5, 0, 0) == 0 and tuner.history[-1]["decision"] == "baseline"  # measured again first
    assert "10.500 CPU s per epoch at r 0.2, 10.000 CPU s without hot rows when last measured" in \
        tuner.history[-1]["reason"]
    # One slow epoch was another program's load: the bracket keeps reuse on.
    assert [tuner.update(seconds, 0, 0) for seconds in (10.0, 9.1)] == [0.2, 0] and tuner.update(10.0, 0, 0) > 0
    assert tuner.history[-1]["decision"] == "on" and "reuse stays on" in tuner.history[-1]["reason"]
    # Slow at every ratio: back, then measured again, then off.
    ratios = [tuner.update(10.6 if tuner.ratio > 0 else 10.0, 0, 0) for _ in range(12)]
    off = [h["decision"] for h in tuner.history].index("off")
    assert ratios[-1] == 0 and tuner.history[off]["reason"].startswith("reuse does not pay")
    assert [h["decision"] for h in tuner.history[off - 3:off]] == ["baseline", "confirm", "baseline"]


def test_reuse_stays_on_when_the_baseline_is_faster_only_by_noise():
    # Measured on the 1M-vertex benchmark graph: the first epoch with hot rows 26.35 s (early in training,
    # few rows hot under the error cap), the baseline without them 25.26 s (4% faster), reuse then 23.7 s.
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0)
    assert decide(tuner, (10.2, 10.3), (10.0, 10.0)) > 0 and tuner.history[-1]["decision"] == "on"  # 2%: noise
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0)
    assert decide(tuner, (10.5, 10.6), (10.0, 10.1)) == pytest.approx(0.1)  # 5% slower: on, with fewer hot rows
    assert tuner.history[-1]["decision"] == "on" and "by more than 10%: reuse stays on" in tuner.history[-1]["reason"]
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0)
    assert decide(tuner, (11.5, 11.5), (10.0, 10.0)) == 0 and tuner.history[-1]["decision"] == "off"  # 15% slower


def test_on_separate_processors_reuse_goes_off_when_the_host_falls_behind_at_the_smallest_ratio():
    tuner = HotRatioTuner(0.02, shared_cores=False)
    tuner.update(99.0, 1.0, 1.0)
    for seconds, host in ((9.0, 1.0), (10.0, 0.0), (9.0, 1.0)):
        tuner.update(seconds, host, 1.0)
    assert tuner.update(10.0, 0.0, 1.0) == pytest.approx(0.02)  # reuse paid: balanced (device / host 1)
    # The host falls behind and the epoch is slower than without hot rows: fewer hot rows first ...
    assert tuner.update(10.5, host_seconds=3.0, device_seconds=1.0) == pytest.approx(0.01)
    assert tuner.history[-1]["decision"] == "balance"
    # ... and at the smallest ratio, still slower: measured again, then none.
    assert tuner.update(10.5, host_seconds=3.0, device_seconds=1.0, cost_seconds=2.0) == 0
    for seconds, host in ((10.0, 0.0), (10.5, 3.0)):
        tuner.update(seconds, host, 1.0)
    assert tuner.update(10.0, 0.0, 1.0) == 0 and tuner.history[-1]["decision"] == "off"
    assert "10.500 and 10.500 s per epoch with hot rows (r 0.01)" in tuner.history[-1]["reason"]
    # With the host ahead, an epoch slower than without hot rows is measured again, then reuse goes off.
    tuner = HotRatioTuner(0.2, shared_cores=False)
    for seconds in (99.0, 9.0, 10.0, 9.0, 10.0):
        tuner.update(seconds, 1.0, 1.0)
    assert tuner.update(10.5, host_seconds=0.5, device_seconds=1.0) == 0
    assert [tuner.update(seconds, 0.5, 1.0) for seconds in (10.0, 10.5, 10.0)] == [0.2, 0, 0]
    assert tuner.history[-1]["decision"] == "off"


def test_the_tuner_resumes_its_decisions_exactly():
    epoch = Timings(without=10.0, with_=11.0)
    a = HotRatioTuner(0.2, shared_cores=True)
    for _ in range(7):  # warm-up, a bracket (off), two epochs without hot rows
        a.update(epoch(a.ratio), 0.1, 1.0, 2.0)
    b = HotRatioTuner(0.2, shared_cores=True)
    b.load_state_dict(a.state_dict())
    for _ in range(8):
        assert a.update(epoch(a.ratio), 0.1, 1.0, 2.0) == b.update(epoch(b.ratio), 0.1, 1.0, 2.0)
    assert a.history == b.history
    # Mid-bracket too.
    e, f = HotRatioTuner(0.2, shared_cores=True), HotRatioTuner(0.2, shared_cores=True)
    for _ in range(3):
        e.update(epoch(e.ratio), 0.1, 1.0, 2.0)
    f.load_state_dict(e.state_dict())
    assert e._phase == "bracket" and f.state_dict() == e.state_dict()
    assert [e.update(epoch(e.ratio), 0, 0) for _ in range(3)] == [f.update(epoch(f.ratio), 0, 0) for _ in range(3)]
    assert e.history == f.history
    # A checkpoint written before reuse could be turned off resumes the walk it held.
    old = {k: v for k, v in a.state_dict().items() if k not in ("zero", "phase", "off", "factor", "bracket", "kind")}
    c = HotRatioTuner(0.2, shared_cores=True)
    c.load_state_dict({**old, "ratio": 0.3})
    assert c.update(12.0, 0, 0) > 0
    # One written with a baseline epoch pending (before the bracket) measures it as the bracket's second epoch.
    d = HotRatioTuner(0.2, shared_cores=True)
    d.load_state_dict({**old, "ratio": 0.0, "phase": "baseline", "best": (9.0, 0.2), "zero": None})
    assert d.update(10.0, 0, 0) == 0.2 and d.update(9.0, 0, 0) == 0
    assert d.update(10.0, 0, 0) > 0 and d.history[-1]["decision"] == "on"


def test_the_controller_records_why_and_the_epoch_line_says_it():
    config = NeutronOrchConfig(super_batch=2, hot_ratio="auto", staleness_bound=3, hot_grad="cpu",
                               hot_error_budget=0.02, snapshot_lead=None)
    control = RatioController(config, Schedule(6, 8, 2, 3), shared_cores=True)
    stages = TRAINER_STAGES.merge(STAGES)

    def record(epoch, seconds, host):
        stage = {"forward": 1.0, "backward": 1.0, "host_aggregate": host, "host_matmul": host, "hot_grad": 0.5,
                 "host_wait_weights": 9.0}  # a wait: not a cost
        return {"epoch": epoch, "seconds": seconds, "stage_seconds": stage}

    control.end_epoch(record(0, 99.0, 1.0), 0.2, stages)
    out = control.end_epoch(record(1, 11.0, 1.0), 0.2, stages)
    assert out["hot_ratio_auto"]["decision"] == "baseline" and control.setting.ratio == 0
    # The epoch's reuse line says the decision and its reason.
    assert "| next epoch: baseline, r 0 (one epoch without hot rows" in reuse_line({**out, "hot_served": 0.3})
    assert control.tuner.history[-1]["cost_s"] == 2.5  # the host's busy seconds and the hot gradient
    out = control.end_epoch(record(2, 10.0, 0.0), 0.0, stages)
    assert out["hot_ratio_auto"]["next"] == 0.2 and out["hot_ratio_auto"]["decision"] == "confirm"
    assert control.end_epoch(record(3, 11.0, 1.0), 0.2, stages)["hot_ratio_auto"]["decision"] == "baseline"
    out = control.end_epoch(record(4, 10.0, 0.0), 0.0, stages)
    assert out["hot_ratio_auto"]["next"] == 0 and out["hot_ratio_auto"]["decision"] == "off"
    assert out["hot_ratio"] == 0.0 and control.setting.ratio == 0 and control.summary()["ratio"] == 0
    # A plan made at ratio 0 has no probe vertices: the drift probe waits for one that has.
    control.saw_plan(np.empty(0, np.int64))
    assert control._probe_ids is None
    control.saw_plan(np.array([3, 1]))
    assert control._probe_ids.tolist() == [3, 1]


def test_a_plan_at_ratio_0_is_the_planner_s_plan_without_the_ranking(graph):
    sampler = NeighborSampler(graph.indptr, graph.indices, [4, 3, 3])
    seeds = [np.asarray(graph.train_idx[i * 32:(i + 1) * 32]) for i in range(3)]
    uppers = [(i, 100 + i, sampler.sample(s, 100 + i, [4, 3])) for i, s in enumerate(seeds)]
    planner = Planner(graph, 3)
    ranked = planner.plan(5, 1, uppers, 0.0, hot=np.empty(0, np.int64))  # an empty hot set, found by ranking
    cold = planner.plan(5, 1, uppers, 0.0)
    assert cold.hot.shape[0] == 0 and cold.stats.hot == cold.stats.hot_appearances == cold.stats.saved_edges == 0
    assert cold.stats.appearances == ranked.stats.appearances
    for a, b in zip(ranked.batches, cold.batches):
        assert np.array_equal(a.cold_pos, b.cold_pos) and b.hot_pos.shape[0] == b.hot_rows.shape[0] == 0
        assert (a.index, a.key, b.saved_edges) == (b.index, b.key, 0)


@pytest.mark.parametrize("with_hot, without, decision", [
    ((30.0, 18.0), (12.0, 20.0), "on"),  # the epoch with hot rows slowed by another program: reuse still pays
    ((10.0, 22.0), (40.0, 18.0), "off"),  # the baseline slowed by another program: reuse still does not pay
])
def test_another_programs_load_does_not_flip_reuse_on_shared_cores(with_hot, without, decision):
    """On shared cores the tuner judges the process's CPU seconds (the work), not the wall time that another
    program's load swings: (wall, CPU) seconds of the epoch with hot rows and of the baseline without."""
    config = NeutronOrchConfig(super_batch=2, hot_ratio="auto", staleness_bound=3, hot_grad="cpu",
                               hot_error_budget=0.02, snapshot_lead=None)
    control = RatioController(config, Schedule(6, 8, 2, 3), shared_cores=True)
    stages = TRAINER_STAGES.merge(STAGES)

    def record(epoch, wall, cpu):
        return {"epoch": epoch, "seconds": wall, "cpu_seconds": cpu, "stage_seconds": {"forward": 1.0}}

    control.end_epoch(record(0, 99.0, 99.0), 0.2, stages)  # warm-up
    for epoch in (1, 3):
        assert control.end_epoch(record(epoch, *with_hot), 0.2, stages)["hot_ratio_auto"]["decision"] == "baseline"
        out = control.end_epoch(record(epoch + 1, *without), 0.0, stages)["hot_ratio_auto"]
    assert out["decision"] == decision and "CPU s per epoch" in out["reason"], out
    assert (control.setting.ratio > 0) == (decision == "on")


@pytest.mark.slow
def test_a_run_at_ratio_0_does_no_host_work_and_trains_as_exact_mode(graph):
    orch = train(config(mode="neutronorch", hot_ratio=0.0, super_batch=2, epochs=3), graph=graph)
    exact = train(config(mode="exact", epochs=3), graph=graph)
    assert [e["train_loss"] for e in orch["epochs"]] == [e["train_loss"] for e in exact["epochs"]]
    assert orch["hot"]["mean_hot_per_super_batch"] == 0 and orch["hot"]["host_bottom_edges"] == 0
    for record in orch["epochs"]:
        assert sum(record["stage_seconds"].get(stage, 0.0) for stage in HOST_WORK) == 0.0
        assert record["stage_seconds"].get("host_wait_weights", 0.0) == 0.0
        assert record["lane_busy"].get("host", 0.0) == 0.0
        assert record["hot_served"] in (None, 0.0) and reuse_line(record).startswith("off (r 0): no rows served hot")
    assert reuse_summary(orch) == "no rows served hot: the run trained as without reuse"


@pytest.mark.slow
def test_each_epoch_says_the_share_served_hot_and_its_staleness(graph):
    summary = train(config(mode="neutronorch", hot_ratio=0.5, super_batch=2, epochs=2), graph=graph)
    bound = summary["staleness"]["bound"]
    for record in summary["epochs"]:
        staleness = record["staleness"]
        assert 0 < record["hot_served"] <= 1 and 0 <= staleness["mean"] <= staleness["max"] <= bound
        assert reuse_line(record).startswith(f"on, r {record['hot_ratio']:.3g}: {100 * record['hot_served']:.1f}% "
                                             f"of bottom-layer rows served hot, staleness mean {staleness['mean']}")
    assert reuse_summary(summary).startswith(f"hot rows served {100 * summary['hot']['reuse_rate']:.1f}% of "
                                             f"bottom-layer rows in 2 of 2 epochs, staleness max")


@pytest.mark.slow
def test_auto_turns_reuse_off_in_a_run_where_it_does_not_pay(monkeypatch, graph):
    update = HotRatioTuner.update
    monkeypatch.setattr(controller_module.HotRatioTuner, "update",  # injected: hot rows make every epoch slower
                        lambda self, seconds, *rest: update(self, 10.0 if self.ratio == 0 else 11.0, *rest))
    summary = train(config(mode="neutronorch", hot_ratio="auto", hot_error_budget=1e9, super_batch=1, epochs=14,
                           batch_size=16), graph=graph)
    decisions = [h["decision"] for h in summary["neutronorch"]["auto_history"]]
    # Epoch 1 measured reuse (then one epoch without: the baseline), or its plans, made before the drift was
    # measured, had nothing hot (an epoch without reuse already); epochs that still served hot rows planned
    # ahead at the earlier ratio decide nothing (mixed). Two epochs with hot rows and two without decide.
    assert decisions[0] == "warm-up" and decisions[1] in ("baseline", "capped")
    off = decisions.index("off")
    measured = [d for d in decisions[1:off + 1] if d not in ("mixed", "capped")]
    assert measured == ["baseline", "confirm", "baseline", "off"], decisions
    assert summary["epochs"][off]["hot_ratio_auto"]["reason"].startswith("reuse does not pay")
    after = [d for d in decisions[off + 1:] if d != "mixed"]  # an epoch planned in part at r 0.2 decides nothing
    assert after[:4] == ["off", "off", "off", "probe"], decisions  # after 4 epochs without hot rows
    # Plans run a few super-batches ahead (half an epoch of 10 here); then nothing is hot and the host idles.
    for record in summary["epochs"][off + 3:off + 5]:
        assert record["hot_ratio"] == 0.0
        assert sum(record["stage_seconds"].get(stage, 0.0) for stage in HOST_WORK) == 0.0


def test_an_epoch_planned_in_part_at_the_ratio_before_measures_neither_either_way():
    """The super-batches planned ahead before a change follow the ratio before: at r 0 after a ratio, and at a
    ratio after r 0 (the epoch after a verdict 'on' served a third of the rows hot that its ratio makes)."""
    tuner = HotRatioTuner(0.2, shared_cores=True)
    tuner.update(99.0, 0, 0, planned_apart=0.0)
    assert tuner.update(9.0, 0, 0, planned_apart=0.0) == 0  # the bracket's first epoch
    assert tuner.update(8.0, 0, 0, planned_apart=0.5) == 0 and tuner.history[-1]["decision"] == "mixed"
    assert "50% of its super-batches were planned ahead at the ratio before" in tuner.history[-1]["reason"]
    assert tuner.update(10.0, 0, 0, planned_apart=0.05) == 0.2  # a twentieth: measured as one without
    assert tuner.update(11.0, 0, 0, planned_apart=0.4) == 0.2 and tuner.history[-1]["decision"] == "mixed"
    assert decide(tuner, (9.0,), (10.0,)) == pytest.approx(0.4) and tuner.history[-1]["decision"] == "on"
    assert tuner.update(12.0, 0, 0, planned_apart=0.6) == pytest.approx(0.4)  # planned at 0 in part: not r 0.4's
    assert tuner.history[-1]["decision"] == "mixed" and "one more at r 0.4" in tuner.history[-1]["reason"]


def test_the_plans_say_which_of_an_epoch_s_super_batches_followed_another_ratio():
    from neutronorch.orchestration.neutronorch.planner import PlanStats
    from neutronorch.orchestration.neutronorch.stats import HotStats

    stats = HotStats()
    for ratio in (0.2, 0.2, 0.0, 0.0, 0.0):
        stats.account(PlanStats(epoch=3, hot=1, reached=4, appearances=4, hot_appearances=1, saved_edges=0,
                                ratio=ratio))
    assert stats.planned_apart(3, 0.0) == pytest.approx(0.4) and stats.planned_apart(3, 0.0) is None


def test_the_last_line_says_where_auto_ended():
    epoch = {"hot_ratio": 0.2, "hot_served": 0.3,
             "hot_ratio_auto": {"next": 0.2, "decision": "confirm", "reason": "..."}}
    summary = {"epochs": [epoch], "hot": {"reuse_rate": 0.3}, "staleness": {"max_observed": 9, "bound": 15}}
    assert reuse_summary(summary).endswith("(bound 15); auto: no verdict yet, reuse on while it measures (last "
                                           "decision: confirm, r 0.2)")
    off = {"epoch": 6, "hot_ratio": 0.2, "hot_served": 0.3, "hot_ratio_auto": {"next": 0.0, "decision": "off"}}
    probe = {"epoch": 7, "hot_ratio": 0.0, "hot_served": 0.0, "hot_ratio_auto": {"next": 0.05, "decision": "mixed"}}
    assert reuse_summary({**summary, "epochs": [epoch, off, probe]}).endswith(
        "; auto: reuse off by its verdict after epoch 6 (last decision: mixed, r 0.05)")
    fixed = {**summary, "epochs": [{"hot_ratio": 0.2, "hot_served": 0.3}]}
    assert reuse_summary(fixed).endswith("(bound 15)")
