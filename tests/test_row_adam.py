"""RowAdam (train/optim.py) against torch.optim.SparseAdam on embedding tables."""

import pytest
import torch

from neutronorch.train.optim import RowAdam


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


def test_a_restored_row_adam_continues_bit_identically():
    """Saved after 8 of 20 steps (through a file, as a checkpoint holds it), loaded into a new optimizer of a
    new table holding the saved weights: the last 12 steps give the uninterrupted run's weights to the bit."""
    import io

    lookups = _lookups(repeat=True)
    whole, _ = _steps(RowAdam, lookups, lr=0.01)
    first, optimizer = _steps(RowAdam, lookups[:8], lr=0.01)
    buffer = io.BytesIO()
    torch.save({"weights": first, "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    table = torch.nn.Embedding(50, 8, sparse=True)
    with torch.no_grad():
        table.weight.copy_(saved["weights"])
    restored = RowAdam(list(table.parameters()), lr=0.5)  # the saved hyperparameters replace these
    restored.load_state_dict(saved["optimizer"])
    assert restored.lr == 0.01 and restored.state[id(restored.params[0])]["step"] == 8
    for step, ids in enumerate(lookups[8:], start=8):
        restored.zero_grad()
        target = torch.sin(torch.arange(ids.numel() * 8, dtype=torch.float32).view(-1, 8) + step)
        ((table(ids) - target) ** 2).sum().backward()
        restored.step()
    assert torch.equal(table.weight.detach(), whole)


def test_row_adam_refuses_the_state_of_other_tables():
    optimizer = RowAdam([torch.nn.Parameter(torch.zeros(4, 2))])
    with pytest.raises(ValueError, match="state of 2 table\\(s\\) given to an optimizer of 1"):
        optimizer.load_state_dict({**optimizer.state_dict(), "tables": optimizer.state_dict()["tables"] * 2})
    other = RowAdam([torch.nn.Parameter(torch.zeros(5, 2))]).state_dict()
    with pytest.raises(ValueError, match="table 0's exp_avg is \\(5, 2\\), the table \\(4, 2\\)"):
        optimizer.load_state_dict(other)
