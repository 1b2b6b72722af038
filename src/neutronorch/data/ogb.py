"""OGB node-property datasets from the folder the ``ogb`` package leaves (``dataset/ogbn_arxiv``); neither
``ogb`` nor a download is needed. docs/datasets.md ("OGB directories") gives the CSV and binary layouts. CSV
is parsed in blocks straight into the arrays (``textnum.py``). ogbn-proteins' vertex features are the mean of
its edges' and its metric ROC-AUC; edges are made undirected."""

from __future__ import annotations

import gzip
import os
import zipfile
import zlib
from pathlib import Path

import numpy as np

from neutronorch.data.arrays import class_labels, feature_rows
from neutronorch.data.checks import SPLITS
from neutronorch.data.csc import edges_to_csc
from neutronorch.data.dtypes import as_int64
from neutronorch.data.files import Progress, holds_objects, read_error, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.splits import stored_split
from neutronorch.data.textnum import TextError, read_numbers
from neutronorch.data.times import time_array
from neutronorch.errors import DataError, not_a_file

ROC_AUC_DATASETS = ("ogbn-proteins",)


def is_ogb_dir(path: Path) -> bool:
    raw = path / "raw"
    return raw.is_dir() and ((raw / "edge.csv.gz").is_file() or (raw / "data.npz").is_file())


@reads_files
def load_ogb(directory: str | os.PathLike, progress: Progress | None = None, times: bool = False) -> Graph:
    """The OGB dataset in ``directory`` (a folder holding ``raw/`` and ``split/``); with ``times`` its vertices'
    years as vertex times (``read_node_years``: ogbn-arxiv, ogbn-papers100M; docs/temporal.md)."""
    directory = Path(directory)
    name = dataset_name(directory)
    raw = directory / "raw"
    if (raw / "data.npz").is_file():
        src, dst, features, labels, num_nodes = _binary(raw)
    else:
        edges, num_nodes = read_edges(raw, progress)
        labels = read_labels(raw / "node-label.csv.gz", num_nodes, f"{raw / 'num-node-list.csv.gz'} says "
                             f"{num_nodes:,} vertices", progress)
        features = read_node_features(raw, edges, num_nodes, progress)
        src, dst = edges[:, 0], edges[:, 1]
    indptr, indices = edges_to_csc(src, dst, num_nodes, source=str(raw))
    del src, dst
    files = {split: str(path) for split, path in split_files(split_folder(directory)).items()}
    train, val, test = (split_ids(Path(path), num_nodes) for path in files.values())
    num_classes = labels.shape[1] if labels.ndim == 2 else (int(labels.max()) + 1 if labels.size else 0)
    notes = [f"OGB {name}: edges made undirected"]
    node_time = read_node_years(raw, num_nodes, progress) if times else None
    if name == "ogbn-proteins":
        notes.append("ogbn-proteins has no node features: each vertex's are the mean of its edges' 8 features")
    # validate names a split's file in its message about it
    return Graph(name=name, indptr=indptr, indices=indices, features=features, labels=labels, train_idx=train,
                 val_idx=val, test_idx=test, num_classes=num_classes, notes=notes,
                 metric="rocauc" if name in ROC_AUC_DATASETS else "accuracy",
                 node_time=node_time).validate(str(directory), files)


def read_node_years(raw: Path, num_nodes: int, progress: Progress | None = None) -> np.ndarray:
    """Each vertex's year (int64): ``raw/node_year.csv.gz``, or ``node_year`` in the binary ``data.npz``."""
    if (raw / "data.npz").is_file():
        path, years = raw / "data.npz", np.asarray(_npz(raw / "data.npz", ("node_year",))["node_year"]).reshape(-1)
    else:
        path = raw / "node_year.csv.gz"
        if not path.is_file():
            raise DataError(f"{path}: missing; `times` reads each vertex's year from it (ogbn-arxiv and "
                            f"ogbn-papers100M ship one). Leave `times` out for a dataset without years.")
        years = read_rows(path, num_nodes, np.int64, f"{raw / 'num-node-list.csv.gz'} says {num_nodes:,} vertices",
                          progress).reshape(-1)
    return time_array(years, num_nodes, "vertex times (node_year)", str(path))


def dataset_name(directory: Path) -> str:
    """``ogbn_arxiv`` (the ogb package's folder name) reads as ``ogbn-arxiv``."""
    return directory.resolve().name.replace("_", "-")


def read_edges(raw: Path, progress: Progress | None = None) -> tuple[np.ndarray, int]:
    """The (num_edges, 2) int64 edges of ``raw/edge.csv.gz`` and the vertex count, each checked against its
    ``num-*-list.csv.gz``."""
    num_nodes = _count(raw / "num-node-list.csv.gz", "vertices")
    num_edges = _count(raw / "num-edge-list.csv.gz", "edges")
    return read_pairs(raw / "edge.csv.gz", num_edges, f"{raw / 'num-edge-list.csv.gz'} says {num_edges:,} edges",
                      progress), num_nodes


def read_pairs(path: Path, num_edges: int, expect: str, progress: Progress | None = None, what: str = "") -> np.ndarray:
    """The (num_edges, 2) int64 ``src,dst`` lines of ``path`` (``expect``: which file gives the count; ``what``:
    whose edges they are, for an error)."""
    if num_edges and _width(path) != 2:
        raise DataError(f"{path}: the first line holds {_width(path)} values; each line{what} must be one 'src,dst' "
                        f"edge. The file is damaged; fetch the dataset again.")
    return (_numbers(path, 2 * num_edges, np.int64, progress, width=2, expect=expect) if num_edges
            else np.empty(0, np.int64)).reshape(num_edges, 2)


def read_labels(path: Path, count: int, expect: str, progress: Progress | None = None) -> np.ndarray:
    """Class ids of ``count`` vertices (-1 for NaN: no label), or 0/1/-1 rows of a multi-label task."""
    return class_labels(read_rows(path, count, np.float64, expect, progress), count, str(path))


def read_rows(path: Path, count: int, dtype, expect: str, progress: Progress | None = None) -> np.ndarray:
    """``count`` rows of ``path``, each as wide as its first line (``expect``: which file gives the count)."""
    width = _width(path)
    return _numbers(path, count * width, dtype, progress, width=width, expect=expect).reshape(count, width)


def read_node_features(raw: Path, edges: np.ndarray, num_nodes: int, progress: Progress | None = None) -> np.ndarray:
    """A float32 row per vertex: ``raw/node-feat.csv.gz``, else the mean of its edges' ``edge-feat.csv.gz``."""
    feature_path = raw / "node-feat.csv.gz"
    if feature_path.is_file():
        return read_rows(feature_path, num_nodes, np.float32, f"{raw / 'num-node-list.csv.gz'} says {num_nodes} "
                         f"vertices", progress)
    if (raw / "edge-feat.csv.gz").is_file():
        return _edge_mean_features(raw / "edge-feat.csv.gz", edges, num_nodes, progress)
    raise DataError(f"{raw}: holds neither node-feat.csv.gz nor edge-feat.csv.gz; neutronorch needs node "
                    f"features (or edge features to form them from).")


def _edge_mean_features(path: Path, edges: np.ndarray, num_nodes: int, progress: Progress | None) -> np.ndarray:
    """Each vertex's mean over the features of the edges it touches (ogbn-proteins)."""
    edge_features = read_rows(path, edges.shape[0], np.float32, f"{path.parent / 'num-edge-list.csv.gz'} says "
                              f"{edges.shape[0]:,} edges", progress)
    dim = edge_features.shape[1]
    count = np.maximum(np.bincount(edges.ravel(), minlength=num_nodes), 1)
    out = np.empty((num_nodes, dim), np.float32)
    for d in range(dim):  # a weighted count per column: one pass over the edges each (np.add.at is slow)
        column = edge_features[:, d]
        out[:, d] = (np.bincount(edges[:, 0], column, num_nodes) + np.bincount(edges[:, 1], column, num_nodes)) / count
    return out


def _binary(raw: Path):
    path = raw / "data.npz"
    data = _npz(path, ("edge_index", "node_feat", "num_nodes_list"))
    counts = np.asarray(data["num_nodes_list"])
    if counts.size != 1:
        raise DataError(f"{path}: num_nodes_list holds {counts.size} counts; a node-property dataset is one graph "
                        f"with one. The file is damaged or not a node-property dataset; fetch it again.")
    num_nodes = int(as_int64(counts, f"{path} (num_nodes_list)", "the vertex count").reshape(-1)[0])
    if num_nodes < 1:
        raise DataError(f"{path}: num_nodes_list says {num_nodes:,} vertices; fetch the dataset again.")
    edge_index = data["edge_index"]
    if edge_index.ndim != 2 or edge_index.shape[0] != 2:
        raise DataError(f"{path}: edge_index has shape {edge_index.shape}, expected (2, num_edges). The file is "
                        f"damaged; fetch the dataset again.")
    features = feature_rows(data["node_feat"], f"{path}: node_feat")
    if features.shape[0] != num_nodes:
        raise DataError(f"{path}: node_feat has shape {features.shape}, but num_nodes_list says {num_nodes} "
                        f"vertices (a row each). The file is damaged; fetch the dataset again.")
    labels = _npz(raw / "node-label.npz", ("node_label",))["node_label"]
    return (edge_index[0], edge_index[1], features,
            class_labels(np.asarray(labels), num_nodes, str(raw / "node-label.npz")), num_nodes)


def split_folder(directory: Path) -> Path:
    """The one folder under ``directory/split`` (``time``, ``sales_ranking``, ``throughput`` ...)."""
    schemes = sorted(p for p in (directory / "split").glob("*") if p.is_dir()) if (directory / "split").is_dir() else []
    if len(schemes) != 1:
        raise DataError(f"{directory / 'split'}: expected one split folder (time, sales_ranking, species ...), "
                        f"found {[p.name for p in schemes] or 'none'}; the dataset is incomplete.")
    return schemes[0]


def split_files(folder: Path) -> dict[str, Path]:
    """``folder``'s ``train``, ``valid`` and ``test`` files, each there, by split (``train_idx`` ...)."""
    return {split: _present(csv_file(folder, part)) for split, part in zip(SPLITS, ("train", "valid", "test"))}


def csv_file(folder: Path, stem: str) -> Path:
    """``folder/stem.csv.gz``, else ``folder/stem.csv`` when only that is there."""
    compressed = folder / f"{stem}.csv.gz"
    plain = folder / f"{stem}.csv"
    return plain if not compressed.is_file() and plain.is_file() else compressed


def split_ids(path: Path, num_nodes: int) -> np.ndarray:
    """The sorted vertex ids of a split file (``splits.stored_split``'s checks)."""
    return stored_split(_numbers(path, num_nodes, np.int64), path, "the split", num_nodes, "The file is truncated "
                        "or damaged, or comes from another version of the dataset; fetch the dataset again.")


def _present(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: {not_a_file(path, 'file is missing')}; the OGB dataset is incomplete (fetch it "
                        f"with the ogb package).")
    return path


def _width(path: Path) -> int:
    """How many comma-separated values the first line of ``path`` (read within its first MiB) holds."""
    line = next(_blocks(_present(path), 1 << 20), b"").split(b"\n")[0]
    if not line.strip():
        raise DataError(f"{path}: the first line is empty; the file is damaged. Fetch the dataset again.")
    return line.count(b",") + 1


def _blocks(path: Path, size: int):
    """The bytes of ``path`` (a gzip-compressed file when it ends in ``.gz``), ``size`` at a time."""
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as text:
            while block := text.read(size):
                yield block
    except (OSError, EOFError, zlib.error) as exc:
        raise read_error(path, exc, f"{path}: cannot be read ({exc}); the file is truncated or corrupt. "
                                    f"Fetch the dataset again.") from None


def _count(path: Path, what: str) -> int:
    """The one whole number of a ``num-*-list`` file: the count of the graph's ``what``."""
    values = _numbers(path, 2, np.int64)  # room for a second value, to say it is there
    if values.shape[0] != 1 or values[0] < 0:
        raise DataError(f"{path}: holds {values.tolist()}, expected one count of {what} (a whole number >= 0). "
                        f"The file is damaged; fetch the dataset again.")
    return int(values[0])


# gzip compresses at most about 1032:1, and every value of a CSV file takes at least two characters (a digit
# and a separator), so a count read from one file is checked against the size of the file it describes
# before an array of that count is allocated.
_GZIP_RATIO = 1032


def _numbers(path: Path, count: int, dtype, progress: Progress | None = None, *, width: int = 0,
             expect: str | None = None) -> np.ndarray:
    """The numbers of ``path``: exactly ``count`` when ``expect`` says which file gave that count, else up to
    ``count``; ``width`` > 0: every line holds that many."""
    _present(path)
    try:
        total = path.stat().st_size
    except OSError as exc:
        raise read_error(path, exc, f"{path}: cannot be read ({exc}).") from None
    room = (total * (_GZIP_RATIO if path.suffix == ".gz" else 1)) // 2 + 1
    if expect is not None and count > room:
        raise DataError(f"{path}: {expect}, {count} values here, but a file of {total} bytes holds at most "
                        f"{room}. The counts and the file come from different versions of the dataset, or the "
                        f"file is truncated; fetch the dataset again.")
    out = np.empty(min(count, room), dtype)
    report = (lambda done: progress(path.name, done, total)) if progress is not None else None
    try:
        read = read_numbers(path, out, report, width)
    except TextError as exc:
        if expect is not None and "more values than expected" in str(exc):
            raise DataError(f"{path}: holds more than the {count} values expected: {expect}. The counts and the "
                            f"file come from different versions of the dataset; fetch it again.") from None
        raise DataError(f"{exc}. The file is damaged; fetch the dataset again.") from None
    except (OSError, EOFError, ValueError) as exc:
        raise read_error(path, exc, f"{path}: cannot be read ({exc}); the file is truncated or corrupt. Fetch "
                                    f"the dataset again.") from None
    if expect is not None and read != count:
        raise DataError(f"{path}: holds {read} values, but {expect}, so {count} values here. The counts and the "
                        f"file come from different versions of the dataset, or the file is truncated; fetch "
                        f"the dataset again.")
    return out[:read]


def _npz(path: Path, keys: tuple[str, ...]) -> dict:
    try:
        with np.load(_present(path), allow_pickle=False) as archive:
            missing = [k for k in keys if k not in archive.files]
            if missing:
                raise DataError(f"{path}: lacks {missing}; it holds {archive.files}. Fetch the dataset again.")
            return {k: archive[k] for k in keys}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        if holds_objects(exc):  # numpy's advice would run the pickle
            raise DataError(f"{path}: holds pickled Python objects where OGB stores plain arrays; it is not an "
                            f"OGB file. Fetch the dataset again.") from None
        raise read_error(path, exc, f"{path}: not a readable .npz ({type(exc).__name__}: {exc}); the file is "
                                    f"truncated or damaged. Fetch the dataset again.") from None
