"""Device mode on typed graphs: every relation, row and label on the training device, against exact mode step
for step; what does not fit is refused naming its sizes; a stopped run resumes to the bit."""

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
from neutronorch.orchestration.typed_device import check_fits, device_bytes
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.typed_checkpoint import load_typed_checkpoint


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


def test_what_does_not_fit_the_device_is_refused_with_its_sizes(mag):
    model = TypedGNN("sage", TypedSpec.of(mag), 16, mag.num_classes, 2)
    fanouts = TypedNeighborSampler(mag, [4, 3]).fanouts
    sizes = check_fits(mag, model, fanouts, 24, device_memory=None, gpu_memory_gb=0.001)  # the CPU: no budget
    assert sizes == device_bytes(mag) and sizes["maps"] == 8 * sum(mag.num_nodes.values())
    assert sizes["features"] == 4 * 8 * mag.num_nodes["paper"]
    assert check_fits(mag, model, fanouts, 24, device_memory=80 << 30, gpu_memory_gb=None) == sizes
    with pytest.raises(ConfigError, match=r"does not fit on the device\. Its topology and edge features take "
                                          r"0\.00 GiB.*0\.50 GiB against 0\.25 GiB \(`gpu_memory_gb` 0\.25\)\. "
                                          r"Raise `gpu_memory_gb`"):
        check_fits(mag, model, fanouts, 24, device_memory=80 << 30, gpu_memory_gb=0.25)
    with pytest.raises(ConfigError, match=r"against 0\.40 GiB \(the device's memory\)"):
        check_fits(mag, model, fanouts, 24, device_memory=int(0.4 * 2**30), gpu_memory_gb=None)


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
