"""The one model stack: ``LayerStack``, what every built-in model is, and ``GNN`` (GraphSAGE, GCN and GAT of
any depth) on it; the relational models (``nn/typed_models.py``) are the same stack over typed blocks.

A stack maps the bottom block's source rows, layer by layer, to the logits of the last block's destinations:
after every layer but the last an activation (ReLU, or LeakyReLU of ``slope``) and in training the dropout
after it, each row's mask keyed by its vertex (``nn/activation.py``). Rows are one tensor on a homogeneous
graph and one per vertex type on a typed one. With ``hot`` (NeutronOrch mode) the bottom layer's output is
spliced together from the destinations computed here and the hot rows computed elsewhere (``nn/splice.py``),
before the activation that follows it: the model, not a mode, decides how layers and activations compose.
"""

from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.activation import draw_key, dropout_keys, keyed_dropout, relu_dropout
from neutronorch.nn.blocks import GraphBlock, Head, InputBlock, norm_layer
from neutronorch.nn.layers import GATConv, GCNConv, Residual, SAGEConv
from neutronorch.nn.names import ARCHITECTURES, MODELS, NORMS, needs_degrees
from neutronorch.nn.splice import HotRows, splice, splice_relu_dropout
from neutronorch.sampling.block import Block
from neutronorch.sampling.neighbor_sampler import mix_key


class Tables:
    """A model's weights by optimizer: ``embedding_parameters``, those of every sparse ``nn.Embedding`` or
    ``nn.EmbeddingBag`` (each once, in module order: the tables' optimizer); ``dense_parameters`` (Adam)."""

    def embedding_parameters(self) -> list[nn.Parameter]:
        found = {}
        for sub in self.modules():
            if isinstance(sub, (nn.Embedding, nn.EmbeddingBag)) and sub.sparse:
                found.setdefault(id(sub.weight), sub.weight)
        return list(found.values())

    def dense_parameters(self) -> list[nn.Parameter]:
        sparse = {id(p) for p in self.embedding_parameters()}
        return [p for p in self.parameters() if id(p) not in sparse]


def each(rows, step: Callable):
    """``step(type, rows)`` on each type's rows of a typed model, ``step(None, rows)`` on a homogeneous one's."""
    return step(None, rows) if isinstance(rows, torch.Tensor) else {t: step(t, r) for t, r in rows.items()}


def _typed(value, node_type: str | None):
    """A homogeneous block's ``value``, or a typed block's of ``node_type`` (a mapping's entry or a method's)."""
    if node_type is None or value is None:
        return value
    return value(node_type) if callable(value) else value.get(node_type)


class LayerStack(Tables, nn.Module):
    """``num_layers`` layers (``layers``) with the activation of the module docstring between them, a ``norm``
    (``norms``) before it where one is set, or graph blocks and a ``head`` after the last (``GNN``). A
    subclass overrides ``layer_output`` where a layer reads more than ``(block, rows)``."""

    slope: float | None = None  # None: ReLU between layers; a number: LeakyReLU of that negative slope
    keyed = False  # True: a forward's dropout masks come from one key, the layer and the type (``masks``)

    def __init__(self, arguments: dict):
        super().__init__()
        self.arguments = arguments  # what rebuilds the model (a checkpoint stores it next to the weights)
        self.kind, self.num_layers, self.dropout = arguments["kind"], arguments["num_layers"], arguments["dropout"]
        self.norm, self.head = arguments.get("norm", "none"), None

    @property
    def bottom(self) -> nn.Module:
        """The layer that reads the input rows (output before the activation): NeutronOrch's host layer."""
        return self.layers[0]

    def width(self, index: int) -> int:
        """The width of ``layer_forward(index, ...)``'s rows (the head's after the last graph block)."""
        if self.head is not None and index == self.num_layers - 1:
            return self.head.lin.out_features
        return self.layers[index].out_dim

    def layer_output(self, index: int, block, x):
        """Layer ``index``'s output before the activation, from its block's source rows ``x``."""
        return self.layers[index](block, x)

    def activate(self, y: torch.Tensor, ids: torch.Tensor | None = None, layer: int = 0) -> torch.Tensor:
        """What follows layer ``layer``'s rows ``y`` (the module docstring's; with graph blocks, the head
        after the last), dropout masks keyed by the rows' vertex ``ids``."""
        last = layer == self.num_layers - 1
        if self.head is not None:
            return self.head(y) if last else y
        if last:
            return y
        if self.norm != "none":
            y = self.norms[layer](y)
        if self.slope is None:
            return relu_dropout(y, self.dropout, self.training, ids)
        return keyed_dropout(F.leaky_relu(y, self.slope), self.dropout, self.training, ids)

    def masks(self, key: int | None, index: int, node_type: str | None):
        """A ``keyed`` stack's masks from ``key`` (the forward's one draw), the layer and the type alone, so a
        vertex's mask does not depend on which other types a batch (a data-parallel rank's part of one)
        reaches."""
        if key is None:
            return contextlib.nullcontext()
        types = list(self.spec.num_nodes)
        return dropout_keys(mix_key(key, index * len(types) + types.index(node_type)))

    def layer_forward(self, index: int, block, x):
        """Layer ``index`` and the activation after it (full-neighbour inference)."""
        return each(self.layer_output(index, block, x), lambda t, y: self.activate(y, _typed(block.dst_ids, t), index))

    def forward(self, blocks: list[Block], x, hot: HotRows | None = None):
        """The last layer's output for ``blocks[-1]``'s destinations from ``blocks[0]``'s source rows ``x``.
        ``hot``: ``HotRows`` (per type on a typed model) spliced into the bottom layer's output in the order of
        ``blocks[1]``'s source frontier, whose vertices key the activation's dropout masks; ``blocks[0]`` then
        covers only the bottom-layer destinations ``hot.index`` calls cold."""
        if len(blocks) != self.num_layers:
            raise ValueError(f"{len(blocks)} blocks for a {self.num_layers}-layer model")
        key = int(draw_key()) if self.keyed and self.training and self.dropout > 0 else None
        for index, block in enumerate(blocks):
            y = self.layer_output(index, block, x)
            if index == 0 and hot:
                above = blocks[1] if self.num_layers > 1 else None
                x = each(y, lambda t, rows: self._spliced(key, t, rows, _typed(hot, t), above))
            else:
                x = each(y, lambda t, rows: self._activated(key, index, t, rows, _typed(block.dst_ids, t)))
        return x

    def _activated(self, key, index, node_type, y, ids):
        with self.masks(key, index, node_type):
            return self.activate(y, ids, index)

    def _spliced(self, key, node_type, y_cold, hot: HotRows | None, above):
        ids = None if above is None else _typed(above.src_ids, node_type)
        if hot is None:
            return self._activated(key, 0, node_type, y_cold, ids)
        rows = hot.index.num_rows if above is None else _typed(above.num_src, node_type)
        if y_cold.shape[0] != hot.index.cold_pos.shape[0] or rows != hot.index.num_rows:
            raise ValueError(f"splice mismatch: the bottom block has {y_cold.shape[0]} destinations and the splice "
                             f"{hot.index.cold_pos.shape[0]} cold of {hot.index.num_rows} rows")
        with self.masks(key, 0, node_type):
            if self.slope is None and self.norm == "none" and self.head is None and self.num_layers > 1:
                return splice_relu_dropout(y_cold, hot.table, hot.index, self.dropout, self.training, hot.grad_acc,
                                           ids)
            return self.activate(splice(y_cold, hot.table, hot.index, hot.grad_acc), ids, 0)


class GNN(LayerStack):
    """GraphSAGE, GCN or GAT (``kind``) of ``num_layers`` layers, optionally ``residual`` (every layer but the
    output layer), with a ``norm`` between layers before the activation, or residual graph blocks between an
    input map and a head (``architecture`` "blocks", ``nn/blocks.py``)."""

    def __init__(self, kind: str, in_dim: int, hidden: int, num_classes: int, num_layers: int,
                 dropout: float = 0.5, heads: int = 4, gcn_norm: str = "symmetric", residual: bool = False,
                 norm: str = "none", architecture: str = "plain"):
        for what, value, choices in (("model", kind, MODELS), ("normalisation", norm, NORMS),
                                     ("architecture", architecture, ARCHITECTURES)):
            if value not in choices:
                raise ValueError(f"unknown {what} {value!r}; choose one of {choices}")
        super().__init__({"kind": kind, "in_dim": in_dim, "hidden": hidden, "num_classes": num_classes,
                          "num_layers": num_layers, "dropout": dropout, "heads": heads, "gcn_norm": gcn_norm,
                          "residual": residual, "norm": norm, "architecture": architecture})
        if architecture == "blocks":
            graph_blocks = [GraphBlock(kind, hidden, norm, dropout, heads, gcn_norm) for _ in range(num_layers)]
            self.layers = nn.ModuleList([InputBlock(in_dim, graph_blocks[0], dropout)] + graph_blocks[1:])
            self.head = Head(hidden, num_classes, norm)
            return
        dims = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        make = {"sage": lambda i, o, last: SAGEConv(i, o),
                "gcn": lambda i, o, last: GCNConv(i, o, norm=gcn_norm),
                "gat": lambda i, o, last: GATConv(i, o, heads=1 if last else heads, attention_dropout=dropout)
                }[kind]
        layers = [make(dims[i], dims[i + 1], i == num_layers - 1) for i in range(num_layers)]
        if residual:  # every layer but the output layer
            layers = [Residual(layer) for layer in layers[:-1]] + layers[-1:]
        self.layers = nn.ModuleList(layers)
        # Between layers, before the activation (after NeutronOrch's splice of the bottom layer's rows).
        self.norms = nn.ModuleList(norm_layer(norm, hidden) for _ in range(num_layers - 1))

    @property
    def needs_degrees(self) -> bool:
        return needs_degrees(self.kind, self.arguments["gcn_norm"])
