"""Link prediction models: a node encoder (any built-in GNN, whose last layer outputs embeddings) and a
scoring head (``LINK_HEADS``) mapping two (..., D) embeddings to (...) logits, symmetric in its two ends:
``dot``, the inner product ``<h_u, h_v>``; ``mlp``, a two-layer perceptron over ``h_u * h_v`` (OGB's
``LinkPredictor``). The encoder starts as DGL's ``SAGEConv`` does (``glorot_``; why: docs/link-prediction.md).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.models import GNN, Tables
from neutronorch.nn.names import LINK_HEADS
from neutronorch.nn.typed_models import TypedGNN


def glorot_(module: GNN, input_norm: float = 1.0) -> GNN:
    """Every ``nn.Linear`` of ``module`` started again: its weight from Glorot's uniform with the ReLU gain,
    its bias at zero. ``input_norm``: the root mean square of the input rows' L2 norms; above 1, the weights
    that read the input (``module.layers[0]``'s) are divided by it, so raw rows start as rows of unit norm
    would (docs/link-prediction.md)."""
    gain = nn.init.calculate_gain("relu")
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight, gain=gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    if input_norm > 1.0 + 1e-3:  # unit rows (normalised, up to rounding): unchanged
        width = module.arguments["in_dim"]
        with torch.no_grad():
            for layer in module.layers[0].modules():
                if isinstance(layer, nn.Linear) and layer.in_features == width:
                    layer.weight.div_(input_norm)
    return module


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

    def __init__(self, encoder: GNN | TypedGNN, head: str = "dot", dropout: float = 0.0, input_norm: float = 1.0):
        super().__init__()
        # A typed encoder keeps its own start: its relations' sums made Glorot's rows about 6 times larger,
        # logits of 100 that a dot head learnt nothing from.
        self.encoder = encoder if isinstance(encoder, TypedGNN) else glorot_(encoder, input_norm)
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
