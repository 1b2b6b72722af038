"""CUDA paths; skipped without a GPU. The same logic runs on CPU in the other test files."""

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.nn.activation import relu_dropout
from neutronorch.nn.aggregation import mean_aggregate, mean_aggregate_torch
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key

pytestmark = pytest.mark.cuda


def test_torch_sampler_on_cuda_matches_the_contract(small_csc):
    indptr, indices = small_csc
    sampler = TorchNeighborSampler(torch.from_numpy(indptr).cuda(), torch.from_numpy(indices).cuda(), [6, 3])
    seeds = torch.arange(0, 300, 9, device="cuda")
    sg = sampler.sample(seeds, batch_key(0, 0, 0))
    for block, src, dst in zip(sg.blocks, sg.frontiers[:-1], sg.frontiers[1:]):
        assert block.indptr.is_cuda and torch.equal(src[:block.num_dst], dst)
        degrees = torch.from_numpy(np.diff(indptr)).cuda()[dst]
        fanout = 3 if block is sg.blocks[0] else 6
        assert torch.equal(block.in_degrees(), degrees.clamp(max=fanout))


def test_aggregation_and_activation_on_cuda_equal_cpu(small_csc):
    from neutronorch.sampling.neighbor_sampler import NeighborSampler

    indptr, indices = small_csc
    block = NeighborSampler(indptr, indices, [5]).sample(np.arange(0, 300, 4), 3).blocks[0]
    x = torch.randn(block.num_src, 16)
    torch.testing.assert_close(mean_aggregate(block.to("cuda"), x.cuda()).cpu(), mean_aggregate_torch(block, x))
    y = torch.randn(100, 32, device="cuda")
    out = relu_dropout(y, 0.5, training=True)
    assert out.is_cuda and bool(((out == 0) | (out == 2 * y.clamp(min=0))).all())


@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_exact_training_on_cuda(model, tmp_path):
    summary = train(TrainConfig(dataset="synthetic:nodes=4000,degree=10,features=16,classes=4,noise=0.6",
                                model=model, fanouts=[5, 5], hidden=32, batch_size=256, lr=0.01, dropout=0.5,
                                weight_decay=0.0, epochs=12 if model == "gat" else 4,
                                device="cuda", progress=False, summary_json=str(tmp_path / "s.json")))
    assert summary["device"].startswith("cuda")
    assert summary["epochs"][0]["stage_seconds"]["copy"] > 0
    assert summary["test_acc"] > 0.75


@pytest.mark.parametrize("model,dropout", [("sage", 0.5), ("gcn", 0.5), ("gat", 0.0)])
def test_neutronorch_p1_s0_cpu_grad_equals_exact_mode_on_cuda(model, dropout):
    from test_neutronorch import config, lockstep

    from neutronorch.data import SyntheticSpec, generate

    graph = generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))
    exact = config(model=model, mode="exact", dropout=dropout)
    orch = config(model=model, mode="neutronorch", dropout=dropout, super_batch=1, staleness_bound=0,
                  hot_grad="cpu", hot_ratio=0.3)
    hot_rows = 0
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch, torch.device("cuda")):
        assert batch_b.features.is_cuda
        hot_rows += int(batch_b.splice.index.hot_pos.numel())
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-4, atol=1e-5)
        for p_a, p_b in zip(model_a.parameters(), model_b.parameters()):
            torch.testing.assert_close(p_b.grad, p_a.grad, rtol=1e-3, atol=1e-5)
    assert hot_rows > 0


@pytest.mark.parametrize("hot_grad", ["cpu", "stop"])
def test_neutronorch_training_on_cuda(hot_grad):
    summary = train(TrainConfig(dataset="synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6",
                                mode="neutronorch", device="cuda", fanouts=[5, 5], hidden=32, batch_size=64,
                                epochs=3, lr=0.01, super_batch=4, hot_ratio=0.3, hot_grad=hot_grad,
                                progress=False))
    assert summary["device"].startswith("cuda")
    assert summary["staleness"]["max_observed"] <= summary["staleness"]["bound"]
    assert summary["hot"]["reuse_rate"] > 0 and summary["test_acc"] > 0.7


def test_device_mode_on_cuda(tmp_path):
    summary = train(TrainConfig(dataset="synthetic:nodes=4000,degree=10,features=16,classes=4,noise=0.6",
                                mode="device", device="cuda", fanouts=[5, 5], hidden=32, batch_size=256,
                                epochs=4, lr=0.01, weight_decay=0.0, progress=False))
    assert summary["device"].startswith("cuda")
    assert summary["test_acc"] > 0.75
    assert summary["epochs"][-1]["stage_seconds"]["sample"] > 0


def test_telemetry_on_cuda(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    summary = train(TrainConfig(dataset="synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6",
                                mode="neutronorch", device="cuda", fanouts=[5, 5], hidden=32, batch_size=64,
                                epochs=2, super_batch=4, hot_ratio=0.3, progress=False, eval_every=-1,
                                timeline=str(png), timeline_steps=8))
    epoch = summary["epochs"][-1]
    assert epoch["moved"]["device_bytes"] > epoch["moved"]["feature_bytes"]  # features + blocks + hot rows
    assert png.read_bytes().startswith(b"\x89PNG")
    assert "copy" in epoch["lane_busy"]
