"""Graphs from and to PyTorch Geometric and DGL (torch, PyG and DGL imported when a conversion is called):
``from_pyg``/``to_pyg``, ``from_dgl``/``to_dgl`` and ``pyg:NAME@ROOT`` specs for a ``Graph``, cleaned by
``Graph.from_arrays``; their ``_hetero`` forms for a ``TypedGraph``, its relations kept as given. Masks with a
column per split take ``split_index``. Link splits: ``interop_links.py``."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from neutronorch.data.arrays import _array, feature_rows
from neutronorch.data.dtypes import as_int64, is_bfloat16
from neutronorch.data.graph import Graph
from neutronorch.data.interop_times import DGL_TIME_KEYS, dgl_time, put_dgl_times, put_pyg_times, pyg_times
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.data.times import time_array
from neutronorch.data.typed import Relation, TypedGraph, relation_label
from neutronorch.errors import DataError

# Short names of PyG datasets that ``pyg:NAME@ROOT`` accepts, as (class, name argument or None). Any
# ``Class`` or ``Class/name`` of torch_geometric.datasets works too.
PYG_NAMES = {
    **{n.lower(): ("Planetoid", n) for n in ("Cora", "CiteSeer", "PubMed")},
    **{n.lower(): ("HeterophilousGraphDataset", n)
       for n in ("Roman-empire", "Amazon-ratings", "Minesweeper", "Tolokers", "Questions")},
    "amazon-computers": ("Amazon", "Computers"), "amazon-photo": ("Amazon", "Photo"),
    "coauthor-cs": ("Coauthor", "CS"), "coauthor-physics": ("Coauthor", "Physics"),
    "wikics": ("WikiCS", None), "reddit": ("Reddit", None), "flickr": ("Flickr", None), "yelp": ("Yelp", None),
}
# What installs each optional library.
INSTALL = {"dgl": "DGL: pip install dgl",
           "torch_geometric": "PyTorch Geometric: pip install torch-geometric (its NeighborLoader's sampler "
                              "backends, pyg-lib or torch-sparse, are not needed)"}
# Each split's boolean mask as PyG and DGL name it (the first name is the one written).
MASKS = {"train_idx": ("train_mask",), "val_idx": ("val_mask", "valid_mask"), "test_idx": ("test_mask",)}


def from_pyg(data, name: str = "pyg", split_index: int = 0, **options) -> Graph:
    """A ``torch_geometric.data.Data`` (``x``, ``y``, ``edge_index``, optional split masks and times:
    ``interop_times.pyg_times``) as a graph; ``options`` go to ``Graph.from_arrays``."""
    if getattr(data, "node_types", None) and getattr(data, "edge_types", None) and len(data.node_types) > 1:
        raise DataError(f"{name}: a HeteroData (types {', '.join(map(str, data.node_types))}); read it with "
                        f"neutronorch.data.from_pyg_hetero(data, target=...).")
    for key in ("x", "y", "edge_index"):
        if getattr(data, key, None) is None:
            raise DataError(f"{name}: the PyG data has no `{key}`; neutronorch trains on node features (x), "
                            f"node labels (y) and edges (edge_index).")
    edge_index = data.edge_index
    splits = _masks(lambda key: getattr(data, key, None), name, split_index)
    times = pyg_times(data, int(data.num_nodes), int(edge_index.shape[1]), name)
    return Graph.from_arrays(edge_index[0], edge_index[1], data.x, data.y, splits, name=name,
                             num_nodes=int(data.num_nodes), **times, **options)


def to_pyg(graph: Graph):
    """The graph as a ``torch_geometric.data.Data`` (x, y, edge_index source-to-target, split masks)."""
    data, torch = _exporter(graph, "to_pyg", "torch_geometric.data")
    out = data.Data(x=_float32(graph.features, torch), edge_index=torch.from_numpy(np.stack(_edges(graph))),
                    num_nodes=graph.num_nodes)
    _put_target(graph, out, "y", torch)
    put_pyg_times(graph, out, torch)
    return out


def from_dgl(g, name: str = "dgl", split_index: int = 0, **options) -> Graph:
    """A ``dgl.DGLGraph`` with node data ``feat``, ``label``, optional split masks and times (``timestamp`` or
    ``time`` in ``edata`` and ``ndata``) as a graph; ``options`` go to ``Graph.from_arrays``."""
    if not (hasattr(g, "ndata") and hasattr(g, "edges")):
        raise DataError(f"{name}: from_dgl reads a dgl.DGLGraph, not a {type(g).__name__}.")
    nodes = g.ndata
    features = next((nodes[k] for k in ("feat", "features", "x") if k in nodes), None)
    labels = next((nodes[k] for k in ("label", "labels", "y") if k in nodes), None)
    if features is None or labels is None:
        raise DataError(f"{name}: the DGL graph needs node data `feat` and `label` (it holds "
                        f"{sorted(nodes.keys())}).")
    src, dst = g.edges(order="eid")
    splits = _masks(lambda key: nodes[key] if key in nodes else None, name, split_index)
    times = {"edge_time": dgl_time(g.edata, name, "edata"), "node_time": dgl_time(nodes, name, "ndata")}
    return Graph.from_arrays(src, dst, features, labels, splits, name=name, num_nodes=int(g.num_nodes()),
                             **{key: value for key, value in times.items() if value is not None}, **options)


def to_dgl(graph: Graph):
    """The graph as a ``dgl.DGLGraph`` with node data feat, label and the split masks."""
    dgl, torch = _exporter(graph, "to_dgl", "dgl")
    g = dgl.graph(tuple(map(torch.from_numpy, _edges(graph))), num_nodes=graph.num_nodes)
    g.ndata["feat"] = _float32(graph.features, torch)
    _put_target(graph, g.ndata, "label", torch)
    put_dgl_times(graph, g, torch)
    return g


def load_pyg_dataset(spec: str, split_index: int = 0) -> Graph:
    """``NAME@ROOT``: a PyG dataset already downloaded under ROOT (never downloaded here). NAME is a short
    name of ``PYG_NAMES`` or ``Class`` / ``Class/name`` of ``torch_geometric.datasets``."""
    name, _, root = spec.partition("@")
    if not name or not root:
        raise DataError(f"pyg:{spec}: give pyg:NAME@ROOT, e.g. pyg:Cora@~/data/pyg (the folder PyG downloaded "
                        f"the dataset into).")
    datasets = optional("torch_geometric.datasets", "pyg:NAME@ROOT datasets")
    class_name, argument = PYG_NAMES.get(name.lower(), tuple(name.split("/", 1)) if "/" in name else (name, None))
    base = getattr(datasets, class_name, None)
    if base is None:
        raise DataError(f"pyg:{spec}: torch_geometric.datasets has no {class_name}; use one of "
                        f"{', '.join(sorted(PYG_NAMES))} or a class of torch_geometric.datasets.")
    root_path = Path(root).expanduser()
    if not root_path.is_dir():
        raise DataError(f"pyg:{spec}: {root_path} is not a folder; give the root PyG downloaded the dataset into.")

    class Local(base):  # never downloads: a missing file is the user's to fetch
        def download(self):
            raise DataError(f"pyg:{spec}: {class_name}{'/' + argument if argument else ''} is not downloaded under "
                            f"{root_path} ({self.raw_dir} lacks {', '.join(map(str, self.raw_file_names))}). "
                            f"Download it with PyG first, or give the folder it is in.")

    Local.__name__ = base.__name__  # PyG keys its processed files by class name
    try:
        dataset = Local(str(root_path), argument) if argument else Local(str(root_path))
    except ImportError as exc:  # PyG reads some raw formats with other libraries (Planetoid: scipy)
        raise DataError(f"pyg:{spec}: PyG needs {exc.name} to read this dataset: pip install {exc.name}") from None
    if len(dataset) != 1:
        raise DataError(f"pyg:{spec}: holds {len(dataset)} graphs; neutronorch trains on one graph.")
    graph = from_pyg(dataset[0], name=(argument or class_name).lower(), split_index=split_index)
    if class_name == "HeterophilousGraphDataset" and graph.num_classes == 2:
        graph.metric = "rocauc"  # as their literature scores the binary ones
    return graph


def _masks(get, name: str, split_index: int) -> tuple | None:
    found = {}
    for part, keys in MASKS.items():
        mask = next((m for m in map(get, keys) if m is not None), None)
        if mask is None:
            return None  # no stored split: drawn by `split`
        mask = np.asarray(mask.detach().cpu().numpy() if hasattr(mask, "detach") else mask)
        if mask.ndim == 2:  # one column per stored split
            if not 0 <= split_index < mask.shape[1]:
                raise DataError(f"{name}: `split_index` {split_index} is out of range; {mask.shape[1]} splits "
                                f"are stored (0..{mask.shape[1] - 1}).")
            mask = mask[:, split_index]
        elif split_index:
            raise DataError(f"{name}: stores a single split, so `split_index` {split_index} has nothing to pick.")
        found[part.removesuffix("_idx")] = mask.astype(bool)
    return found


def _pairs(value, what: str) -> np.ndarray:
    pairs = as_int64(_array(value, what), what, "vertex ids")
    if pairs.ndim != 2 or pairs.shape[0] != 2:
        raise DataError(f"{what} has shape {tuple(pairs.shape)}, expected (2, E): a row of sources over a row "
                        f"of targets.")
    return np.ascontiguousarray(pairs)


def _edges(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    return Relation(graph.indptr, graph.indices).edges()


def _exporter(graph, what: str, module: str):
    """The library ``module`` and torch, for the exporter ``what`` of ``graph``: a ``Graph`` (``to_pyg``,
    ``to_dgl``) or a ``TypedGraph`` (their ``_hetero`` forms), else a ``DataError`` naming the one that
    exports it."""
    typed = what.endswith("_hetero")
    want, other = (TypedGraph, Graph) if typed else (Graph, TypedGraph)
    if not isinstance(graph, want):
        partner = what.removesuffix("_hetero") if typed else f"{what}_hetero"
        hint = f"; {partner} exports a {other.__name__}" if isinstance(graph, other) else ""
        raise DataError(f"{what}: expected a neutronorch {want.__name__}, not a {type(graph).__name__}{hint}.")
    library = optional(module, what)
    import torch  # noqa: PLC0415 - torch is there when PyG or DGL is

    return library, torch


def optional(module: str, what: str, error: type[Exception] = DataError):
    """An optional library's ``module``, else ``error`` saying that ``what`` needs it and how to install it.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise error(f"{what} needs {INSTALL[module.partition('.')[0]]}") from None


_MASK_KEYS = tuple(key for keys in MASKS.values() for key in keys)
# Where each library keeps a type's features and the target's labels, first the name it writes.
_PYG = {"features": ("x",), "labels": ("y",), "holder": "HeteroData"}
_DGL = {"features": ("feat", "x"), "labels": ("label", "y"), "holder": "DGL graph"}
_DGL_EDGE_FEATURES = ("feat", "w", "weight")  # a 1-D `w` or `weight`: one weight per edge


def to_pyg_hetero(graph: TypedGraph):
    """The graph as a ``HeteroData``: per type ``num_nodes`` and ``x`` (float32), per relation ``edge_index``
    and ``edge_attr``, and on the target ``y`` and the split masks."""
    pyg_data, torch = _exporter(graph, "to_pyg_hetero", "torch_geometric.data")
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
        if relation.edge_time is not None:
            data[key].edge_time = torch.from_numpy(np.asarray(relation.edge_time))
    for node_type, times in graph.node_time.items():
        data[node_type].time = torch.from_numpy(np.asarray(times))
    _put_target(graph, data[graph.target], "y", torch)
    return data


def to_dgl_hetero(graph: TypedGraph):
    """The graph as a DGL heterograph: per type its count and ``feat`` (float32), per relation a canonical
    edge type with its edges in CSC order and their ``feat``, and on the target ``label`` and the split masks.
    """
    dgl, torch = _exporter(graph, "to_dgl_hetero", "dgl")
    edges = {key: tuple(map(torch.from_numpy, relation.edges())) for key, relation in graph.relations.items()}
    g = dgl.heterograph(edges, num_nodes_dict={t: int(count) for t, count in graph.num_nodes.items()})
    for node_type, rows in graph.features.items():
        g.nodes[node_type].data["feat"] = _float32(rows, torch)
    for key, relation in graph.relations.items():
        if relation.edge_features is not None:
            g.edges[key].data["feat"] = _float32(relation.edge_features, torch)
        if relation.edge_time is not None:
            g.edges[key].data[DGL_TIME_KEYS[0]] = torch.from_numpy(np.asarray(relation.edge_time))
    for node_type, times in graph.node_time.items():
        g.nodes[node_type].data[DGL_TIME_KEYS[0]] = torch.from_numpy(np.asarray(times))
    _put_target(graph, g.nodes[graph.target].data, "label", torch)
    return g


def from_pyg_hetero(data, target: str, name: str = "pyg", num_classes: int | None = None,
                    split: str | None = None, seed: int = 0) -> TypedGraph:
    """A validated typed graph from a ``HeteroData``: node types with ``num_nodes`` and ``x``, edge types'
    ``edge_index`` (and ``edge_attr``), and ``y`` with the split masks on ``target``. Repeated edges are kept.
    ``num_classes`` defaults to the largest label plus one (multi-label: its width). Without masks the
    labelled vertices are split by ``split`` (default ``DEFAULT_SPLIT``, seeded by ``seed``)."""
    node_types = list(data.node_types)
    num_nodes = {t: _count(data, t, name) for t in node_types}
    edges = {}
    for key in data.edge_types:
        store = data[key]
        if "edge_index" not in store:
            raise DataError(f"{name}: relation {relation_label(key)} has no edge_index.")
        edge_index = _pairs(store.edge_index, f"{name}: relation {relation_label(key)}: edge_index")
        times = pyg_times(store, -1, edge_index.shape[1], name, f": relation {relation_label(key)}")
        edges[tuple(key)] = (edge_index[0], edge_index[1], _numpy(store.edge_attr) if "edge_attr" in store else None,
                             times.get("edge_time"))
    node_time = {t: times["node_time"] for t in node_types
                 if (times := pyg_times(data[t], num_nodes[t], -1, name, f": type {t}"))}
    return _typed_graph(name, num_nodes, {t: data[t] for t in node_types}, edges, target, _PYG, num_classes,
                        split, seed, node_time)


def from_dgl_hetero(g, target: str, name: str = "dgl", num_classes: int | None = None,
                    split: str | None = None, seed: int = 0) -> TypedGraph:
    """``from_pyg_hetero`` of a DGL heterograph: ``feat`` (or ``x``) per node type, each canonical edge type's
    edges (and ``feat``, or a 1-D ``w``/``weight``), and ``label`` (or ``y``) with the split masks on
    ``target``."""
    node_types = list(g.ntypes)
    edges = {}
    for key in g.canonical_etypes:
        stored = g.edges[key].data
        weights = next((stored[k] for k in _DGL_EDGE_FEATURES if k in stored), None)
        src, dst = g.edges(etype=key, order="eid")
        edges[tuple(key)] = (_numpy(src), _numpy(dst), None if weights is None else _numpy(weights),
                             dgl_time(stored, name, f"relation {relation_label(key)}'s edata"))
    node_time = {t: times for t in node_types if (times := dgl_time(g.nodes[t].data, name, f"type {t}'s ndata"))
                 is not None}
    return _typed_graph(name, {t: int(g.num_nodes(t)) for t in node_types}, {t: g.nodes[t].data for t in node_types},
                        edges, target, _DGL, num_classes, split, seed, node_time)


def _float32(rows: np.ndarray, torch):
    return torch.from_numpy(np.asarray(rows, dtype=np.float32))


def _put_target(graph: Graph | TypedGraph, store, label_key: str, torch) -> None:
    """The (target's) labels under ``label_key``, when there are some, and a boolean mask per split."""
    if graph.labels is not None:
        store[label_key] = torch.from_numpy(np.asarray(graph.labels, np.int64 if graph.labels.ndim == 1 else None))
    count = graph.num_nodes[graph.target] if isinstance(graph, TypedGraph) else graph.num_nodes
    for split, (name, *_) in MASKS.items():
        mask = np.zeros(count, dtype=bool)
        mask[np.asarray(getattr(graph, split))] = True
        store[name] = torch.from_numpy(mask)


def _typed_graph(name: str, num_nodes: dict[str, int], stores: dict, edges: dict, target: str, keys: dict,
                 num_classes: int | None, split: str | None, seed: int, node_time: dict) -> TypedGraph:
    """The validated typed graph of either library's parts: ``stores`` maps each type to its node data,
    ``edges`` each relation to its (sources, destinations, edge features or None, edge times or None),
    ``node_time`` the timed types' vertex times. Only ``target`` may carry labels or split masks."""
    if target not in stores:
        raise DataError(f"{name}: no target type: {target!r} is not a node type of the {keys['holder']} "
                        f"({', '.join(stores)}). Name the type whose labels are predicted.")
    for node_type, store in stores.items():
        stray = [key for key in (*keys["labels"], *_MASK_KEYS) if node_type != target and key in store]
        if stray:
            raise DataError(f"{name}: type {node_type} carries {', '.join(stray)}, but the target is {target}; a "
                            f"typed graph has labels and a split on its target type only. Pass target="
                            f"{node_type!r}, or move them.")
    features = {}
    for node_type, store in stores.items():
        key = next((k for k in keys["features"] if k in store), None)
        if key is not None:
            features[node_type] = feature_rows(_numpy(store[key]), f"{name}: type {node_type}: {key}")
    relations = {key: Relation.from_edges(src, dst, num_nodes[key[0]], num_nodes[key[2]], edge_features,
                                          source=f"{name}: relation {relation_label(key)}", edge_time=times)
                 for key, (src, dst, edge_features, times) in edges.items()}
    node_time = {t: time_array(times, num_nodes[t], f"type {t}: vertex times", name) for t, times in node_time.items()}
    labels, classes = _labels(stores[target], target, name, num_classes, keys["labels"])
    splits, notes = _splits(stores[target], labels, classes, split, seed)
    graph = TypedGraph(name=name, num_nodes=num_nodes, relations=relations, features=features, target=target,
                       labels=labels, num_classes=classes, notes=notes, node_time=node_time, **splits)
    graph.drop_unlabelled_from_splits()
    return graph.validate(name)


def _numpy(tensor) -> np.ndarray:
    """A tensor (or array) as numpy; bfloat16 as float32."""
    array = _array(tensor, "a tensor")
    return array.astype(np.float32) if is_bfloat16(array) else array


def _count(data, node_type: str, name: str) -> int:
    count = data[node_type].num_nodes
    if count is None:
        raise DataError(f"{name}: type {node_type} has no num_nodes (nor x to infer it from); set "
                        f"data[{node_type!r}].num_nodes.")
    return int(count)


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
        spec = split or DEFAULT_SPLIT
        drawn = make_split(labels[labelled], num_classes, spec, seed)
        return ({part: labelled[idx] for part, idx in zip(MASKS, drawn)},
                [f"no stored split: labelled vertices split by {spec} (seed {seed})"])
    return {part: np.flatnonzero(_numpy(mask).astype(bool)) for part, mask in masks.items()}, []
