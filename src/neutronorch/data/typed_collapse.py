"""A typed graph with its types forgotten: ``collapse(typed) -> Graph``, what a type-blind model trains on
(docs/heterogeneous.md, "Accuracy"). Every type's vertices are stacked in ``num_nodes``' order and every
relation's edges go into one CSC, an edge kept once; features are padded with zeros from column 0 to the
widest type's width (a featureless type: zero rows), so they do not say a vertex's type; labels are -1 off
the target. Builds in memory."""

from __future__ import annotations

import numpy as np

from neutronorch.data.graph import Graph
from neutronorch.data.typed import Relation, TypedGraph
from neutronorch.errors import DataError


def type_offsets(graph: TypedGraph) -> dict[str, int]:
    """Where each type's vertices start among the stacked ones."""
    starts = np.cumsum([0, *graph.num_nodes.values()])
    return {t: int(start) for t, start in zip(graph.num_nodes, starts)}


def collapse(graph: TypedGraph) -> Graph:
    """``graph`` as one homogeneous graph, validated. The relations are taken as they are: collapse
    ``graph.with_reverse()`` for the edges a typed run trains on."""
    if graph.labels is None:
        raise DataError(f"{graph.name}: its target {graph.target!r} has no labels; a collapsed graph is for "
                        f"node classification.")
    offsets = type_offsets(graph)
    total = sum(graph.num_nodes.values())
    sources, destinations = [], []
    for (src_type, _, dst_type), relation in graph.relations.items():
        src, dst = relation.edges()
        sources.append(src + offsets[src_type])
        destinations.append(dst + offsets[dst_type])
    empty = np.zeros(0, np.int64)
    merged = Relation.from_edges(np.concatenate(sources or [empty]), np.concatenate(destinations or [empty]), total,
                                 total, deduplicate=True, source=f"{graph.name} collapsed")
    width = max(1, max(graph.feature_dim(t) for t in graph.num_nodes))
    features = np.zeros((total, width), np.float32)
    for node_type, rows in graph.features.items():
        start = offsets[node_type]
        features[start:start + graph.num_nodes[node_type], :rows.shape[1]] = rows
    labels_shape = (total,) + tuple(graph.labels.shape[1:])
    labels = np.full(labels_shape, -1, dtype=np.int64)
    start = offsets[graph.target]
    labels[start:start + graph.num_nodes[graph.target]] = graph.labels
    shift = lambda idx: np.asarray(idx, np.int64) + start  # noqa: E731
    collapsed = Graph(name=f"{graph.name}-collapsed", indptr=merged.indptr, indices=merged.indices,
                      features=features, labels=labels, train_idx=shift(graph.train_idx),
                      val_idx=shift(graph.val_idx), test_idx=shift(graph.test_idx), num_classes=graph.num_classes,
                      notes=[f"{graph.name} with its {len(graph.num_nodes)} vertex types and "
                             f"{len(graph.relations)} relations collapsed into one (types ignored)"],
                      metric=graph.metric)
    return collapsed.validate(collapsed.name)
