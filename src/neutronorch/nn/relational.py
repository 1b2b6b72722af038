"""Relational GNN layers over typed blocks: each computes only its destinations' outputs.

Every layer maps ``(tblock, x_src) -> y_dst`` (pre-activation): ``tblock`` a ``TypedBlock`` (one homogeneous
``Block`` per relation ``(src_type, name, dst_type)`` over per-type source frontiers, each type's
destinations leading its frontier), ``x_src`` one tensor of source rows per vertex type, ``y_dst`` one tensor
per destination type, ``tblock.num_dst[t]`` rows. A relation reads ``x_src[src_type]`` through its own block;
a destination's own row is ``x_src[dst_type][i]``, never a row of the source type's tensor.

- ``TypedSAGEConv``: a GraphSAGE-mean per relation, summed per destination type (PyG's
  ``HeteroConv({rel: SAGEConv((in_s, in_d), out)}, aggr="sum")``).
- ``RGCNConv``: R-GCN, ``W_root x_v + sum_r mean_{N_r(v)} W_r x_u + b``, optionally with a basis
  decomposition (PyG's ``RGCNConv(aggr="mean")`` on the graph with every type stacked).
- ``RGATConv``: a GAT per relation without self loops, summed per destination type, optionally attending
  over edge features: the layer of the MLPerf GNN benchmark's R-GAT (PyG's ``HeteroConv({rel: GATConv(in,
  out // heads, heads, add_self_loops=False)})``).

The relations a layer is built with are its parameters' keys. A relation the layer knows but the block lacks
counts as one with no edges (its bias and root terms still apply), so a vertex's output never depends on
whether a sampler kept an empty block; a block of a relation the layer does not know is an error. A
destination type gets an output when some relation of the layer ends at it (R-GCN: every destination type,
its root term applying to all).

Edge weights (``TypedSAGEConv``, ``RGCNConv``: ``edge_weight[rel]``, one number per edge of the relation's
block, in its ``indices``' order) multiply each message inside the mean, which still divides by the number of
edges: ``sum_{e into v} w_e x_{u_e} / |N_r(v)|``. With every weight 1 it is the plain mean; it is what PyG's
``GraphConv(aggr="mean")`` and DGL's ``SAGEConv(edge_weight=...)`` compute, and it keeps a sampled block's mean
an unbiased estimate of the full neighbourhood's (a normalised ``sum w x / sum w`` would not be linear in the
weights). The weighted mean runs in torch ops (the numba kernels have no weights); unweighted relations run
``mean_aggregate``'s kernels.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

import torch
from torch import nn
from torch.nn import functional as F

from neutronorch.nn.aggregation import edge_destinations, mean_aggregate
from neutronorch.nn.attention import attention_aggregate
from neutronorch.nn.bucket import linear, project
from neutronorch.nn.rows import take_rows
from neutronorch.sampling.block import Block
from neutronorch.sampling.typed_block import RelationType, TypedBlock

SAGE_ROOTS = ("relation", "type", None)


def module_key(relation: RelationType) -> str:
    """A relation's key among a layer's modules (``author__writes__paper``, as PyG's ``HeteroConv`` names it)."""
    return "__".join(relation)


class TypedSAGEConv(nn.Module):
    """Relational GraphSAGE-mean: for a vertex ``v`` of type ``t``,
    ``y_v = sum_{r = (s, name, t)} (W_r mean_{u in N_r(v)} x_u) + root_t(x_v)``, one neighbour weight ``W_r``
    (``in_dims[s]`` wide) per relation, the relations ending at ``t`` summed.

    The self (root) term, by ``root``:

    - ``"relation"`` (the default): a root weight and bias per relation, ``root_t(x) = sum_r (R_r x + b_r)``,
      exactly the parameters of PyG's ``HeteroConv({rel: SAGEConv((in_s, in_t), out)}, aggr="sum")``
      (``lin_l`` = ``neigh[rel]`` with ``root[rel]``'s bias, ``lin_r`` = ``root[rel]``), so weights copy one to
      one either way. The relations' root weights are summed before the product: one product per type.
    - ``"type"``: one root weight and bias per destination type, ``root_t(x) = R_t x + b_t``. It computes the
      same functions (``R_t = sum_r R_r``) with fewer parameters; PyG's layer with every ``lin_r`` of a type
      set to ``R_t / k`` (``k`` relations end at ``t``) is its counterpart.
    - ``None``: no root term, a bias per relation (PyG's ``SAGEConv(root_weight=False)``, the MLPerf
      benchmark's R-SAGE).

    With ``edge_weight`` a relation's mean is the weighted mean of the module docstring."""

    def __init__(self, in_dims: Mapping[str, int] | int, out_dim: int, relations: Iterable[RelationType],
                 root: str | None = "relation"):
        super().__init__()
        if root not in SAGE_ROOTS:
            raise ValueError(f"unknown root {root!r}; choose one of {SAGE_ROOTS}")
        self.relations = _relations(relations)
        self.in_dims = _in_dims(in_dims, self.relations)
        self.out_dim, self.root_mode = out_dim, root
        self.neigh = nn.ModuleDict({module_key(r): nn.Linear(self.in_dims[r[0]], out_dim, bias=root is None)
                                    for r in self.relations})
        if root == "relation":
            self.root = nn.ModuleDict({module_key(r): nn.Linear(self.in_dims[r[2]], out_dim)
                                       for r in self.relations})
        elif root == "type":
            self.root = nn.ModuleDict({t: nn.Linear(self.in_dims[t], out_dim) for t in _dst_types(self.relations)})
        else:
            self.root = None

    def forward(self, tblock: TypedBlock, x_src: Mapping[str, torch.Tensor],
                edge_weight: Mapping[RelationType, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        _check_block(self, tblock)
        out = {}
        for t, n_dst in tblock.num_dst.items():
            into = [r for r in self.relations if r[2] == t]
            if not into:
                continue
            y = self._root(t, into, x_src, n_dst)
            for r in into:
                block = tblock.blocks.get(r)
                lin = self.neigh[module_key(r)]
                if block is None:  # no edges: only a bias of the relation's own (root=None) applies
                    if lin.bias is None:
                        continue
                    term = lin.bias.unsqueeze(0).repeat(n_dst, 1)
                else:
                    weights = None if edge_weight is None else edge_weight.get(r)
                    term = mean_linear(block, _input(x_src, r[0], self.in_dims), lin.weight, lin.bias, weights)
                y = term if y is None else y + term
            out[t] = y
        return out

    def _root(self, t: str, into: list[RelationType], x_src: Mapping[str, torch.Tensor],
              n_dst: int) -> torch.Tensor | None:
        if self.root is None:
            return None
        x_dst = _input(x_src, t, self.in_dims)[:n_dst]
        if self.root_mode == "type":
            return linear(self.root[t], x_dst)
        lins = [self.root[module_key(r)] for r in into]
        if len(lins) == 1:
            return linear(lins[0], x_dst)
        # sum_r (R_r x + b_r) = (sum_r R_r) x + sum_r b_r: one product for the type, not one per relation.
        weight = torch.stack([lin.weight for lin in lins]).sum(0)
        bias = torch.stack([lin.bias for lin in lins]).sum(0)
        return project(x_dst, weight, bias)


class RGCNConv(nn.Module):
    """R-GCN (Schlichtkrull et al., ESWC 2018) with mean normalisation: for a vertex ``v``,
    ``y_v = x_v W_root + sum_r mean_{u in N_r(v)} x_u W_r + b``, ``W_root`` and ``b`` shared by every type,
    one ``W_r`` per relation. With ``num_bases`` B, ``W_r = sum_b comp[r, b] basis[b]`` (the basis
    decomposition). PyG's ``RGCNConv(in_dim, out_dim, len(relations), num_bases, aggr="mean")`` on the graph
    with every type's vertices stacked and ``edge_type`` a relation's position in ``relations`` computes the
    same: ``weight`` (or ``basis``), ``comp``, ``root`` and ``bias`` copy one to one (PyG calls ``basis``
    ``weight``), all laid out ``in x out`` as there.

    Every type's input has one width, ``in_dim``, as in PyG's layer and in the paper: ``W_root`` and the
    basis act on every type's rows. A model whose types differ in width (or have no features) projects or
    embeds each type to ``in_dim`` before this layer; the layer itself refuses other widths.

    A destination type no relation ends at still gets ``x_v W_root + b``. With ``edge_weight`` a relation's
    mean is the weighted mean of the module docstring."""

    def __init__(self, in_dim: int, out_dim: int, relations: Iterable[RelationType], num_bases: int | None = None):
        super().__init__()
        self.relations = _relations(relations)
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
                _glorot(p)

    def relation_weights(self) -> torch.Tensor:
        """``W_r`` of every relation, ``(relations, in_dim, out_dim)``."""
        if self.basis is None:
            return self.weight
        return (self.comp @ self.basis.view(self.num_bases, -1)).view(len(self.relations), self.in_dim,
                                                                      self.out_dim)

    def forward(self, tblock: TypedBlock, x_src: Mapping[str, torch.Tensor],
                edge_weight: Mapping[RelationType, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        _check_block(self, tblock)
        for t, x in x_src.items():
            if x.shape[-1] != self.in_dim:
                raise ValueError(f"R-GCN reads one input width, {self.in_dim}, for every type; {t!r} has "
                                 f"{x.shape[-1]}. Project or embed each type to {self.in_dim} first.")
        weights = self.relation_weights()
        root_t = self.root.t()
        out = {}
        for t, n_dst in tblock.num_dst.items():
            y = project(_input(x_src, t, None)[:n_dst], root_t, self.bias)
            for r in self.relations:
                block = tblock.blocks.get(r)
                if r[2] != t or block is None:
                    continue
                w = None if edge_weight is None else edge_weight.get(r)
                y = y + mean_linear(block, _input(x_src, r[0], None), weights[self.index[r]].t(), None, w)
            out[t] = y
        return out


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
                _glorot(lin.weight)
        for att in (self.att_src, self.att_dst, self.att_edge):
            if att is not None:
                _glorot(att)


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
        self.relations = _relations(relations)
        self.in_dims = _in_dims(in_dims, self.relations)
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
        _check_block(self, tblock)
        out = {}
        for t, n_dst in tblock.num_dst.items():
            y = None
            for r in self.relations:
                if r[2] != t:
                    continue
                conv = self.convs[module_key(r)]
                block = tblock.blocks.get(r)
                if block is None:
                    term = conv.bias.unsqueeze(0).repeat(n_dst, 1)
                else:
                    attr = None if edge_attr is None else edge_attr.get(r)
                    term = self._relation(conv, r, block, x_src, n_dst, attr)
                y = term if y is None else y + term
            if y is not None:
                out[t] = y
        return out

    def _relation(self, conv: RelationAttention, relation: RelationType, block: Block,
                  x_src: Mapping[str, torch.Tensor], n_dst: int, edge_attr: torch.Tensor | None) -> torch.Tensor:
        heads = self.heads
        s, _, t = relation
        lin_src = conv.lin if conv.lin is not None else conv.lin_src
        z = linear(lin_src, _input(x_src, s, self.in_dims)).view(-1, heads, self.head_dim)
        # Scores, softmax and the weighted sum in float32 for half-precision z (bfloat16 under autocast).
        acc = torch.float32 if z.dtype in (torch.bfloat16, torch.float16) else z.dtype
        z32 = z.to(acc)
        score_src = (z32 * conv.att_src).sum(-1)
        if s == t and conv.lin is not None:  # the destinations' projections are z's leading rows
            score_dst = (z32[:n_dst] * conv.att_dst).sum(-1)
        else:  # only a_dst . W x_v is needed: one width-``heads`` product, not the whole projection
            lin_dst = conv.lin if conv.lin is not None else conv.lin_dst
            x_dst = _input(x_src, t, self.in_dims)[:n_dst]
            score_dst = project(x_dst, _score_weight(lin_dst.weight, conv.att_dst)).to(acc)
        src, dst = block.indices.long(), edge_destinations(block)
        # Per edge: take_rows sums the gradients of a vertex's many edges in a fixed order (nn/rows.py).
        logits = take_rows(score_src, src) + take_rows(score_dst, dst)
        if conv.lin_edge is not None:
            if edge_attr is None:
                raise ValueError(f"relation {relation} attends over edge features: pass edge_attr[{relation}]")
            attr = edge_attr.view(-1, 1) if edge_attr.dim() == 1 else edge_attr
            if attr.shape[0] != block.num_edges:
                raise ValueError(f"edge_attr[{relation}] has {attr.shape[0]} rows for {block.num_edges} edges")
            logits = logits + project(attr, _score_weight(conv.lin_edge.weight, conv.att_edge)).to(acc)
        elif edge_attr is not None:
            raise ValueError(f"edge_attr given for {relation}, which the layer built without edge features "
                             f"(edge_dims)")
        logits = F.leaky_relu(logits, self.negative_slope)
        peak = torch.full((n_dst, heads), float("-inf"), dtype=logits.dtype, device=logits.device)
        peak = peak.scatter_reduce(0, dst.unsqueeze(1).expand_as(logits), logits.detach(), reduce="amax")
        weights = torch.exp(logits - take_rows(peak, dst))
        total = torch.zeros_like(peak).index_add(0, dst, weights)
        alpha = F.dropout(weights / take_rows(total, dst), self.attention_dropout, self.training)
        # attention_aggregate also sums one self loop per destination: here weighted 0, reading row
        # dst_offset + i of z, which a source frontier smaller than the destinations lacks (zero rows
        # appended then, the block widened to them: its kernels size their work by num_src).
        alpha = torch.cat([alpha, alpha.new_zeros(n_dst, heads)])
        flat = z32.view(-1, heads * self.head_dim)
        short = block.dst_offset + n_dst - flat.shape[0]
        if short > 0:
            flat = F.pad(flat, (0, 0, 0, short))
            block = Block(block.num_dst, flat.shape[0], block.indptr, block.indices, block.dst_offset)
        aggregated = attention_aggregate(block, flat, alpha, heads)
        return (aggregated + conv.bias).to(z.dtype)


def mean_linear(block: Block, x_src: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                edge_weight: torch.Tensor | None = None) -> torch.Tensor:
    """``mean_{u in N(v)} x_u`` (weighted by ``edge_weight`` when given: ``weighted_mean``) times ``weight``
    (``out x in``, as ``F.linear`` takes it) plus ``bias``, for the block's destinations: projecting before
    aggregating when that costs fewer flops (the mean is linear and row-wise), as the homogeneous layers do."""
    aggregate = (lambda x: mean_aggregate(block, x)) if edge_weight is None else (
        lambda x: weighted_mean(block, x, edge_weight))
    out_dim, in_dim = weight.shape
    if _project_first(block, in_dim, out_dim):
        y = aggregate(project(x_src, weight))
        return y if bias is None else y + bias.to(y.dtype)
    return project(aggregate(x_src), weight, bias)


def weighted_mean(block: Block, x_src: torch.Tensor, edge_weight: torch.Tensor) -> torch.Tensor:
    """Row ``i`` = ``sum_e w_e x_src[u_e] / deg(i)`` over destination ``i``'s edges ``e`` (zero for a destination
    without edges): each message scaled by its edge's weight, divided by the edge count, not by the weights'
    sum. ``edge_weight``: ``(edges,)`` or ``(edges, 1)`` in ``block.indices``' order. Sums are float32 for
    half-precision rows; the result has ``x_src``'s dtype. Torch ops on every device (a gradient reaches
    ``edge_weight`` too)."""
    if edge_weight.numel() != block.num_edges:
        raise ValueError(f"{edge_weight.numel()} edge weights for {block.num_edges} edges")
    acc = torch.float32 if x_src.dtype in (torch.bfloat16, torch.float16) else x_src.dtype
    messages = take_rows(x_src, block.indices.long()).to(acc) * edge_weight.reshape(-1, 1).to(acc)
    out = torch.zeros((block.num_dst, x_src.shape[1]), dtype=acc, device=x_src.device)
    out = out.index_add(0, edge_destinations(block), messages)
    count = block.in_degrees().clamp(min=1).to(acc).unsqueeze(1)
    return (out / count).to(x_src.dtype)


def _project_first(block: Block, in_dim: int, out_dim: int) -> bool:
    """Whether multiplying by the weight before aggregating costs fewer flops than after (``nn.layers``' rule)."""
    after = block.num_edges * in_dim + block.num_dst * in_dim * out_dim
    before = block.num_src * in_dim * out_dim + block.num_edges * out_dim
    return before < after


def _score_weight(weight: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    """``(heads, in)``: row ``h`` = ``sum_c att[h, c] W[h, c, :]``, so ``x @ result.T`` = ``((x W^T) * att).sum(-1)``
    per head without the ``heads x head_dim``-wide projection."""
    heads, head_dim = att.shape[-2:]
    return (weight.view(heads, head_dim, -1) * att.reshape(heads, head_dim, 1)).sum(1)


def _relations(relations: Iterable[RelationType]) -> tuple[RelationType, ...]:
    relations = tuple(tuple(r) for r in relations)
    if not relations:
        raise ValueError("a relational layer needs at least one relation")
    if len(set(relations)) != len(relations):
        raise ValueError("a relation is listed twice")
    bad = [r for r in relations if len(r) != 3]
    if bad:
        raise ValueError(f"relations are (src_type, name, dst_type) triples; got {bad}")
    return relations


def _in_dims(in_dims: Mapping[str, int] | int, relations: tuple[RelationType, ...]) -> dict[str, int]:
    types = {t for r in relations for t in (r[0], r[2])}
    if isinstance(in_dims, int):
        return {t: in_dims for t in sorted(types)}
    missing = sorted(types - set(in_dims))
    if missing:
        raise ValueError(f"no input width for vertex type(s) {missing}")
    return dict(in_dims)


def _dst_types(relations: tuple[RelationType, ...]) -> list[str]:
    return list(dict.fromkeys(r[2] for r in relations))


def _check_block(layer: nn.Module, tblock: TypedBlock) -> None:
    unknown = [r for r in tblock.blocks if r not in layer.relations]
    if unknown:
        raise ValueError(f"the block holds relation(s) {unknown} the layer has no weights for")


def _input(x_src: Mapping[str, torch.Tensor], node_type: str, in_dims: Mapping[str, int] | None) -> torch.Tensor:
    x = x_src.get(node_type)
    if x is None:
        raise ValueError(f"no input rows for vertex type {node_type!r}")
    if in_dims is not None and x.shape[-1] != in_dims[node_type]:
        raise ValueError(f"vertex type {node_type!r}: rows {x.shape[-1]} wide, the layer reads "
                         f"{in_dims[node_type]}")
    return x


def _glorot(tensor: torch.Tensor) -> None:
    """PyG's ``glorot``: uniform in +-sqrt(6 / (rows + columns)) of the last two dimensions."""
    bound = math.sqrt(6.0 / (tensor.size(-2) + tensor.size(-1)))
    with torch.no_grad():
        tensor.uniform_(-bound, bound)
