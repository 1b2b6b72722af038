"""Residual graph blocks (``--architecture blocks``), the structure of Platonov et al.'s (ICLR 2023) GNNs:

    h = GELU(dropout(W_in x))                                  (the input map, on every input row)
    h = h + FFN(aggregate(norm(h)))        for each layer        (one block per fanout)
    logits = W_out norm(h)                                     (the head, on the seed rows)

``aggregate`` and ``FFN``: docs/models.md, "Graph blocks". The bottom block includes the input map; no block
is separable.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.activation import keyed_dropout
from neutronorch.nn.aggregation import gcn_aggregate, mean_aggregate
from neutronorch.nn.bucket import linear
from neutronorch.nn.layers import GATConv
from neutronorch.sampling.block import Block


def norm_layer(kind: str, width: int) -> nn.Module:
    return {"layer": nn.LayerNorm, "batch": nn.BatchNorm1d}.get(kind, nn.Identity)(width)


class FeedForward(nn.Module):
    def __init__(self, in_dim: int, dim: int, dropout: float):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(in_dim, dim), nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """``ids``: the rows' vertex ids, which key their dropout masks."""
        x = F.gelu(keyed_dropout(linear(self.lin1, x), self.dropout, self.training, ids))
        return keyed_dropout(linear(self.lin2, x), self.dropout, self.training, ids)


class GraphBlock(nn.Module):
    """``h_v + FFN(aggregate(norm(h))_v)`` for a block's destinations."""

    separable = False

    def __init__(self, kind: str, dim: int, norm: str, dropout: float, heads: int, gcn_norm: str):
        super().__init__()
        self.kind, self.in_dim, self.out_dim = kind, dim, dim
        self.gcn_norm = gcn_norm
        self.norm = norm_layer(norm, dim)
        self.attention = GATConv(dim, dim, heads=heads, attention_dropout=dropout) if kind == "gat" else None
        self.ffn = FeedForward(2 * dim if kind == "sage" else dim, dim, dropout)

    def forward(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        h = self.norm(x_src)
        if self.kind == "sage":
            message = torch.cat([block.dst_rows(h), mean_aggregate(block, h)], dim=1)
        elif self.kind == "gcn":
            message = gcn_aggregate(block, h, self.gcn_norm)
        else:
            message = self.attention(block, h)
        return block.dst_rows(x_src) + self.ffn(message, block.dst_ids)


class InputBlock(nn.Module):
    """The bottom block: the input map on every source row, then the first graph block."""

    separable = False

    def __init__(self, in_dim: int, first: GraphBlock, dropout: float):
        super().__init__()
        self.input = nn.Linear(in_dim, first.in_dim)
        self.first = first
        self.in_dim, self.out_dim = in_dim, first.out_dim
        self.dropout = dropout

    def forward(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        h = F.gelu(keyed_dropout(linear(self.input, x_src), self.dropout, self.training, block.src_ids))
        return self.first(block, h)


class Head(nn.Module):
    """``W_out norm(h)``: the logits of the last block's rows."""

    def __init__(self, dim: int, num_classes: int, norm: str):
        super().__init__()
        self.norm = norm_layer(norm, dim)
        self.lin = nn.Linear(dim, num_classes)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return linear(self.lin, self.norm(h))
