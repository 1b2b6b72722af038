"""Link prediction models: a node encoder (any built-in GNN, whose last layer outputs embeddings) and a
scoring head (``LINK_HEADS``) mapping two (..., D) embeddings to (...) logits, symmetric in its two ends:
``dot``, the inner product ``<h_u, h_v>``; ``mlp``, a two-layer perceptron over ``h_u * h_v`` (OGB's
``LinkPredictor``). The encoder starts as DGL's ``SAGEConv`` does (``glorot_``; why: docs/link-prediction.md).
"""

from __future__ import annotations

from typing import Mapping

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.models import GNN, Tables
from neutronorch.nn.names import LINK_HEADS
from neutronorch.nn.typed_link import SCALED, input_groups, typed_start
from neutronorch.nn.typed_models import TypedGNN

def glorot_(module: GNN, input_norm: float = 1.0, input_mean: torch.Tensor | None = None) -> GNN:
    """Every ``nn.Linear`` of ``module`` started again: its weight from Glorot's uniform with the ReLU gain,
    its bias at zero. ``input_norm``: the root mean square of the input rows' L2 norms; above 1, the weights
    that read the input (``input_weights``) are divided by it, so raw rows start as rows of unit norm
    would. ``input_mean``: the mean input row; the first layer's bias then starts at minus what its input
    weights make of it, so that its outputs start centred (docs/link-prediction.md)."""
    gain = nn.init.calculate_gain("relu")
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight, gain=gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    with torch.no_grad():
        if input_norm > SCALED:
            for weight in input_weights(module):
                weight.div_(input_norm)
        bias = _first_bias(module)
        if input_mean is not None and bias is not None:
            mean = torch.as_tensor(input_mean, dtype=torch.float32).to(bias.device)
            bias.sub_(sum(weight.float() @ mean for weight in input_weights(module)).to(bias.dtype))
    return module


def _first_bias(module: GNN) -> torch.Tensor | None:
    """The bias that the first layer adds to its output: its convolution's (SAGE's self term, GCN's linear map,
    GAT's own) or its input map's (``--architecture blocks``); None where it has none."""
    first = module.layers[0]
    first = getattr(first, "layer", first)  # a residual wrapper's convolution
    for name in ("lin_self", "lin", "input"):
        linear = getattr(first, name, None)
        if isinstance(linear, nn.Linear) and linear.bias is not None:
            return linear.bias
    bias = getattr(first, "bias", None)
    return bias if isinstance(bias, nn.Parameter) and bias.dim() == 1 else None


def input_weights(module: GNN) -> list[nn.Parameter]:
    """The weights of ``module``'s first layer that read the input rows (its linear maps as wide as them)."""
    width = module.arguments["in_dim"]
    return [layer.weight for layer in module.layers[0].modules()
            if isinstance(layer, nn.Linear) and layer.in_features == width]


def optimizer_groups(model: nn.Module, lr: float, parameters=None) -> list[dict]:
    """Adam's parameter groups for ``model``'s ``parameters`` (default: all of them): one, except for a
    ``LinkModel`` whose input rows are larger than unit norm, whose input weights (``input_weights``; a typed
    encoder's per type, ``typed_link.input_groups``) learn at ``lr`` divided by that norm. Adam moves every
    weight by about ``lr`` a step whatever its gradient's scale, so a step moves a first-layer output by about
    ``lr`` times the L1 norm of the rows: 0.8 at lr 0.003 on Amazon Photo's 0/1 rows of 259 ones, which the
    second layer multiplies into logits of 1,500 after one step, then every embedding the same (a collapse to
    loss 2 ln 2). With the rate divided too, training proceeds as it would on the rows divided by their norm
    (the initial weights divided as ``glorot_``'s; the same steps up to Adam's epsilon and weight decay)."""
    parameters = list(model.parameters() if parameters is None else parameters)
    scaled = scaled_inputs(model)
    if not scaled:
        return [{"params": parameters}]
    divided = {id(weight) for weights, _ in scaled for weight in weights}
    groups = [{"params": [p for p in parameters if id(p) not in divided]}]
    for weights, norm in scaled:
        ids = {id(weight) for weight in weights}
        groups.append({"params": [p for p in parameters if id(p) in ids], "lr": lr / norm})
    return [g for g in groups if g["params"] or "lr" not in g]


def scaled_inputs(model: nn.Module) -> list[tuple[list[nn.Parameter], float]]:
    """The weights of a ``LinkModel``'s encoder that learn at a divided rate, each list with its divisor."""
    if not isinstance(model, LinkModel):
        return []
    if isinstance(model.encoder, TypedGNN):
        return input_groups(model.encoder, model.input_norms)
    return [(input_weights(model.encoder), model.input_norm)] if model.input_norm > SCALED else []


class DotHead(nn.Module):
    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (source * target).sum(-1)


class MLPHead(nn.Module):
    def __init__(self, width: int, dropout: float = 0.0):
        super().__init__()
        self.hidden = nn.Linear(width, width)
        self.out = nn.Linear(width, 1)
        self.dropout = dropout

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.hidden(source * target))
        h = F.dropout(h, self.dropout, self.training)
        return self.out(h).squeeze(-1)


class LinkModel(Tables, nn.Module):
    """``encoder`` (a ``GNN``, or a ``TypedGNN`` whose ``spec.outputs`` are the link's end types) and a
    ``head`` scoring pairs of its embeddings: ``forward`` is the encoder's, ``score`` the head's."""

    def __init__(self, encoder: GNN | TypedGNN, head: str = "dot", dropout: float = 0.0,
                 input_norm: float | Mapping[str, float] = 1.0,
                 input_mean: torch.Tensor | Mapping[str, torch.Tensor] | None = None):
        super().__init__()
        self.input_norm, self.input_norms = 1.0, {}
        if isinstance(encoder, TypedGNN):
            # A typed encoder keeps its own weights' start (Glorot's, summed over its relations, made rows about
            # 6 times larger: logits of 100 that a dot head learnt nothing from), but given its featured
            # types' norms and mean rows (dicts), each type's input weights are scaled and its outputs centred.
            if isinstance(input_norm, Mapping):
                self.input_norms = typed_start(encoder, input_norm, input_mean or {})
            self.encoder = encoder
        else:
            self.encoder = glorot_(encoder, input_norm, input_mean)
            # Where the input weights were divided by it, they learn at a rate divided by it (optimizer_groups).
            self.input_norm = float(input_norm)
        if head not in LINK_HEADS:
            raise ValueError(f"unknown link head {head!r}; choose one of {LINK_HEADS}")
        self.head = DotHead() if head == "dot" else MLPHead(encoder.width(encoder.num_layers - 1), dropout)
        self.kind, self.num_layers = encoder.kind, encoder.num_layers
        # What rebuilds this model (a checkpoint stores it next to the weights).
        self.arguments = {"link_head": head, "head_dropout": dropout, "encoder": dict(encoder.arguments)}

    @property
    def needs_degrees(self) -> bool:
        return self.encoder.needs_degrees

    @property
    def bottom(self) -> nn.Module:
        return self.encoder.bottom

    @property
    def embeddings(self) -> nn.ModuleDict:
        """A typed encoder's embedding tables (NeutronOrch's snapshots carry the rows its hot rows read)."""
        return self.encoder.embeddings

    def input_rows(self, features, input_ids) -> dict[str, torch.Tensor]:
        return self.encoder.input_rows(features, input_ids)

    def forward(self, *inputs) -> torch.Tensor:
        return self.encoder(*inputs)

    def score(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.head(source, target)
