"""Adam without ``torch.optim.Optimizer``: the same update, without importing ``torch._dynamo``.

Why it exists: ``torch.optim.Optimizer.__init__`` is wrapped by ``torch._disable_dynamo``, which imports
``torch._dynamo`` on its first call (and ``Optimizer.step`` calls ``torch._dynamo.graph_break()``). That
import took about 2.3 s on the 2-core development machine, on every start: three times the rest of the
set-up before the first training step (about 0.8 s, data loading included). This class does the update of
``torch.optim.Adam`` (defaults ``foreach=None``, ``amsgrad=False``, ``maximize=False``, L2 ``weight_decay``
added to the gradient, bias corrections computed as torch computes them) with ``torch._foreach_*`` ops,
grouped by device and dtype, as torch's foreach path does.

``tests/test_optim.py`` checks it against ``torch.optim.Adam`` (equal to 1e-6 relative over 20 steps, with
weight decay and parameters left without a gradient in some steps), that state dicts load both ways (so
checkpoints written by ``torch.optim.Adam`` resume with it and the other way round), and that neither
constructing nor stepping it imports ``torch._dynamo``.

Not provided: amsgrad, maximize, decoupled weight decay (AdamW), tensor learning rates, sparse gradients and
``torch.optim`` hooks; ``torch.optim.lr_scheduler`` classes refuse anything that is not an ``Optimizer``,
but code that sets ``group["lr"]`` in ``param_groups`` works.
"""

from __future__ import annotations

from collections import defaultdict
from copy import deepcopy
from itertools import chain
from typing import Any, Callable, Iterable

import torch

# What a param group of torch.optim.Adam holds besides the settings below: written to state dicts with
# torch's values so that torch.optim.Adam loads them as its own; a loaded state dict must have these values.
_TORCH_FIXED = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False,
                "differentiable": False, "fused": None, "decoupled_weight_decay": False}
_MUST_BE_OFF = ("amsgrad", "maximize", "capturable", "differentiable", "fused", "decoupled_weight_decay")


class Adam:
    """``torch.optim.Adam(params, lr, betas, eps, weight_decay)``, its state dict format included."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False):
        if amsgrad:
            raise ValueError("neutronorch.train.optim.Adam does not implement amsgrad; use torch.optim.Adam.")
        _check(lr, betas, eps, weight_decay)
        self.defaults = {"lr": float(lr), "betas": (float(betas[0]), float(betas[1])), "eps": float(eps),
                         "weight_decay": float(weight_decay), **_TORCH_FIXED}
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
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        for p in group["params"]:
            if not isinstance(p, torch.Tensor) or not p.is_leaf:
                raise ValueError("can only optimize leaf tensors")
            if id(p) in seen:
                raise ValueError("some parameters appear in more than one parameter group")
            seen.add(id(p))
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Adam step of every parameter that has a gradient (the others, and their state, stay as they
        are). ``closure`` re-evaluates the model and returns the loss, as in torch."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with torch.no_grad():
            for group in self.param_groups:
                self._step_group(group)
        return loss

    def _step_group(self, group: dict[str, Any]) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("Adam does not support sparse gradients, please consider SparseAdam instead")
            state = self.state[p]
            if len(state) == 0:
                # As torch.optim.Adam (not capturable, not fused): the step counter on the CPU.
                state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            if torch.is_complex(p):
                p, grad = torch.view_as_real(p), torch.view_as_real(grad)
                exp_avg, exp_avg_sq = torch.view_as_real(exp_avg), torch.view_as_real(exp_avg_sq)
            params.append(p)
            grads.append(grad)
            exp_avgs.append(exp_avg)
            exp_avg_sqs.append(exp_avg_sq)
            steps.append(state["step"])
        if not params:
            return
        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        grouped = torch._C._group_tensors_by_device_and_dtype([params, grads, exp_avgs, exp_avg_sqs, steps], False)
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
        groups' (as torch does). Moments move to their parameter's device and dtype."""
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
                    # Kept on the CPU, as torch.optim.Adam (neither capturable nor fused) keeps it.
                    item = (item.to(device="cpu", dtype=_scalar_dtype()) if isinstance(item, torch.Tensor)
                            else torch.tensor(float(item), dtype=_scalar_dtype()))
                elif isinstance(item, torch.Tensor):
                    item = item.to(dtype=param.dtype if param.is_floating_point() else None, device=param.device)
                loaded[name] = item
            state[param] = loaded
        self.state = state
        self.param_groups = [{**saved, "params": group["params"]}
                             for group, saved in zip(self.param_groups, saved_groups)]

    def __repr__(self) -> str:
        settings = ", ".join(f"{k}={self.defaults[k]}" for k in ("lr", "betas", "eps", "weight_decay"))
        return f"Adam({settings}, {sum(len(g['params']) for g in self.param_groups)} parameters)"


def _scalar_dtype() -> torch.dtype:
    """The dtype torch.optim.Adam gives its step counters."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _check(lr, betas, eps, weight_decay) -> None:
    if isinstance(lr, torch.Tensor):
        raise ValueError("lr must be a number (torch.optim.Adam takes a tensor only with capturable or fused)")
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= betas[0] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
    if not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def _check_off(group: dict[str, Any]) -> None:
    on = [key for key in _MUST_BE_OFF if group.get(key)]
    if on:
        raise ValueError(f"neutronorch.train.optim.Adam does not implement {', '.join(on)}; use torch.optim.Adam.")
