"""Your own model in ``train()``: the protocol of ``nn.custom``, a PyG model unchanged, a block-form model in
every mode, checkpoints, predict, evaluation, and the errors of a module that does not follow it."""

import json

import numpy as np
import pytest
import torch
from torch import nn

from neutronorch import TrainConfig, train
from neutronorch.data import SyntheticSpec, generate
from neutronorch.errors import CheckpointError, ConfigError, TrainingError
from neutronorch.features.store import FeatureStore
from neutronorch.nn.custom import ModelProtocolError, UserModel
from neutronorch.nn.layers import SAGEConv
from neutronorch.nn.models import GNN
from neutronorch.sampling.block import pyg_form
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.train.checkpoint import load_checkpoint
from neutronorch.train.layerwise import layerwise
from neutronorch.train.predict import predict

SPEC = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"


def config(**overrides):
    values = dict(dataset=SPEC, fanouts=[5, 5], batch_size=128, epochs=3, lr=0.01, dropout=0.5,
                  weight_decay=0.0, progress=False)
    values.update(overrides)
    return TrainConfig(**values)


class BlockSage(nn.Module):
    """A two-layer model of the block form with its bottom layer apart (what NeutronOrch mode reuses)."""

    def __init__(self, dims=(16, 32, 4)):
        super().__init__()
        self.bottom = SAGEConv(dims[0], dims[1])
        self.top = SAGEConv(dims[1], dims[2])

    def forward(self, blocks, x):
        return self.upper(blocks[1:], self.bottom(blocks[0], x))

    def upper(self, blocks, h):
        return self.top(blocks[0], torch.relu(h))


class Wrapped(nn.Module):
    """A built-in model as a user's block-form module (for comparisons with the built-in path)."""

    def __init__(self, gnn):
        super().__init__()
        self.gnn = gnn

    def forward(self, blocks, x):
        return self.gnn(blocks, x)


def test_pyg_form_is_neighbor_loaders_layout_and_trimming_changes_nothing():
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    graph = generate(SyntheticSpec.parse(SPEC))
    sampler = NeighborSampler(graph.indptr, graph.indices, [4, 3, 2])
    sg = sampler.sample(np.arange(0, 3000, 97), batch_key(0, 0, 0))
    edge_index, nodes, edges = pyg_form(sg.blocks)
    sizes = np.cumsum(nodes)
    assert sizes[-1] == sg.input_nodes.shape[0] and nodes[0] == sg.seeds.shape[0]
    assert sum(edges) == edge_index.shape[1]
    ids = sg.input_nodes.numpy()
    start = 0
    for hop, count in enumerate(edges):  # hop h's edges lead to the vertices hop h - 1 newly reached
        dst = edge_index[1, start:start + count].numpy()
        low = 0 if hop == 0 else sizes[hop - 1]
        assert ((dst >= low) & (dst < sizes[hop])).all()
        for u, v in zip(ids[edge_index[0, start:start + count].numpy()], ids[dst]):  # real edges u -> v
            assert u in graph.indices[graph.indptr[v]:graph.indptr[v + 1]]
        start += count
    torch.manual_seed(0)
    model = pyg_nn.GraphSAGE(16, 32, 3, 4).eval()
    x = torch.from_numpy(np.asarray(graph.features)[ids])
    full = model(x, edge_index)[:nodes[0]]
    trimmed = model(x, edge_index, num_sampled_nodes_per_hop=nodes, num_sampled_edges_per_hop=edges)[:nodes[0]]
    torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_pyg_model_trains_unchanged_with_checkpoints_and_predict(tmp_path):
    pyg_nn = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    model = pyg_nn.GraphSAGE(16, 32, 2, 4, dropout=0.5)
    summary = train(config(checkpoint_dir=str(tmp_path)), model=model)
    assert summary["test_acc"] > 0.75
    losses = [e["train_loss"] for e in summary["epochs"]]
    assert losses[-1] < losses[0]
    with pytest.raises(CheckpointError, match="your own model .*GraphSAGE.*load_checkpoint"):
        load_checkpoint(tmp_path / "best.pt")
    checkpoint = load_checkpoint(tmp_path / "best.pt", model=pyg_nn.GraphSAGE(16, 32, 2, 4))
    graph = generate(SyntheticSpec.parse(SPEC))
    predicted = predict(checkpoint, graph, "test")
    assert float((predicted == graph.labels[graph.test_idx]).mean()) == pytest.approx(summary["test_acc"])
    with pytest.raises(CheckpointError, match="do not fit"):
        load_checkpoint(tmp_path / "best.pt", model=pyg_nn.GraphSAGE(16, 8, 2, 4))
    # Resuming with a built-in model instead is refused, saying why.
    with pytest.raises(CheckpointError, match="your own model .* built-in model"):
        train(config(checkpoint_dir=str(tmp_path), resume=True, epochs=4))


@pytest.mark.slow
def test_a_pyg_style_module_trains_whatever_its_forward_names_its_arguments():
    torch.manual_seed(0)
    summary = train(config(), model=ShortNames())
    losses = [e["train_loss"] for e in summary["epochs"]]
    assert losses[-1] < losses[0] and summary["test_acc"] > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["device", "neutronorch"])
def test_a_block_form_model_trains_in_every_mode(mode):
    torch.manual_seed(0)
    exact = train(config(mode="exact", epochs=4), model=BlockSage())
    torch.manual_seed(0)
    orch = dict(super_batch=2, hot_ratio=0.3) if mode == "neutronorch" else {}
    other = train(config(mode=mode, epochs=4, **orch), model=BlockSage())
    assert exact["test_acc"] > 0.75 and abs(other["test_acc"] - exact["test_acc"]) < 0.05
    if mode == "neutronorch":
        assert other["mode"] == "neutronorch" and other["hot"]["reuse_rate"] > 0.1


@pytest.mark.slow
def test_a_user_models_reuse_in_lockstep_equals_exact_mode():
    # P = 1, S = 0, the hot rows' gradient added: NeutronOrch's rule for its own layers, kept for a user's.
    torch.manual_seed(0)
    exact = train(config(mode="exact", epochs=2), model=BlockSage())
    torch.manual_seed(0)
    orch = train(config(mode="neutronorch", epochs=2, super_batch=1, staleness_bound=0, hot_grad="cpu",
                        hot_ratio=0.3), model=BlockSage())
    assert orch["hot"]["reuse_rate"] > 0.1
    for a, b in zip(exact["epochs"], orch["epochs"]):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-5)


def test_evaluation_of_a_user_model_is_exact_full_neighbour_inference():
    # Whole neighbourhoods of each chunk give the logits the built-in layer-by-layer inference gives.
    graph = generate(SyntheticSpec.parse(SPEC))
    torch.manual_seed(0)
    gnn = GNN("sage", 16, 32, 4, 2, dropout=0.0)
    store = FeatureStore(graph.features, graph.labels)
    nodes = torch.arange(0, 3000, 7)
    ours = layerwise(gnn, graph, store, nodes, torch.device("cpu"), chunk_size=100)
    theirs = layerwise(UserModel(Wrapped(gnn), 2, 4), graph, store, nodes, torch.device("cpu"), chunk_size=100)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)


class OneArgument(nn.Module):
    def forward(self, a):
        return a


class ShortNames(nn.Module):
    """A PyG-style module whose forward names its arguments as it likes: read by position, as PyG does."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 4)

    def forward(self, h, ei):
        messages = torch.zeros_like(h).index_add_(0, ei[1], h[ei[0]])
        return self.lin(h + messages)


class WrongShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 3)  # three outputs for a four-class graph

    def forward(self, blocks, x):
        return self.lin(x[:blocks[-1].num_dst])


class NoParameters(nn.Module):
    def forward(self, blocks, x):
        return torch.zeros(blocks[-1].num_dst, 4)


class Detached(WrongShape):
    def forward(self, blocks, x):
        return torch.cat([super().forward(blocks, x), x[:blocks[-1].num_dst, :1]], 1).detach()


class SparseTable(WrongShape):
    def __init__(self):
        super().__init__()
        self.rows = nn.Embedding(3000, 3, sparse=True)


@pytest.mark.parametrize("module, message", [
    (NoParameters, "NoParameters has no parameters, so training has nothing to update; give it its weights as "
                   "nn.Parameter"),
    (lambda: WrongShape().requires_grad_(False), "none of the 2 parameters of .*WrongShape requires a gradient "
                                                 r"\(lin.weight has requires_grad False\)"),
    (lambda: WrongShape().to(torch.float64), r"2 trainable parameter\(s\) .* \(lin.weight is float64\).*float32"),
    (lambda: WrongShape().to("meta"), r"2 parameter\(s\) of .*WrongShape are on the meta device \(lin.weight\)"),
    (Detached, r"Detached.forward\(blocks, x\) returned logits that carry no gradient.*detach\(\)"),
    (SparseTable, r"SparseTable.rows is an embedding with sparse=True.*make it dense \(sparse=False\)"),
])
def test_a_module_training_cannot_update_is_refused(module, message):
    with pytest.raises(ConfigError, match=message):
        train(config(epochs=1), model=module())


@pytest.mark.slow
def test_a_frozen_module_predicts(tmp_path):
    """Frozen weights are for training only: predict takes a module with requires_grad off."""
    train(config(epochs=1, checkpoint_dir=str(tmp_path)), model=BlockSage())
    checkpoint = load_checkpoint(tmp_path / "last.pt", model=BlockSage().requires_grad_(False))
    graph = generate(SyntheticSpec.parse(SPEC))
    assert predict(checkpoint, graph, "test").shape == graph.test_idx.shape
def test_a_module_off_the_protocol_is_a_neutronorch_error():
    """A user can fix it, so it is a ConfigError (the command line's one line), and still a ValueError."""
    from neutronorch.data.textnum import TextError
    from neutronorch.errors import ConfigError, DataError, NeutronorchError

    assert issubclass(ModelProtocolError, ConfigError) and issubclass(ModelProtocolError, ValueError)
    assert issubclass(TextError, DataError) and issubclass(TextError, ValueError)
    with pytest.raises(NeutronorchError, match="must be a torch.nn.Module"):
        UserModel(lambda blocks, x: x, 2, 4)


def test_a_module_off_the_protocol_is_told_what_it_expects():
    with pytest.raises(ModelProtocolError, match=r"takes \(a\).*forward\(x, edge_index\).*forward\(blocks, x\)"):
        train(config(epochs=1), model=OneArgument())
    assert UserModel(ShortNames(), 2, 4).form == "pyg" and UserModel(BlockSage(), 2, 4).form == "blocks"
    with pytest.raises(ModelProtocolError, match="must be a torch.nn.Module"):
        UserModel(lambda blocks, x: x, 2, 4)
    with pytest.raises(ModelProtocolError, match=r"returned shape \[128, 3\].*expects a \[128, 4\] tensor"):
        train(config(epochs=1), model=WrongShape())
    with pytest.raises(ModelProtocolError, match="NeutronOrch mode .* `bottom` .*exact or device mode"):
        train(config(epochs=1, mode="neutronorch"), model=Wrapped(GNN("sage", 16, 8, 4, 2)))


@pytest.mark.slow
def test_a_user_model_resumes_exactly(tmp_path):
    pyg_nn = pytest.importorskip("torch_geometric.nn")

    def model():
        torch.manual_seed(0)
        return pyg_nn.GraphSAGE(16, 32, 2, 4, dropout=0.5)  # torch's dropout: its random state is saved

    straight = train(config(epochs=2), model=model())
    train(config(epochs=1, checkpoint_dir=str(tmp_path)), model=model())
    resumed = train(config(epochs=2, checkpoint_dir=str(tmp_path), resume=True), model=model())
    assert resumed["epochs"][-1]["train_loss"] == straight["epochs"][-1]["train_loss"]
    assert resumed["test_acc"] == straight["test_acc"]


@pytest.mark.slow
def test_the_pyg_example_runs():
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("torch_geometric")
    example = Path(__file__).resolve().parents[1] / "examples" / "pyg_model_train.py"
    done = subprocess.run([sys.executable, str(example), "--dataset",
                           "synthetic:nodes=2000,degree=8,features=16,classes=4", "--epochs", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test accuracy" in done.stdout and "predicted" in done.stdout


class NaNInEval(BlockSage):
    """Finite in training, NaN in evaluation (a branch on ``self.training`` gone wrong)."""

    def forward(self, blocks, x):
        out = super().forward(blocks, x)
        return out if self.training else out * float("nan")


@pytest.mark.slow
@pytest.mark.parametrize("eval_fanouts", [None, [5, 5]])
def test_logits_that_are_not_numbers_in_evaluation_are_an_error_naming_the_epoch_and_split(tmp_path, eval_fanouts):
    # Full-neighbour and sampled inference alike: never a score read from NaN rows (whose argmax is class 0).
    summary_json = tmp_path / "summary.json"
    with pytest.raises(TrainingError, match=r"the evaluation after epoch 0 gave NaN or infinite logits for 150 of "
                                            r"the 150 validation vertices, while the training loss was finite.*eval "
                                            r"mode"):
        train(config(epochs=2, eval_fanouts=eval_fanouts, summary_json=str(summary_json)), model=NaNInEval())
    summary = json.loads(summary_json.read_text())
    assert summary["status"] == "failed" and "NaN or infinite logits" in summary["error"]
