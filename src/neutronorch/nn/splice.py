"""Splice: assemble a layer's output from rows computed here and rows computed elsewhere.

NeutronOrch computes the bottom layer of hot vertices once per super-batch (on the host) and reuses the
rows in every mini-batch. A mini-batch's bottom-layer output is then ``out[cold_pos] = y_cold`` (computed
by the device for the cold destinations) and ``out[hot_pos] = table[hot_rows]`` (reused). In the backward
pass the cold rows' gradient flows on to the device layer; the hot rows' gradient is either dropped (the
rows are constants) or added into ``grad_acc``, an accumulator with one row per hot vertex that the host
turns into the bottom layer's weight gradient once per super-batch.
"""

from __future__ import annotations

import torch


class _Splice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y_cold, table, num_rows, cold_pos, hot_pos, hot_rows, grad_acc):
        out = y_cold.new_empty((num_rows, table.shape[1]))
        out.index_copy_(0, cold_pos, y_cold)
        out.index_copy_(0, hot_pos, table.index_select(0, hot_rows))
        ctx.save_for_backward(cold_pos, hot_pos, hot_rows)
        ctx.grad_acc = grad_acc
        return out

    @staticmethod
    def backward(ctx, grad):
        cold_pos, hot_pos, hot_rows = ctx.saved_tensors
        if ctx.grad_acc is not None and hot_pos.numel():
            ctx.grad_acc.index_add_(0, hot_rows, grad.index_select(0, hot_pos))
        grad_cold = grad.index_select(0, cold_pos) if ctx.needs_input_grad[0] else None
        return grad_cold, None, None, None, None, None, None


def splice(y_cold: torch.Tensor, table: torch.Tensor, num_rows: int, cold_pos: torch.Tensor,
           hot_pos: torch.Tensor, hot_rows: torch.Tensor, grad_acc: torch.Tensor | None = None) -> torch.Tensor:
    """Rows ``cold_pos`` from ``y_cold`` (in order), rows ``hot_pos`` from ``table[hot_rows]``; together the
    positions must cover ``range(num_rows)`` exactly once. Hot-row gradients go into ``grad_acc`` if given."""
    return _Splice.apply(y_cold, table, num_rows, cold_pos, hot_pos, hot_rows, grad_acc)
