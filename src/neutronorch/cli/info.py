"""What ``neutronorch info`` prints: one JSON object per dataset, homogeneous or typed, with the same keys
where they mean the same; a typed graph adds its target, its types and its relations (a homogeneous graph is
read as its ``TypedGraph.of`` view)."""

from __future__ import annotations


import numpy as np

from neutronorch.data import TypedGraph, is_typed_dataset, load_dataset, load_typed_dataset
from neutronorch.data.csc import edge_hygiene
from neutronorch.data.partition_files import is_partition_dir, partition_summary
from neutronorch.data.times import time_info


def dataset_info(spec: str) -> dict:
    """``info``'s object for the dataset ``spec`` names. Per type its vertices and feature width (0 and no
    dtype: none); per relation its edges, edge feature width, in-degrees and repeated edges, and within one
    type its self loops and one-way edges, counted in the relation as stored (``edge_hygiene``: loaders clean
    edge lists, a native folder is read as written)."""
    if is_partition_dir(spec):
        return partition_summary(spec)
    typed = is_typed_dataset(spec)
    graph = load_typed_dataset(spec) if typed else load_dataset(spec)
    view = graph if typed else TypedGraph.of(graph)
    types = {t: {"nodes": int(count), "feature_dim": view.feature_dim(t),
                 "feature_dtype": str(view.features[t].dtype) if t in view.features else None,
                 **({"node_time": time_info(view.node_time[t])} if t in view.node_time else {})}
             for t, count in view.num_nodes.items()}
    relations = []
    for (src, name, dst), relation in view.relations.items():
        degrees = relation.in_degrees()
        relations.append({"src": src, "name": name, "dst": dst, "edges": relation.num_edges,
                          "edge_feature_dim": relation.edge_feature_dim,
                          **({} if relation.edge_time is None else
                             {"edge_time": time_info(relation.edge_time, relation.indptr)}),
                          "max_in_degree": int(degrees.max()) if degrees.size else 0,
                          "mean_in_degree": float(degrees.mean()) if degrees.size else 0.0,
                          **(edge_hygiene(relation.indptr, relation.indices) if src == dst
                             else {"duplicate_edges": _repeated(relation, view.num_nodes[src])})})
    info = {"name": graph.name, "nodes": sum(view.num_nodes.values()), "edges": view.num_edges}
    if not typed:
        info.update({key: types[view.target][key] for key in ("feature_dim", "feature_dtype", "node_time")
                     if key in types[view.target]})
    info.update({"classes": graph.num_classes, "train": len(graph.train_idx), "val": len(graph.val_idx),
                 "test": len(graph.test_idx)})
    info.update({"target": graph.target, "node_types": types, "relations": relations} if typed else
                {key: value for key, value in relations[0].items()
                 if key not in ("src", "name", "dst", "edges", "edge_feature_dim")})
    # What placing it on a GPU takes (docs/gpu.md): CSC topology, and features as float32.
    topology = sum(a.nbytes for r in view.relations.values() for a in (r.indptr, r.indices))
    features = sum(view.num_nodes[t] * view.feature_dim(t) for t in view.features)
    info["device_gib"] = {"topology": round(topology / 2**30, 4), "features": round(features * 4 / 2**30, 4)}
    if typed:
        info["metric"] = graph.metric
    elif graph.links is not None:  # a link dataset's supervision edges (an OGB link folder): sizes, negatives
        info["links"] = graph.links.describe()
    return {**info, "notes": graph.notes}


def _repeated(relation, num_src: int) -> int:
    """Edges that repeat an earlier one between the same two vertices (8 bytes an edge, twice)."""
    src, dst = relation.edges()
    return relation.num_edges - int(np.unique(dst * num_src + src).size)  # one key per (src, dst)

