"""Relational models: ``TypedGNN``, the one layer stack (``LayerStack``, ``nn/models.py``) over the relational
layers (``nn/relational.py``) and a typed sampler's blocks, and the ``TypedSpec`` it is built from (nothing
here reads a loaded graph's arrays). What each kind computes, its inputs and edge features, and which
relations each layer holds: docs/heterogeneous.md, "Training".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import torch
from torch import nn

from neutronorch.data.typed import relation_label
from neutronorch.nn.models import LayerStack
from neutronorch.nn.names import TYPED_MODELS
from neutronorch.nn.relational import RGATConv, RGCNConv, TypedSAGEConv
from neutronorch.nn.splice import HotRows
from neutronorch.sampling.block import RelationType, TypedBlock

if TYPE_CHECKING:
    from neutronorch.data.typed import TypedGraph

logger = logging.getLogger("neutronorch")

LEAKY_SLOPE = 0.01  # torch's default, the slope IGB's and the MLPerf reference's R-GAT use between layers


@dataclass(frozen=True)
class TypedSpec:
    """What a relational model needs of a typed graph: every type's vertex count and feature width (0: an
    embedding table), the relations in the graph's order, the target type, the width of the relations' edge
    features (``edge_dims``: those that have them), and ``outputs``: the types whose rows the model outputs,
    concatenated (a typed link task's two end types; empty: the target's alone)."""

    num_nodes: dict[str, int]
    feature_dims: dict[str, int]
    relations: tuple[RelationType, ...]
    target: str
    edge_dims: dict[RelationType, int] = field(default_factory=dict)
    outputs: tuple[str, ...] = ()

    @classmethod
    def of(cls, graph: "TypedGraph") -> "TypedSpec":
        return cls(dict(graph.num_nodes), {t: graph.feature_dim(t) for t in graph.num_nodes},
                   tuple(graph.relations), graph.target,
                   {r: rel.edge_feature_dim for r, rel in graph.relations.items() if rel.edge_feature_dim},
                   graph.links.ends.types if getattr(graph, "links", None) is not None else ())

    def to_dict(self) -> dict:
        """As JSON stores it (``edge_dims`` as ``[src, name, dst, width]`` lists), for ``from_dict``."""
        return {"num_nodes": dict(self.num_nodes), "feature_dims": dict(self.feature_dims),
                "relations": [list(r) for r in self.relations], "target": self.target,
                "edge_dims": [[*r, width] for r, width in self.edge_dims.items()],
                **({"outputs": list(self.outputs)} if self.outputs else {})}

    @classmethod
    def from_dict(cls, stored: Mapping) -> "TypedSpec":
        """The spec ``to_dict`` stored."""
        return cls(dict(stored["num_nodes"]), dict(stored["feature_dims"]), tuple(map(tuple, stored["relations"])),
                   stored["target"], {tuple(e[:3]): int(e[3]) for e in stored.get("edge_dims", [])},
                   tuple(stored.get("outputs", ())))


def reachable_types(spec: TypedSpec, hops: int, start: str | None = None) -> list[list[str]]:
    """``out[h]``, ``h`` in ``0..hops``: the types a typed sampler's frontier holds after ``h`` hops from
    seeds of ``start`` (default ``spec.outputs`` or the target), each list in ``spec.num_nodes``' order."""
    reached = [{start} if start else set(spec.outputs or (spec.target,))]
    for _ in range(hops):
        last = reached[-1]
        reached.append(last | {r[0] for r in spec.relations if r[2] in last})
    return [[t for t in spec.num_nodes if t in types] for types in reached]


def table_shapes(kind: str, spec: TypedSpec, hidden: int, num_layers: int, embed_dim: int | None = None
                 ) -> dict[str, tuple[int, int]]:
    """The embedding tables a ``TypedGNN`` of these arguments holds: (rows, width) per featureless type it
    reads, in order."""
    width = hidden if kind == "rgcn" else (embed_dim or hidden)
    return {t: (spec.num_nodes[t], width) for t in reachable_types(spec, num_layers)[num_layers]
            if not spec.feature_dims[t]}


class TypedGNN(LayerStack):
    """A relational GNN of ``num_layers`` layers of ``kind`` (``TYPED_MODELS``) over ``spec``'s graph, whose
    last layer gives ``num_classes`` logits per target vertex. ``heads``: R-GAT's heads below the last layer
    (``hidden`` must divide among them); ``num_bases``: R-GCN's basis decomposition (None: a weight per
    relation); ``embed_dim``: the featureless types' table width for ``sage`` and ``rgat`` (default
    ``hidden``; ``rgcn``'s are ``hidden`` wide); ``root``: ``TypedSAGEConv``'s root term; ``tables(type, rows,
    width)``: a table's initialised float32 weights, or None for ``nn.Embedding``'s own (None: all of them, in
    memory; not among ``arguments``: where the tables live is no part of the model)."""

    keyed = True

    def __init__(self, kind: str, spec: TypedSpec, hidden: int, num_classes: int, num_layers: int,
                 dropout: float = 0.5, heads: int = 4, num_bases: int | None = None, embed_dim: int | None = None,
                 root: str | None = "relation",
                 tables: Callable[[str, int, int], torch.Tensor | None] | None = None):
        if kind not in TYPED_MODELS:
            raise ValueError(f"unknown relational model {kind!r}; choose one of {TYPED_MODELS}")
        if num_layers < 1:
            raise ValueError(f"a relational model needs at least one layer, not {num_layers}")
        super().__init__({"kind": kind, "spec": spec.to_dict(), "hidden": hidden, "num_classes": num_classes,
                          "num_layers": num_layers, "dropout": dropout, "heads": heads, "num_bases": num_bases,
                          "embed_dim": embed_dim, "root": root})
        self.spec = spec
        self.slope = LEAKY_SLOPE if kind == "rgat" else None
        reached = reachable_types(spec, num_layers)
        self.input_types = reached[num_layers]
        # A type some layer has destinations of needs a relation into it, or the layer above lacks its rows.
        stranded = [t for t in reached[num_layers - 1] if t not in {r[2] for r in spec.relations}]
        if stranded:
            raise ValueError(f"vertex type(s) {', '.join(stranded)} feed the target through relations but no "
                             f"relation leads into them, so a {num_layers}-layer model cannot compute "
                             f"their rows; add reverse relations (TypedGraph.with_reverse()) or use fewer "
                             f"layers")
        featured = [t for t in self.input_types if spec.feature_dims[t]]
        shapes = table_shapes(kind, spec, hidden, num_layers, embed_dim)
        self.embeddings = nn.ModuleDict({t: _table(t, *shape, tables) for t, shape in shapes.items()})
        self.projections = nn.ModuleDict({t: nn.Linear(spec.feature_dims[t], hidden) for t in featured}
                                         if kind == "rgcn" else {})
        # A type no wider than hidden enters the bottom layer raw, its map folded into each relation's weight
        # (RGCNConv's projections); a wider one is projected first, the cheaper order for it.
        self.folded = [t for t in self.projections if spec.feature_dims[t] <= hidden]
        in_dims = {t: spec.feature_dims[t] or shapes[t][1] for t in self.input_types}  # rgcn reads hidden
        # SAGE and R-GCN read one-column edge features as edge weights (R-GAT attends over any width).
        self.weighted = () if kind == "rgat" else tuple(r for r, w in spec.edge_dims.items() if w == 1)
        make = {"sage": lambda dims, out, rels, last: TypedSAGEConv(dims, out, rels, root=root),
                "rgcn": lambda dims, out, rels, last: RGCNConv(hidden, out, rels, num_bases=num_bases),
                "rgat": lambda dims, out, rels, last: RGATConv(
                    dims, out, rels, heads=1 if last else heads,
                    edge_dims={r: spec.edge_dims[r] for r in rels if r in spec.edge_dims})}[kind]
        layers = []
        for index in range(num_layers):
            relations = [r for r in spec.relations if r[2] in reached[num_layers - 1 - index]]
            last = index == num_layers - 1
            layers.append(make(in_dims, num_classes if last else hidden, relations, last))
            in_dims = dict.fromkeys(in_dims, hidden)
        self.layers = nn.ModuleList(layers)
        held = {r for layer in layers for r in layer.relations}
        wide = [f"{relation_label(r)} ({w} columns)" for r, w in spec.edge_dims.items()
                if w > 1 and r in held]
        if kind != "rgat" and wide:
            logger.warning(f"{kind} reads one-column edge features as edge weights and ignores wider ones: "
                           f"the edge features of {', '.join(wide)} are not used (R-GAT attends over edge "
                           f"features of any width)")

    def input_rows(self, features: Mapping[str, torch.Tensor], input_ids: Mapping[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
        """The rows the bottom layer reads per type before any projection: ``features[t]``, or the table rows
        of ``input_ids[t]`` for a featureless type."""
        return {t: self.embeddings[t](input_ids[t]) if t in self.embeddings else features[t] for t in input_ids}

    @property
    def bottom(self) -> "TypedBottom":
        """The bottom layer with its input projections (``TypedBottom``; the tables' rows are its inputs)."""
        return TypedBottom(self.layers[0], self.projections, self.folded, self.weighted)

    def forward(self, blocks: list[TypedBlock], features: Mapping[str, torch.Tensor],
                input_ids: Mapping[str, torch.Tensor], hot: Mapping[str, HotRows] | None = None) -> torch.Tensor:
        """Logits of the last block's target destinations (``LayerStack.forward``; ``hot`` per type), or with
        ``spec.outputs`` the rows of those types that the top block has, concatenated. ``input_ids[t]``: the
        bottom block's source frontier of each type; ``features[t]``: the rows of each featured type's."""
        out = super().forward(blocks, self.input_rows(features, input_ids), hot)
        if not self.spec.outputs:
            return out[self.spec.target]
        return torch.cat([out[t] for t in self.spec.outputs if t in out])

    def layer_output(self, index: int, tblock: TypedBlock, x: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """As ``LayerStack``'s, per destination type (``typed_layer``)."""
        if index == 0:
            return typed_layer(self.layers[0], tblock, x, self.weighted, self.projections, self.folded)
        return typed_layer(self.layers[index], tblock, x, self.weighted)


class TypedBottom(nn.Module):
    """A relational model's bottom layer with its input projections (``typed_layer``) over
    ``TypedGNN.input_rows``' rows, holding the model's own modules (a deep copy: NeutronOrch's host layer)."""

    def __init__(self, layer: nn.Module, projections: nn.ModuleDict, folded: list[str],
                 weighted: tuple[RelationType, ...]):
        super().__init__()
        self.layer, self.projections, self.folded, self.weighted = layer, projections, folded, weighted

    def forward(self, tblock: TypedBlock, rows: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return typed_layer(self.layer, tblock, rows, self.weighted, self.projections, self.folded)

    @property
    def out_dim(self) -> int:
        return self.layer.out_dim


def typed_layer(layer: nn.Module, tblock: TypedBlock, rows: Mapping[str, torch.Tensor],
                weighted: Iterable[RelationType], projections: Mapping[str, nn.Module] | None = None,
                folded: Iterable[str] = ()) -> dict[str, torch.Tensor]:
    """``layer``'s output per destination type (before the activation), handed the block's edge features
    (``edge_arguments``) and the rows through the input ``projections``, or with those of ``folded`` types."""
    projections = projections or {}
    x = {t: projections[t](r) if t in projections and t not in folded else r for t, r in rows.items()}
    extra = edge_arguments(layer, tblock, weighted)
    if folded:
        extra["projections"] = {t: projections[t] for t in folded}
    return layer(tblock, x, **extra)


def edge_arguments(layer: nn.Module, tblock: TypedBlock, weighted: Iterable[RelationType]) -> dict:
    """The keyword arguments that hand ``layer`` its block's edge features (``tblock.edge_features``): an
    ``RGATConv`` its ``edge_attr`` (``edge_dims``' relations); another layer its ``edge_weight`` for its
    relations in ``weighted`` (one column each); nothing when none of them has a block. Raises ``ValueError``
    naming the relation when its block lacks the rows, or has another number or width."""
    if isinstance(layer, RGATConv):
        widths, name = layer.edge_dims, "edge_attr"
    else:
        widths, name = {r: 1 for r in weighted if r in layer.relations}, "edge_weight"
    given = {}
    for relation, width in widths.items():
        block = tblock.blocks.get(relation)
        if block is None:
            continue
        rows = tblock.edge_features.get(relation)
        if rows is None:
            raise ValueError(f"relation {relation_label(relation)} has edge features, but its sampled block "
                             f"carries none: sample with a TypedNeighborSampler that reads them (its default), "
                             f"or read them into the blocks with typed_sampler.gather_edge_features")
        if tuple(rows.shape) != (block.num_edges, width):
            raise ValueError(f"relation {relation_label(relation)}: edge features of shape {tuple(rows.shape)} "
                             f"for {block.num_edges} sampled edges; the model reads {width} column(s) per edge")
        given[relation] = rows
    return {name: given} if given else {}


def _table(node_type: str, rows: int, width: int, tables) -> nn.Embedding:
    """A featureless type's table: ``tables``' weights for it where it gives some (or the table itself: a
    partitioned run's, of its part's rows), else ``nn.Embedding``'s."""
    weight = tables(node_type, rows, width) if tables is not None else None
    if isinstance(weight, nn.Embedding):
        return weight
    if weight is None:
        return nn.Embedding(rows, width, sparse=True)
    if tuple(weight.shape) != (rows, width) or weight.dtype != torch.float32:
        raise ValueError(f"the table of {node_type} given is {tuple(weight.shape)} {weight.dtype}; the model reads "
                         f"({rows}, {width}) float32")
    return nn.Embedding.from_pretrained(weight, freeze=False, sparse=True)

