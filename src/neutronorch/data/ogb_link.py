"""OGB link-prediction datasets (ogbl-collab, -ppa, -citation2) from the folder the ``ogb`` package leaves;
neither ``ogb`` nor a download is needed. docs/datasets.md ("OGB layouts", under link prediction) gives the
layout. The split's ``.pt`` files are read with ``torch.load(weights_only=True)`` and numpy's array rebuilding
allowed by name: a file that needs any other object is refused, never unpickled. The message-passing graph is
made symmetric for all three (citation2's links stay directed, as OGB's examples do); no node task."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from neutronorch.data.arrays import timed_csc
from neutronorch.data.csc import edges_to_csc
from neutronorch.data.dtypes import as_int64
from neutronorch.data.files import read_error, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.link_checks import check_stored_links, link_graph
from neutronorch.data.links import PER_SOURCE, SHARED, LinkSplit, check_link_split
from neutronorch.data.ogb import (Progress, _present, dataset_name, read_edges, read_node_features, read_rows,
                                  split_folder)
from neutronorch.errors import DataError

PARTS = ("train", "valid", "test")
SPLIT_FILES = tuple(f"{part}.pt" for part in PARTS) + ("split_dict.pt",)
# The metric each benchmark is ranked by (OGB's evaluator); others: MRR for per-source negatives.
METRICS = {"ogbl-collab": "hits@50", "ogbl-ppa": "hits@100", "ogbl-ddi": "hits@20", "ogbl-citation2": "mrr"}


def is_ogb_link_dir(path: Path) -> bool:
    """An OGB folder (``raw/edge.csv.gz``) without node labels whose split is stored as ``.pt`` files (or,
    split files missing, whose name says ``ogbl``: loading then says which file is missing)."""
    raw = path / "raw"
    if not (raw / "edge.csv.gz").is_file() or (raw / "node-label.csv.gz").is_file():
        return False
    split = path / "split"
    has_split = split.is_dir() and any((scheme / name).is_file() for scheme in split.iterdir() if scheme.is_dir()
                                       for name in SPLIT_FILES)
    return has_split or path.resolve().name.startswith("ogbl")


@reads_files
def load_ogb_link(directory: str | os.PathLike, progress: Progress | None = None, times: bool = False) -> Graph:
    """The OGB link-prediction dataset in ``directory``: its message-passing graph (symmetric, no node
    task) with its ``LinkSplit`` in ``links``; with ``times`` each message edge's year as its edge time
    (``raw/edge_year.csv.gz``: ogbl-collab; a collaboration of several years is an edge per year) and each
    link's year as its time (the split files' ``year``): a temporal link task (docs/temporal.md)."""
    directory = Path(directory)
    name = dataset_name(directory)
    raw = directory / "raw"
    edges, num_nodes = read_edges(raw, progress)
    features = read_node_features(raw, edges, num_nodes, progress)
    folder = split_folder(directory)
    parts = _read_split(folder)
    split = _link_split(parts, num_nodes, name)
    edge_time = None
    if times:
        split.train_time, split.val_time, split.test_time = (_years(parts[part]) for part in PARTS)
        years = read_edge_years(raw, edges.shape[0], progress)
        indptr, indices, edge_time = timed_csc(edges[:, 0], edges[:, 1], years, num_nodes, True, str(raw))
    else:
        indptr, indices = edges_to_csc(edges[:, 0], edges[:, 1], num_nodes, source=str(raw / "edge.csv.gz"))
    del edges
    split.direction = ("directed: citations, OGB's own split" if split.negative_kind == PER_SOURCE
                       else "undirected: OGB's own split")
    notes = [f"OGB {name}: " + ("citations are directed links; message passing runs along both directions, as "
                                "OGB's examples do" if split.negative_kind == PER_SOURCE else
                                "edges made undirected")]
    # The benchmark's own split, scored as OGB's evaluator scores it: leaks are warned about, not refused.
    notes += check_stored_links(split, indptr, indices, name, str(raw / "edge.csv.gz"), benchmark=True)
    return link_graph(name, indptr, indices, features, split, notes, ", as OGB scores them", str(directory),
                      {"links": str(folder)}, edge_time)


def read_edge_years(raw: Path, num_edges: int, progress: Progress | None) -> np.ndarray:
    """Each edge's year of ``raw/edge_year.csv.gz`` (a line per line of ``edge.csv.gz``)."""
    path = raw / "edge_year.csv.gz"
    if not path.is_file():
        raise DataError(f"{path}: missing; `times` reads each edge's year from it (ogbl-collab ships one). Leave "
                        f"`times` out for a dataset without years.")
    years = read_rows(path, num_edges, np.int64, f"{raw / 'edge.csv.gz'} holds {num_edges:,} edges", progress)
    return years.reshape(-1)


def _read_split(folder: Path) -> dict[str, dict]:
    """{"train": {...}, "valid": {...}, "test": {...}} from the three files or ``split_dict.pt``."""
    if not any((folder / f"{part}.pt").is_file() for part in PARTS) and (folder / "split_dict.pt").is_file():
        whole = load_torch_file(folder / "split_dict.pt")
        missing = [part for part in PARTS if not isinstance(whole, dict) or part not in whole]
        if missing:
            raise DataError(f"{folder / 'split_dict.pt'}: lacks {missing}; it must map train, valid and test to "
                            f"their edges. Fetch the dataset again.")
        parts = {part: (whole[part], folder / "split_dict.pt") for part in PARTS}
    else:
        paths = {part: _present(folder / f"{part}.pt") for part in PARTS}
        parts = {part: (load_torch_file(path), path) for part, path in paths.items()}
    out = {}
    for part, (content, path) in parts.items():
        if not isinstance(content, dict):
            raise DataError(f"{path}: holds a {type(content).__name__}, where OGB stores a dict of arrays. "
                            f"Fetch the dataset again.")
        out[part] = {"path": path, **{key: _array(value, path, key) for key, value in content.items()}}
    return out


def _array(value, path: Path, key: str) -> np.ndarray:
    if hasattr(value, "numpy"):  # a tensor: torch is loaded, reading the file
        value = value.numpy()
    if not isinstance(value, np.ndarray):
        raise DataError(f"{path}: {key!r} holds a {type(value).__name__}, where OGB stores an array. Fetch the "
                        f"dataset again.")
    return value


def load_torch_file(path: Path):
    """``torch.load`` without arbitrary unpickling: tensors, containers and numpy arrays only (OGB's split
    files, MAG240M's ``split_dict.pt`` and ``meta.pt``, MLPerf's IGBH seeds). torch is imported here, when
    such a file is read: the data layer loads without it."""
    try:
        import torch  # noqa: PLC0415 - the data layer loads without torch; only these files need it
    except ImportError:
        raise DataError(f"{path}: a file torch.save wrote; reading it needs torch, which is not installed here. "
                        f"Install it (pip install torch).") from None

    # torch 2.6 takes allowed globals under a name of one's choosing: numpy 1 and 2 name the rebuilder apart.
    if tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) < (2, 6):
        raise DataError(f"{path}: reading a dataset's .pt files safely (never unpickling arbitrary objects) needs "
                        f"torch 2.6 or later, and this is {torch.__version__}; upgrade it (pip install -U torch).")
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if "Unsupported global" in text or "allowlisted" in text:
            found = text.split("GLOBAL ")[-1].split(" ")[0] if "GLOBAL " in text else ""
            raise DataError(f"{path}: holds Python objects{f' ({found})' if found else ''} that only full "
                            f"unpickling could build, and unpickling can run any code, so neutronorch does not; "
                            f"the dataset's .pt files hold only arrays and numbers. Fetch the dataset again.") from None
        raise _damaged(path, exc) from None
    except Exception as exc:  # noqa: BLE001 - damaged bytes fail anywhere in torch's reader, as anything
        raise _damaged(path, exc) from None


def _damaged(path: Path, exc: Exception) -> DataError:
    first = str(exc).split(". ")[0].splitlines()[0] if str(exc) else ""
    what = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return read_error(path, exc, f"{path}: not a readable .pt file ({what}); it is truncated or damaged. Fetch the "
                                 f"dataset again.")


def _empty_bytes(*args) -> bytes:
    """``bytes()``, a pickled empty array's data (protocol 2); any other call of ``bytes`` is refused."""
    if args:
        raise pickle.UnpicklingError("Unsupported global: GLOBAL builtins.bytes called with arguments")
    return b""


def _numpy_globals() -> list:
    """What rebuilding a pickled numpy array of numbers calls, under the names numpy 1 (OGB's files) and numpy
    2 write."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct
    allowed: list = [(_reconstruct, "numpy.core.multiarray._reconstruct"),
                     (_reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype,
                     (_empty_bytes, "builtins.bytes"), (_empty_bytes, "__builtin__.bytes")]
    for kind in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
                 "float32", "float64"):
        dtype_class = type(np.dtype(kind))
        if dtype_class is not np.dtype:  # numpy >= 1.25 pickles a dtype by its class (numpy.dtypes.Int64DType)
            allowed.append(dtype_class)
    return allowed


def _link_split(parts: dict[str, dict], num_nodes: int, name: str) -> LinkSplit:
    """The ``LinkSplit`` of collab/ppa-style (``edge``) or citation2-style (``source_node``) split dicts."""
    per_source = "source_node" in parts["train"]
    positives, negatives = {}, {}
    for part, content in parts.items():
        path = content["path"]
        if per_source:
            sources = _ids(content, "source_node", path, 1)
            targets = _ids(content, "target_node", path, 1)
            if sources.shape != targets.shape:
                raise DataError(f"{path}: {sources.shape[0]:,} source nodes but {targets.shape[0]:,} target nodes; "
                                f"the counts disagree. Fetch the dataset again.")
            positives[part] = np.stack([sources, targets])
            if part != "train":
                negatives[part] = _ids(content, "target_node_neg", path, 2)
                if negatives[part].shape[0] != sources.shape[0]:
                    raise DataError(f"{path}: target_node_neg has {negatives[part].shape[0]:,} rows for "
                                    f"{sources.shape[0]:,} positives (a row of negatives each); the counts "
                                    f"disagree. Fetch the dataset again.")
        else:
            positives[part] = _pairs(content, "edge", path)
            if part != "train":
                negatives[part] = _pairs(content, "edge_neg", path)
    split = LinkSplit(train=positives["train"], val=positives["valid"], test=positives["test"],
                      val_neg=negatives["valid"], test_neg=negatives["test"], undirected=not per_source,
                      negatives=PER_SOURCE if per_source else SHARED,
                      metric=METRICS.get(name, "mrr" if per_source else None))
    check_link_split(split, num_nodes, str(parts["train"]["path"].parent))
    return split


def _years(content: dict) -> np.ndarray:
    """A split part's ``year`` of each link (int64), asked for by ``load_ogb_link(times=True)``."""
    if "year" not in content:
        raise DataError(f"{content['path']}: holds no 'year' of its links, so they have no times; read the dataset "
                        f"without times (ogbl-collab's split carries them).")
    return _ids(content, "year", content["path"], 1)


def _ids(content: dict, key: str, path: Path, ndim: int) -> np.ndarray:
    if key not in content:
        raise DataError(f"{path}: lacks {key!r}; it holds {sorted(k for k in content if k != 'path')}. The split "
                        f"of another dataset or a damaged file; fetch the dataset again.")
    ids = as_int64(content[key], str(path), f"{key!r}")
    if ids.ndim != ndim:
        raise DataError(f"{path}: {key!r} has shape {ids.shape}, expected {ndim} dimension(s). Fetch the dataset "
                        f"again.")
    if not ids.size:
        raise DataError(f"{path}: {key!r} is empty (shape {ids.shape}), and each array of the split holds at least "
                        f"one entry. The file is truncated or damaged; fetch the dataset again.")
    return ids


def _pairs(content: dict, key: str, path: Path) -> np.ndarray:
    """An (E, 2) edge list as the (2, E) int64 array a ``LinkSplit`` holds."""
    edges = _ids(content, key, path, 2)
    if edges.shape[1] != 2:
        raise DataError(f"{path}: {key!r} has shape {edges.shape}, expected (E, 2) pairs. Fetch the dataset again.")
    return np.ascontiguousarray(edges.T)
