"""Relational models: ``TypedGNN``, the one layer stack (``LayerStack``, ``nn/models.py``: its loop,
activations, dropout and NeutronOrch's splice) over the relational layers (``nn/relational.py``) and a typed
sampler's blocks, and the ``TypedSpec`` it is built from (types, counts, feature widths, relations, edge
feature widths, target: nothing here reads a loaded graph's arrays).
What each kind computes, its inputs (embedding tables for featureless types, R-GCN's input projections),
its edge features and which relations each layer holds: docs/heterogeneous.md, "Training".

What a relational model adds to the stack: per-type input rows (``input_rows``; a featureless type's table
rows, ``nn.Embedding(sparse=True)`` or ``tables``' weights, ``train/typed_tables.py``), the bottom layer with
its projections (``TypedBottom``, NeutronOrch's host layer), each layer's edge features
(``edge_arguments``), and dropout masks from one key per forward, the layer and the type (``masks``): a
vertex's mask depends on its layer, type and id alone, so data-parallel ranks that split a batch draw exactly
one process's masks. A layer holds only the relations into the types it can have as destinations
(``reachable_types``); a type some layer must compute that no relation leads into is refused, naming it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Mapping

import torch
from torch import nn

from neutronorch.data.typed import relation_label
from neutronorch.nn.activation import draw_key, dropout_keys
from neutronorch.nn.models import LayerStack
from neutronorch.nn.names import TYPED_MODELS
from neutronorch.nn.relational import RGATConv, RGCNConv, TypedSAGEConv
from neutronorch.nn.splice import HotRows
from neutronorch.sampling.neighbor_sampler import mix_key
from neutronorch.sampling.block import RelationType, TypedBlock

if TYPE_CHECKING:
    from neutronorch.data.typed import TypedGraph

logger = logging.getLogger("neutronorch")

LEAKY_SLOPE = 0.01  # torch's default, the slope IGB's and the MLPerf reference's R-GAT use between layers


@dataclass(frozen=True)
class TypedSpec:
    """What a relational model needs of a typed graph: every type's vertex count and feature width (0: no
    features, so an embedding table), the relations in the graph's order, the target type, and the width of
    each relation's edge features (``edge_dims``: only the relations that have them). ``outputs``: the types
    whose rows the model outputs, concatenated in that order (a typed link task's two end types); empty: the
    target's alone."""

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
        """As a summary or checkpoint stores it (JSON: relations as lists, ``edge_dims`` as ``[src, name, dst,
        width]`` lists); ``from_dict`` reads it back."""
        return {"num_nodes": dict(self.num_nodes), "feature_dims": dict(self.feature_dims),
                "relations": [list(r) for r in self.relations], "target": self.target,
                "edge_dims": [[*r, width] for r, width in self.edge_dims.items()],
                **({"outputs": list(self.outputs)} if self.outputs else {})}

    @classmethod
    def from_dict(cls, stored: Mapping) -> "TypedSpec":
        """The spec ``to_dict`` stored (one stored without ``edge_dims`` has no edge features)."""
        return cls(dict(stored["num_nodes"]), dict(stored["feature_dims"]), tuple(map(tuple, stored["relations"])),
                   stored["target"], {tuple(e[:3]): int(e[3]) for e in stored.get("edge_dims", [])},
                   tuple(stored.get("outputs", ())))


def reachable_types(spec: TypedSpec, hops: int, start: str | None = None) -> list[list[str]]:
    """``out[h]``: the types a typed sampler's frontier holds after ``h`` hops from seeds of ``start`` (default
    the target, or ``spec.outputs``; ``out[0]`` those types alone), each list in ``spec.num_nodes``' order;
    ``hops + 1`` lists."""
    reached = [{start} if start else set(spec.outputs or (spec.target,))]
    for _ in range(hops):
        last = reached[-1]
        reached.append(last | {r[0] for r in spec.relations if r[2] in last})
    return [[t for t in spec.num_nodes if t in types] for types in reached]


def table_shapes(kind: str, spec: TypedSpec, hidden: int, num_layers: int, embed_dim: int | None = None
                 ) -> dict[str, tuple[int, int]]:
    """The embedding tables a ``TypedGNN`` of these arguments holds: (rows, width) per featureless type it
    reads, in the order it makes them."""
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
        _check_reached(spec, reached)
        featured = [t for t in self.input_types if spec.feature_dims[t]]
        width = hidden if kind == "rgcn" else (embed_dim or hidden)
        self.embeddings = nn.ModuleDict({t: _table(t, rows, columns, tables) for t, (rows, columns)
                                         in table_shapes(kind, spec, hidden, num_layers, embed_dim).items()})
        self.projections = nn.ModuleDict({t: nn.Linear(spec.feature_dims[t], hidden) for t in featured}
                                         if kind == "rgcn" else {})
        # A type no wider than hidden enters the bottom layer raw, its map folded into each relation's weight
        # (RGCNConv's projections); a wider one is projected first, the cheaper order for it.
        self.folded = [t for t in self.projections if spec.feature_dims[t] <= hidden]
        in_dims = {t: spec.feature_dims[t] or width for t in self.input_types}  # rgcn's: hidden for every type
        # SAGE and R-GCN read one-column edge features as edge weights (R-GAT attends over any width).
        self.weighted = () if kind == "rgat" else tuple(r for r, w in spec.edge_dims.items() if w == 1)
        layers = []
        for index in range(num_layers):
            last = index == num_layers - 1
            destinations = set(reached[num_layers - 1 - index])
            relations = [r for r in spec.relations if r[2] in destinations]
            out_dim = num_classes if last else hidden
            if kind == "sage":
                layers.append(TypedSAGEConv(in_dims, out_dim, relations, root=root))
            elif kind == "rgcn":
                layers.append(RGCNConv(hidden, out_dim, relations, num_bases=num_bases))
            else:
                layers.append(RGATConv(in_dims, out_dim, relations, heads=1 if last else heads,
                                       edge_dims={r: spec.edge_dims[r] for r in relations if r in spec.edge_dims}))
            in_dims = dict.fromkeys(in_dims, hidden)
        self.layers = nn.ModuleList(layers)
        _log_ignored_edge_features(kind, spec, {r for layer in layers for r in layer.relations})

    def input_rows(self, features: Mapping[str, torch.Tensor], input_ids: Mapping[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
        """The rows the bottom layer reads per type before any projection: ``features[t]`` (float32 rows of a
        featured type's input frontier), or the table rows of ``input_ids[t]`` for a featureless type."""
        return {t: self.embeddings[t](input_ids[t]) if t in self.embeddings else features[t] for t in input_ids}

    @property
    def bottom(self) -> "TypedBottom":
        """The bottom layer with its input projections, sharing this model's parameters: what NeutronOrch's
        host computes the hot rows with (the embedding tables are not in it: their rows are its inputs)."""
        return TypedBottom(self.layers[0], self.projections, self.folded, self.weighted)

    def forward(self, blocks: list[TypedBlock], features: Mapping[str, torch.Tensor],
                input_ids: Mapping[str, torch.Tensor], hot: Mapping[str, HotRows] | None = None) -> torch.Tensor:
        """Logits of the last block's target destinations (``LayerStack.run``; ``hot`` per type), or with
        ``spec.outputs`` the rows of those types that the top block has, concatenated. ``blocks``: a
        ``SampledSubgraph``'s, bottom layer first; ``input_ids[t]``: the bottom block's source frontier of each
        type, on the model's device; ``features[t]``: the rows of each featured type's frontier."""
        out = self.run(blocks, self.input_rows(features, input_ids), hot)
        if not self.spec.outputs:
            return out[self.spec.target]
        return torch.cat([out[t] for t in self.spec.outputs if t in out])

    def forward_key(self) -> int | None:
        return int(draw_key()) if self.training and self.dropout > 0 else None

    def masks(self, key: int | None, index: int, node_type: str):
        """From ``key`` (the forward's one draw), the layer and the type, whatever else the batch holds, so a
        vertex's mask does not depend on which other types a batch (a data-parallel rank's part of one)
        reaches."""
        if key is None:
            return super().masks(key, index, node_type)
        types = list(self.spec.num_nodes)
        return dropout_keys(mix_key(key, index * len(types) + types.index(node_type)))

    def layer_output(self, index: int, tblock: TypedBlock, x: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """As ``LayerStack``'s, per destination type, with the block's edge features (the bottom layer reads
        ``input_rows``' rows and projects them itself)."""
        if index == 0:
            return self.bottom(tblock, x)
        layer = self.layers[index]
        return layer(tblock, x, **edge_arguments(layer, tblock, self.weighted))


class TypedBottom(nn.Module):
    """A relational model's bottom layer with the featured types' input projections (``rgcn``), over the rows
    ``TypedGNN.input_rows`` gives: a type whose projection is folded into the layer enters raw, another is
    projected first; and the block's edge features, as the model hands them to every layer
    (``edge_arguments``: ``weighted`` are the relations SAGE and R-GCN weight their means by). Holds the
    model's own modules (``TypedGNN.bottom``); a deep copy of it is NeutronOrch's host layer."""

    def __init__(self, layer: nn.Module, projections: nn.ModuleDict, folded: list[str],
                 weighted: Iterable[RelationType] = ()):
        super().__init__()
        self.layer, self.projections, self.folded = layer, projections, list(folded)
        self.weighted = tuple(weighted)

    def forward(self, tblock: TypedBlock, rows: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The bottom layer's output per destination type (before the activation)."""
        x = {t: self.projections[t](r) if t in self.projections and t not in self.folded else r
             for t, r in rows.items()}
        extra = edge_arguments(self.layer, tblock, self.weighted)
        if self.folded:
            extra["projections"] = {t: self.projections[t] for t in self.folded}
        return self.layer(tblock, x, **extra)

    @property
    def out_dim(self) -> int:
        return self.layer.out_dim


def edge_arguments(layer: nn.Module, tblock: TypedBlock, weighted: Iterable[RelationType]) -> dict:
    """The keyword arguments that hand ``layer`` its block's edge features (``tblock.edge_features``): an
    ``RGATConv`` its ``edge_attr`` for the relations it attends over edge features of (``edge_dims``);
    another layer its ``edge_weight`` for those of its relations in ``weighted`` (one column each). Nothing
    when none of them has a block, so a layer without edge features runs exactly as it always has. Raises
    ``ValueError`` naming the relation when its block lacks the rows, or has another number or width."""
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


def _log_ignored_edge_features(kind: str, spec: TypedSpec, relations: set[RelationType]) -> None:
    """Say once, when a SAGE or R-GCN model is built, which relations' edge features it leaves unread: those
    wider than one column, which only R-GAT reads."""
    wide = [f"{relation_label(r)} ({w} columns)" for r, w in spec.edge_dims.items() if w > 1 and r in relations]
    if kind != "rgat" and wide:
        logger.warning(f"{kind} reads one-column edge features as edge weights and ignores wider ones: the edge "
                       f"features of {', '.join(wide)} are not used (R-GAT attends over edge features of any "
                       f"width)")


def _table(node_type: str, rows: int, width: int, tables) -> nn.Embedding:
    """A featureless type's table: ``tables``' weights for it when it gives some, else ``nn.Embedding``'s own
    (drawn from the global generator: both ways draw the same, ``train/typed_tables.py``)."""
    weight = tables(node_type, rows, width) if tables is not None else None
    if weight is None:
        return nn.Embedding(rows, width, sparse=True)
    if tuple(weight.shape) != (rows, width) or weight.dtype != torch.float32:
        raise ValueError(f"the table of {node_type} given is {tuple(weight.shape)} {weight.dtype}; the model reads "
                         f"({rows}, {width}) float32")
    return nn.Embedding.from_pretrained(weight, freeze=False, sparse=True)


def _check_reached(spec: TypedSpec, reached: list[list[str]]) -> None:
    """Every type some layer has destinations of must have a relation into it in that layer, or the layer
    above would find no rows of it."""
    into = {r[2] for r in spec.relations}
    for hop in range(len(reached) - 1):
        stranded = [t for t in reached[hop] if t not in into]
        if stranded:
            raise ValueError(f"vertex type(s) {', '.join(stranded)} feed the target through relations but no "
                             f"relation leads into them, so a {len(reached) - 1}-layer model cannot compute "
                             f"their rows; add reverse relations (TypedGraph.with_reverse()) or use fewer "
                             f"layers")
