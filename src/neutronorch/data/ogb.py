"""OGB node-property datasets from the directory the ``ogb`` package leaves on disk (``dataset/ogbn_arxiv``
and the like); neither ``ogb`` nor a download is needed.

Two layouts:

- **CSV** (ogbn-arxiv, ogbn-products, ogbn-proteins): ``raw/num-node-list.csv.gz``,
  ``raw/num-edge-list.csv.gz``, ``raw/edge.csv.gz`` (one ``src,dst`` per line), ``raw/node-feat.csv.gz``
  (a row per vertex), ``raw/node-label.csv.gz`` (a class id per vertex, or ogbn-proteins' 112 0/1 task
  labels), ``split/<scheme>/{train,valid,test}.csv.gz`` (vertex ids). Parsed in blocks straight into the
  arrays (``textnum.py``): the text is never held whole.
- **Binary** (ogbn-papers100M): ``raw/data.npz`` (``edge_index``, ``node_feat``, ``num_nodes_list``) and
  ``raw/node-label.npz`` (``node_label``, NaN for the vertices without a label), with the same split files.

ogbn-proteins has no node features: a vertex's features are the mean of the 8 features of its edges (as
OGB's own examples form them), and its metric is ROC-AUC over its 112 tasks; the others' is accuracy, as
OGB's evaluator scores them. Edges are made undirected like every loader's (docs/datasets.md).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from neutronorch.data.arrays import class_labels
from neutronorch.data.csc import edges_to_csc
from neutronorch.data.dtypes import STORAGE_DTYPES
from neutronorch.data.graph import Graph
from neutronorch.data.textnum import first_line_width, read_numbers
from neutronorch.errors import DataError

# progress(what, done, total): bytes of the file being read.
Progress = Callable[[str, int, int], None]
ROC_AUC_DATASETS = ("ogbn-proteins",)


def is_ogb_dir(path: Path) -> bool:
    raw = path / "raw"
    return raw.is_dir() and ((raw / "edge.csv.gz").is_file() or (raw / "data.npz").is_file())


def load_ogb(directory: str | os.PathLike, progress: Progress | None = None) -> Graph:
    """The OGB dataset in ``directory`` (a folder holding ``raw/`` and ``split/``)."""
    directory = Path(directory)
    name = _name(directory)
    raw = directory / "raw"
    if (raw / "data.npz").is_file():
        src, dst, features, labels, num_nodes = _binary(raw)
    else:
        src, dst, features, labels, num_nodes = _csv(raw, name, progress)
    indptr, indices = edges_to_csc(src, dst, num_nodes, source=str(raw))
    del src, dst
    train, val, test = _split(directory, num_nodes)
    num_classes = labels.shape[1] if labels.ndim == 2 else int(labels.max()) + 1
    notes = [f"OGB {name}: edges made undirected"]
    if name == "ogbn-proteins":
        notes.append("ogbn-proteins has no node features: each vertex's are the mean of its edges' 8 features")
    graph = Graph(name=name, indptr=indptr, indices=indices, features=features, labels=labels, train_idx=train,
                  val_idx=val, test_idx=test, num_classes=num_classes, notes=notes,
                  metric="rocauc" if name in ROC_AUC_DATASETS else "accuracy")
    graph.validate(str(directory))
    return graph


def _name(directory: Path) -> str:
    """``ogbn_arxiv`` (the ogb package's folder name) reads as ``ogbn-arxiv``."""
    return directory.resolve().name.replace("_", "-")


def _csv(raw: Path, name: str, progress: Progress | None):
    num_nodes = int(_numbers(raw / "num-node-list.csv.gz", 1, np.int64)[0])
    num_edges = int(_numbers(raw / "num-edge-list.csv.gz", 1, np.int64)[0])
    edges = _numbers(raw / "edge.csv.gz", 2 * num_edges, np.int64, progress).reshape(num_edges, 2)
    labels_path = raw / "node-label.csv.gz"
    width = _width(labels_path)
    labels = _numbers(labels_path, num_nodes * width, np.float64, progress)
    labels = class_labels(labels.reshape(num_nodes, width) if width > 1 else labels, num_nodes, str(labels_path))
    feature_path = raw / "node-feat.csv.gz"
    if feature_path.is_file():
        dim = _width(feature_path)
        features = _numbers(feature_path, num_nodes * dim, np.float32, progress).reshape(num_nodes, dim)
    elif (raw / "edge-feat.csv.gz").is_file():
        features = _edge_mean_features(raw / "edge-feat.csv.gz", edges, num_nodes, progress)
    else:
        raise DataError(f"{raw}: holds neither node-feat.csv.gz nor edge-feat.csv.gz; neutronorch needs node "
                        f"features (or edge features to form them from).")
    return edges[:, 0], edges[:, 1], features, labels, num_nodes


def _edge_mean_features(path: Path, edges: np.ndarray, num_nodes: int, progress: Progress | None) -> np.ndarray:
    """Each vertex's mean over the features of the edges it touches (ogbn-proteins)."""
    dim = _width(path)
    edge_features = _numbers(path, edges.shape[0] * dim, np.float32, progress).reshape(edges.shape[0], dim)
    count = np.maximum(np.bincount(edges.ravel(), minlength=num_nodes), 1)
    out = np.empty((num_nodes, dim), np.float32)
    for d in range(dim):  # a weighted count per column: one pass over the edges each (np.add.at is slow)
        column = edge_features[:, d]
        out[:, d] = (np.bincount(edges[:, 0], column, num_nodes) + np.bincount(edges[:, 1], column, num_nodes)) / count
    return out


def _binary(raw: Path):
    data = _npz(raw / "data.npz", ("edge_index", "node_feat", "num_nodes_list"))
    num_nodes = int(np.asarray(data["num_nodes_list"]).sum())
    edge_index = data["edge_index"]
    features = np.asarray(data["node_feat"])
    if features.dtype.name not in STORAGE_DTYPES:
        features = features.astype(np.float32)
    labels = _npz(raw / "node-label.npz", ("node_label",))["node_label"]
    return (edge_index[0], edge_index[1], features,
            class_labels(np.asarray(labels), num_nodes, str(raw / "node-label.npz")), num_nodes)


def _split(directory: Path, num_nodes: int) -> tuple[np.ndarray, ...]:
    schemes = sorted(p for p in (directory / "split").glob("*") if p.is_dir()) if (directory / "split").is_dir() else []
    if len(schemes) != 1:
        raise DataError(f"{directory / 'split'}: expected one split folder (time, sales_ranking, species ...), "
                        f"found {[p.name for p in schemes] or 'none'}; the dataset is incomplete.")
    out = []
    for part in ("train", "valid", "test"):
        path = schemes[0] / f"{part}.csv.gz"
        if not path.is_file():
            raise DataError(f"{path}: file is missing; the dataset is incomplete.")
        ids = _numbers(path, num_nodes, np.int64)
        out.append(np.sort(ids))
    return tuple(out)


def _present(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: file is missing; the OGB dataset is incomplete (fetch it with the ogb package).")
    return path


def _width(path: Path) -> int:
    try:
        return first_line_width(_present(path))
    except (OSError, EOFError) as exc:
        raise DataError(f"{path}: cannot be read ({exc}); the file is truncated or corrupt.") from None


def _numbers(path: Path, count: int, dtype, progress: Progress | None = None) -> np.ndarray:
    _present(path)
    out = np.empty(count, dtype)
    total = path.stat().st_size
    report = (lambda done: progress(path.name, done, total)) if progress is not None else None
    try:
        read = read_numbers(path, out, report)
    except (OSError, EOFError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read ({exc}); the file is truncated or corrupt.") from None
    return out[:read]


def _npz(path: Path, keys: tuple[str, ...]) -> dict:
    if not path.is_file():
        raise DataError(f"{path}: file is missing; the OGB dataset is incomplete.")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz ({exc}).") from None
    missing = [k for k in keys if k not in archive.files]
    if missing:
        raise DataError(f"{path}: lacks {missing}; it holds {archive.files}.")
    return {k: archive[k] for k in keys}
