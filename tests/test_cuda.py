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
