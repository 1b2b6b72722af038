"""The trainer's optimizers, without ``torch.optim.Optimizer``, whose construction imports ``torch._dynamo``
(seconds at every start; docs/performance.md, "No compile wait at start").

``Adam``: ``torch.optim.Adam``'s update (L2 ``weight_decay``): its foreach path's operations in the same
order, or its fused op (which rounds in its own order); state dicts load both ways and across the paths. Not
provided: amsgrad, maximize, AdamW's decoupled weight decay, tensor learning rates, sparse gradients, gradient
scaling, closures, ``zero_grad(set_to_none=False)`` and ``torch.optim`` hooks; ``lr_scheduler`` classes refuse
it, but setting ``group["lr"]`` works.

``RowAdam``: ``torch.optim.SparseAdam``'s update of embedding tables, row by row in one numba kernel (why:
docs/heterogeneous.md). In SparseAdam's order of operations, for every looked-up row: ``m += (1 - b1)(g -
m)``, ``v += (1 - b2)(g^2 - v)``, ``w -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)``, ``t`` the
table's step count; rows not looked up keep their weights and moments. A gradient listing a row twice is
coalesced first, as SparseAdam does (repeats found by stamping each row with the step: scratch, reset on
loading, so a restored optimizer continues bit-identically). Tables only: float32 CPU weights with sparse
gradients; no weight decay.
"""

from __future__ import annotations

import math
from collections import defaultdict
from copy import deepcopy
from itertools import chain
from typing import Any, Callable, Iterable

import numpy as np
import torch
from numba import njit, prange
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

# What a param group of torch.optim.Adam holds besides the settings below: written to state dicts with
# torch's values so that torch.optim.Adam loads them as its own; a loaded state dict must have these values.
_TORCH_FIXED = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                "differentiable": False, "fused": None, "decoupled_weight_decay": False}
# "fused" is not among these: it chooses how the same update is computed, and this class has it too. A loaded
# group's value (torch.optim.Adam(fused=True)'s included) is accepted and leaves the optimizer's own setting.
_MUST_BE_OFF = ("amsgrad", "maximize", "capturable", "differentiable", "decoupled_weight_decay")


class Adam:
    """``torch.optim.Adam(params, lr, betas, eps, weight_decay, fused)``, its state dict format included.

    ``fused``: ``None`` runs ``torch._fused_adam_`` for floating-point parameters on CUDA and the foreach
    path for the others, ``True`` the fused op for all (each must be floating point, on a device that has
    the op), ``False`` the foreach path for all. A parameter group may set its own."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False, fused: bool | None = None):
        _check(lr, betas, eps, weight_decay)
        self.defaults = {"lr": float(lr), "betas": (float(betas[0]), float(betas[1])), "eps": float(eps),
                         "weight_decay": float(weight_decay), **_TORCH_FIXED,
                         "amsgrad": bool(amsgrad), "fused": None if fused is None else bool(fused)}
        _check_off(self.defaults)
        # Set by load_state_dict: the loaded step counters are moved to where each parameter's path keeps
        # them at the next step.
        self._place_steps = False
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        params = list(params)
        if not params:
            raise ValueError("optimizer got an empty parameter list")
        for group in (params if isinstance(params[0], dict) else [{"params": params}]):
            self.add_param_group(group)
        self._one = torch.tensor(1.0)  # the step increment, as torch adds it to its CPU step counters

    def add_param_group(self, group: dict[str, Any]) -> None:
        group = dict(group)
        params = group["params"]
        group["params"] = [params] if isinstance(params, torch.Tensor) else list(params)
        for key, value in self.defaults.items():
            group.setdefault(key, value)
        _check(group["lr"], group["betas"], group["eps"], group["weight_decay"])
        _check_off(group)
        if group["fused"] is not None:
            group["fused"] = bool(group["fused"])
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in group["params"]:
            if not isinstance(p, torch.Tensor) or not p.is_leaf:
                raise ValueError("can only optimize leaf tensors")
            if id(p) in seen:
                raise ValueError("some parameters appear in more than one parameter group")
            seen.add(id(p))
            if group["fused"] and not (p.is_floating_point() and p.device.type in _FUSED_DEVICES):
                raise ValueError(f"fused=True requires floating-point parameters on a device with the fused "
                                 f"Adam kernel ({', '.join(_FUSED_DEVICES)}), not {p.dtype} on {p.device}; "
                                 f"use fused=None or False")
        self.param_groups.append(group)

    def zero_grad(self) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step of every parameter that has a gradient (the others, and their state, stay as they
        are)."""
        if self._place_steps:
            self._move_loaded_steps()
        for group in self.param_groups:
            self._step_group(group)

    def _step_group(self, group: dict[str, Any]) -> None:
        # [params, grads, exp_avgs, exp_avg_sqs, steps]: lists[False] for the foreach path, lists[True] fused.
        lists: tuple[list[list[torch.Tensor]], ...] = ([[], [], [], [], []], [[], [], [], [], []])
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
            fused = _uses_fused(group, p)
            state = self.state[p]
            if len(state) == 0:
                # As torch.optim.Adam (not capturable): the step counter on the CPU, or float32 on the
                # parameter's device for the fused op.
                state["step"] = (torch.zeros((), dtype=torch.float32, device=p.device) if fused
                                 else torch.tensor(0.0, dtype=_scalar_dtype()))
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            if torch.is_complex(p):  # only on the foreach path
                p, grad = torch.view_as_real(p), torch.view_as_real(grad)
                exp_avg, exp_avg_sq = torch.view_as_real(exp_avg), torch.view_as_real(exp_avg_sq)
            for target, tensor in zip(lists[fused], (p, grad, exp_avg, exp_avg_sq, state["step"])):
                target.append(tensor)
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if lists[True][0]:
            grouped = torch._C._group_tensors_by_device_and_dtype(lists[True], False)
            for (device_params, device_grads, device_exp_avgs, device_exp_avg_sqs, steps), _ in grouped.values():
                # As torch's _fused_adam: L2 weight decay, bias corrections and the update in the kernel.
                torch._foreach_add_(steps, 1)
                torch._fused_adam_(device_params, device_grads, device_exp_avgs, device_exp_avg_sqs, [], steps,
                                   amsgrad=False, lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay,
                                   eps=eps, maximize=False, grad_scale=None, found_inf=None)
        if not lists[False][0]:
            return
        grouped = torch._C._group_tensors_by_device_and_dtype(lists[False], False)
        for (device_params, device_grads, device_exp_avgs, device_exp_avg_sqs, device_steps), _ in grouped.values():
            # The same operations, in the same order, as torch's _multi_tensor_adam (and, one tensor at a
            # time, its _single_tensor_adam, which torch.optim.Adam uses for CPU parameters).
            if device_steps[0].is_cpu:
                torch._foreach_add_(device_steps, self._one, alpha=1.0)
            else:
                torch._foreach_add_(device_steps, 1)
            if weight_decay != 0:
                device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)
            torch._foreach_lerp_(device_exp_avgs, device_grads, 1 - beta1)
            torch._foreach_mul_(device_exp_avg_sqs, beta2)
            torch._foreach_addcmul_(device_exp_avg_sqs, device_grads, device_grads, 1 - beta2)
            del device_grads
            counts = [step.item() for step in device_steps]
            step_size = [(lr / (1 - beta1 ** count)) * -1 for count in counts]
            bias_correction2_sqrt = [(1 - beta2 ** count) ** 0.5 for count in counts]
            denom = torch._foreach_sqrt(device_exp_avg_sqs)
            torch._foreach_div_(denom, bias_correction2_sqrt)
            torch._foreach_add_(denom, eps)
            torch._foreach_addcdiv_(device_params, device_exp_avgs, denom, step_size)

    def _move_loaded_steps(self) -> None:
        """Each loaded step counter to where its parameter's path keeps it: on the CPU (foreach), or float32 on
        the parameter's device (fused). A no-op for counters already there."""
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.get(p)
                if state and isinstance(state.get("step"), torch.Tensor):
                    if _uses_fused(group, p):
                        state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
                    else:
                        state["step"] = state["step"].to(device="cpu", dtype=_scalar_dtype())
        self._place_steps = False

    def state_dict(self) -> dict[str, Any]:
        """As ``torch.optim.Optimizer.state_dict``: parameters numbered in group order; tensors not copied."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        return {"state": {index[id(p)]: value for p, value in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict of this class or of ``torch.optim.Adam``; its hyperparameters replace the
        groups' (as torch does), except ``fused``: each group keeps its own path. Moments move to their
        parameter's device and dtype; step counters where the group's path keeps them, at the next step."""
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(saved_groups) != len(self.param_groups):
            raise ValueError("loaded state dict has a different number of parameter groups")
        if any(len(g["params"]) != len(s["params"]) for g, s in zip(self.param_groups, saved_groups)):
            raise ValueError("loaded state dict contains a parameter group that doesn't match the size of "
                             "optimizer's group")
        for saved in saved_groups:
            for key, value in _TORCH_FIXED.items():  # absent in state dicts of older torch versions
                saved.setdefault(key, value)
            _check_off(saved)
        by_id = dict(zip(chain.from_iterable(s["params"] for s in saved_groups),
                         chain.from_iterable(g["params"] for g in self.param_groups)))
        state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        for key, value in state_dict["state"].items():
            if key not in by_id:
                continue
            param = by_id[key]
            loaded = {}
            for name, item in value.items():
                if name == "step":
                    # As it comes (moved by _move_loaded_steps at the next step); a number (older torch
                    # versions) as the tensor torch makes of it.
                    if not isinstance(item, torch.Tensor):
                        item = torch.tensor(float(item), dtype=_scalar_dtype())
                elif isinstance(item, torch.Tensor):
                    item = item.to(dtype=param.dtype if param.is_floating_point() else None, device=param.device)
                loaded[name] = item
            state[param] = loaded
        self.state = state
        self.param_groups = [{**saved, "params": group["params"], "fused": group["fused"]}
                             for group, saved in zip(self.param_groups, saved_groups)]
        self._place_steps = True

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={self.defaults[k]}" for k in ("lr", "betas", "eps", "weight_decay", "fused"))
        return f"Adam({settings}, {sum(len(g['params']) for g in self.param_groups)} parameters)"


_FUSED_DEVICES = tuple(_get_fused_kernels_supported_devices())


def _uses_fused(group: dict[str, Any], p: torch.Tensor) -> bool:
    """Whether ``p`` is updated by the fused op: ``fused=None`` means floating-point parameters on CUDA."""
    fused = group["fused"]
    return (p.is_cuda and p.is_floating_point()) if fused is None else fused


def _scalar_dtype() -> torch.dtype:
    """The dtype torch.optim.Adam gives its step counters."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _check(lr, betas, eps, weight_decay) -> None:
    if isinstance(lr, torch.Tensor):
        raise ValueError("lr must be a number (torch.optim.Adam takes a tensor only with capturable or fused)")
    for valid, what in ((0.0 <= lr, f"learning rate: {lr}"), (0.0 <= eps, f"epsilon value: {eps}"),
                        (0.0 <= betas[0] < 1.0, f"beta parameter at index 0: {betas[0]}"),
                        (0.0 <= betas[1] < 1.0, f"beta parameter at index 1: {betas[1]}"),
                        (0.0 <= weight_decay, f"weight_decay value: {weight_decay}")):
        if not valid:
            raise ValueError(f"Invalid {what}")  # torch.optim.Adam's messages


def _check_off(group: dict[str, Any]) -> None:
    on = [key for key in _MUST_BE_OFF if group.get(key)]
    if on:
        raise ValueError(f"neutronorch.train.optim.Adam does not implement {', '.join(on)}; use torch.optim.Adam.")


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
