"""Graphs from and to PyTorch Geometric and DGL, when those libraries are installed (neither is needed
otherwise): ``from_pyg``/``to_pyg``, ``from_dgl``/``to_dgl``, and ``pyg:NAME@ROOT`` dataset specs.

Conversions go through ``Graph.from_arrays``, so a converted graph is cleaned like any loaded one
(undirected, no self loops or repeated edges; vertices without a label leave the splits). Masks with one column per
split (PyG's heterophilous datasets store 10) take ``split_index``. Link splits (``RandomLinkSplit``'s three
``Data``) go through ``from_pyg_link``/``to_pyg_link`` in ``interop_links.py``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from neutronorch.data.graph import Graph
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
# Each split's boolean mask as PyG and DGL name it (the first name is the one written).
MASKS = {"train_idx": ("train_mask",), "val_idx": ("val_mask", "valid_mask"), "test_idx": ("test_mask",)}


def from_pyg(data, name: str = "pyg", split_index: int = 0, **options) -> Graph:
    """A ``torch_geometric.data.Data`` (``x``, ``y``, ``edge_index`` and, if present, ``train_mask``,
    ``val_mask``, ``test_mask``) as a graph; ``options`` go to ``Graph.from_arrays`` (``undirected``,
    ``split``, ``seed``, ``metric``)."""
    if getattr(data, "node_types", None) and getattr(data, "edge_types", None) and len(data.node_types) > 1:
        raise DataError(f"{name}: a HeteroData (types {', '.join(map(str, data.node_types))}); read it with "
                        f"neutronorch.data.from_pyg_hetero(data, target=...).")
    for key in ("x", "y", "edge_index"):
        if getattr(data, key, None) is None:
            raise DataError(f"{name}: the PyG data has no `{key}`; neutronorch trains on node features (x), "
                            f"node labels (y) and edges (edge_index).")
    edge_index = data.edge_index
    splits = _masks(lambda key: getattr(data, key, None), name, split_index)
    return Graph.from_arrays(edge_index[0], edge_index[1], data.x, data.y, splits, name=name,
                             num_nodes=int(data.num_nodes), **options)


def to_pyg(graph: Graph):
    """The graph as a ``torch_geometric.data.Data`` (x, y, edge_index source-to-target, split masks)."""
    check_exported(graph, "to_pyg")
    data = _require("torch_geometric.data", "to_pyg")
    import torch  # noqa: PLC0415 - torch is there when PyG is

    src, dst = _edges(graph)
    return data.Data(x=torch.from_numpy(np.asarray(graph.features, dtype=np.float32)),
                edge_index=torch.from_numpy(np.stack([src, dst])), y=torch.from_numpy(np.asarray(graph.labels)),
                num_nodes=graph.num_nodes, **{k: torch.from_numpy(m) for k, m in split_masks(graph, graph.num_nodes)})


def from_dgl(g, name: str = "dgl", split_index: int = 0, **options) -> Graph:
    """A ``dgl.DGLGraph`` with node data ``feat`` (or ``features``), ``label`` (or ``labels``) and, if
    present, ``train_mask``, ``val_mask``, ``test_mask``; ``options`` go to ``Graph.from_arrays``."""
    if not (hasattr(g, "ndata") and hasattr(g, "edges")):
        raise DataError(f"{name}: from_dgl reads a dgl.DGLGraph, not a {type(g).__name__}.")
    nodes = g.ndata
    features = next((nodes[k] for k in ("feat", "features", "x") if k in nodes), None)
    labels = next((nodes[k] for k in ("label", "labels", "y") if k in nodes), None)
    if features is None or labels is None:
        raise DataError(f"{name}: the DGL graph needs node data `feat` and `label` (it holds "
                        f"{sorted(nodes.keys())}).")
    src, dst = g.edges()
    splits = _masks(lambda key: nodes[key] if key in nodes else None, name, split_index)
    return Graph.from_arrays(src, dst, features, labels, splits, name=name, num_nodes=int(g.num_nodes()),
                             **options)


def to_dgl(graph: Graph):
    """The graph as a ``dgl.DGLGraph`` with node data feat, label and the split masks."""
    check_exported(graph, "to_dgl")
    dgl = _require("dgl", "to_dgl")
    import torch  # noqa: PLC0415 - torch is there when DGL is

    src, dst = _edges(graph)
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=graph.num_nodes)
    g.ndata["feat"] = torch.from_numpy(np.asarray(graph.features, dtype=np.float32))
    g.ndata["label"] = torch.from_numpy(np.asarray(graph.labels))
    for key, mask in split_masks(graph, graph.num_nodes):
        g.ndata[key] = torch.from_numpy(mask)
    return g


def load_pyg_dataset(spec: str, split_index: int = 0) -> Graph:
    """``NAME@ROOT``: a PyG dataset already downloaded under ROOT (never downloaded here). NAME is a short
    name of ``PYG_NAMES`` or ``Class`` / ``Class/name`` of ``torch_geometric.datasets``."""
    name, _, root = spec.partition("@")
    if not name or not root:
        raise DataError(f"pyg:{spec}: give pyg:NAME@ROOT, e.g. pyg:Cora@~/data/pyg (the folder PyG downloaded "
                        f"the dataset into).")
    datasets = _require("torch_geometric.datasets", "pyg:NAME@ROOT datasets")
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


def _edges(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    dst = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(np.asarray(graph.indptr)))
    return np.asarray(graph.indices, dtype=np.int64), dst


def split_masks(graph, count: int):
    """``(name, mask)`` per split of ``graph`` (a typed graph's: its target's): a boolean mask over ``count``
    vertices, under the name PyG and DGL give it."""
    for split, (name, *_) in MASKS.items():
        mask = np.zeros(count, dtype=bool)
        mask[np.asarray(getattr(graph, split))] = True
        yield name, mask


def check_exported(graph, what: str, typed: bool = False) -> None:
    """``graph`` of the kind ``what`` exports (``to_pyg``, ``to_dgl``: a ``Graph``; their ``_hetero`` forms, with
    ``typed``: a ``TypedGraph``), else a ``DataError`` naming the one that exports it."""
    from neutronorch.data.typed import TypedGraph  # noqa: PLC0415 - it reads this package

    want, other = (TypedGraph, Graph) if typed else (Graph, TypedGraph)
    if isinstance(graph, want):
        return
    partner = what.removesuffix("_hetero") if typed else f"{what}_hetero"
    hint = f"; {partner} exports a {other.__name__}" if isinstance(graph, other) else ""
    raise DataError(f"{what}: expected a neutronorch {want.__name__}, not a {type(graph).__name__}{hint}.")


def _require(module: str, what: str):
    """An optional library's module, or a clear error saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        package = "dgl" if module.startswith("dgl") else "torch-geometric"
        raise DataError(f"{what} needs {package}: pip install {package}") from None
