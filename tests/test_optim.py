"""The trainer's Adam (``neutronorch.train.optim``) against ``torch.optim.Adam``: the same updates, state dicts
that load both ways, and no ``torch._dynamo`` import."""

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
    optimizer.zero_grad(set_to_none=True)
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
    ours_model, torch_model = _models(device)
    ours = Adam(ours_model.parameters(), lr=0.01, weight_decay=5e-3)
    reference = torch.optim.Adam(torch_model.parameters(), lr=0.01, weight_decay=5e-3)
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
            "optimizer.zero_grad(set_to_none=True)\n"
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
