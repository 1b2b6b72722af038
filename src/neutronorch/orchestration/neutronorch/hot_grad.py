"""The hot rows' bottom-layer gradient (``hot_grad="cpu"``), on the trainer thread.

Each step's backward pass adds dL/dY of the hot rows it used into ``HotEmbeddings.grad_acc``; at the
super-batch's last step ``finish`` turns it into W0's gradient through the host's autograd graph of those
rows (on a typed graph also the snapshot's table rows' sparse gradient). Data parallel it is averaged apart
with equal weights, each step's dL/dY scaled by ``weigh`` where the ranks' parts carry unequal weight
(``docs/distributed.md``, "The hot rows' gradient is averaged apart").
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.orchestration.batch import per_type
from neutronorch.orchestration.neutronorch.node import NodeHotSet
from neutronorch.orchestration.neutronorch.versions import HotEmbeddings
from neutronorch.orchestration.seeds import NodeSeeds


class HotGradient:
    def __init__(self, seeds: NodeSeeds, node: NodeHotSet | None):
        self.seeds, self.node, self.distributed = seeds, node, seeds.sampling.world > 1
        self._shares: tuple[int, np.ndarray] | None = None  # (epoch, its ``rank_shares``)
        self._scale = 1.0  # the current step's scale of dL/dY in the accumulator
        self._averaged: list[torch.Tensor] | None = None

    def weigh(self, hot: HotEmbeddings, step: int) -> None:
        """Before global step ``step``'s forward pass (data parallel): scale its share of the accumulator."""
        if not self.distributed or hot.grad_acc is None:
            return
        epoch, index = divmod(step, self.seeds.num_batches)
        if self._shares is None or self._shares[0] != epoch:
            self._shares = (epoch, self.seeds.rank_shares(epoch))
        scale = float(self._shares[1][index])
        if scale not in (0.0, 1.0):  # 0: no loss terms here, so no gradient to scale
            for grad in per_type(hot.grad_acc).values():
                grad.div_(scale)
            self._scale = scale

    def unweigh(self, hot: HotEmbeddings) -> None:
        """After the backward pass: the accumulator back in its units."""
        if self._scale != 1.0:
            for grad in per_type(hot.grad_acc).values():
                grad.mul_(self._scale)
            self._scale = 1.0

    def finish(self, hot: HotEmbeddings, bottom: torch.nn.Module, tables: torch.nn.ModuleDict | None = None) -> None:
        """At the super-batch's last step: W0's gradient (and a typed graph's sparse gradient of ``tables``)
        from the accumulated dL/dY, added to the parameters' or kept for ``averaged``."""
        typed = isinstance(hot.output, dict)
        # The rows this rank computed (on a partitioned graph also some it does not hold hot itself).
        outputs = hot.output if typed else {} if hot.output is None or hot.output.shape[0] == 0 else {None: hot.output}
        if not outputs and not self.distributed:
            return
        params = list(bottom.parameters())
        accumulated = hot.grad_acc if typed else {None: hot.grad_acc}
        if hot.exchange is not None:  # shared rows summed over the node
            grad_y = self.node.gradient_by_type(accumulated, hot.exchange, {t: len(y) for t, y in outputs.items()},
                                                bottom.out_dim)
        else:
            grad_y = {t: accumulated[t].cpu() for t in outputs}
        live = [t for t in outputs if grad_y[t].shape[0]]
        grads = torch.autograd.grad([outputs[t] for t in live], [*hot.params, *hot.rows.values()],
                                    [grad_y[t].to(outputs[t].dtype) for t in live], allow_unused=True
                                    ) if live else [None] * len(params)
        dense = [None if g is None else g.to(p.device, non_blocking=True) for p, g in zip(params, grads)]
        rows = [(tables[t].weight, torch.sparse_coo_tensor(hot.ids[t].to(tables[t].weight.device).unsqueeze(0),
                                                           grad.to(tables[t].weight.device), tables[t].weight.shape,
                                                           check_invariants=False))
                for t, grad in zip(hot.rows, grads[len(params):]) if grad is not None]
        if self.distributed:  # every rank hands them over at this step, zeros where nothing was hot
            self._averaged = [torch.zeros_like(p) if g is None else g for p, g in zip(params, dense)] + rows
            return
        with torch.no_grad():
            for param, grad in zip(params, dense):
                if grad is not None:
                    param.grad = grad if param.grad is None else param.grad.add_(grad)
            for table, grad in rows:
                table.grad = grad if table.grad is None else table.grad + grad

    def averaged(self, bottom: torch.nn.Module) -> dict[torch.Tensor, torch.Tensor] | None:
        grads, self._averaged = self._averaged, None
        if grads is None:
            return None
        params = list(bottom.parameters())
        return {**dict(zip(params, grads[:len(params)])), **dict(grads[len(params):])}

