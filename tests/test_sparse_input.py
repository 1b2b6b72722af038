"""Products of mostly-zero rows through their nonzeros (``nn/sparse_input.py``): the same values and gradients
as the dense product, the same result whatever the threads, and the layers that take them equal to their
dense selves."""

import numba
import pytest
import torch
from torch.nn import functional as F

from neutronorch.nn import sparse_input
from neutronorch.nn.layers import GATConv, GCNConv, SAGEConv
from neutronorch.sampling.block import Block


def _rows(n=300, width=600, density=0.02, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, width, generator=g) < density
    return (mask * torch.rand(n, width, generator=g)).to(dtype)


def _block(num_dst, num_src, degree=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    indices = torch.randint(0, num_src, (num_dst * degree,), generator=g)
    return Block(num_dst, num_src, torch.arange(0, num_dst * degree + 1, degree), indices)


def test_equals_the_dense_product_and_its_gradients():
    x = _rows()
    w = torch.randn(64, 600, requires_grad=True)
    b = torch.randn(64, requires_grad=True)
    assert sparse_input.dense_equivalent(x) < 1.0
    dense, sparse = F.linear(x, w, b), sparse_input.project(x, w, b)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(dense)
    expected = torch.autograd.grad(dense, (w, b), grad)
    got = torch.autograd.grad(sparse, (w, b), grad)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4)


def test_several_weights_side_by_side_and_the_input_gradient():
    x = _rows(density=0.01).requires_grad_()
    w1, w2 = torch.randn(16, 600, requires_grad=True), torch.randn(24, 600, requires_grad=True)
    both = sparse_input._SparseRowsProduct.apply(x, None, w1, w2)
    torch.testing.assert_close(both, F.linear(x, torch.cat([w1, w2])), rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(both)
    got = torch.autograd.grad(both, (x, w1, w2), grad)
    expected = torch.autograd.grad(F.linear(x, torch.cat([w1, w2])), (x, w1, w2), grad)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-4)


def test_bfloat16_rows_and_autocast_give_what_the_dense_product_gives():
    x = _rows(dtype=torch.bfloat16)
    w = torch.randn(32, 600)
    assert sparse_input.dense_equivalent(x) < 1.0
    out = sparse_input.project(x, w)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.linear(x.float(), w), rtol=1e-2, atol=1e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert sparse_input.project(_rows(), w).dtype == torch.bfloat16


@pytest.mark.parametrize("case", ["dense", "narrow", "needs grad", "int", "empty"])
def test_only_mostly_zero_wide_feature_rows_qualify(case):
    x = {"dense": _rows(density=0.5), "narrow": _rows(width=100), "needs grad": _rows().requires_grad_(),
         "int": _rows().long(), "empty": _rows(n=0)}[case]
    assert sparse_input.dense_equivalent(x) == 1.0


def test_the_result_does_not_depend_on_the_threads():
    x = _rows(n=2000, density=0.03)
    w = torch.randn(64, 600, requires_grad=True)
    grad = torch.randn(2000, 64)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            out = sparse_input.project(x, w)
            results.append((out, torch.autograd.grad(out, w, grad)[0]))
    finally:
        numba.set_num_threads(before)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("layer", ["sage", "gcn", "gat"])
@pytest.mark.parametrize("shape", [(250, 300), (40, 300)])  # nearly every source a destination; few
def test_layers_on_mostly_zero_rows_equal_their_dense_selves(layer, shape, monkeypatch):
    num_dst, num_src = shape
    torch.manual_seed(0)
    module = {"sage": lambda: SAGEConv(600, 32), "gcn": lambda: GCNConv(600, 32, norm="mean"),
              "gat": lambda: GATConv(600, 32, heads=2)}[layer]()
    block, x = _block(num_dst, num_src), _rows(n=num_src)
    assert sparse_input.dense_equivalent(x) < 1.0
    sparse = module(block, x)
    grads = torch.autograd.grad(sparse.square().sum(), list(module.parameters()))
    monkeypatch.setattr(sparse_input, "MAX_DENSITY", -1.0)  # every product dense
    assert sparse_input.dense_equivalent(x) == 1.0
    dense = module(block, x)
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, torch.autograd.grad(dense.square().sum(), list(module.parameters()))):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
