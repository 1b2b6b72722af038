"""The one model stack (``nn/models.py``'s ``LayerStack``) that ``GNN`` and ``TypedGNN`` are: the parameter names
a checkpoint stores stay those the models had before they shared it, so checkpoints written then still load."""

from __future__ import annotations

import torch

from neutronorch.nn.custom import UserModel
from neutronorch.nn.models import GNN, LayerStack
from neutronorch.nn.typed_models import TypedGNN, TypedSpec

WRITES, REV = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
SPEC = TypedSpec({"paper": 10, "author": 5}, {"paper": 8, "author": 0}, (WRITES, REV), "paper")


def test_saved_parameter_names_are_kept():
    assert list(GNN("sage", 12, 16, 5, 2, residual=True, norm="layer").state_dict()) == [
        "layers.0.layer.lin_self.weight", "layers.0.layer.lin_self.bias", "layers.0.layer.lin_neigh.weight",
        "layers.0.skip.weight", "layers.1.lin_self.weight", "layers.1.lin_self.bias", "layers.1.lin_neigh.weight",
        "norms.0.weight", "norms.0.bias"]
    gat = list(GNN("gat", 12, 16, 5, 2, heads=2, architecture="blocks").state_dict())
    assert gat[:6] == ["layers.0.input.weight", "layers.0.input.bias", "layers.0.first.attention.attn_src",
                       "layers.0.first.attention.attn_dst", "layers.0.first.attention.bias",
                       "layers.0.first.attention.lin.weight"] and gat[-2:] == ["head.lin.weight", "head.lin.bias"]
    assert list(TypedGNN("rgcn", SPEC, 16, 5, 2).state_dict()) == [
        "embeddings.author.weight", "projections.paper.weight", "projections.paper.bias", "layers.0.weight",
        "layers.0.root", "layers.0.bias", "layers.1.weight", "layers.1.root", "layers.1.bias"]
    rgat = list(TypedGNN("rgat", SPEC, 16, 5, 2, heads=2).state_dict())
    assert rgat[:3] == ["embeddings.author.weight", "layers.0.convs.author__writes__paper.att_src",
                        "layers.0.convs.author__writes__paper.att_dst"]
    assert rgat[-1] == "layers.1.convs.author__writes__paper.lin.weight"


class Table(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rows = torch.nn.Embedding(4, 2, sparse=True)

    def forward(self, blocks, features, ids):
        return self.rows(ids["paper"])


def test_both_kinds_are_one_stack_with_one_bottom_and_one_split_of_weights():
    gnn, typed = GNN("sage", 12, 16, 5, 2), TypedGNN("rgcn", SPEC, 16, 5, 2)
    assert isinstance(gnn, LayerStack) and isinstance(typed, LayerStack)
    assert gnn.bottom is gnn.layers[0] and typed.bottom.layer is typed.layers[0]
    assert gnn.embedding_parameters() == [] and len(gnn.dense_parameters()) == len(list(gnn.parameters()))
    assert [id(p) for p in typed.embedding_parameters()] == [id(typed.embeddings["author"].weight)]
    assert (typed.width(0), typed.width(1), gnn.width(1)) == (16, 5, 5)
    own = UserModel(Table(), 1, 2, "paper")
    assert own.arguments["num_classes"] == 2 and len(own.embedding_parameters()) == 1 and not own.dense_parameters()
