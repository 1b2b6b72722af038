"""Stacks of GNN layers: GraphSAGE, GCN and GAT of any depth.

``GNN.forward(blocks, x)`` runs the usual stack (ReLU and dropout between layers). With ``hot`` (NeutronOrch
mode), the bottom block holds only the destinations computed here, and the bottom layer's output is
spliced together from them and the hot rows computed elsewhere, before the activation that follows it:
the model, not a mode, decides how layers and activations compose. ``GNN.layer_forward`` runs a single
layer with the activation that follows it (full-neighbour inference).
"""

from __future__ import annotations

import torch
from torch import nn

from neutronorch.nn.activation import relu_dropout
from neutronorch.nn.blocks import GraphBlock, Head, InputBlock, norm_layer
from neutronorch.nn.layers import GATConv, GCNConv, Residual, SAGEConv
from neutronorch.nn.names import ARCHITECTURES, GCN_NORMS, MODELS, NORMS, needs_degrees
from neutronorch.nn.splice import HotRows, splice, splice_relu_dropout
from neutronorch.sampling.block import Block

__all__ = ["ARCHITECTURES", "GCN_NORMS", "GNN", "MODELS", "NORMS", "needs_degrees"]


class GNN(nn.Module):
    def __init__(self, kind: str, in_dim: int, hidden: int, num_classes: int, num_layers: int,
                 dropout: float = 0.5, heads: int = 4, gcn_norm: str = "symmetric", residual: bool = False,
                 norm: str = "none", architecture: str = "plain"):
        super().__init__()
        if kind not in MODELS:
            raise ValueError(f"unknown model {kind!r}; choose one of {MODELS}")
        self.kind = kind
        # What rebuilds this model (a checkpoint stores it next to the weights).
        self.arguments = {"kind": kind, "in_dim": in_dim, "hidden": hidden, "num_classes": num_classes,
                          "num_layers": num_layers, "dropout": dropout, "heads": heads, "gcn_norm": gcn_norm,
                          "residual": residual, "norm": norm, "architecture": architecture}
        if norm not in NORMS:
            raise ValueError(f"unknown normalisation {norm!r}; choose one of {NORMS}")
        if architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {architecture!r}; choose one of {ARCHITECTURES}")
        self.num_layers = num_layers
        self.dropout = dropout
        self.norm = norm
        self.head = None
        if architecture == "blocks":
            graph_blocks = [GraphBlock(kind, hidden, norm, dropout, heads, gcn_norm) for _ in range(num_layers)]
            self.layers = nn.ModuleList([InputBlock(in_dim, graph_blocks[0], dropout)] + graph_blocks[1:])
            self.head = Head(hidden, num_classes, norm)
            return
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        layers = []
        for i in range(num_layers):
            last = i == num_layers - 1
            if kind == "sage":
                layers.append(SAGEConv(dims[i], dims[i + 1]))
            elif kind == "gcn":
                layers.append(GCNConv(dims[i], dims[i + 1], norm=gcn_norm))
            else:
                layers.append(GATConv(dims[i], dims[i + 1], heads=1 if last else heads, attention_dropout=dropout))
        if residual:  # every layer but the output layer
            layers = [Residual(layer) for layer in layers[:-1]] + layers[-1:]
        self.layers = nn.ModuleList(layers)
        # Between layers, before the activation (after NeutronOrch's splice of the bottom layer's rows).
        self.norms = nn.ModuleList(norm_layer(norm, hidden) for _ in range(num_layers - 1))

    @property
    def needs_degrees(self) -> bool:
        """Whether its blocks must carry their sources' graph degrees (``Block.src_degree``)."""
        return any(layer.needs_degrees for layer in self.layers)

    def width(self, index: int) -> int:
        """The width of ``layer_forward(index, ...)``'s rows (the head's classes after the last block)."""
        if self.head is not None and index == self.num_layers - 1:
            return self.head.lin.out_features
        return self.layers[index].out_dim

    @property
    def bottom(self) -> nn.Module:
        """The layer that reads raw features."""
        return self.layers[0]

    def activate(self, index: int, y: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        """What follows layer ``index``'s pre-activation output (nothing after the last layer; with graph
        blocks, nothing between them and the head after the last). ``ids``: the rows' vertex ids, which key
        their dropout masks."""
        if self.head is not None:
            return self.head(y) if index == self.num_layers - 1 else y
        if index == self.num_layers - 1:
            return y
        if self.norm != "none":
            y = self.norms[index](y)
        return relu_dropout(y, self.dropout, self.training, ids)

    def layer_forward(self, index: int, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        return self.activate(index, self.layers[index](block, x_src), block.dst_ids)

    def forward(self, blocks: list[Block], x: torch.Tensor, hot: HotRows | None = None) -> torch.Tensor:
        """Logits of the last block's destinations. ``x`` holds the bottom block's source rows; with
        ``hot``, ``blocks[0]`` covers only the bottom-layer destinations ``hot.index`` calls cold."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks for a {self.num_layers}-layer model")
        if hot is None:
            return self.forward_from(0, blocks, x)
        index = hot.index
        if blocks[0].num_dst != index.cold_pos.shape[0] or (
                self.num_layers > 1 and blocks[1].num_src != index.num_rows):
            raise ValueError(f"splice mismatch: the bottom block has {blocks[0].num_dst} destinations and the "
                             f"splice {index.cold_pos.shape[0]} cold of {index.num_rows} rows")
        y_cold = self.layers[0](blocks[0], x)
        if self.num_layers == 1:
            return self.activate(0, splice(y_cold, hot.table, index, hot.grad_acc))
        ids = blocks[1].src_ids  # the spliced rows' vertices: the next block's source frontier
        if self.norm == "none" and self.head is None:
            h = splice_relu_dropout(y_cold, hot.table, index, self.dropout, self.training, hot.grad_acc, ids)
        else:
            h = self.activate(0, splice(y_cold, hot.table, index, hot.grad_acc), ids)
        return self.forward_from(1, blocks, h)

    def forward_from(self, start: int, blocks: list[Block], x: torch.Tensor) -> torch.Tensor:
        """Layers ``start`` and above; ``x`` is the source frontier of ``blocks[start]``."""
        for index in range(start, self.num_layers):
            x = self.layer_forward(index, blocks[index], x)
        return x

