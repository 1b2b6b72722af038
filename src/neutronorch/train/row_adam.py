"""``RowAdam``: ``torch.optim.SparseAdam``'s update of embedding tables, row by row in one numba kernel
(why: docs/heterogeneous.md). In SparseAdam's order of operations, for every looked-up row:
``m += (1 - b1)(g - m)``, ``v += (1 - b2)(g^2 - v)``, ``w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v)
+ eps)``, ``t`` the table's step count; rows not looked up keep their weights and moments. A gradient listing
a row twice is coalesced first, as SparseAdam does (repeats found by stamping each row with the step: scratch,
reset on loading, so a restored optimizer continues bit-identically). Tables only: float32 CPU weights with
sparse gradients; no weight decay.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np
import torch
from numba import njit, prange


@njit(cache=True, nogil=True)
def _unique(rows, stamp, step):
    """Whether no row is listed twice; stamps every listed row with ``step`` (each step's stamp is new)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        if stamp[r] == step:
            return False
        stamp[r] = step
    return True


@njit(parallel=True, fastmath=False, cache=True, nogil=True)
def _adam_rows(weight, exp_avg, exp_avg_sq, rows, grad, beta1, beta2, eps, step_size):
    """SparseAdam's update of ``weight``'s rows ``rows`` (unique) from their gradient rows ``grad``."""
    width = weight.shape[1]
    one_minus_b1 = np.float32(1.0) - beta1
    one_minus_b2 = np.float32(1.0) - beta2
    for i in prange(rows.shape[0]):
        r = rows[i]
        w, m, v, g = weight[r], exp_avg[r], exp_avg_sq[r], grad[i]
        for j in range(width):
            gj = g[j]
            mj = m[j] + (gj - m[j]) * one_minus_b1
            vj = v[j] + (gj * gj - v[j]) * one_minus_b2
            m[j] = mj
            v[j] = vj
            w[j] += -step_size * (mj / (np.sqrt(vj) + eps))


class RowAdam:
    """``torch.optim.SparseAdam(params, lr, betas, eps)`` for embedding tables (float32 CPU weights, sparse
    gradients), updating the looked-up rows in one kernel. ``zero_grad`` and ``step`` as in torch.
    ``moments(table)``: the table's two moments, zero float32 tensors of its shape, or None for ones in memory."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8,
                 moments: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor] | None] | None = None):
        if not 0.0 < lr or not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0 or not 0.0 <= eps:
            raise ValueError(f"RowAdam: lr must be positive, betas in [0, 1) and eps >= 0; got lr {lr}, betas "
                             f"{betas}, eps {eps}")
        self.params = list(params)
        if not self.params:
            raise ValueError("RowAdam got an empty parameter list")
        for p in self.params:
            if p.dtype != torch.float32 or p.device.type != "cpu" or p.dim() != 2 or not p.is_contiguous():
                raise ValueError(f"RowAdam updates contiguous float32 CPU tables (rows x width), not a "
                                 f"{tuple(p.shape)} {p.dtype} tensor on {p.device}; use torch.optim.SparseAdam")
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.state = {}
        for p in self.params:
            given = moments(p) if moments is not None else None
            exp_avg, exp_avg_sq = given if given is not None else (torch.zeros_like(p), torch.zeros_like(p))
            for moment in (exp_avg, exp_avg_sq):
                if moment.shape != p.shape or moment.dtype != torch.float32 or not moment.is_contiguous():
                    raise ValueError(f"RowAdam: a moment given for a {tuple(p.shape)} table is a {tuple(moment.shape)} "
                                     f"{moment.dtype} tensor; give contiguous float32 ones of the table's shape")
            self.state[id(p)] = {"step": 0, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq,
                                 "stamp": np.full(p.shape[0], -1, dtype=np.int32)}

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict:
        """The hyperparameters and, per table in ``params``' order, its step count and moments (the tensors
        themselves, not copies, as torch's optimizers give them)."""
        return {"lr": self.lr, "betas": list(self.betas), "eps": self.eps,
                "tables": [{key: self.state[id(p)][key] for key in ("step", "exp_avg", "exp_avg_sq")}
                           for p in self.params]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s output: the hyperparameters replace these (as torch's optimizers
        do), and each table's moments are copied in. Raises ``ValueError`` when ``state`` holds another
        number of tables, or moments of another shape than their table."""
        tables = state["tables"]
        if len(tables) != len(self.params):
            raise ValueError(f"RowAdam state of {len(tables)} table(s) given to an optimizer of {len(self.params)}")
        for index, (p, saved) in enumerate(zip(self.params, tables)):
            for key in ("exp_avg", "exp_avg_sq"):
                if tuple(saved[key].shape) != tuple(p.shape):
                    raise ValueError(f"RowAdam state: table {index}'s {key} is {tuple(saved[key].shape)}, the "
                                     f"table {tuple(p.shape)}")
        for p, saved in zip(self.params, tables):
            mine = self.state[id(p)]
            mine["step"] = int(saved["step"])
            mine["exp_avg"].copy_(saved["exp_avg"])
            mine["exp_avg_sq"].copy_(saved["exp_avg_sq"])
            mine["stamp"].fill(-1)  # below every later step: no row counts as looked up twice
        betas = state["betas"]
        self.lr, self.betas, self.eps = float(state["lr"]), (float(betas[0]), float(betas[1])), float(state["eps"])

    @torch.no_grad()
    def step(self) -> None:
        """Move the looked-up rows of every table with a gradient; the others are left as they are."""
        beta1, beta2 = self.betas
        for p in self.params:
            grad = p.grad
            if grad is None:
                continue
            if not grad.is_sparse:
                raise RuntimeError("RowAdam takes the sparse gradients of nn.Embedding(sparse=True) tables; "
                                   "use Adam for dense gradients")
            state = self.state[id(p)]
            state["step"] += 1
            step = state["step"]
            rows, values = grad._indices()[0], grad._values()
            if not grad.is_coalesced() and not _unique(rows.numpy(), state["stamp"], np.int32(step)):
                grad = grad.coalesce()
                rows, values = grad._indices()[0], grad._values()
            step_size = self.lr * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)
            _adam_rows(p.detach().numpy(), state["exp_avg"].numpy(), state["exp_avg_sq"].numpy(), rows.numpy(),
                       values.contiguous().float().numpy(), np.float32(beta1), np.float32(beta2),
                       np.float32(self.eps), np.float32(step_size))
