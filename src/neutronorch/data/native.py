"""The native on-disk format: one directory of ``.npy`` arrays plus ``meta.json``.

Arrays are opened as memory maps, so a graph larger than RAM can be opened and only the rows a
mini-batch touches are read. This module must never load a whole array eagerly.

Layout (``format_version`` 1)::

    meta.json      name, num_nodes, num_edges, feature_dim, num_classes, format_version[, notes, metric,
                   feature_dtype]
    indptr.npy     int32/int64, num_nodes+1   CSC offsets
    indices.npy    int32/int64, num_edges     in-neighbour ids
    features.npy   float32/float16, num_nodes x feature_dim; or bfloat16 stored as its uint16 bits, with
                   "feature_dtype": "bfloat16" in meta.json (numpy has no bfloat16 of its own)
    labels.npy     int64, num_nodes (-1: no label); or int8, num_nodes x num_classes (multi-label, -1: unknown)
    train_idx.npy, val_idx.npy, test_idx.npy   int64 vertex ids
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Callable

import numpy as np

from neutronorch.atomic import make_folder, remove_made, reserve, sweep_stale, temp_prefix, write_error
from neutronorch.data.checks import METRICS
from neutronorch.data.dtypes import BFLOAT16, bfloat16, is_bfloat16
from neutronorch.data.files import open_npy, read_error, reads_files
from neutronorch.data.graph import ARRAYS, Graph
from neutronorch.data.typed import TYPED_FORMAT
from neutronorch.errors import DataError

FORMAT_VERSION = 1
META_KEYS = ("name", "num_nodes", "num_edges", "feature_dim", "num_classes", "format_version")
OPTIONAL_KEYS = ("notes", "metric", "feature_dtype")
REWRITE = "Write the dataset again with `neutronorch convert` (or `generate`)."


def is_native_dir(path: Path) -> bool:
    return path.is_dir() and (path / "meta.json").is_file()


@reads_files
def load_native(directory: str | os.PathLike, mmap: bool = True, validate: bool = True) -> Graph:
    """Open a native dataset directory; arrays are memory-mapped unless ``mmap`` is False."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    meta = read_meta(meta_path)
    arrays = {name: open_npy(directory / f"{name}.npy", f"the graph's {name}", REWRITE, mmap) for name in ARRAYS}
    arrays["features"] = as_stored(arrays["features"], meta.get("feature_dtype"), directory / "features.npy")
    if arrays["labels"].ndim == 1 and meta["num_classes"] > max(2, arrays["labels"].shape[0]):
        # A class per vertex at most: anything beyond is a damaged count, and the model's output layer
        # (num_classes wide) would be allocated from it.
        top = int(np.max(arrays["labels"])) if arrays["labels"].size else -1
        raise DataError(f"{meta_path}: num_classes is {meta['num_classes']}, more than the "
                        f"{arrays['labels'].shape[0]} labels can carry (they use classes 0..{top}). Set it to "
                        f"{max(top + 1, 2)}, or convert the data again.")
    graph = Graph(name=meta["name"], num_classes=int(meta["num_classes"]),
                  notes=list(meta.get("notes", [])), metric=meta.get("metric"), **arrays)
    expected = {"num_nodes": graph.num_nodes, "num_edges": graph.num_edges}
    if graph.features.ndim == 2:
        expected["feature_dim"] = graph.feature_dim
    for key, actual in expected.items():
        if int(meta[key]) != actual:
            raise DataError(f"{directory}: meta.json says {key}={meta[key]} but the arrays hold {actual}. "
                            f"One of the files is truncated or from another graph; convert the data again.")
    if validate:
        files = {name: str(directory / f"{name}.npy") for name in ARRAYS}
        graph.validate(str(directory), {**files, "num_classes": str(meta_path), "metric": str(meta_path)})
    return graph


def read_meta(meta_path: Path, keys: tuple[str, ...] = META_KEYS, optional: tuple[str, ...] = OPTIONAL_KEYS,
              counts: tuple[str, ...] = META_KEYS[1:], written_by: str = "`neutronorch convert` or `generate`") -> dict:
    """``meta.json`` (which a folder being written gets last) as a dict holding every one of ``keys``, no key
    outside ``keys`` and ``optional`` (a misspelt optional key would otherwise be ignored), each key once; its
    ``counts`` whole numbers >= 0, its name a name, its notes strings, its metric one of ``METRICS`` and its
    ``format_version`` the one read."""
    if not meta_path.is_file():
        raise DataError(f"{meta_path}: file is missing. Is {meta_path.parent} a dataset written by {written_by}? "
                        f"(A folder being written has none until it is complete.)")

    def unique(pairs):
        names = [k for k, _ in pairs]
        repeated = sorted({k for k in names if names.count(k) > 1})
        if repeated:
            raise DataError(f"{meta_path}: gives {', '.join(repeated)} more than once; JSON keeps only the last, "
                            f"so say each once.")
        return dict(pairs)

    try:
        meta = json.loads(meta_path.read_text(), object_pairs_hook=unique)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{meta_path}: not valid JSON ({exc}). Fix or regenerate the file.") from None
    except OSError as exc:
        raise read_error(meta_path, exc, f"{meta_path}: cannot be read ({exc}).") from None
    if not isinstance(meta, dict):
        raise DataError(f"{meta_path}: expected a JSON object with the keys {list(keys)}.")
    if meta.get("format") == TYPED_FORMAT and "format" not in keys:
        raise DataError(typed_refusal(meta_path.parent))
    missing = [k for k in keys if k not in meta]
    if missing:
        raise DataError(f"{meta_path}: missing keys {missing}. It needs {list(keys)}.")
    unknown = sorted(set(meta) - set(keys) - set(optional))
    if unknown:
        raise DataError(f"{meta_path}: unknown keys {unknown}; it takes {list(keys)} and optionally "
                        f"{list(optional)}. Fix the spelling or remove them.")
    for key in ("name", *counts):
        check_meta_value(meta[key], str if key == "name" else int, key, meta_path)
    notes = meta.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise DataError(f"{meta_path}: notes is {notes!r}, expected a list of strings.")
    if meta.get("metric") is not None and meta["metric"] not in METRICS:
        raise DataError(f"{meta_path}: metric is {meta['metric']!r}, which names no metric; use one of "
                        f"{', '.join(METRICS)}, or leave the key out.")
    if meta["format_version"] != FORMAT_VERSION:
        raise DataError(f"{meta_path}: format_version {meta['format_version']!r} is not supported (this "
                        f"neutronorch reads version {FORMAT_VERSION}). Write the dataset again.")
    return meta


def as_stored(array: np.ndarray, dtype_name: str | None, path: Path) -> np.ndarray:
    """An array as meta.json says it is stored (``dtype_name``; None: as it is): bfloat16 from its uint16 bits,
    the others as they are."""
    if dtype_name == BFLOAT16 and array.dtype == np.uint16:
        return array.view(bfloat16())
    if dtype_name is not None and array.dtype.name != dtype_name:
        raise DataError(f"{path}: meta.json's feature_dtype is {dtype_name!r}, but the file holds {array.dtype}. "
                        f"Write the dataset again.")
    return array


def typed_refusal(path) -> str:
    """Why a homogeneous reader refuses the typed graph at ``path``, and what reads it."""
    return (f"{path}: holds a typed graph (several vertex and relation types), which the commands read "
            f"(docs/heterogeneous.md) but not as a homogeneous graph. Read it in Python with "
            f"neutronorch.data.load_typed_dataset.")


def check_meta_value(value, kind: type, what: str, meta_path: Path) -> None:
    """A value of meta.json is a whole number >= 0 (``kind`` int) or a name (str)."""
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise DataError(f"{meta_path}: {what} is {value!r}, expected a whole number >= 0. Fix or regenerate the "
                        f"file.")
    if kind is str and (not isinstance(value, str) or not value):
        raise DataError(f"{meta_path}: {what} is {value!r}, expected a name.")


def save_native(graph: Graph, directory: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``graph`` to ``directory``; features keep their dtype.

    ``directory`` must not exist or be empty, unless ``overwrite`` (then it must hold a native dataset,
    which is replaced). The arrays are written into a temporary folder beside it and moved into place at
    the end, so a failed write leaves what was there before, and a graph memory-mapped from ``directory``
    itself can be written back over it (its old files stay readable until the swap)."""
    target = Path(directory)
    if graph.links is not None:  # it would be written without them, and read back as a graph with no task
        raise DataError(f"{graph.name}: the native format does not store a link split yet; train from the "
                        f"dataset it was read from (an OGB link-prediction folder loads directly).")
    check_native_target(target, overwrite)
    return write_folder(target, lambda folder: _write_arrays(graph, folder))


def write_folder(target: Path, fill: Callable[[Path], None]) -> Path:
    """Call ``fill`` on a new folder beside ``target`` and move that folder into place, replacing
    ``target`` (which the caller has checked may be replaced). A failed write leaves what was there before,
    and arrays memory-mapped from ``target`` itself stay readable while the new ones are written."""
    existed, made = target.exists(), []
    try:
        made = make_folder(target.parent)  # removed again if the write fails
        sweep_stale(target)  # what a killed writer left beside it
        partial = _new_folder(target.parent, temp_prefix(target))
    except OSError as exc:
        remove_made(made)
        raise write_error(target, exc, existed) from exc
    try:
        if target.is_dir():  # a folder that was there (empty, or a dataset replaced) keeps its permissions
            os.chmod(partial, stat.S_IMODE(target.stat().st_mode))
        fill(partial)
        if target.exists():
            # Not a temporary name of the sweep's: between the two renames it holds the only copy.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            target.replace(old / target.name)
            try:
                partial.replace(target)
            except BaseException:
                (old / target.name).replace(target)  # what was there goes back
                old.rmdir()
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            partial.replace(target)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        remove_made(made)
        raise write_error(target, exc, existed) from exc
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        remove_made(made)
        raise
    return target


def check_native_target(target: Path, overwrite: bool) -> None:
    """``save_native`` may write ``target``: a new or empty folder, or with ``overwrite`` a native dataset
    holding nothing else (replacing the folder replaces all it holds)."""
    check_dataset_folder(target, overwrite, "native", is_native_dir(target),
                         {"meta.json", *(f"{name}.npy" for name in ARRAYS)})


def check_dataset_folder(target: Path, overwrite: bool, kind: str, is_dataset: bool, own: set[str]) -> None:
    """A ``kind`` dataset may be written to ``target``: a new or empty folder, or with ``overwrite`` a
    ``kind`` dataset (``is_dataset``) holding nothing but its ``own`` entries (replacing the folder replaces
    all it holds)."""
    if target.exists() and not target.is_dir():
        raise DataError(f"{target}: exists and is a file; the {kind} format is a folder. Choose another path.")
    replace = target.is_dir() and any(target.iterdir())
    if replace and not overwrite:
        raise DataError(f"{target}: exists and is not empty. Choose a new folder, or pass --overwrite to "
                        f"replace the dataset in it.")
    if replace and not is_dataset:
        raise DataError(f"{target}: holds files but no {kind} dataset (no meta.json of one); refusing to "
                        f"replace it. Choose a new folder.")
    if replace:
        others = sorted(p.name for p in target.iterdir() if p.name not in own)
        if others:
            raise DataError(f"{target}: holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''} besides "
                            f"the dataset; replacing the folder would delete them. Move them out first, or "
                            f"choose a new folder.")


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder named ``prefix`` + random letters, with the permissions a plain ``mkdir`` gives
    (``tempfile.mkdtemp`` would make it private, 0700, and the dataset with it)."""
    while True:
        path = parent / f"{prefix}{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _write_arrays(graph: Graph, directory: Path) -> None:
    for name in ARRAYS:
        arr = getattr(graph, name)
        if name == "labels" and arr.ndim == 2:
            arr = np.asarray(arr, dtype=np.int8)  # 0/1 or -1 per task
        elif name in ("labels", "train_idx", "val_idx", "test_idx"):
            arr = np.asarray(arr, dtype=np.int64)
        save_array(directory / f"{name}.npy", arr)
    meta = {
        "name": graph.name,
        "num_nodes": graph.num_nodes,
        "num_edges": graph.num_edges,
        "feature_dim": graph.feature_dim,
        "num_classes": int(graph.num_classes),
        "format_version": FORMAT_VERSION,
        "notes": list(graph.notes),
    }
    if graph.metric:
        meta["metric"] = graph.metric
    if is_bfloat16(graph.features):
        meta["feature_dtype"] = BFLOAT16
    (directory / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


def save_array(path: Path, arr: np.ndarray) -> None:
    """Write in chunks so a memory-mapped source is never loaded whole; bfloat16 as its uint16 bits."""
    arr = arr.view(np.uint16) if is_bfloat16(arr) else arr
    out = np.lib.format.open_memmap(path, mode="w+", dtype=arr.dtype, shape=arr.shape)
    reserve(path)  # a disk too small is an error here, not a SIGBUS while the map is filled
    step = max(1, (1 << 26) // max(1, int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.itemsize))
    for start in range(0, arr.shape[0], step):
        out[start:start + step] = arr[start:start + step]
    out.flush()
    del out
