"""GNN layers over blocks: each computes only its destinations' outputs.

Every layer maps ``(block, x_src) -> y_dst`` (pre-activation). SAGE and GCN are *separable*: their output
is ``transform(x_dst, aggregate(block, x_src))`` with a parameter-free ``aggregate``, the two calls
NeutronOrch's host computes hot vertices with; GAT's whole output is computed there instead.
"""

from __future__ import annotations

import torch
from torch import nn

from neutronorch.nn import sparse_input
from neutronorch.nn.activation import edge_ids, keyed_dropout
from neutronorch.nn.aggregation import fused_mean_linear, gcn_aggregate, mean_aggregate
from neutronorch.nn.attention import attention_aggregate, attention_edges
from neutronorch.nn.bucket import linear, project
from neutronorch.nn.edge_softmax import edge_softmax, head_scores
from neutronorch.nn.names import GCN_NORMS
from neutronorch.sampling.block import Block


class SAGEConv(nn.Module):
    """GraphSAGE-mean: ``y_v = W_self x_v + W_neigh mean_{u in N(v)} x_u + b``."""

    separable = True

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.in_dim, self.out_dim = in_dim, out_dim
        self.lin_self = nn.Linear(in_dim, out_dim)
        self.lin_neigh = nn.Linear(in_dim, out_dim, bias=False)

    def aggregate(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        return mean_aggregate(block, x_src)

    def transform(self, x_dst: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
        return linear(self.lin_self, x_dst) + linear(self.lin_neigh, aggregated)

    def forward(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        x_dst = block.dst_rows(x_src)
        share = sparse_input.dense_equivalent(x_src)
        if share < 1.0 and project_first(block, self.in_dim, 2 * self.out_dim, share):
            # Mostly-zero rows (bag-of-words features): one product through their nonzeros gives both the
            # destinations' own term and the sources' projection to average.
            both = sparse_input.project(x_src, [self.lin_self.weight, self.lin_neigh.weight])
            own, neigh = both[:, :self.out_dim], both[:, self.out_dim:]
            return (block.dst_rows(own) + self.lin_self.bias.to(own.dtype)
                    + mean_aggregate(block, neigh.contiguous()))
        if project_first(block, self.in_dim, self.out_dim, share):
            # mean(x) W == mean(x W): cheaper when the output is narrower than the input.
            return linear(self.lin_self, x_dst) + mean_aggregate(block, linear(self.lin_neigh, x_src))
        fused = fused_mean_linear(block, x_src, [self.lin_self.weight, self.lin_neigh.weight], self.lin_self.bias,
                                  self_columns=True, include_self=False)
        return fused if fused is not None else self.transform(x_dst, self.aggregate(block, x_src))


class GCNConv(nn.Module):
    """Graph convolution with a self loop (Kipf & Welling, ICLR 2017), normalised one of two ways:

    - ``norm="symmetric"`` (PyG's ``GCNConv``): ``y_v = W (x_v / D_v + sum_{u in N(v)} x_u / sqrt(D_u D_v)) +
      b`` with D the in-degree in the graph plus one, the sum over N(v) estimated without bias from the
      sampled neighbours (``symmetric_aggregate``); blocks carry their sources' degrees (``src_degree``);
    - ``norm="mean"``: ``y_v = W mean({x_v} + {x_u : u in S(v)}) + b`` (the GraphSAGE paper's GCN aggregator).
    """

    separable = True

    def __init__(self, in_dim: int, out_dim: int, norm: str = "symmetric"):
        super().__init__()
        if norm not in GCN_NORMS:
            raise ValueError(f"unknown GCN normalisation {norm!r}; choose one of {GCN_NORMS}")
        self.in_dim, self.out_dim, self.norm = in_dim, out_dim, norm
        self.lin = nn.Linear(in_dim, out_dim)

    def aggregate(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        return gcn_aggregate(block, x_src, self.norm)

    def transform(self, x_dst: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
        return linear(self.lin, aggregated)

    def forward(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        fuse = None if self.norm != "mean" else lambda: fused_mean_linear(
            block, x_src, [self.lin.weight], self.lin.bias, self_columns=False, include_self=True)
        return aggregate_linear(block, x_src, self.lin.weight, self.lin.bias, self.aggregate, fuse)


class GATConv(nn.Module):
    """Multi-head graph attention over the vertex and its sampled neighbours (Velickovic et al. 2018):
    ``y_v = ||_h sum_u alpha^h_vu W^h x_u + b``,
    ``alpha^h_vu = softmax_u LeakyReLU(a_l^h W^h x_u + a_r^h W^h x_v)``, in training the coefficients dropped
    with probability ``attention_dropout``."""

    separable = False

    def __init__(self, in_dim: int, out_dim: int, heads: int = 1, attention_dropout: float = 0.0):
        super().__init__()
        if out_dim % heads:
            raise ValueError(f"GAT width {out_dim} is not divisible by {heads} heads")
        self.in_dim, self.out_dim, self.heads = in_dim, out_dim, heads
        self.head_dim = out_dim // heads
        self.attention_dropout = attention_dropout
        self.lin = nn.Linear(in_dim, out_dim, bias=False)
        self.attn_src = nn.Parameter(torch.empty(heads, self.head_dim))
        self.attn_dst = nn.Parameter(torch.empty(heads, self.head_dim))
        self.bias = nn.Parameter(torch.zeros(out_dim))
        nn.init.xavier_uniform_(self.attn_src)
        nn.init.xavier_uniform_(self.attn_dst)

    def forward(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        z = linear(self.lin, x_src).view(-1, self.heads, self.head_dim)
        # Scores, softmax and the weighted sum in float32 whatever z's dtype (bfloat16 under autocast).
        z32 = z.float()
        score_src, score_dst = head_scores(z32, self.attn_src, self.attn_dst, block.dst_offset, block.num_dst)
        # (source, destination) per edge and self loop: the torch ops' index; the CPU kernels need none.
        edges = None if z32.device.type == "cpu" else attention_edges(block)
        alpha = edge_softmax(block, score_src, score_dst, self_loops=True, edges=edges)
        # As in the reference GAT (+1.4 points on Cora here); each edge's mask keyed by its vertex pair.
        ids = None
        if self.training and self.attention_dropout > 0 and block.src_ids is not None:
            src, dst = edges if edges is not None else attention_edges(block)
            ids = edge_ids(block.dst_ids.index_select(0, dst), block.src_ids.index_select(0, src))
        alpha = keyed_dropout(alpha, self.attention_dropout, self.training, ids)
        out = attention_aggregate(block, z32.view(-1, self.out_dim), alpha, self.heads, edges)
        return (out + self.bias).to(z.dtype)


class Residual(nn.Module):
    """A layer with a skip connection from its input: ``y_v = layer(block, x)_v + skip(x_v)``, the skip the
    identity when the widths agree, else a learned projection (no bias)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer
        self.in_dim, self.out_dim = layer.in_dim, layer.out_dim
        self.separable = layer.separable
        self.skip = nn.Identity() if layer.in_dim == layer.out_dim else nn.Linear(layer.in_dim, layer.out_dim,
                                                                                   bias=False)

    def aggregate(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        return self.layer.aggregate(block, x_src)

    def transform(self, x_dst: torch.Tensor, aggregated: torch.Tensor) -> torch.Tensor:
        return self.layer.transform(x_dst, aggregated) + self._skip(x_dst)

    def forward(self, block: Block, x_src: torch.Tensor) -> torch.Tensor:
        return self.layer(block, x_src) + self._skip(block.dst_rows(x_src))

    def _skip(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.skip, x) if isinstance(self.skip, nn.Linear) else self.skip(x)


def aggregate_linear(block: Block, x_src: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     aggregate, fuse=None) -> torch.Tensor:
    """``aggregate(block, x_src)`` times ``weight`` (``out x in``) plus ``bias``: projecting first where that
    costs fewer flops (the aggregation is linear and row-wise), else through ``fuse()`` where it gives a
    result, else aggregating first."""
    out_dim, in_dim = weight.shape
    if project_first(block, in_dim, out_dim, sparse_input.dense_equivalent(x_src)):
        y = aggregate(block, project(x_src, weight))
        return y if bias is None else y + bias.to(y.dtype)
    fused = fuse() if fuse is not None else None
    return fused if fused is not None else project(aggregate(block, x_src), weight, bias)


def project_first(block: Block, in_dim: int, out_dim: int, share: float = 1.0) -> bool:
    """Whether multiplying by the weight before aggregating costs fewer flops than after. ``share``: what a
    product of the source rows costs against a dense one (``sparse_input.dense_equivalent``)."""
    after = block.num_edges * in_dim + block.num_dst * in_dim * out_dim
    before = block.num_src * in_dim * out_dim * share + block.num_edges * out_dim
    if share < 1.0:
        before += block.num_src * in_dim
    return before < after
