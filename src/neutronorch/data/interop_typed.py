"""Typed graphs from and to PyTorch Geometric's ``HeteroData`` and DGL's heterographs, when those libraries are
installed (they are needed nowhere else): ``to_pyg_hetero``/``from_pyg_hetero`` and
``to_dgl_hetero``/``from_dgl_hetero``.

PyG keeps a relation as ``edge_index`` (2, E), sources in row 0 and destinations in row 1, with ``edge_attr``
rows in the same order; DGL as a canonical edge type ``(src, name, dst)`` with its edges' endpoints and edge
data (``feat``) in edge-id order; a typed graph keeps it as a CSC over the destination type. Labels and split
masks live on the target type. torch, PyG and DGL are imported when a conversion is called, never at import
time.
"""

from __future__ import annotations

import numpy as np

from neutronorch.data.interop import MASKS, _require, check_exported, split_masks
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.data.typed import Relation, TypedGraph, relation_label
from neutronorch.errors import DataError

_MASK_KEYS = tuple(key for keys in MASKS.values() for key in keys)
# Where each library keeps a type's features and the target's labels, first the name it writes.
_PYG = {"features": ("x",), "labels": ("y",), "holder": "HeteroData"}
_DGL = {"features": ("feat", "x"), "labels": ("label", "y"), "holder": "DGL graph"}
_DGL_EDGE_FEATURES = ("feat", "w", "weight")  # a 1-D `w` or `weight`: one weight per edge


def to_pyg_hetero(graph: TypedGraph):
    """The graph as a ``torch_geometric.data.HeteroData``: per type ``num_nodes`` and ``x`` (float32; none
    for a type without features), per relation ``edge_index`` (source to destination, int64) and
    ``edge_attr``, and on the target type ``y`` and ``train_mask``/``val_mask``/``test_mask``."""
    check_exported(graph, "to_pyg_hetero", typed=True)
    pyg_data = _require("torch_geometric.data", "to_pyg_hetero")
    import torch  # noqa: PLC0415 - torch is there when PyG is

    data = pyg_data.HeteroData()
    for node_type, count in graph.num_nodes.items():
        data[node_type].num_nodes = int(count)
    for node_type, rows in graph.features.items():
        data[node_type].x = _float32(rows, torch)
    for key, relation in graph.relations.items():
        src, dst = relation.edges()
        data[key].edge_index = torch.from_numpy(np.stack([src, dst]))
        if relation.edge_features is not None:
            data[key].edge_attr = _float32(relation.edge_features, torch)
    _put_target(graph, data[graph.target], "y", torch)
    return data


def to_dgl_hetero(graph: TypedGraph):
    """The graph as a DGL heterograph: every type with its vertex count, ``feat`` (float32; none for a type
    without features), every relation a canonical edge type ``(src, name, dst)`` with its edges in CSC order
    and their ``feat``, and on the target type ``label`` and ``train_mask``/``val_mask``/``test_mask``. DGL
    lists types and relations in name order."""
    check_exported(graph, "to_dgl_hetero", typed=True)
    dgl = _require("dgl", "to_dgl_hetero")
    import torch  # noqa: PLC0415 - torch is there when DGL is

    edges = {key: tuple(map(torch.from_numpy, relation.edges())) for key, relation in graph.relations.items()}
    g = dgl.heterograph(edges, num_nodes_dict={t: int(count) for t, count in graph.num_nodes.items()})
    for node_type, rows in graph.features.items():
        g.nodes[node_type].data["feat"] = _float32(rows, torch)
    for key, relation in graph.relations.items():
        if relation.edge_features is not None:
            g.edges[key].data["feat"] = _float32(relation.edge_features, torch)
    _put_target(graph, g.nodes[graph.target].data, "label", torch)
    return g


def from_pyg_hetero(data, target: str, name: str = "pyg", num_classes: int | None = None,
                    split: str | None = None, seed: int = 0) -> TypedGraph:
    """A validated typed graph from a ``HeteroData``: the node types with their ``num_nodes`` and ``x``, every
    edge type's ``edge_index`` (and ``edge_attr``), and ``y`` with the split masks on ``target``.

    Repeated edges are kept. ``num_classes`` defaults to the largest label plus one (a multi-label ``y``: its
    width). Without masks, the labelled vertices are split by ``split`` (default ``ratio:0.6,0.2``, seeded by
    ``seed``); vertices without a label (-1) are left out of the stored masks, with a note."""
    node_types = list(data.node_types)
    _check_target(node_types, lambda t: data[t], target, name, _PYG)
    num_nodes = {t: _count(data, t, name) for t in node_types}
    edges = {}
    for key in data.edge_types:
        store = data[key]
        if "edge_index" not in store:
            raise DataError(f"{name}: relation {relation_label(key)} has no edge_index.")
        edge_index = _numpy(store.edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise DataError(f"{name}: relation {relation_label(key)}: edge_index has shape {edge_index.shape}, "
                            f"expected (2, edges).")
        edges[tuple(key)] = (edge_index[0], edge_index[1], _numpy(store.edge_attr) if "edge_attr" in store else None)
    return _typed_graph(name, num_nodes, {t: data[t] for t in node_types}, edges, target, _PYG, num_classes,
                        split, seed)


def from_dgl_hetero(g, target: str, name: str = "dgl", num_classes: int | None = None,
                    split: str | None = None, seed: int = 0) -> TypedGraph:
    """A validated typed graph from a DGL heterograph: every node type with its count and ``feat`` (or ``x``),
    every canonical edge type's edges (and ``feat``, or a 1-D ``w``/``weight``: one weight per edge), and
    ``label`` (or ``y``) with ``train_mask``/``val_mask``/``test_mask`` on ``target``.

    As ``from_pyg_hetero``: repeated edges are kept, ``num_classes`` defaults to the largest label plus one
    (a multi-label ``label``: its width), and without masks the labelled vertices are split by ``split``
    (default ``ratio:0.6,0.2``, seeded by ``seed``)."""
    node_types = list(g.ntypes)
    _check_target(node_types, lambda t: g.nodes[t].data, target, name, _DGL)
    edges = {}
    for key in g.canonical_etypes:
        stored = g.edges[key].data
        weights = next((stored[k] for k in _DGL_EDGE_FEATURES if k in stored), None)
        src, dst = g.edges(etype=key, order="eid")
        edges[tuple(key)] = (_numpy(src), _numpy(dst), None if weights is None else _numpy(weights))
    return _typed_graph(name, {t: int(g.num_nodes(t)) for t in node_types}, {t: g.nodes[t].data for t in node_types},
                        edges, target, _DGL, num_classes, split, seed)


def _float32(rows: np.ndarray, torch):
    return torch.from_numpy(np.asarray(rows, dtype=np.float32))


def _put_target(graph: TypedGraph, store, label_key: str, torch) -> None:
    """The target's labels under ``label_key`` (when it has some) and one boolean mask per split."""
    if graph.labels is not None:
        store[label_key] = torch.from_numpy(np.asarray(graph.labels, dtype=np.int64))
    for mask_name, mask in split_masks(graph, graph.num_nodes[graph.target]):
        store[mask_name] = torch.from_numpy(mask)


def _check_target(node_types: list[str], store_of, target: str, name: str, keys: dict) -> None:
    """``target`` is a node type, and no other type carries labels or split masks."""
    if target not in node_types:
        raise DataError(f"{name}: no target type: {target!r} is not a node type of the {keys['holder']} "
                        f"({', '.join(node_types)}). Name the type whose labels are predicted.")
    for node_type in node_types:
        store = store_of(node_type)
        stray = [key for key in (*keys["labels"], *_MASK_KEYS) if node_type != target and key in store]
        if stray:
            raise DataError(f"{name}: type {node_type} carries {', '.join(stray)}, but the target is {target}; a "
                            f"typed graph has labels and a split on its target type only. Pass target="
                            f"{node_type!r}, or move them.")


def _typed_graph(name: str, num_nodes: dict[str, int], stores: dict, edges: dict, target: str, keys: dict,
                 num_classes: int | None, split: str | None, seed: int) -> TypedGraph:
    """The validated typed graph of either library's parts: ``stores`` maps each type to its node data,
    ``edges`` each relation to its (sources, destinations, edge features or None)."""
    features = {}
    for node_type, store in stores.items():
        key = next((k for k in keys["features"] if k in store), None)
        if key is not None:
            features[node_type] = _features(_numpy(store[key]), node_type, name, key)
    relations = {key: Relation.from_edges(src, dst, num_nodes[key[0]], num_nodes[key[2]], edge_features,
                                          source=f"{name}: relation {relation_label(key)}")
                 for key, (src, dst, edge_features) in edges.items()}
    labels, classes = _labels(stores[target], target, name, num_classes, keys["labels"])
    splits, notes = _splits(stores[target], labels, classes, split, seed)
    graph = TypedGraph(name=name, num_nodes=num_nodes, relations=relations, features=features, target=target,
                       labels=labels, num_classes=classes, notes=notes, **splits)
    graph.drop_unlabelled_from_splits()
    graph.validate(name)
    return graph


def _numpy(tensor) -> np.ndarray:
    """A tensor (or array) as numpy; bfloat16, which numpy lacks, as float32."""
    if hasattr(tensor, "detach"):
        tensor = tensor.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(tensor)


def _count(data, node_type: str, name: str) -> int:
    count = data[node_type].num_nodes
    if count is None:
        raise DataError(f"{name}: type {node_type} has no num_nodes (nor x to infer it from); set "
                        f"data[{node_type!r}].num_nodes.")
    return int(count)


def _features(x: np.ndarray, node_type: str, name: str, key: str) -> np.ndarray:
    if x.ndim != 2 or x.dtype.kind not in "fiub":
        raise DataError(f"{name}: type {node_type}: {key} has dtype {x.dtype} and shape {x.shape}, expected a "
                        f"2-D array of real numbers (a row per vertex).")
    return x if x.dtype.name in ("float32", "float16") else x.astype(np.float32)


def _labels(store, target: str, name: str, num_classes: int | None, keys: tuple[str, ...]) -> tuple[np.ndarray, int]:
    key = next((k for k in keys if k in store), None)
    if key is None:
        raise DataError(f"{name}: the target type {target} has no {' or '.join(keys)}; give its labels (a class "
                        f"id per vertex, -1 for none).")
    labels = _numpy(store[key])
    if labels.dtype.kind not in "iu":
        raise DataError(f"{name}: type {target}: {key} has dtype {labels.dtype}, expected integer class ids.")
    labels = labels.astype(np.int64, copy=False)
    if num_classes is None:
        num_classes = int(labels.shape[1]) if labels.ndim == 2 else int(labels.max(initial=-1)) + 1
    return labels, num_classes


def _splits(store, labels: np.ndarray, num_classes: int, split: str | None, seed: int):
    """The target's splits from its masks (unlabelled vertices are left out later), or drawn over its labelled
    vertices; and what was done, as notes."""
    masks = {part: next((store[k] for k in keys if k in store), None) for part, keys in MASKS.items()}
    missing = [keys[0] for part, keys in MASKS.items() if masks[part] is None]
    if missing and len(missing) < len(masks):
        raise DataError(f"the target type has no {', '.join(missing)}, but other split masks; give all three "
                        f"masks, or none to have the split drawn.")
    if missing:
        labelled = np.flatnonzero((labels >= 0).any(axis=1) if labels.ndim == 2 else labels >= 0)
        drawn = make_split(labels[labelled], num_classes, split or DEFAULT_SPLIT, seed)
        spec = split or DEFAULT_SPLIT
        return ({part: labelled[idx] for part, idx in zip(MASKS, drawn)},
                [f"no stored split: labelled vertices split by {spec} (seed {seed})"])
    return {part: np.flatnonzero(_numpy(mask).astype(bool)) for part, mask in masks.items()}, []
