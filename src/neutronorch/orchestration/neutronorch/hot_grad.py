"""The hot rows' bottom-layer gradient (``hot_grad="cpu"``), on the trainer thread.

Each step's backward pass adds dL/dY of the hot rows it used into the super-batch's accumulator
(``HotEmbeddings.grad_acc``); at the super-batch's last step, ``finish`` turns it into W0's gradient
through the host's autograd graph of those rows.

- **One process**: the gradient is added to the bottom layer's.
- **Data parallel**: it is handed to the gradient reduction (``averaged``), which averages it over the
  ranks with equal weights, apart from the loss-weighted mean of the other gradients. It sums the
  gradients of the super-batch's P steps, each its rank's mean, so weighting it by the last step's loss
  terms alone would misweigh the other steps (and drop a rank with none in the last step). Equal weights
  are exact where every rank's part of a step carries equal weight; where it does not (an epoch's last,
  uneven global batch; unlabelled seeds), ``weigh`` scales that step's dL/dY by world x this rank's share
  of the global batch's loss terms (the accumulator divided by it before the backward pass, multiplied
  after), so the average is exactly one process's sum.
- **Rows computed once per node**: the node's ranks sum the shared rows' dL/dY first, and each
  back-propagates the rows it computed (``node.py``).
- **A typed graph**: one accumulator per vertex type; the gradient reaches the bottom layer's parameters
  and the snapshot's embedding-table rows the hot rows read, which it adds to the tables as sparse rows
  (data parallel, hands over to be averaged as the bottom layer's: ``GradientSync`` averages a table's
  rows handed over apart with equal weights too).
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.orchestration.neutronorch.node import NodeHotSet
from neutronorch.orchestration.neutronorch.versions import HotEmbeddings
from neutronorch.orchestration.seeds import NodeSeeds


class HotGradient:
    def __init__(self, seeds: NodeSeeds, sampling: SamplingConfig, num_batches: int, node: NodeHotSet | None):
        self.seeds, self.sampling, self.num_batches = seeds, sampling, num_batches
        self.distributed = sampling.world > 1
        self.node = node
        self._shares: tuple[int, np.ndarray] | None = None  # (epoch, its ``rank_shares``)
        self._scale = 1.0  # the current step's scale of dL/dY in the accumulator
        self._averaged: list[torch.Tensor] | None = None

    def weigh(self, hot: HotEmbeddings, step: int) -> None:
        """Before global step ``step``'s forward pass (data parallel): scale its share of the accumulator."""
        if not self.distributed or hot.grad_acc is None:
            return
        epoch, index = divmod(step, self.num_batches)
        if self._shares is None or self._shares[0] != epoch:
            self._shares = (epoch, self.seeds.rank_shares(epoch))
        scale = float(self._shares[1][index])
        if scale not in (0.0, 1.0):  # 0: no loss terms here, so no gradient to scale
            for grad in _accumulators(hot):
                grad.div_(scale)
            self._scale = scale

    def unweigh(self, hot: HotEmbeddings) -> None:
        """After the backward pass: the accumulator back in its units."""
        if self._scale != 1.0:
            for grad in _accumulators(hot):
                grad.mul_(self._scale)
            self._scale = 1.0

    def finish(self, hot: HotEmbeddings, bottom: torch.nn.Module, on_cuda: bool,
               tables: torch.nn.ModuleDict | None = None) -> None:
        """At the super-batch's last step: W0's gradient from the accumulated dL/dY (of the rows this rank
        computed, shared ones summed over the node), added to ``bottom``'s gradient or kept for ``averaged``.
        On a typed graph also the gradient of the table rows the hot rows read, added to ``tables``."""
        if isinstance(hot.output, dict):
            return self._finish_typed(hot, bottom, tables)
        nothing = hot.output is None or hot.num_hot == 0
        if nothing and not self.distributed:
            return
        params = list(bottom.parameters())
        grads = [None] * len(params)
        if not nothing:
            grad_y = hot.grad_acc.cpu() if on_cuda else hot.grad_acc
            if hot.exchange is not None:
                grad_y = self.node.gradient(grad_y, hot.exchange)
            if grad_y.shape[0]:
                grads = torch.autograd.grad(hot.output, hot.params, grad_y.to(hot.output.dtype), allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g.to(p.device, non_blocking=True) for p, g in zip(params, grads)]
        if self.distributed:
            self._averaged = grads  # every rank hands one over at this step, zeros where nothing was hot
            return
        for p, g in zip(params, grads):
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    def averaged(self, bottom: torch.nn.Module) -> dict[torch.Tensor, torch.Tensor] | None:
        grads, self._averaged = self._averaged, None
        if grads is None:
            return None
        params = list(bottom.parameters())
        return {**dict(zip(params, grads[:len(params)])), **dict(grads[len(params):])}

    def _finish_typed(self, hot: HotEmbeddings, bottom: torch.nn.Module, tables: torch.nn.ModuleDict) -> None:
        """``finish`` on a typed graph: dL/dY of each type's hot rows through the host's graph, to the bottom
        layer's parameters it reached and to the snapshot's table rows (a sparse gradient of their tables)."""
        types, params = list(hot.output), list(bottom.parameters())
        grad_y = {t: hot.grad_acc[t].cpu() for t in types}
        if hot.exchange is not None:  # of the rows this rank computed, shared ones summed over the node
            order = list(self.node.offsets)
            flat = torch.cat([torch.zeros((0, bottom.out_dim)), *(hot.grad_acc[t].cpu() for t in order
                                                                   if t in hot.grad_acc)])
            grad_y = self.node.by_type(self.node.gradient(flat, hot.exchange),
                                       [len(hot.output[t]) if t in hot.output else 0 for t in order])
        grads = torch.autograd.grad([hot.output[t] for t in types], [*hot.params, *hot.rows.values()],
                                    [grad_y[t] for t in types], allow_unused=True) if types else [None] * len(params)
        dense = [None if g is None else g.to(p.device) for p, g in zip(params, grads)]
        rows = [(tables[t].weight, torch.sparse_coo_tensor(hot.ids[t].to(tables[t].weight.device).unsqueeze(0),
                                                           grad.to(tables[t].weight.device), tables[t].weight.shape,
                                                           check_invariants=False))
                for t, grad in zip(hot.rows, grads[len(params):]) if grad is not None]
        if self.distributed:  # every rank hands them over at this step, zeros where nothing was hot
            self._averaged = [torch.zeros_like(p) if g is None else g for p, g in zip(params, dense)] + rows
            return
        with torch.no_grad():
            for param, grad in [*zip(params, dense), *rows]:
                if grad is not None:
                    param.grad = grad if param.grad is None else param.grad + grad


def _accumulators(hot: HotEmbeddings) -> list[torch.Tensor]:
    """The hot rows' gradient accumulators (a typed graph's: one per type)."""
    if hot.grad_acc is None:
        return []
    return list(hot.grad_acc.values()) if isinstance(hot.grad_acc, dict) else [hot.grad_acc]
