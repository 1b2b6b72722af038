"""What every prediction (``predict``, ``embed``, ``score_pairs``) reads and writes: the vertices asked for,
the rows given back (in memory, or a ``.npy`` file ``out`` checked before any work and written atomically)
and the scratch folder of the intermediate layers' rows. It computes no row itself."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch

from neutronorch.atomic import open_array_atomically
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.memory import available_memory_bytes
from neutronorch.train.output_guard import (check_creatable, check_distinct, check_fresh, check_name_lengths,
                                              check_space)
from neutronorch.train.task import Task

NODE_SETS = ("test", "val", "train", "all")
# What ``nodes`` may be: a set's name, a .npy or text file, or the vertex ids themselves.
Nodes = Union[str, os.PathLike, np.ndarray, torch.Tensor, Sequence[int]]


def select_nodes(graph: Graph | TypedGraph, nodes: Nodes, node_type: str | None = None) -> np.ndarray:
    """``test``, ``val``, ``train``, ``all``, a ``.npy`` file of vertex ids, a text file of them (``read_ids``),
    or the ids themselves (a numpy array, list, tuple or torch tensor), checked alike: 1-D integers in
    0..num_nodes-1. Of a typed graph, ids of ``node_type`` (default: the target, whose vertices the splits
    hold)."""
    count, of = graph.num_nodes, ""
    if isinstance(graph, TypedGraph):
        node_type = node_type or graph.target
        count, of = graph.num_nodes[node_type], f" ({node_type} vertices)"
    if isinstance(nodes, (str, os.PathLike)):
        if nodes in ("test", "val", "train"):
            if isinstance(graph, TypedGraph) and node_type != graph.target:
                raise ConfigError(f"`nodes` {nodes}: the splits hold vertices of the target type {graph.target}; "
                                  f"give all, or a .npy file of {node_type} ids.")
            return np.array(getattr(graph, f"{nodes}_idx"), dtype=np.int64)
        if nodes == "all":
            return np.arange(count, dtype=np.int64)
        if not Path(nodes).is_file():
            raise ConfigError(f"`nodes` {str(nodes)!r}: give one of {', '.join(NODE_SETS)}, an existing file of "
                              f"vertex ids (.npy, or text), or the ids (an array, list or tensor).")
        what = f"`nodes` {nodes}"
        if Path(nodes).suffix != ".npy":
            ids, lines = read_ids(Path(nodes), what)
            ids = whole_numbers(ids, lines, what)
        else:
            ids = load_array(Path(nodes), what)
    else:
        ids, what = ids_in_memory(nodes), "`nodes` (vertex ids given in memory)"
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        named = ids.dtype.kind in "USO"  # names, as a table converted with ids renumbered has them
        raise ConfigError(f"{what}: expected a 1-D array of integer vertex ids, got {ids.dtype} {ids.shape}"
                          + ("; these look like names: a dataset converted from your tables numbers its vertices "
                             "0..n-1, and its node_ids.npy gives each number's name (docs/datasets.md, 'Your own "
                             "tables'): look the names up there" if named else "") + ".")
    bad = (ids < 0) | (ids >= count)  # compared in the ids' own type: a huge unsigned id is shown as it is
    if bad.any():
        first = int(np.argmax(bad))
        raise ConfigError(f"{what}: {int(bad.sum()):,} vertex id{'s' if bad.sum() > 1 else ''} out of range, the "
                          f"first {int(ids[first])} (entry {first}); vertex ids must be in 0..{count - 1}{of}.")
    return ids.astype(np.int64)


def load_array(path: Path, what: str) -> np.ndarray:
    """A .npy file of ids (no pickles); one that cannot be read is the user's error, named by ``what``."""
    try:
        return np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"{what}: cannot be read as a .npy array ({exc}).") from None


def id_lines(path: Path, what: str, spaced: bool = False) -> list[tuple[int, list[str]]]:
    """A text file's ids by line: (its number from 1, its ids, separated by commas or whitespace or both),
    blank lines and ``#`` comments left out. ``spaced``: the ids may hold spaces (a dataset's own ids do), so
    only commas and tabs separate them, and a line without either is one id."""
    try:
        with open(path, encoding="utf-8-sig") as text:
            lines = [(number, _fields(line.partition("#")[0], spaced)) for number, line in enumerate(text, 1)]
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{what}: cannot be read as text ({exc}).") from None
    return [(number, ids) for number, ids in lines if ids]


# A field of an id file: quoted (it may then hold the separators, as a table's quoted field does), or a run of
# what separates no ids: commas and whitespace, or where ids hold spaces commas and tabs.
_FIELD = {False: re.compile(r'"([^"]*)"|([^,\s"]+)'), True: re.compile(r'"([^"]*)"|([^,\t"]+)')}


def _fields(line: str, spaced: bool) -> list[str]:
    found = ((quoted if quoted else bare.strip()) for quoted, bare in _FIELD[spaced].findall(line))
    return [field for field in found if field]


def read_ids(path: Path, what: str, spaced: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The ids of a text file (``id_lines``: one a line, or several separated by commas or spaces; only commas
    and tabs where ``spaced``), as text, and the line (from 1) of each; a file without any is refused."""
    lines = id_lines(path, what, spaced)
    ids = np.asarray([i for _, found in lines for i in found], dtype=str)
    if not ids.size:
        apart = "commas or tabs" if spaced else "commas or spaces"
        raise ConfigError(f"{what}: holds no ids; give one a line, or several separated by {apart}.")
    return ids, np.asarray([number for number, found in lines for _ in found], dtype=np.int64)


def whole_numbers(ids: np.ndarray, lines: np.ndarray, what: str) -> np.ndarray:
    """Ids read as text (``read_ids``) as vertex numbers, int64; the first that is none is refused with its
    line."""
    try:
        return ids.astype(np.int64)
    except (ValueError, OverflowError):
        bad = next(k for k, i in enumerate(ids) if not is_whole(i))
        raise ConfigError(f"{what}: line {lines[bad]} holds {str(ids[bad])!r}, not a vertex number (a whole "
                          f"number from 0).") from None


def is_whole(text: str) -> bool:
    """Whether ``text`` is a whole number int64 holds."""
    try:
        return -(1 << 63) <= int(text) < 1 << 63
    except ValueError:
        return False


def ids_in_memory(nodes, what: str = "`nodes` (vertex ids given in memory)") -> np.ndarray:
    """Vertex ids a caller holds: a numpy array, list, tuple or torch tensor (on any device); ``what``
    names them in the error a value that is no array gets."""
    if isinstance(nodes, torch.Tensor):
        return nodes.detach().cpu().numpy()
    if isinstance(nodes, (list, tuple)) and len(nodes) == 0:
        return np.zeros(0, dtype=np.int64)  # np.asarray([]) would be float64
    try:
        return np.asarray(nodes)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot be read as an array ({exc}).") from None


def prediction_rows(task: Task, probabilities: bool) -> tuple[tuple, type, object]:
    """(row shape, dtype, transform of the logits) of ``predict``'s output for ``task``."""
    if probabilities:
        return (task.num_classes,), np.float32, task.probabilities
    if task.multilabel:
        return (task.num_classes,), np.int8, task.predictions
    return (), np.int64, task.predictions


def write_rows(out: str | os.PathLike | None, shape: tuple, dtype, fill) -> np.ndarray:
    """``fill(array)`` of a new array of ``shape`` and ``dtype``: in memory (``out`` None, returned), or a
    memory-mapped ``.npy`` file ``out`` written atomically (its space checked first), returned opened
    read-only."""
    if out is None:
        array = np.empty(shape, dtype)
        fill(array)
        return array
    check_space("out", out, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    with open_array_atomically(out, shape, dtype) as array:
        fill(array)
    return np.load(out, mmap_mode="r")


def check_prediction_output(out, scratch, checkpoint, graph: Graph | TypedGraph, overwrite: bool,
                            inputs: dict[str, list]) -> None:
    """``out`` of a prediction (None: nothing to check) checked before any work (``check_output_path``)
    against the checkpoint's file, the graph's and ``inputs`` (field -> the files it names)."""
    if out is not None:
        reads = {"checkpoint": [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else [],
                 "dataset": graph.files(), **inputs}
        check_output_path(out, scratch, reads, overwrite)


def check_output_path(out: str | os.PathLike, scratch: str | None = "auto", reads: dict | None = None,
                      overwrite: bool = False, text: tuple[str, ...] = ()) -> None:
    """Fail before any data is loaded if the output or the scratch folder cannot be written, if the output
    is one of the inputs in ``reads`` (field -> paths), or if it exists and ``overwrite`` is not given.
    ``text``: the suffixes of text tables the caller writes besides a .npy array."""
    check_name_lengths("out", out, temporary=True)
    if Path(out).suffix.lower() not in (".npy", *text):  # the name says what the file holds
        tables = f", or {' or '.join(text)} for a text table of your ids" if text else ""
        raise ConfigError(f"`out` {out}: the rows are written as a .npy array{tables}; give a path ending in .npy "
                          f"({Path(out).with_suffix('.npy')}){tables and ' or one of those'}, so that its name says "
                          f"what it holds.")
    check_distinct(reads or {}, {"out": [out]})
    check_fresh({"out": [out]}, overwrite)
    check_creatable("out", out)
    if scratch not in ("auto", None) and not (Path(scratch).is_dir() and os.access(scratch, os.W_OK)):
        raise ConfigError(f"`scratch_dir` {scratch}: not a writable folder (or give auto, or memory).")


def scratch_folder(model: torch.nn.Module, graph: Graph, layers: int, scratch: str | None,
                   out: str | os.PathLike | None) -> str | None:
    """Where the intermediate layers' embeddings go: None (memory) or a folder (memory maps)."""
    if scratch != "auto" or not getattr(model, "layerwise", True):  # a user's model keeps no layer's rows
        return scratch if scratch != "auto" else None
    widths = [model.width(i) for i in range(layers - 1)]
    # Two layers' rows of every vertex are alive at once (the one read and the one written).
    needed = 2 * graph.num_nodes * max(widths, default=0) * 4
    available = available_memory_bytes()
    if not widths or available is None or needed <= available // 2:
        return None
    return str(Path(out).resolve().parent) if out is not None else tempfile.gettempdir()
