"""Typed graphs from and to PyTorch Geometric's ``HeteroData``, when PyG is installed (it is needed nowhere
else): ``to_pyg_hetero`` and ``from_pyg_hetero``.

PyG keeps a relation as ``edge_index`` (2, E), sources in row 0 and destinations in row 1, with ``edge_attr``
rows in the same order; a typed graph keeps it as a CSC over the destination type. Labels and split masks
live on the target type. torch and PyG are imported when a conversion is called, never at import time.
"""

from __future__ import annotations

import numpy as np

from neutronorch.data.interop import _require
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.data.typed import Relation, TypedGraph, relation_label
from neutronorch.errors import DataError

_MASKS = {"train_idx": ("train_mask",), "val_idx": ("val_mask", "valid_mask"), "test_idx": ("test_mask",)}
_TARGET_KEYS = ("y", *(key for keys in _MASKS.values() for key in keys))


def to_pyg_hetero(graph: TypedGraph):
    """The graph as a ``torch_geometric.data.HeteroData``: per type ``num_nodes`` and ``x`` (float32; none
    for a type without features), per relation ``edge_index`` (source to destination, int64) and
    ``edge_attr``, and on the target type ``y`` and ``train_mask``/``val_mask``/``test_mask``."""
    pyg_data = _require("torch_geometric.data", "to_pyg_hetero")
    import torch  # noqa: PLC0415 - torch is there when PyG is

    data = pyg_data.HeteroData()
    for node_type, count in graph.num_nodes.items():
        data[node_type].num_nodes = int(count)
        if node_type in graph.features:
            data[node_type].x = torch.from_numpy(np.asarray(graph.features[node_type], dtype=np.float32))
    for key, relation in graph.relations.items():
        src, dst = relation.edges()
        data[key].edge_index = torch.from_numpy(np.stack([src, dst]))
        if relation.edge_features is not None:
            data[key].edge_attr = torch.from_numpy(np.asarray(relation.edge_features, dtype=np.float32))
    target = data[graph.target]
    target.y = torch.from_numpy(np.asarray(graph.labels, dtype=np.int64))
    for split, (mask_name, *_) in _MASKS.items():
        mask = np.zeros(graph.num_nodes[graph.target], dtype=bool)
        mask[np.asarray(getattr(graph, split))] = True
        target[mask_name] = torch.from_numpy(mask)
    return data


def from_pyg_hetero(data, target: str, name: str = "pyg", num_classes: int | None = None,
                    split: str | None = None, seed: int = 0) -> TypedGraph:
    """A validated typed graph from a ``HeteroData``: the node types with their ``num_nodes`` and ``x``, every
    edge type's ``edge_index`` (and ``edge_attr``), and ``y`` with the split masks on ``target``.

    Repeated edges are kept. ``num_classes`` defaults to the largest label plus one (a multi-label ``y``: its
    width). Without masks, the labelled vertices are split by ``split`` (default ``ratio:0.6,0.2``, seeded by
    ``seed``); vertices without a label (-1) are left out of the stored masks, with a note."""
    node_types = list(data.node_types)
    if target not in node_types:
        raise DataError(f"{name}: no target type: {target!r} is not a node type of the HeteroData "
                        f"({', '.join(node_types)}). Name the type whose labels are predicted.")
    for node_type in node_types:
        stray = [key for key in _TARGET_KEYS if node_type != target and key in data[node_type]]
        if stray:
            raise DataError(f"{name}: type {node_type} carries {', '.join(stray)}, but the target is {target}; a "
                            f"typed graph has labels and a split on its target type only. Pass target="
                            f"{node_type!r}, or move them.")
    num_nodes = {t: _count(data, t, name) for t in node_types}
    features = {t: _features(_numpy(data[t].x), t, name) for t in node_types if "x" in data[t]}
    relations = {}
    for key in data.edge_types:
        store = data[key]
        if "edge_index" not in store:
            raise DataError(f"{name}: relation {relation_label(key)} has no edge_index.")
        edge_index = _numpy(store.edge_index)
        if edge_index.ndim != 2 or edge_index.shape[0] != 2:
            raise DataError(f"{name}: relation {relation_label(key)}: edge_index has shape {edge_index.shape}, "
                            f"expected (2, edges).")
        edge_attr = _numpy(store.edge_attr) if "edge_attr" in store else None
        relations[tuple(key)] = Relation.from_edges(edge_index[0], edge_index[1], num_nodes[key[0]],
                                                    num_nodes[key[2]], edge_attr,
                                                    source=f"{name}: relation {relation_label(key)}")
    labels, classes = _labels(data[target], target, name, num_classes)
    splits, notes = _splits(data[target], labels, classes, split, seed)
    graph = TypedGraph(name=name, num_nodes=num_nodes, relations=relations, features=features, target=target,
                       labels=labels, num_classes=classes, notes=notes, **splits)
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


def _features(x: np.ndarray, node_type: str, name: str) -> np.ndarray:
    if x.ndim != 2 or x.dtype.kind not in "fiub":
        raise DataError(f"{name}: type {node_type}: x has dtype {x.dtype} and shape {x.shape}, expected a 2-D "
                        f"array of real numbers (a row per vertex).")
    return x if x.dtype.name in ("float32", "float16") else x.astype(np.float32)


def _labels(store, target: str, name: str, num_classes: int | None) -> tuple[np.ndarray, int]:
    if "y" not in store:
        raise DataError(f"{name}: the target type {target} has no y; give its labels (a class id per vertex, "
                        f"-1 for none).")
    labels = _numpy(store.y)
    if labels.dtype.kind not in "iu":
        raise DataError(f"{name}: type {target}: y has dtype {labels.dtype}, expected integer class ids.")
    labels = labels.astype(np.int64, copy=False)
    if num_classes is None:
        num_classes = int(labels.shape[1]) if labels.ndim == 2 else int(labels.max(initial=-1)) + 1
    return labels, num_classes


def _splits(store, labels: np.ndarray, num_classes: int, split: str | None, seed: int):
    """The target's splits from its masks, or drawn over its labelled vertices; and what was done, as notes."""
    known = (labels >= 0).any(axis=1) if labels.ndim == 2 else labels >= 0
    masks = {part: next((store[k] for k in keys if k in store), None) for part, keys in _MASKS.items()}
    missing = [keys[0] for part, keys in _MASKS.items() if masks[part] is None]
    if missing and len(missing) < len(masks):
        raise DataError(f"the target type has no {', '.join(missing)}, but other split masks; give all three "
                        f"masks, or none to have the split drawn.")
    if missing:
        labelled = np.flatnonzero(known)
        drawn = make_split(labels[labelled], num_classes, split or DEFAULT_SPLIT, seed)
        spec = split or DEFAULT_SPLIT
        return ({part: labelled[idx] for part, idx in zip(_MASKS, drawn)},
                [f"no stored split: labelled vertices split by {spec} (seed {seed})"])
    splits, dropped = {}, []
    for part, mask in masks.items():
        idx = np.flatnonzero(_numpy(mask).astype(bool))
        keep = known[idx]
        if not keep.all():
            dropped.append(f"{int((~keep).sum()):,} from {part.removesuffix('_idx')}")
        splits[part] = idx[keep]
    notes = [f"vertices without a label left out of the splits: {', '.join(dropped)}"] if dropped else []
    return splits, notes
