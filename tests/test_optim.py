"""The trainer's Adam (``neutronorch.train.optim``) against ``torch.optim.Adam``: the same updates on both of its
paths (foreach, and the fused op: the default on CUDA, forced here on the CPU with ``fused=True``), state dicts
that load both ways and between the paths, and no ``torch._dynamo`` import."""

import copy
import io
import subprocess
import sys

import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data import SyntheticSpec, generate
from neutronorch.train.optim import Adam

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


class TwoBranches(torch.nn.Module):
    """Branch ``b`` is used only in odd steps: its parameters have no gradient (None) in the others."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(8, 16)
        self.out = torch.nn.Linear(16, 3)

    def forward(self, x, use_b):
        h = self.a(x) + (self.b(x) if use_b else 0)
        return self.out(torch.relu(h))


def _step(model, optimizer, k, device):
    g = torch.Generator().manual_seed(100 + k)
    x, y = torch.randn(32, 8, generator=g).to(device), torch.randint(0, 3, (32,), generator=g).to(device)
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(x, k % 2 == 1), y).backward()
    optimizer.step()


def _models(device):
    torch.manual_seed(0)
    model = TwoBranches().to(device)
    return model, copy.deepcopy(model)


def _assert_same(model_a, model_b):
    for (name, a), b in zip(model_a.named_parameters(), model_b.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_updates_equal_torch_adam_with_weight_decay_and_missing_gradients(device):
    """The default path (foreach on the CPU, fused on CUDA) against torch's on the same path."""
    ours_model, torch_model = _models(device)
    ours = Adam(ours_model.parameters(), lr=0.01, weight_decay=5e-3)
    reference = torch.optim.Adam(torch_model.parameters(), lr=0.01, weight_decay=5e-3,
                                 fused=True if device == "cuda" else None)
    for k in range(20):
        if k == 12:  # scheduler-style edits of the learning rate take effect
            for optimizer in (ours, reference):
                optimizer.param_groups[0]["lr"] = 0.003
        _step(ours_model, ours, k, device)
        _step(torch_model, reference, k, device)
        _assert_same(ours_model, torch_model)
    assert float(ours.state[ours_model.b.weight]["step"]) == 10  # skipped without a gradient
    for p, q in zip(ours_model.parameters(), torch_model.parameters()):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(ours.state[p][key], reference.state[q][key], rtol=1e-6, atol=0)


def _through_a_file(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("first", ["torch", "ours"])
def test_state_dicts_load_both_ways(first):
    """Five steps with one class, its state dict (through a file, as in a checkpoint) loaded into the other,
    five more steps: the same as ten steps with the first."""
    classes = {"torch": torch.optim.Adam, "ours": Adam}
    second = "ours" if first == "torch" else "torch"
    model, _ = _models("cpu")
    optimizer = classes[first](model.parameters(), lr=0.01, weight_decay=1e-3)
    for k in range(5):
        _step(model, optimizer, k, "cpu")
    state = optimizer.state_dict()
    assert set(state["param_groups"][0]) == set(torch.optim.Adam([torch.zeros(1)]).state_dict()["param_groups"][0])
    assert set(state["state"][0]) == {"step", "exp_avg", "exp_avg_sq"}
    resumed_model = copy.deepcopy(model)
    resumed = classes[second](resumed_model.parameters(), lr=1.0)  # the state dict's lr replaces it
    resumed.load_state_dict(_through_a_file(state))
    assert resumed.param_groups[0]["lr"] == 0.01 and resumed.param_groups[0]["weight_decay"] == 1e-3
    for k in range(5, 10):
        _step(model, optimizer, k, "cpu")
        _step(resumed_model, resumed, k, "cpu")
        _assert_same(model, resumed_model)


def test_unsupported_settings_are_refused():
    params = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="amsgrad"):
        Adam(params, lr=0.01, amsgrad=True)
    state = torch.optim.Adam(params, amsgrad=True).state_dict()
    with pytest.raises(ValueError, match="amsgrad"):
        Adam(params).load_state_dict(state)


@pytest.mark.slow
def test_constructing_and_stepping_does_not_import_dynamo():
    code = ("import sys, torch\n"
            "from neutronorch.train.optim import Adam\n"
            "model = torch.nn.Linear(4, 2)\n"
            "optimizer = Adam(model.parameters(), lr=0.01, weight_decay=1e-4)\n"
            "model(torch.randn(3, 4)).sum().backward()\n"
            "optimizer.step()\n"
            "optimizer.zero_grad()\n"
            "optimizer.load_state_dict(optimizer.state_dict())\n"
            "assert 'torch._dynamo' not in sys.modules, 'torch._dynamo was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_summary_reports_the_time_to_the_first_step():
    config = dict(dataset="synthetic:nodes=2000,degree=8,features=16,classes=4", fanouts=[5, 5], hidden=16,
                  batch_size=256, epochs=1, eval_every=-1, progress=False)
    startup = train(TrainConfig(**config))["startup"]
    assert 0 < startup["data_seconds"] < startup["first_step_seconds"]
    given = train(TrainConfig(**config), graph=generate(SyntheticSpec.parse(config["dataset"])))["startup"]
    assert given["data_seconds"] == 0 and given["first_step_seconds"] > 0
    assert train(TrainConfig(**{**config, "epochs": 0}))["startup"]["first_step_seconds"] is None


# The fused op computes the bias corrections in float32 (the foreach path in float64 on the host), so the two
# paths differ in the last bits: 1e-6 relative, and 1e-6 absolute for weights that pass near zero (about 8
# float32 spacings of a weight of 1; the largest difference seen over 20 steps was 2 of them).
PATHS = dict(rtol=1e-6, atol=1e-6)

SHAPES = [(), (1,), (7,), (5, 3), (4, 3, 2), (300,)]


def _params(dtype=torch.float32, device="cpu"):
    torch.manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, dtype=torch.float32).to(device=device, dtype=dtype))
            for shape in SHAPES]


def _give_gradients(params, k):
    """Random gradients; the second parameter gets none in odd steps."""
    g = torch.Generator().manual_seed(1000 + k)
    for i, p in enumerate(params):
        grad = torch.randn(p.shape, generator=g).to(device=p.device, dtype=p.dtype)
        p.grad = None if (i == 1 and k % 2 == 1) else grad


def _run(make_optimizer, steps=20, dtype=torch.float32, device="cpu"):
    params = _params(dtype, device)
    optimizer = make_optimizer(params)
    for k in range(steps):
        if k == 12:
            optimizer.param_groups[0]["lr"] = 0.003
        _give_gradients(params, k)
        optimizer.step()
    return params, optimizer


def _count_fused_calls(monkeypatch):
    calls = []
    fused_adam = torch._fused_adam_

    def counting(params, *args, **kwargs):
        calls.append(len(params))
        return fused_adam(params, *args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adam_", counting)
    return calls


@pytest.mark.parametrize("weight_decay", [0.0, 5e-3])
def test_fused_path_matches_foreach_and_torch_adam(weight_decay, monkeypatch):
    """20 steps on the CPU with the fused op: equal to the foreach path and torch.optim.Adam within the paths'
    tolerance, and bit for bit to torch.optim.Adam(fused=True), which runs the same op."""
    settings = dict(lr=0.01, weight_decay=weight_decay)
    foreach, _ = _run(lambda p: Adam(p, fused=False, **settings))
    reference, _ = _run(lambda p: torch.optim.Adam(p, **settings))
    torch_fused, torch_fused_optimizer = _run(lambda p: torch.optim.Adam(p, fused=True, **settings))
    calls = _count_fused_calls(monkeypatch)
    fused, optimizer = _run(lambda p: Adam(p, fused=True, **settings))
    assert calls == [len(SHAPES), len(SHAPES) - 1] * 10  # one call a step, every parameter in it
    for i, (a, b, c, d) in enumerate(zip(fused, foreach, reference, torch_fused)):
        torch.testing.assert_close(a, b, **PATHS, msg=f"parameter {i}: fused against foreach")
        torch.testing.assert_close(a, c, **PATHS, msg=f"parameter {i}: fused against torch.optim.Adam")
        assert torch.equal(a, d), f"parameter {i}: fused against torch.optim.Adam(fused=True)"
    for p, q in zip(fused, torch_fused):
        state, torch_state = optimizer.state[p], torch_fused_optimizer.state[q]
        assert state["step"].dtype == torch.float32 and state["step"].device == p.device
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key], torch_state[key]), key
    assert float(optimizer.state[fused[1]]["step"]) == 10  # skipped without a gradient


def test_fused_path_does_not_change_gradients():
    params = _params()
    optimizer = Adam(params, lr=0.01, weight_decay=0.1, fused=True)
    _give_gradients(params, 0)
    grads = [p.grad.clone() for p in params]
    optimizer.step()
    assert all(torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_fused_path_in_bfloat16():
    """bf16 parameters and moments: the fused op computes in float32 and rounds once per tensor, the foreach
    path rounds every intermediate to bf16, so the two agree only to bf16 precision (a few of its spacings);
    against torch.optim.Adam(fused=True) bit for bit."""
    probe = [torch.zeros(2, dtype=torch.bfloat16)]
    try:
        torch._fused_adam_(probe, [torch.ones_like(probe[0])], [torch.zeros_like(probe[0])],
                           [torch.zeros_like(probe[0])], [], [torch.ones(())], amsgrad=False, lr=0.1, beta1=0.9,
                           beta2=0.999, weight_decay=0.0, eps=1e-8, maximize=False, grad_scale=None, found_inf=None)
    except RuntimeError as error:
        pytest.skip(f"this torch has no CPU fused Adam for bfloat16: {error}")
    for weight_decay in (0.0, 5e-3):
        settings = dict(lr=0.01, weight_decay=weight_decay)
        fused, _ = _run(lambda p: Adam(p, fused=True, **settings), dtype=torch.bfloat16)
        torch_fused, _ = _run(lambda p: torch.optim.Adam(p, fused=True, **settings), dtype=torch.bfloat16)
        foreach, _ = _run(lambda p: Adam(p, fused=False, **settings), dtype=torch.bfloat16)
        for a, b, c in zip(fused, torch_fused, foreach):
            assert a.dtype == torch.bfloat16
            assert torch.equal(a, b)
            torch.testing.assert_close(a, c, rtol=2 ** -6, atol=2 ** -6)


def test_fused_none_on_the_cpu_is_the_foreach_path_bit_for_bit(monkeypatch):
    calls = _count_fused_calls(monkeypatch)
    default, default_optimizer = _run(lambda p: Adam(p, lr=0.01, weight_decay=5e-3))
    foreach, foreach_optimizer = _run(lambda p: Adam(p, lr=0.01, weight_decay=5e-3, fused=False))
    assert calls == []
    for p, q in zip(default, foreach):
        assert torch.equal(p, q)
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(default_optimizer.state[p][key], foreach_optimizer.state[q][key])
        assert default_optimizer.state[p]["step"].device.type == "cpu"
    assert default_optimizer.state_dict()["param_groups"][0]["fused"] is None


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
def test_state_dicts_round_trip_fused_foreach_fused(default_dtype):
    """Fused for 7 steps, its state dict (through a file) loaded by the foreach path for 7, that one's loaded
    by the fused path for 6: the trajectory of 20 fused steps. With float64 as the default dtype the two paths
    keep their step counters in different dtypes (float32 fused, float64 foreach): each is converted at the
    first step after loading."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)
    try:
        settings = dict(lr=0.01, weight_decay=5e-3)
        straight, _ = _run(lambda p: Adam(p, fused=True, **settings))
        params = _params()
        optimizer = Adam(params, fused=True, **settings)
        for k in range(20):
            if k == 12:
                optimizer.param_groups[0]["lr"] = 0.003
            if k in (7, 14):
                fused = k == 14
                optimizer_before, optimizer = optimizer, Adam(params, lr=1.0, fused=fused)
                optimizer.load_state_dict(_through_a_file(optimizer_before.state_dict()))
                assert optimizer.param_groups[0]["lr"] == (0.01 if k < 12 else 0.003)
                assert optimizer.param_groups[0]["fused"] is fused
            _give_gradients(params, k)
            optimizer.step()
            if k in (7, 14):
                want = torch.float32 if fused else default_dtype
                assert all(optimizer.state[p]["step"].dtype == want for p in params)
        for a, b in zip(params, straight):
            torch.testing.assert_close(a, b, **PATHS)
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("first, second", [("torch-fused", "ours"), ("torch-fused", "ours-fused"),
                                           ("ours-fused", "torch"), ("ours", "torch-fused")])
def test_state_dicts_load_between_torch_and_ours_across_paths(first, second):
    """torch.optim.Adam(fused=True)'s state dicts load (its ``fused`` does not switch our path), and ours
    load into torch's either way."""
    classes = {"torch": lambda p, **s: torch.optim.Adam(p, **s),
               "torch-fused": lambda p, **s: torch.optim.Adam(p, fused=True, **s),
               "ours": lambda p, **s: Adam(p, **s), "ours-fused": lambda p, **s: Adam(p, fused=True, **s)}
    params = _params()
    optimizer = classes[first](params, lr=0.01, weight_decay=1e-3)
    for k in range(5):
        _give_gradients(params, k)
        optimizer.step()
    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = classes[second](resumed_params, lr=1.0)
    resumed.load_state_dict(_through_a_file(optimizer.state_dict()))
    assert resumed.param_groups[0]["lr"] == 0.01
    if second.startswith("ours"):
        assert resumed.param_groups[0]["fused"] is (True if second == "ours-fused" else None)
    for k in range(5, 10):
        for group in (params, resumed_params):
            _give_gradients(group, k)
        optimizer.step()
        resumed.step()
    for a, b in zip(resumed_params, params):
        torch.testing.assert_close(a, b, **PATHS)


def test_fused_true_refuses_what_the_op_cannot_update():
    with pytest.raises(ValueError, match="fused=True requires floating-point parameters"):
        Adam([torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))], fused=True)
    Adam([torch.nn.Parameter(torch.zeros(2, dtype=torch.complex64))])  # the foreach path takes them
    torch_fused = torch.optim.Adam(_params(), fused=True).state_dict()
    torch_fused["param_groups"][0]["capturable"] = True
    with pytest.raises(ValueError, match="capturable"):  # still refused, with fused as without
        Adam(_params()).load_state_dict(torch_fused)


@pytest.mark.cuda
def test_the_default_on_cuda_is_the_fused_path(monkeypatch):
    """One fused call a step, counters on the device, no host-device sync; equal to the foreach path within
    the paths' tolerance; checkpoints move between the paths."""
    calls = _count_fused_calls(monkeypatch)
    default, optimizer = _run(lambda p: Adam(p, lr=0.01, weight_decay=5e-3), device="cuda")
    assert calls == [len(SHAPES), len(SHAPES) - 1] * 10
    assert all(optimizer.state[p]["step"].device.type == "cuda" for p in default)
    foreach, foreach_optimizer = _run(lambda p: Adam(p, lr=0.01, weight_decay=5e-3, fused=False), device="cuda")
    assert all(foreach_optimizer.state[p]["step"].device.type == "cpu" for p in foreach)
    for a, b in zip(default, foreach):
        torch.testing.assert_close(a, b, **PATHS)
    _give_gradients(default, 20)
    torch.cuda.set_sync_debug_mode("error")  # the fused step reads nothing back from the device
    try:
        optimizer.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # A CUDA checkpoint of the fused path resumes on the foreach path and the other way round.
    resumed = Adam(_params(device="cuda"), fused=False)
    resumed.load_state_dict(_through_a_file(optimizer.state_dict()))
    resumed_params = resumed.param_groups[0]["params"]
    _give_gradients(resumed_params, 20)
    resumed.step()
    assert all(resumed.state[p]["step"].device.type == "cpu" for p in resumed_params)
    again = Adam(_params(device="cuda"))
    again.load_state_dict(_through_a_file(resumed.state_dict()))
    _give_gradients(again.param_groups[0]["params"], 21)
    again.step()
    assert all(again.state[p]["step"].device.type == "cuda" and again.state[p]["step"].dtype == torch.float32
               for p in again.param_groups[0]["params"])
