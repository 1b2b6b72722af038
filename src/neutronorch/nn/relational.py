"""Relational GNN layers over typed blocks: ``TypedSAGEConv``, ``RGCNConv`` and ``RGATConv`` (the MLPerf GNN
benchmark's R-GAT layer, its per-relation parameters a ``RelationAttention``); what each computes and its PyG
counterpart: docs/heterogeneous.md, "Relational layers".

Every layer maps ``(tblock, x_src) -> y_dst`` (pre-activation, one tensor per type). The relations a layer
is built with are its parameters' keys: one the block lacks counts as one with no edges (its bias and root
terms still apply), one the layer does not know is an error. Edge weights (``edge_weight[rel]``) scale each
message inside the mean (``mean_aggregate``'s ``edge_weight``).
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Iterable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.aggregation import mean_aggregate
from neutronorch.nn.attention import attention_aggregate
from neutronorch.nn.bucket import linear, project
from neutronorch.nn.edge_softmax import edge_softmax, head_scores
from neutronorch.nn.layers import aggregate_linear
from neutronorch.nn.precision import sum_dtype
from neutronorch.sampling.block import Block, RelationType, TypedBlock

SAGE_ROOTS = ("relation", "type", None)


def module_key(relation: RelationType) -> str:
    """A relation's key among a layer's modules (``author__writes__paper``, as PyG's ``HeteroConv`` names it)."""
    return "__".join(relation)


class TypedSAGEConv(nn.Module):
    """Relational GraphSAGE-mean: for ``v`` of type ``t``, ``y_v = sum_{r = (s, name, t)} (W_r mean_{N_r(v)} x_u)
    + root_t(x_v)``. ``root``: ``"relation"``, a root weight and bias per relation (PyG's ``lin_l`` =
    ``neigh[rel]`` with ``root[rel]``'s bias, ``lin_r`` = ``root[rel]``); ``"type"``, one per destination
    type; ``None``, none and a bias per relation (R-SAGE)."""

    def __init__(self, in_dims: Mapping[str, int] | int, out_dim: int, relations: Iterable[RelationType],
                 root: str | None = "relation"):
        super().__init__()
        if root not in SAGE_ROOTS:
            raise ValueError(f"unknown root {root!r}; choose one of {SAGE_ROOTS}")
        self.relations = relation_list(relations)
        self.in_dims = input_dims(in_dims, self.relations)
        self.out_dim, self.root_mode = out_dim, root
        self.neigh = nn.ModuleDict({module_key(r): nn.Linear(self.in_dims[r[0]], out_dim, bias=root is None)
                                    for r in self.relations})
        # The root terms' keys and the types they read: per relation, per destination type, or none.
        keys = {module_key(r) if root == "relation" else r[2]: r[2] for r in self.relations}
        self.root = None if root is None else nn.ModuleDict({k: nn.Linear(self.in_dims[t], out_dim)
                                                             for k, t in keys.items()})

    def forward(self, tblock: TypedBlock, x_src: Mapping[str, torch.Tensor],
                edge_weight: Mapping[RelationType, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        def term(r: RelationType, block: Block | None, n_dst: int) -> torch.Tensor | None:
            lin = self.neigh[module_key(r)]
            if block is None:  # no edges: only a bias of the relation's own (root=None) applies
                return None if lin.bias is None else lin.bias.unsqueeze(0).repeat(n_dst, 1)
            weights = None if edge_weight is None else edge_weight.get(r)
            return mean_linear(block, input_rows(x_src, r[0], self.in_dims), lin.weight, lin.bias, weights)

        return relation_sums(self, tblock, lambda t, n_dst: self._root(t, x_src, n_dst), term)

    def _root(self, t: str, x_src: Mapping[str, torch.Tensor], n_dst: int) -> torch.Tensor | None:
        into = [r for r in self.relations if r[2] == t]
        if self.root is None or not into:
            return None
        x_dst = input_rows(x_src, t, self.in_dims)[:n_dst]
        if self.root_mode == "type":
            return linear(self.root[t], x_dst)
        lins = [self.root[module_key(r)] for r in into]
        if len(lins) == 1:
            return linear(lins[0], x_dst)
        # sum_r (R_r x + b_r) = (sum_r R_r) x + sum_r b_r: one product for the type. Additions, not
        # stack(...).sum(0), whose backward may leave the weights' .grad views of one shared buffer, which a
        # second backward pass (NeutronOrch's hot rows) would then add into for all of them.
        weight = functools.reduce(torch.add, [lin.weight for lin in lins])
        bias = functools.reduce(torch.add, [lin.bias for lin in lins])
        return project(x_dst, weight, bias)


class RGCNConv(nn.Module):
    """R-GCN (Schlichtkrull et al., ESWC 2018) with mean normalisation: ``y_v = x_v W_root + sum_r mean_{N_r(v)}
    x_u W_r + b``, ``W_root`` and ``b`` shared by every type, optionally ``W_r = sum_b comp[r, b] basis[b]``
    (``num_bases``); parameters laid out ``in x out`` as PyG's ``RGCNConv(aggr="mean")`` has them (its
    ``weight`` is ``basis`` here). Every type's input is ``in_dim`` wide.

    ``projections[t]`` (``forward``): a linear map ``h = P_t x + c_t`` to ``in_dim`` that type ``t``'s raw rows
    still need. The mean is linear, so a relation from ``t`` contributes ``mean(x_u) (P_t^T W_r) + [N_r(v)
    nonempty] c_t W_r`` (with edge weights the bracket is the weighted mean of ones), and only the
    destinations' own rows are projected for the root term."""

    def __init__(self, in_dim: int, out_dim: int, relations: Iterable[RelationType], num_bases: int | None = None):
        super().__init__()
        self.relations = relation_list(relations)
        self.index = {r: i for i, r in enumerate(self.relations)}
        self.in_dim, self.out_dim, self.num_bases = in_dim, out_dim, num_bases
        count = len(self.relations)
        if num_bases is None:
            self.weight = nn.Parameter(torch.empty(count, in_dim, out_dim))
            self.basis = self.comp = None
        else:
            if num_bases < 1:
                raise ValueError(f"num_bases must be at least 1, got {num_bases}")
            self.weight = None
            self.basis = nn.Parameter(torch.empty(num_bases, in_dim, out_dim))
            self.comp = nn.Parameter(torch.empty(count, num_bases))
        self.root = nn.Parameter(torch.empty(in_dim, out_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim))
        for p in (self.weight, self.basis, self.comp, self.root):
            if p is not None:
                glorot(p)

    def relation_weights(self) -> torch.Tensor:
        """``W_r`` of every relation, ``(relations, in_dim, out_dim)``."""
        if self.basis is None:
            return self.weight
        return (self.comp @ self.basis.view(self.num_bases, -1)).view(len(self.relations), self.in_dim,
                                                                      self.out_dim)

    def forward(self, tblock: TypedBlock, x_src: Mapping[str, torch.Tensor],
                edge_weight: Mapping[RelationType, torch.Tensor] | None = None,
                projections: Mapping[str, nn.Linear] | None = None) -> dict[str, torch.Tensor]:
        projections = projections or {}
        for t, x in x_src.items():
            width = projections[t].in_features if t in projections else self.in_dim
            if x.shape[-1] != width:
                raise ValueError(f"R-GCN reads one input width, {self.in_dim}, for every type; {t!r} has "
                                 f"{x.shape[-1]}" + (f", its projection reads {width}" if t in projections else
                                                     f". Project or embed each type to {self.in_dim} first."))
        weights, root_t = self.relation_weights(), self.root.t()

        def root(t: str, n_dst: int) -> torch.Tensor:
            x_dst = input_rows(x_src, t, None)[:n_dst]
            return project(linear(projections[t], x_dst) if t in projections else x_dst, root_t, self.bias)

        def term(r: RelationType, block: Block | None, n_dst: int) -> torch.Tensor | None:
            if block is None:
                return None
            w = None if edge_weight is None else edge_weight.get(r)
            weight, lin = weights[self.index[r]], projections.get(r[0])
            on_rows = weight if lin is None else lin.weight.t() @ weight  # P^T W_r: on the raw rows
            y = mean_linear(block, input_rows(x_src, r[0], None), on_rows.t(), None, w)
            if lin is not None and lin.bias is not None:
                y = y + reached(block, w, y.dtype).unsqueeze(1) * (lin.bias @ weight).to(y.dtype)
            return y

        return relation_sums(self, tblock, root, term)


class RelationAttention(nn.Module):
    """One relation's GAT parameters, named as PyG's ``GATConv`` names them (``load_state_dict`` copies one
    into the other): ``lin`` when both end types share a width, else ``lin_src`` and ``lin_dst``; ``att_src``,
    ``att_dst`` ``(1, heads, head_dim)``; with edge features ``lin_edge`` and ``att_edge``; ``bias``."""

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
        for p in (self.lin, self.lin_src, self.lin_dst, self.lin_edge, self.att_src, self.att_dst,
                  self.att_edge):
            if p is not None:
                glorot(p.weight if isinstance(p, nn.Linear) else p)


class RGATConv(nn.Module):
    """Relational graph attention, the MLPerf GNN benchmark's R-GAT layer: per relation ``r = (s, name, t)`` a
    multi-head GAT (heads concatenated) over ``v``'s in-neighbours through ``r`` alone, without a self loop,
    the relations ending at ``t`` summed:
    ``y_v = sum_r (||_h sum_{u in N_r(v)} alpha^{r,h}_vu W^r_h x_u + b_r)``,
    ``alpha^{r,h}_vu = softmax_u LeakyReLU(a^r_src,h W^r_h x_u + a^r_dst,h W^r_h x_v [+ a^r_edge,h W^r_edge,h e_uv])``.
    Slope 0.2. ``edge_dims[rel]``: the width of ``edge_attr[rel]``, a row per edge of its block."""

    def __init__(self, in_dims: Mapping[str, int] | int, out_dim: int, relations: Iterable[RelationType],
                 heads: int = 1, edge_dims: Mapping[RelationType, int] | None = None):
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
        acc = sum_dtype(z)
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
        # attention_aggregate's self loops are weighted 0 here, but read row dst_offset + i of z, which a
        # source frontier smaller than the destinations lacks: zero rows appended then, the block widened.
        alpha = edge_softmax(block, score_src, score_dst, edge_logits)
        flat = z32.view(-1, heads * self.head_dim)
        short = block.dst_offset + n_dst - flat.shape[0]
        if short > 0:
            flat = F.pad(flat, (0, 0, 0, short))
            block = Block(block.num_dst, flat.shape[0], block.indptr, block.indices, block.dst_offset)
        aggregated = attention_aggregate(block, flat, alpha, heads)
        return (aggregated + conv.bias).to(z.dtype)


def relation_sums(layer: nn.Module, tblock: TypedBlock, root: Callable, term: Callable) -> dict[str, torch.Tensor]:
    """Per destination type ``t``: ``root(t, rows)`` plus ``term(r, block, rows)`` for each of the layer's
    relations ``r`` into ``t`` in order (``block`` None where ``tblock`` lacks ``r``); None adds nothing, and
    a type with nothing at all gets no output."""
    unknown = [r for r in tblock.blocks if r not in layer.relations]
    if unknown:
        raise ValueError(f"the block holds relation(s) {unknown} the layer has no weights for")
    out = {}
    for t, n_dst in tblock.num_dst.items():
        y = root(t, n_dst)
        for r in layer.relations:
            if r[2] == t:
                value = term(r, tblock.blocks.get(r), n_dst)
                y = value if y is None else y if value is None else y + value
        if y is not None:
            out[t] = y
    return out


def mean_linear(block: Block, x_src: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """``aggregate_linear`` of the mean, weighted by ``edge_weight``."""
    return aggregate_linear(block, x_src, weight, bias,
                            lambda b, x: mean_aggregate(b, x, edge_weight=edge_weight))


def reached(block: Block, edge_weight: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Per destination, the mean of ones over its edges: 1 with edges, 0 without; with ``edge_weight``, the
    weighted mean ``sum_e w_e / deg``."""
    if edge_weight is None:
        return (block.in_degrees() > 0).to(dtype)
    ones = torch.ones((block.num_src, 1), dtype=edge_weight.dtype, device=edge_weight.device)
    return mean_aggregate(block, ones, edge_weight=edge_weight).view(-1).to(dtype)


def relation_list(relations: Iterable[RelationType]) -> tuple[RelationType, ...]:
    relations = tuple(tuple(r) for r in relations)
    if not relations:
        raise ValueError("a relational layer needs at least one relation")
    if len(set(relations)) != len(relations):
        raise ValueError("a relation is listed twice")
    bad = [r for r in relations if len(r) != 3]
    if bad:
        raise ValueError(f"relations are (src_type, name, dst_type) triples; got {bad}")
    return relations


def input_dims(in_dims: Mapping[str, int] | int, relations: tuple[RelationType, ...]) -> dict[str, int]:
    types = {t for r in relations for t in (r[0], r[2])}
    if isinstance(in_dims, int):
        return {t: in_dims for t in sorted(types)}
    missing = sorted(types - set(in_dims))
    if missing:
        raise ValueError(f"no input width for vertex type(s) {missing}")
    return dict(in_dims)


def input_rows(x_src: Mapping[str, torch.Tensor], node_type: str, in_dims: Mapping[str, int] | None) -> torch.Tensor:
    x = x_src.get(node_type)
    if x is None:
        raise ValueError(f"no input rows for vertex type {node_type!r}")
    if in_dims is not None and x.shape[-1] != in_dims[node_type]:
        raise ValueError(f"vertex type {node_type!r}: rows {x.shape[-1]} wide, the layer reads "
                         f"{in_dims[node_type]}")
    return x


def glorot(tensor: torch.Tensor) -> None:
    """PyG's ``glorot``: uniform in +-sqrt(6 / (rows + columns)) of the last two dimensions."""
    bound = math.sqrt(6.0 / (tensor.size(-2) + tensor.size(-1)))
    with torch.no_grad():
        tensor.uniform_(-bound, bound)


def _score_weight(weight: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """``(heads, in)``: row ``h`` = ``sum_c att[h, c] W[h, c, :]``, so ``x @ result.T`` = ``((x W^T) * att).sum(-1)``
    per head without the ``heads x head_dim``-wide projection."""
    heads, head_dim = att.shape[-2:]
    return (weight.view(heads, head_dim, -1) * att.reshape(heads, head_dim, 1)).sum(1)
