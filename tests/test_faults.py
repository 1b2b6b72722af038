"""A fault in any stage reaches the caller promptly, with its traceback, and no pipeline thread survives."""

import threading
import time

import pytest

from neutronorch import TrainConfig, train
from neutronorch.data import SyntheticSpec, generate
from neutronorch.features.cache import FeatureCache
from neutronorch.features.store import FeatureStore
from neutronorch.nn.splice import SpliceIndex
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.sampling.neighbor_sampler import NeighborSampler, TorchNeighborSampler
from neutronorch.train import loop, run

PIPELINE_THREADS = ("exact-producer", "device-producer", "neutronorch-")
# At most the batches made ahead of the trainer, taken after a fault: 2 prefetched (exact, device); NeutronOrch's
# planned super-batches, 2 of 2 batches.
MADE_AHEAD = 4


@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))


def run_config(mode: str, **overrides) -> TrainConfig:
    values = dict(dataset="given", mode=mode, fanouts=[4, 3], hidden=16, batch_size=32, epochs=3, progress=False,
                  eval_every=1, **(dict(super_batch=2, hot_ratio=0.3) if mode == "neutronorch" else {}))
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def compiled(graph):
    """One short run of each mode first: numba compiles its kernels at their first call (seconds on a fresh
    checkout), and a step that is compiling is busy, not waiting; the fault must surface while waiting."""
    for mode in ("exact", "device", "neutronorch"):
        train(run_config(mode, epochs=1), graph)


class Injected(Exception):
    pass


def inject(monkeypatch, owner, name, after_calls, raised_at):
    """Make ``owner.name`` raise ``Injected`` on its call number ``after_calls + 1`` (in whatever thread)."""
    real = getattr(owner, name)
    calls = {"n": 0}

    def faulty(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after_calls:
            raised_at.append(time.monotonic())
            raise Injected(f"{name} broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, faulty)


STAGES = [
    ("exact", "sampler", NeighborSampler, "_hops", 3),  # every path samples a batch through _hops
    ("exact", "gather", FeatureStore, "gather_into", 3),
    ("exact", "evaluation", run, "evaluate", 0),
    ("device", "sampler", TorchNeighborSampler, "_hops", 3),
    ("device", "gather", FeatureCache, "gather", 3),
    ("neutronorch", "planner", Planner, "plan", 2),
    ("neutronorch", "host gather", FeatureStore, "gather", 2),
    ("neutronorch", "cold sampler", SpliceIndex, "build", 5),
]


@pytest.mark.slow
@pytest.mark.parametrize("mode,stage,owner,name,after", STAGES, ids=[f"{m}-{s}" for m, s, *_ in STAGES])
def test_a_fault_in_any_stage_stops_the_run_promptly(monkeypatch, graph, compiled, mode, stage, owner, name,
                                                      after):
    raised_at, steps = [], []
    inject(monkeypatch, owner, name, after, raised_at)
    step = loop.train_step

    def counted(*args, **kwargs):
        steps.append(time.monotonic())
        return step(*args, **kwargs)

    monkeypatch.setattr(loop, "train_step", counted)
    with pytest.raises(Injected, match=f"{name} broke") as info:
        train(run_config(mode, batch_size=8), graph)
    caught = time.monotonic()
    # Promptly: within a second, or (on a loaded machine, where a second is a few steps) before the trainer took
    # more steps than the batches made ahead of it; one that waited for the epoch's end would take about 15 more.
    after_fault = sum(1 for t in steps if raised_at and t > raised_at[0])
    assert raised_at and (caught - raised_at[0] < 1.0 or after_fault <= MADE_AHEAD), \
        f"the fault took {caught - raised_at[0]:.2f} s and {after_fault} steps to surface"
    assert any(entry.name == "faulty" for entry in info.traceback)  # the original traceback
    deadline = time.monotonic() + 5
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pipeline_threads()


def _pipeline_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith(PIPELINE_THREADS)]


@pytest.mark.cuda
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_a_fault_in_the_copy_to_the_device_stops_the_run_promptly(monkeypatch, graph, compiled, mode):
    from neutronorch.orchestration.host_loader import HostLoader

    raised_at = []
    inject(monkeypatch, HostLoader, "_ship", 3, raised_at)
    with pytest.raises(Injected, match="_ship broke"):
        train(run_config(mode, device="cuda", device_sampling="off"), graph)
    assert raised_at and time.monotonic() - raised_at[0] < 1.0
    deadline = time.monotonic() + 5
    while _pipeline_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _pipeline_threads()
