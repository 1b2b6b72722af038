"""Relational graph attention over typed blocks: ``RGATConv``, the layer of the MLPerf GNN benchmark's R-GAT,
with its per-relation parameters (``RelationAttention``). The shared conventions (inputs, outputs, relations a
block lacks) are ``nn/relational.py``'s."""

from __future__ import annotations

from typing import Iterable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.attention import attention_aggregate
from neutronorch.nn.bucket import linear, project
from neutronorch.nn.edge_softmax import edge_softmax, head_scores
from neutronorch.nn.relational import glorot, input_dims, input_rows, module_key, relation_list, relation_sums
from neutronorch.sampling.block import Block
from neutronorch.sampling.block import RelationType, TypedBlock


class RelationAttention(nn.Module):
    """One relation's GAT parameters, named as PyG's ``GATConv`` names them (so ``load_state_dict`` copies
    one into the other): ``lin`` when source and destination types share a width (PyG's ``GATConv(in, ...)``,
    one projection for both ends), else ``lin_src`` and ``lin_dst`` (``GATConv((in_s, in_d), ...)``);
    ``att_src``, ``att_dst`` ``(1, heads, head_dim)``; with edge features, ``lin_edge`` and ``att_edge``;
    ``bias``."""

    def __init__(self, in_src: int, in_dst: int, heads: int, head_dim: int, edge_dim: int | None):
        super().__init__()
        width = heads * head_dim
        if in_src == in_dst:
            self.lin = nn.Linear(in_src, width, bias=False)
            self.lin_src = self.lin_dst = None
        else:
            self.lin = None
            self.lin_src = nn.Linear(in_src, width, bias=False)
            self.lin_dst = nn.Linear(in_dst, width, bias=False)
        self.att_src = nn.Parameter(torch.empty(1, heads, head_dim))
        self.att_dst = nn.Parameter(torch.empty(1, heads, head_dim))
        if edge_dim is not None:
            self.lin_edge = nn.Linear(edge_dim, width, bias=False)
            self.att_edge = nn.Parameter(torch.empty(1, heads, head_dim))
        else:
            self.lin_edge = self.att_edge = None
        self.bias = nn.Parameter(torch.zeros(width))
        for lin in (self.lin, self.lin_src, self.lin_dst, self.lin_edge):
            if lin is not None:
                glorot(lin.weight)
        for att in (self.att_src, self.att_dst, self.att_edge):
            if att is not None:
                glorot(att)


class RGATConv(nn.Module):
    """Relational graph attention as the MLPerf GNN benchmark (IGBH, R-GAT) defines its layer: per relation
    ``r = (s, name, t)`` a multi-head GAT over ``v``'s in-neighbours through ``r`` alone, without a self loop,
    the relations ending at ``t`` summed:
    ``y_v = sum_r (||_h sum_{u in N_r(v)} alpha^{r,h}_vu W^r_h x_u + b_r)``,
    ``alpha^{r,h}_vu = softmax_u LeakyReLU(a^r_src,h W^r_h x_u + a^r_dst,h W^r_h x_v [+ a^r_edge,h W^r_edge,h e_uv])``.
    Heads are concatenated (``out_dim = heads x head_dim``). A destination with no edge through ``r`` gets
    ``b_r`` from it. The counterpart is PyG's ``HeteroConv({rel: GATConv(in, out_dim // heads, heads,
    add_self_loops=False[, edge_dim=...])}, aggr="sum")`` (the benchmark's reference builds exactly this,
    ``aggr`` left at its default, "sum"); each relation's parameters are a ``RelationAttention``, named as
    in PyG's ``GATConv``.

    ``edge_dims[rel]``: the width of a relation's edge features, which then enter its attention scores
    (PyG's ``edge_dim``) and must be given as ``edge_attr[rel]`` (one row per edge of the relation's block,
    in its ``indices``' order). ``attention_dropout`` (PyG's ``dropout``) drops attention coefficients in
    training with torch's dropout (not keyed by edge: a relation's edges have no id that would key it).
    """

    def __init__(self, in_dims: Mapping[str, int] | int, out_dim: int, relations: Iterable[RelationType],
                 heads: int = 1, edge_dims: Mapping[RelationType, int] | None = None, negative_slope: float = 0.2,
                 attention_dropout: float = 0.0):
        super().__init__()
        if out_dim % heads:
            raise ValueError(f"R-GAT width {out_dim} is not divisible by {heads} heads")
        self.relations = relation_list(relations)
        self.in_dims = input_dims(in_dims, self.relations)
        edge_dims = dict(edge_dims or {})
        unknown = set(edge_dims) - set(self.relations)
        if unknown:
            raise ValueError(f"edge_dims names relations the layer does not have: {sorted(unknown)}")
        self.edge_dims = edge_dims
        self.out_dim, self.heads, self.head_dim = out_dim, heads, out_dim // heads
        self.negative_slope, self.attention_dropout = negative_slope, attention_dropout
        self.convs = nn.ModuleDict({
            module_key(r): RelationAttention(self.in_dims[r[0]], self.in_dims[r[2]], heads, self.head_dim,
                                               edge_dims.get(r))
            for r in self.relations})

    def forward(self, tblock: TypedBlock, x_src: Mapping[str, torch.Tensor],
                edge_attr: Mapping[RelationType, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        def term(r: RelationType, block: Block | None, n_dst: int) -> torch.Tensor:
            conv = self.convs[module_key(r)]
            if block is None:
                return conv.bias.unsqueeze(0).repeat(n_dst, 1)
            return self._relation(conv, r, block, x_src, n_dst, None if edge_attr is None else edge_attr.get(r))

        return relation_sums(self, tblock, lambda t, n_dst: None, term)

    def _relation(self, conv: RelationAttention, relation: RelationType, block: Block,
                  x_src: Mapping[str, torch.Tensor], n_dst: int, edge_attr: torch.Tensor | None) -> torch.Tensor:
        heads = self.heads
        s, _, t = relation
        lin_src = conv.lin if conv.lin is not None else conv.lin_src
        z = linear(lin_src, input_rows(x_src, s, self.in_dims)).view(-1, heads, self.head_dim)
        # Scores, softmax and the weighted sum in float32 for half-precision z (bfloat16 under autocast).
        acc = torch.float32 if z.dtype in (torch.bfloat16, torch.float16) else z.dtype
        z32 = z.to(acc)
        if s == t and conv.lin is not None:  # the destinations' projections are z's leading rows
            score_src, score_dst = head_scores(z32, conv.att_src, conv.att_dst, 0, n_dst)
        else:  # only a_dst . W x_v is needed: one width-``heads`` product, not the whole projection
            score_src = head_scores(z32, conv.att_src)[0]
            lin_dst = conv.lin if conv.lin is not None else conv.lin_dst
            x_dst = input_rows(x_src, t, self.in_dims)[:n_dst]
            score_dst = project(x_dst, _score_weight(lin_dst.weight, conv.att_dst)).to(acc)
        edge_logits = None
        if conv.lin_edge is not None:
            if edge_attr is None:
                raise ValueError(f"relation {relation} attends over edge features: pass edge_attr[{relation}]")
            attr = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
            if attr.shape[0] != block.num_edges:
                raise ValueError(f"edge_attr[{relation}] has {attr.shape[0]} rows for {block.num_edges} edges")
            edge_logits = project(attr, _score_weight(conv.lin_edge.weight, conv.att_edge)).to(acc)
        elif edge_attr is not None:
            raise ValueError(f"edge_attr given for {relation}, which the layer built without edge features "
                             f"(edge_dims)")
        # The block's edges' coefficients, then one row per destination for attention_aggregate's self loop,
        # weighted 0 (edge_softmax without self loops). The self loop reads row dst_offset + i of z, which
        # a source frontier smaller than the destinations lacks (zero rows appended then, the block widened
        # to them: its kernels size their work by num_src).
        alpha = edge_softmax(block, score_src, score_dst, edge_logits, self.negative_slope)
        alpha = F.dropout(alpha, self.attention_dropout, self.training)
        flat = z32.view(-1, heads * self.head_dim)
        short = block.dst_offset + n_dst - flat.shape[0]
        if short > 0:
            flat = F.pad(flat, (0, 0, 0, short))
            block = Block(block.num_dst, flat.shape[0], block.indptr, block.indices, block.dst_offset)
        aggregated = attention_aggregate(block, flat, alpha, heads)
        return (aggregated + conv.bias).to(z.dtype)


def _score_weight(weight: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """``(heads, in)``: row ``h`` = ``sum_c att[h, c] W[h, c, :]``, so ``x @ result.T`` = ``((x W^T) * att).sum(-1)``
    per head without the ``heads x head_dim``-wide projection."""
    heads, head_dim = att.shape[-2:]
    return (weight.view(heads, head_dim, -1) * att.reshape(heads, head_dim, 1)).sum(1)
