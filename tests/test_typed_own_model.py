"""Your own module on a typed graph through train() (``train/heterogeneous.py``, ``nn/custom.py``): a
TypedGNN handed over as one's own trains to the bit as the built-in one, in exact and device mode; a module
written by hand trains, its sparse tables moved only where a batch looked; and what is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from neutronorch import TrainConfig, train
from neutronorch.data import synthetic_typed
from neutronorch.errors import ConfigError, TrainingError
from neutronorch.nn.custom import ModelProtocolError, UserModel
from neutronorch.nn.typed_models import TypedGNN, TypedSpec

WRITES, TOPIC = ("author", "writes", "paper"), ("field", "rev_has_topic", "paper")


@pytest.fixture(scope="module")
def mag():
    return synthetic_typed(nodes=1500, degree=6, features=16, train=0.3, val=0.1, seed=0)


def config(**settings) -> TrainConfig:
    base = dict(epochs=2, fanouts=[4, 4], hidden=16, batch_size=64, lr=0.01, dropout=0.0, threads=1,
                sampler_threads=1, device="cpu")
    return TrainConfig(**{**base, **settings})


def losses(summary: dict) -> list[float]:
    return [e["train_loss"] for e in summary["epochs"]]


class Authors(nn.Module):
    """One relational layer by hand: a paper's own row and the mean of its sampled authors' table rows (a
    sparse table) and fields' rows (a dense table, for Adam)."""

    def __init__(self, graph, width: int = 8):
        super().__init__()
        self.authors = nn.Embedding(graph.num_nodes["author"], width, sparse=True)
        self.fields = nn.Embedding(graph.num_nodes["field"], width)
        self.out = nn.Linear(graph.feature_dim("paper") + 2 * width, graph.num_classes)
        self.looked_up: list[torch.Tensor] = []

    @staticmethod
    def mean(block, rows):
        sums = torch.zeros(block.num_dst, rows.shape[1]).index_add_(0, torch.repeat_interleave(
            torch.arange(block.num_dst), block.indptr[1:] - block.indptr[:-1]), rows[block.indices.long()])
        return sums / (block.indptr[1:] - block.indptr[:-1]).clamp(min=1).unsqueeze(1)

    def forward(self, blocks, features, ids):
        top = blocks[-1]
        if self.training:
            self.looked_up.append(ids["author"].clone())
        seeds = features["paper"][:top.num_dst["paper"]]
        authors = self.mean(top.blocks[WRITES], self.authors(ids["author"]))
        fields = self.mean(top.blocks[TOPIC], self.fields(ids["field"]))
        return self.out(torch.cat([seeds, authors, fields], 1))


@pytest.mark.parametrize("mode", ["exact", "device"])
def test_a_typed_gnn_of_ones_own_trains_as_the_built_in_one(mag, mode):
    """The built-in run seeds torch and builds its TypedGNN; one built the same way and handed over takes the
    same steps (the same optimizers: Adam for the dense weights, RowAdam for the tables), to the bit."""
    built_in = train(config(mode=mode), graph=mag)
    torch.manual_seed(0)
    own = TypedGNN("sage", TypedSpec.of(mag.with_reverse()), 16, mag.num_classes, 2, dropout=0.0)
    summary = train(config(mode=mode), graph=mag, model=own)
    assert losses(summary) == losses(built_in) and summary["test_acc"] == built_in["test_acc"]
    assert summary["model"]["kind"] == "neutronorch.nn.typed_models.TypedGNN"
    assert summary["model"]["parameters"] == built_in["model"]["parameters"]
    assert summary["embedding_tables"] is None  # the module's tables are its own, in memory


def test_a_module_written_by_hand_trains_and_its_sparse_table_moves_where_looked_up(mag):
    model = Authors(mag)
    adapted = UserModel(model, 1, mag.num_classes, "paper")
    assert [id(p) for p in adapted.embedding_parameters()] == [id(model.authors.weight)]
    assert id(model.fields.weight) in {id(p) for p in adapted.dense_parameters()}
    before = model.authors.weight.detach().clone()
    summary = train(config(fanouts=[4], epochs=4, eval_every=0), graph=mag, model=model)
    trained = losses(summary)
    assert trained[-1] < 0.9 * trained[0], trained
    assert summary["model"]["parameters"]["embedding"] == model.authors.weight.numel()
    touched = torch.unique(torch.cat(model.looked_up))
    untouched = torch.ones(before.shape[0], dtype=torch.bool)
    untouched[touched] = False
    assert untouched.any() and torch.equal(model.authors.weight[untouched], before[untouched])
    assert not torch.equal(model.authors.weight[touched], before[touched])


class PygForm(nn.Module):
    def forward(self, x_dict, edge_index_dict):
        return x_dict


class TwoArguments(nn.Module):
    def forward(self, blocks, features):
        return features


class WrongShape(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 3)

    def forward(self, blocks, features, ids):
        return self.lin(features["paper"])


class NoParameters(nn.Module):
    def forward(self, blocks, features, ids):
        return torch.zeros(blocks[-1].num_dst["paper"], 3)


class Frozen(WrongShape):
    def __init__(self):
        super().__init__()
        self.requires_grad_(False)


class Half(WrongShape):
    def __init__(self):
        super().__init__()
        self.half()


@pytest.mark.parametrize("module, settings, message", [
    (Authors, dict(mode="neutronorch"), "`mode` neutronorch trains the built-in"),
    (NoParameters, {}, "`model`: .*NoParameters has no parameters, so training has nothing to update"),
    (Frozen, {}, "none of the 2 parameters of .*Frozen requires a gradient .*requires_grad_"),
    (Half, {}, r"2 trainable parameter\(s\) of .*Half are not float32 \(lin.weight is float16\).*module.float"),
    (Authors, dict(checkpoint_dir="ckpt"), "checkpoints of your own module"),
    (Authors, dict(embedding_storage="mmap"), "embedding_storage"),
    (PygForm, {}, "TypedNeighborLoader"),
    (TwoArguments, {}, r"forward\(blocks, features, ids\)"),
])
def test_what_ones_own_module_cannot_do_is_refused_before_any_work(mag, module, settings, message):
    instance = module(mag) if module is Authors else module()
    with pytest.raises(ConfigError, match=message):
        train(config(fanouts=[4], **settings), graph=mag, model=instance)


@pytest.mark.slow
def test_a_module_whose_every_weight_is_a_sparse_table_trains(mag):
    """No dense parameter: the tables' optimizer alone (no empty Adam)."""

    class TablesOnly(nn.Module):
        def __init__(self):
            super().__init__()
            self.rows = nn.Embedding(mag.num_nodes["paper"], mag.num_classes, sparse=True)

        def forward(self, blocks, features, ids):
            return self.rows(ids["paper"][:blocks[-1].num_dst["paper"]])

    module = TablesOnly()
    before = module.rows.weight.detach().clone()
    summary = train(config(epochs=1, fanouts=[3]), graph=mag, model=module)
    assert summary["status"] == "completed" and not torch.equal(module.rows.weight.detach(), before)


def test_a_wrong_output_is_named(mag):
    with pytest.raises(ModelProtocolError, match=r"\[64, 16\] tensor"):
        train(config(fanouts=[4]), graph=mag, model=WrongShape())

    class Detached(Authors):
        def forward(self, blocks, features, ids):
            return super().forward(blocks, features, ids).detach()

    with pytest.raises(ConfigError, match=r"forward\(blocks, features, ids\) returned logits that carry no "
                                          r"gradient.*detach\(\)"):
        train(config(fanouts=[4]), graph=mag, model=Detached(mag))


def test_neutronorch_asks_an_adapted_module_for_a_bottom_layer_it_lacks(mag):
    with pytest.raises(ModelProtocolError, match="exact or device"):
        _ = UserModel(Authors(mag), 1, mag.num_classes, "paper").bottom
    with pytest.raises(ModelProtocolError, match="torch.nn.Module"):
        UserModel(np.zeros(3), 1, 2, "paper")


class NaNInEval(Authors):
    """Finite in training, NaN in evaluation."""

    def forward(self, blocks, features, ids):
        out = super().forward(blocks, features, ids)
        return out if self.training else out * float("nan")


class Constant(nn.Module):
    """The same logits for every paper: a model that cannot tell vertices apart."""

    def __init__(self, graph):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(graph.num_classes))

    def forward(self, blocks, features, ids):
        rows = blocks[-1].num_dst["paper"]
        return self.bias.expand(rows, -1) + 0 * features["paper"][:rows, :1]


def test_typed_evaluation_logits_that_are_not_numbers_are_an_error(mag):
    with pytest.raises(TrainingError, match=r"the evaluation after epoch 0 gave NaN or infinite logits for \d+ of "
                                            r"the \d+ validation vertices.*eval mode"):
        train(config(fanouts=[4], epochs=1), graph=mag, model=NaNInEval(mag))


def test_a_collapsed_typed_run_says_so_and_a_learning_one_does_not(mag):
    collapsed = train(config(fanouts=[4], epochs=2), graph=mag, model=Constant(mag))
    assert all(e["collapsed"] == ["every vertex given the same scores"] for e in collapsed["epochs"])
    assert len(collapsed["warnings"]) == 1 and collapsed["status"] == "completed"
    learning = train(config(fanouts=[4], epochs=2), graph=mag, model=Authors(mag))
    assert learning["warnings"] == [] and not any("collapsed" in e for e in learning["epochs"])
