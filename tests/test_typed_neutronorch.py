"""NeutronOrch on typed graphs: hot rows per destination type spliced into a relational model's bottom
layer, and the mode that plans, computes and reuses them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.nn.splice import HotRows, SpliceIndex
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.typed_inputs import gather_frontier, gather_inputs

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
    reference = model(whole.blocks, *gather_inputs(mag, whole, CPU))
    reference.square().sum().backward()
    expected = grads(model)
    model.zero_grad(set_to_none=True)

    upper = sampler.sample_hops(seeds, 9, 1)
    destinations = upper.frontiers[0]
    hot_pos = {t: np.arange(ids.shape[0])[1::2] for t, ids in destinations.items()}
    cold_pos = {t: np.arange(ids.shape[0])[0::2] for t, ids in destinations.items()}
    hot_block = sampler.sample_bottom({t: ids.numpy()[hot_pos[t]] for t, ids in destinations.items()}, 9)
    features, ids = gather_frontier(mag, hot_block.src_ids, CPU)
    tables = model.bottom_layer()(hot_block, model.input_rows(features, ids))
    cold_block = sampler.sample_bottom({t: ids.numpy()[cold_pos[t]] for t, ids in destinations.items()}, 9)
    hot = {t: HotRows(tables[t].detach(), SpliceIndex.build(ids.shape[0], cold_pos[t], hot_pos[t],
                                                             np.arange(hot_pos[t].shape[0])),
                      torch.zeros(tables[t].shape))
           for t, ids in destinations.items() if hot_pos[t].shape[0]}
    assert hot, "the batch has hot rows to splice"
    torch.manual_seed(0)
    spliced = model([cold_block, *upper.blocks], *gather_frontier(mag, cold_block.src_ids, CPU), hot)
    torch.testing.assert_close(spliced, reference, rtol=1e-5, atol=1e-6)
    spliced.square().sum().backward()
    torch.autograd.backward([tables[t] for t in hot], [hot[t].grad_acc for t in hot])
    got = grads(model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
