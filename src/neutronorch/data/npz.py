"""Node-classification graphs stored as numpy ``.npz`` archives, told apart by their entry names: GraphGallery
(pickled scipy matrices, unpickled by ``sparse_pickle``'s stand-ins, never by ``np.load(allow_pickle=True)``),
gnn-benchmark/nettack (plain CSR pieces) and the Yandex heterophilous graphs (ten stored splits; the binary
ones scored by ROC-AUC, as their literature does). Edges are made undirected; files without a split get one
from ``make_split``."""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.dtypes import as_int64
from neutronorch.data.files import present, read_error, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.sparse_pickle import SparseMatrix, csr_matrix, dense_features, load_pickle
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.errors import DataError

_GRAPHGALLERY = ("adj_matrix", "node_attr", "node_label")
_GNN_BENCHMARK = ("adj_data", "adj_indices", "adj_indptr", "adj_shape", "labels")
_YANDEX = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
_ATTR_CSR = ("attr_data", "attr_indices", "attr_indptr", "attr_shape")

# Width of the random features given to a gnn-benchmark file that stores none.
SYNTHETIC_FEATURE_DIM = 64

_HEADER_READERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


@reads_files
def load_npz(path: str | os.PathLike, split: str = DEFAULT_SPLIT, seed: int = 0, split_index: int = 0) -> Graph:
    """A GraphGallery, gnn-benchmark or Yandex ``.npz`` file; ``split`` and ``seed`` draw the split of a file
    that has none, ``split_index`` picks a Yandex file's own."""
    path = Path(path)
    present(path, "a graph as a .npz archive", "Give the path of a .npz graph file.")
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise read_error(path, exc, f"{path}: not a readable .npz archive ({exc}). The file is truncated or not "
                                    f"an .npz; fetch it again.") from None
    with archive:
        entries = _Entries(archive, path)
        if all(key in entries.keys for key in _YANDEX):
            return _load_yandex(entries, path, split_index)
        if split_index:
            raise DataError(f"{path}: holds no stored splits, so `split_index` {split_index} has nothing to pick; "
                            f"leave it at 0 (`split` draws the split).")
        if all(key in entries.keys for key in _GRAPHGALLERY):
            return _load_graphgallery(entries, path, split, seed)
        if all(key in entries.keys for key in _GNN_BENCHMARK):
            return _load_gnn_benchmark(entries, path, split, seed)
    raise DataError(f"{path}: unknown .npz layout; it holds {sorted(entries.keys) or 'no arrays'}. Supported: "
                    f"GraphGallery ({', '.join(_GRAPHGALLERY)}), gnn-benchmark ({', '.join(_GNN_BENCHMARK)}, "
                    f"attr_*) and Yandex ({', '.join(_YANDEX)}). Convert the file to one of them.")


class _Entries:
    """The arrays of an open ``.npz`` archive, each read (and unpickled if need be) on request."""

    def __init__(self, archive: zipfile.ZipFile, path: Path):
        self.archive = archive
        self.path = path
        self.keys = {name[:-len(".npy")] for name in archive.namelist() if name.endswith(".npy")}

    def __getitem__(self, key: str):
        source = f"{self.path} (entry {key})"
        try:
            with self.archive.open(f"{key}.npy") as member:
                read_header = _HEADER_READERS.get(np.lib.format.read_magic(member))
                if read_header is not None and read_header(member)[2].hasobject:
                    value = load_pickle(member, source)
                    # savez stores a single pickled object as a 0-d object array.
                    if isinstance(value, np.ndarray) and value.dtype.hasobject and value.ndim == 0:
                        value = value.item()
                    return value
                member.seek(0)
                return np.lib.format.read_array(member, allow_pickle=False)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
            raise DataError(f"{source}: cannot be read ({type(exc).__name__}: {exc}). The file is truncated "
                            f"or corrupt; fetch it again.") from None

    def array(self, key: str, kinds: tuple = (np.ndarray,), expected: str = "an array"):
        value = self[key]
        if not isinstance(value, kinds):
            raise DataError(f"{self.path} (entry {key}): expected {expected}, found {type(value).__name__}. "
                            f"The file does not follow its layout; convert it again.")
        return value


def _load_graphgallery(entries: _Entries, path: Path, split: str, seed: int) -> Graph:
    adjacency, features = (entries.array(key, (SparseMatrix, np.ndarray), "a matrix")
                           for key in ("adj_matrix", "node_attr"))
    labels = entries.array("node_label")
    num_nodes, src, dst = _matrix_edges(adjacency, f"{path} (entry adj_matrix)")
    features = dense_features(features, f"{path} (entry node_attr)")
    return _assemble(path, num_nodes, src, dst, features, labels, split, seed, notes=[])


def _load_gnn_benchmark(entries: _Entries, path: Path, split: str, seed: int) -> Graph:
    adjacency = csr_matrix(*(entries.array(f"adj_{part}") for part in ("data", "indices", "indptr", "shape")))
    num_nodes, src, dst = _matrix_edges(adjacency, f"{path} (entries adj_*)")
    labels = entries.array("labels")
    notes = []
    if all(key in entries.keys for key in _ATTR_CSR):
        attributes = csr_matrix(*(entries.array(key) for key in _ATTR_CSR))
        features = dense_features(attributes, f"{path} (entries attr_*)")
    elif "attr_matrix" in entries.keys:
        features = dense_features(entries.array("attr_matrix"), f"{path} (entry attr_matrix)")
    else:
        rng = np.random.default_rng(seed)
        features = rng.standard_normal((num_nodes, SYNTHETIC_FEATURE_DIM), dtype=np.float32)
        notes.append(f"the file has no node features; features are {SYNTHETIC_FEATURE_DIM} random Gaussian "
                     f"values per vertex (seed {seed}) and carry no information")
    return _assemble(path, num_nodes, src, dst, features, labels, split, seed, notes)


def _load_yandex(entries: _Entries, path: Path, split_index: int = 0) -> Graph:
    edges = entries.array("edges")
    if edges.ndim != 2 or edges.shape[1] != 2:
        raise DataError(f"{path} (entry edges): expected shape (num_edges, 2), got {edges.shape}. "
                        f"The file is corrupt; fetch it again.")
    features = dense_features(entries.array("node_features"), f"{path} (entry node_features)")
    labels = entries.array("node_labels")
    masks = []
    for key in ("train_masks", "val_masks", "test_masks"):
        mask = entries.array(key)
        stored = mask.shape[0] if mask.ndim == 2 else 1  # a single split may be stored as one row
        if not 0 <= split_index < stored:
            raise DataError(f"{path}: `split_index` {split_index} is out of range; the file stores {stored} "
                            f"split{'s' if stored > 1 else ''} (0..{stored - 1}).")
        mask = mask[split_index] if mask.ndim == 2 else mask
        if mask.shape != labels.shape:
            raise DataError(f"{path} (entry {key}): mask has shape {mask.shape} but there are "
                            f"{labels.shape[0]} labels. The file is corrupt; fetch it again.")
        masks.append(np.flatnonzero(mask).astype(np.int64))
    graph = _assemble(path, features.shape[0], edges[:, 0], edges[:, 1], features, labels, split=None, seed=0,
                      notes=[f"uses split {split_index} of the {stored} splits stored in the file"],
                      stored_split=masks)
    if graph.num_classes == 2:
        graph.metric = "rocauc"  # as Platonov et al. (ICLR 2023) score the binary ones
    return graph


def _assemble(path: Path, num_nodes: int, src: np.ndarray, dst: np.ndarray, features: np.ndarray,
              labels: np.ndarray, split: str | None, seed: int, notes: list[str],
              stored_split: list[np.ndarray] | None = None) -> Graph:
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise DataError(f"{path}: labels must be a 1-D integer array, got {labels.dtype} {labels.shape}. "
                        f"Store one class id per vertex.")
    labels = as_int64(labels, str(path), "labels")
    if labels.shape[0] != num_nodes:
        raise DataError(f"{path}: {labels.shape[0]:,} labels for {num_nodes:,} vertices. The entries come from "
                        f"different graphs or the file is truncated; fetch it again.")
    num_classes = int(labels.max()) + 1 if num_nodes else 0
    indptr, indices = edges_to_csc(src, dst, num_nodes, source=str(path))
    train_idx, val_idx, test_idx = stored_split or make_split(labels, num_classes, split, seed)
    return Graph(name=path.name.removesuffix(".npz"), indptr=indptr, indices=indices, features=features,
                 labels=labels, train_idx=train_idx, val_idx=val_idx, test_idx=test_idx,
                 num_classes=num_classes, notes=notes).validate(str(path))


def _matrix_edges(adjacency: SparseMatrix | np.ndarray, source: str) -> tuple[int, np.ndarray, np.ndarray]:
    """Return ``(num_nodes, src, dst)`` of the stored entries of a square adjacency matrix."""
    if isinstance(adjacency, SparseMatrix):
        # to_coo first: it checks the pickled state that ``shape`` reads.
        src, dst, _ = adjacency.to_coo(source)
    shape = adjacency.shape
    if len(shape) != 2 or shape[0] != shape[1]:
        raise DataError(f"{source}: the adjacency matrix must be square, got shape {shape}. "
                        f"The file is corrupt; fetch it again.")
    if isinstance(adjacency, np.ndarray):
        src, dst = np.nonzero(adjacency)
    return shape[0], src, dst
