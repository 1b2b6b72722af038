"""Device mode on typed graphs: every relation and label on the training device, the featured types' rows in
device caches, against exact mode step for step; a partial cache trains as a whole one; what does not fit is
refused naming its sizes; a stopped run resumes to the bit."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.errors import ConfigError, Interrupted
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.config_parts import PlacementConfig
from neutronorch.orchestration.device_reader import device_bytes, typed_cache_rows
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.checkpoint import load_typed_checkpoint


@pytest.fixture(scope="module")
def mag():
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=2).with_reverse()


@pytest.fixture(scope="module")
def weighted():
    """cites and rev_cites carry a weight per edge."""
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=2, edge_weights=True).with_reverse()


def config(**settings) -> TrainConfig:
    base = dict(dataset="-", epochs=2, batch_size=12, fanouts=[4, 3], hidden=16, lr=0.01, dropout=0.3,
                eval_every=1, threads=1, seed=5, device="cpu")
    return TrainConfig(**{**base, **settings})


class Means:
    """A ``progress`` that keeps the running mean of the loss the trainer reports (on the CPU, every step)."""

    def __init__(self):
        self.means: list[tuple[int, float]] = []

    def __call__(self, epoch, done, total):
        pass

    def loss(self, epoch, mean):
        self.means.append((epoch, mean))


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_device_mode_trains_exactly_as_exact_mode(mag, kind):
    """The same samples, rows and order: every step's loss and every score are exact mode's, to the bit."""
    exact, device = Means(), Means()
    a = train(config(model=kind, heads=2), graph=mag, progress=exact)
    b = train(config(model=kind, heads=2, mode="device"), graph=mag, progress=device)
    assert (a["mode"], b["mode"]) == ("exact", "device")
    assert len(device.means) == len(exact.means) > 10 and device.means == exact.means
    for key in ("val_acc", "test_acc", "final_val_acc", "final_test_acc"):
        assert b[key] == a[key], key
    assert [e["sampled_edges"] for e in b["epochs"]] == [e["sampled_edges"] for e in a["epochs"]]
    assert b["device_data"]["sampler"] == "TorchNeighborSampler"
    assert b["device_data"]["bytes"] == device_bytes(mag)


def test_the_featured_types_share_what_the_budget_leaves_and_the_rest_is_refused_with_its_sizes(mag):
    model = TypedGNN("sage", TypedSpec.of(mag), 16, mag.num_classes, 2)
    fanouts = TypedNeighborSampler(mag, [4, 3]).fanouts
    papers = mag.num_nodes["paper"]

    def rows(memory, **settings):
        return typed_cache_rows(mag, model, fanouts, 24, memory, PlacementConfig(**settings))

    assert rows(None, gpu_memory_gb=0.001) == {"paper": papers}  # the CPU: no budget, every row
    assert rows(None, gpu_cache_gb=4 * 8 * 200 / 2**30) == {"paper": 200}  # a number: a cache of that many bytes
    assert rows(80 << 30) == {"paper": papers}
    assert rows(80 << 30, gpu_cache_gb=0) == {"paper": 0}  # no cache: every row read from the host
    assert rows(80 << 30, gpu_cache_gb=4 * 8 * 300 / 2**30) == {"paper": 300}
    low, high = 0, 1 << 31  # the least budget that holds all but the feature rows
    while low < high:
        middle = (low + high) // 2
        try:
            rows(middle)
            high = middle
        except ConfigError:
            low = middle + 1
    assert rows(low) == {"paper": 0}
    budget = rows(low + 4 * papers + 4 * 8 * 100)["paper"]  # room for a slot map and 100 rows
    assert budget == 100 and rows(low + 4 * papers + 4 * 8 * 150, gpu_cache_gb=4 * 8 * 120 / 2**30)["paper"] == 120
    assert rows(low + 4 * 8 * papers) == {"paper": papers}  # every row: no slot map
    assert device_bytes(mag, {"paper": budget})["features"] == 4 * 8 * budget + 4 * papers  # with its slot map
    with pytest.raises(ConfigError, match=r"does not fit on the device\. Its topology and edge features take "
                                          r"0\.00 GiB.*0\.50 GiB before any feature row, against 0\.25 GiB "
                                          r"\(`gpu_memory_gb` 0\.25\)\. Raise `gpu_memory_gb`"):
        rows(80 << 30, gpu_memory_gb=0.25)
    with pytest.raises(ConfigError, match=r"against 0\.40 GiB \(the device's memory\)"):
        rows(int(0.4 * 2**30))


@pytest.mark.parametrize("kind", ["sage", "rgat"])
def test_a_partial_device_cache_trains_as_every_row_cached(weighted, kind):
    """The hottest rows on the device, the others read from the host: the same rows, so the same losses to the
    bit; the rows the cache served are counted as a homogeneous run counts them."""
    whole, part = Means(), Means()
    a = train(config(model=kind, heads=2, mode="device"), graph=weighted, progress=whole)
    b = train(config(model=kind, heads=2, mode="device", cache_policy="degree", gpu_cache_gb=4 * 8 * 300 / 2**30),
              graph=weighted, progress=part)
    assert part.means == whole.means and b["test_acc"] == a["test_acc"]
    assert a["device_data"]["cache"] == {"paper": {"rows": 800, "of": 800, "misses": "none"}}
    assert b["device_data"]["cache"] == {"paper": {"rows": 300, "of": 800, "misses": "host"}}
    assert b["device_data"]["bytes"]["features"] == 4 * 8 * 300 + 4 * 800
    hits = [e["moved"]["cache_hits"] for e in b["epochs"]]
    everything = [e["moved"]["cache_hits"] for e in a["epochs"]]
    assert all(0 < h < e for h, e in zip(hits, everything))
    assert b["moved"]["cache_hits"] == sum(hits) and a["moved"]["feature_rows"] == b["moved"]["feature_rows"]


def test_misses_the_device_cannot_read_in_place_are_gathered_by_the_host(mag, monkeypatch):
    """Where no view of the host rows is made (no UVA on a GPU, rows beyond memory), the type's store gathers the
    misses (``staged_fetch``): the same losses."""
    import neutronorch.orchestration.device_reader as device_reader

    whole, staged = Means(), Means()
    train(config(mode="device"), graph=mag, progress=whole)
    monkeypatch.setattr(device_reader, "misses_in_place", lambda *args: None)
    b = train(config(mode="device", gpu_cache_gb=4 * 8 * 100 / 2**30), graph=mag, progress=staged)
    assert staged.means == whole.means and b["device_data"]["cache"]["paper"]["rows"] == 100


@pytest.mark.parametrize("kind", ["sage", "rgat"])
def test_device_mode_reads_edge_features_exactly_as_exact_mode(weighted, kind):
    exact, device = Means(), Means()
    a = train(config(model=kind, heads=2), graph=weighted, progress=exact)
    b = train(config(model=kind, heads=2, mode="device"), graph=weighted, progress=device)
    assert device.means == exact.means and b["test_acc"] == a["test_acc"]
    assert b["device_data"]["bytes"]["topology"] > device_bytes(dataclasses.replace(
        weighted, relations={r: dataclasses.replace(rel, edge_features=None)
                             for r, rel in weighted.relations.items()}))["topology"]


@pytest.mark.cuda
def test_a_partial_device_cache_reads_its_misses_through_uva_on_cuda(weighted):
    """On a GPU: the rows not cached are read from pinned host memory in place; the losses are every row
    cached's."""
    whole, part = Means(), Means()
    a = train(config(device="cuda", mode="device"), graph=weighted, progress=whole)
    b = train(config(device="cuda", mode="device", gpu_cache_gb=4 * 8 * 300 / 2**30), graph=weighted, progress=part)
    assert b["device_data"]["cache"]["paper"] == {"rows": 300, "of": 800, "misses": "uva"}
    # The same rows; the GPU's scatter-adds may order their sums differently from run to run.
    np.testing.assert_allclose([m for _, m in part.means], [m for _, m in whole.means], rtol=1e-5, atol=1e-6)
    assert all(e["moved"]["cache_hits"] > 0 and e["moved"]["device_bytes"] > 0 for e in b["epochs"])


@pytest.mark.cuda
@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_device_mode_trains_as_exact_mode_on_cuda(weighted, kind):
    """On a GPU: every relation, row and edge weight on it, sampled there by the Triton kernels, on a stream of
    its own that the trainer's waits on."""
    exact, device = Means(), Means()
    a = train(config(model=kind, device="cuda", epochs=3), graph=weighted, progress=exact)
    b = train(config(model=kind, device="cuda", epochs=3, mode="device"), graph=weighted, progress=device)
    assert b["mode"] == "device" and b["device"].startswith("cuda")
    assert b["device_data"]["sampler"] == "TritonNeighborSampler"
    assert [e["sampled_edges"] for e in b["epochs"]] == [e["sampled_edges"] for e in a["epochs"]]
    np.testing.assert_allclose([m for _, m in device.means], [m for _, m in exact.means], rtol=1e-4, atol=1e-5)
    assert b["test_acc"] == pytest.approx(a["test_acc"], abs=2e-3)


def test_a_device_mode_run_stopped_mid_epoch_resumes_to_the_bit(mag, tmp_path):
    """Its batches depend on their keys alone, as exact mode's: resumed after step 3 of epoch 1, the run ends
    with the uninterrupted one's losses, scores and weights."""
    def run(directory, **settings):
        return train(config(mode="device", epochs=3, checkpoint_dir=str(directory), progress=False, **settings),
                     graph=mag)

    whole = run(tmp_path / "whole")
    stop = threading.Event()

    def progress(epoch, done, total):
        if (epoch, done) == (1, 3):
            stop.set()

    with pytest.raises(Interrupted, match="epoch 1 after step 3"):
        train(config(mode="device", epochs=3, checkpoint_dir=str(tmp_path / "cut"), progress=False), graph=mag,
              progress=progress, stop=stop)
    resumed = run(tmp_path / "cut", resume=True)
    assert [e["train_loss"] for e in resumed["epochs"]] == [e["train_loss"] for e in whole["epochs"]]
    assert (resumed["val_acc"], resumed["test_acc"]) == (whole["val_acc"], whole["test_acc"])
    a, b = (load_typed_checkpoint(d / "last.pt").model.state_dict() for d in (tmp_path / "whole", tmp_path / "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
