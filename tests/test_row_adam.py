"""RowAdam (train/row_adam.py) against torch.optim.SparseAdam on embedding tables."""

import pytest
import torch

from neutronorch.train.row_adam import RowAdam


def _steps(optimizer_class, lookups, **kwargs):
    torch.manual_seed(0)
    table = torch.nn.Embedding(50, 8, sparse=True)
    optimizer = optimizer_class(list(table.parameters()), **kwargs)
    for step, ids in enumerate(lookups):
        optimizer.zero_grad()
        target = torch.sin(torch.arange(ids.numel() * 8, dtype=torch.float32).view(-1, 8) + step)
        ((table(ids) - target) ** 2).sum().backward()
        optimizer.step()
    return table.weight.detach(), optimizer


def _lookups(repeat: bool):
    generator = torch.Generator().manual_seed(1)
    out = []
    for _ in range(20):
        ids = torch.randperm(50, generator=generator)[:17]
        out.append(torch.cat([ids, ids[:5]]) if repeat else ids)
    return out


@pytest.mark.parametrize("repeat", [False, True])
def test_row_adam_moves_rows_as_sparse_adam_does(repeat):
    lookups = _lookups(repeat)
    ours, _ = _steps(RowAdam, lookups, lr=0.01)
    torch_weights, _ = _steps(torch.optim.SparseAdam, lookups, lr=0.01)
    assert torch.allclose(ours, torch_weights, rtol=1e-6, atol=1e-6), (ours - torch_weights).abs().max()


def test_rows_never_looked_up_keep_their_weights():
    torch.manual_seed(0)
    before = torch.nn.Embedding(50, 8, sparse=True).weight.detach().clone()
    after, optimizer = _steps(RowAdam, [torch.tensor([3, 7, 9])] * 3, lr=0.1)
    moved = torch.nonzero((after != before).any(1)).flatten().tolist()
    assert moved == [3, 7, 9]
    assert optimizer.state[id(optimizer.params[0])]["step"] == 3


def test_row_adam_refuses_what_it_does_not_update():
    with pytest.raises(ValueError, match="float32 CPU tables"):
        RowAdam([torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.float64))])
    with pytest.raises(ValueError, match="lr must be positive"):
        RowAdam([torch.nn.Parameter(torch.zeros(4, 2))], lr=0)
    dense = torch.nn.Parameter(torch.zeros(4, 2))
    dense.grad = torch.ones(4, 2)
    with pytest.raises(RuntimeError, match="sparse gradients"):
        RowAdam([dense]).step()
