"""What ``neutronorch info`` prints: one JSON object per dataset, homogeneous or typed, with the same keys
where they mean the same (name, nodes, edges, classes, the split sizes, device_gib, notes); a typed graph adds
its target, its types and its relations, each relation with the in-degree and edge counts a homogeneous graph
gives for its one edge set."""

from __future__ import annotations

import numpy as np

from neutronorch.data import Graph, TypedGraph, is_typed_dataset, load_dataset, load_typed_dataset
from neutronorch.data.csc import edge_hygiene


def dataset_info(spec: str) -> dict:
    """``info``'s object for the dataset ``spec`` names."""
    if is_typed_dataset(spec):
        return typed_info(load_typed_dataset(spec))
    return graph_info(load_dataset(spec))


def graph_info(graph: Graph) -> dict:
    degrees = graph.in_degrees()
    return {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
            "feature_dim": graph.feature_dim, "feature_dtype": str(graph.features.dtype),
            "classes": graph.num_classes, **_split_sizes(graph), "max_in_degree": int(degrees.max()),
            "mean_in_degree": float(degrees.mean()),
            # Loaders clean edge lists; a native directory is read as written, so say what it holds.
            **edge_hygiene(graph.indptr, graph.indices),
            # What placing it on a GPU takes (docs/gpu.md): CSC topology, and features as float32.
            "device_gib": _device_gib([graph.indptr, graph.indices], graph.num_nodes * graph.feature_dim),
            # A link dataset's supervision edges (an OGB link folder): the sets' sizes and negatives.
            **({"links": graph.links.describe()} if graph.links is not None else {}),
            "notes": graph.notes}


def typed_info(graph: TypedGraph) -> dict:
    """Per type its vertices and feature width (0 and no dtype: none); per relation its edges, edge feature
    width, in-degrees and repeated edges, and within one type its self loops and one-way edges, counted in
    the relation as stored (``edge_hygiene``)."""
    types = {t: {"nodes": int(count), "feature_dim": graph.feature_dim(t),
                 "feature_dtype": str(graph.features[t].dtype) if t in graph.features else None}
             for t, count in graph.num_nodes.items()}
    relations = []
    for (src, name, dst), relation in graph.relations.items():
        degrees = relation.in_degrees()
        relations.append({"src": src, "name": name, "dst": dst, "edges": relation.num_edges,
                          "edge_feature_dim": relation.edge_feature_dim,
                          "max_in_degree": int(degrees.max()) if degrees.size else 0,
                          "mean_in_degree": float(degrees.mean()) if degrees.size else 0.0,
                          **(edge_hygiene(relation.indptr, relation.indices) if src == dst
                             else {"duplicate_edges": _repeated(relation, graph.num_nodes[src])})})
    rows = sum(graph.num_nodes[t] * graph.feature_dim(t) for t in graph.features)
    return {"name": graph.name, "nodes": sum(graph.num_nodes.values()), "edges": graph.num_edges,
            "classes": graph.num_classes, **_split_sizes(graph), "target": graph.target, "node_types": types,
            "relations": relations,
            "device_gib": _device_gib([a for r in graph.relations.values() for a in (r.indptr, r.indices)], rows),
            "metric": graph.metric, "notes": graph.notes}


def _split_sizes(graph: Graph | TypedGraph) -> dict[str, int]:
    return {"train": len(graph.train_idx), "val": len(graph.val_idx), "test": len(graph.test_idx)}


def _device_gib(topology: list[np.ndarray], feature_values: int) -> dict[str, float]:
    """What placing a graph on a GPU takes (docs/gpu.md): its CSC arrays, and its features as float32."""
    return {"topology": round(sum(array.nbytes for array in topology) / 2**30, 4),
            "features": round(feature_values * 4 / 2**30, 4)}


def _repeated(relation, num_src: int) -> int:
    """Edges that repeat an earlier one between the same two vertices (8 bytes an edge, twice)."""
    src, dst = relation.edges()
    pairs = np.sort(dst * num_src + src)  # one key per (src, dst): repeats sit side by side
    return int((pairs[1:] == pairs[:-1]).sum())
