"""Your own graph from table files (``neutronorch convert EDGES OUT --features F --labels L``,
docs/datasets.md, "Your own tables"): an edge table and feature, label and optional split tables, each a
text table (CSV, TSV, whitespace-separated; gzip-compressed too; text_tables.py), a ``.npy`` array or JSON.
Vertex ids may be whole numbers or names: ids that are not exactly 0..n-1 are numbered in sorted order and
the map is kept (``node_ids``), as class names are (``class_names``). Every problem is a ``DataError`` naming
the file and the line or id, never a guess."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from neutronorch.data.arrays import class_labels
from neutronorch.data.files import Progress, open_npy, present, read_error, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.splits import DEFAULT_SPLIT, parse_split
from neutronorch.data.text_tables import TEXT_SUFFIXES, Column, from_text
from neutronorch.errors import ConfigError, DataError

TABLE_SUFFIXES = (*TEXT_SUFFIXES, *(s + ".gz" for s in TEXT_SUFFIXES), ".npy", ".json")
# Edge lists that are datasets alone (SNAP's: features and labels synthetic, ``snap.py``).
SNAP_SUFFIXES = (".txt", ".txt.gz", ".edges", ".tsv", ".tsv.gz")
HEADERS = ("auto", "yes", "no")
_SETS = {"train": "train_idx", "training": "train_idx", "val": "val_idx", "valid": "val_idx",
         "validation": "val_idx", "test": "test_idx"}


def is_table(path: str | os.PathLike) -> bool:
    return Path(path).name.lower().endswith(TABLE_SUFFIXES)


def only_a_table(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a table that is not a dataset alone: it needs the others (``load_tables``)."""
    return is_table(path) and not Path(path).name.lower().endswith(SNAP_SUFFIXES)


@reads_files
def load_tables(edges: str | os.PathLike, features: str | os.PathLike, labels: str | os.PathLike,
                split: str | None = None, seed: int = 0, directed: bool = False, header: str = "auto",
                name: str | None = None, progress: Progress | None = None) -> tuple[Graph, dict[str, np.ndarray]]:
    """The graph of an edge table, a feature table and a label table, with ``split`` (a split table, or
    ``ratio:``/``per-class:`` drawn with ``seed``; default ``ratio:0.6,0.2``); messages pass both ways
    unless ``directed`` (then from each edge's first column to its second). Returns it and what to keep
    beside it: ``node_ids`` (each vertex's id in the files, where they were renumbered) and ``class_names``.
    ``progress(file, bytes done, bytes total)`` before and after each table is read."""
    if header not in HEADERS:
        raise ConfigError(f"`header` {header!r}: expected one of {', '.join(HEADERS)}.")
    if split is not None and not is_table(split):
        parse_split(split)  # a bad spec is said before any table is read
    def read(path, role: str) -> Column:
        size = Path(path).stat().st_size if Path(path).is_file() else 0
        if progress is not None:
            progress(Path(path).name, 0, size)
        table = _read(Path(path), role, header)
        if progress is not None:
            progress(Path(path).name, size, size)
        return table

    edge_table = read(edges, "edges")
    if edge_table.values.shape[1] < 2:
        raise DataError(f"{edges}: holds one column; an edge table's lines hold a source and a destination id.")
    feature_table, label_table = read(features, "features"), read(labels, "labels")
    split_table = read(split, "split") if split is not None and is_table(split) else None
    ends = edge_table.values[:, :2]
    tables = [feature_table, label_table, *([split_table] if split_table else [])]
    node_ids, num_nodes = _numbering(edge_table.path, ends.ravel(), tables)
    number = (lambda ids: ids.astype(np.int64)) if node_ids is None else (
        lambda ids: np.searchsorted(node_ids, ids.astype(node_ids.dtype)))
    ends = number(ends.ravel()).reshape(ends.shape)
    x = _placed(feature_table, number, num_nodes, np.float32)
    y, class_names = _classes(label_table, number, num_nodes)
    notes = [f"from your tables: {edge_table.said}; {feature_table.said}; {label_table.said}"
             + (f"; {split_table.said}" if split_table else f"; split {split or DEFAULT_SPLIT} (seed {seed})"),
             "messages pass from each edge's first id to its second" if directed else "edges made undirected"]
    if node_ids is not None:
        notes.append(f"vertex ids renumbered 0..{num_nodes - 1} in sorted order; node_ids.npy keeps each "
                     f"vertex's id in the files")
    graph = Graph.from_arrays(ends[:, 0], ends[:, 1], x, y, _split_sets(split_table, number) if split_table else None,
                              name=name or _stem(edge_table.path), num_nodes=num_nodes, undirected=not directed,
                              split=split or DEFAULT_SPLIT, seed=seed)
    graph.notes[:0] = notes
    kept = {"node_ids": node_ids, "class_names": class_names}
    return graph, {key: value for key, value in kept.items() if value is not None}


def _stem(path: Path) -> str:
    return Path(path.name.removesuffix(".gz")).stem


def _read(path: Path, role: str, header: str) -> Column:
    """``path`` read as a table of ``role``: edges (ids in each row's first two columns), features (a row's
    id, then its values), labels (a row's id and label, or one label per row in id order), split (a row's id
    and its set's name)."""
    present(path, f"the {role} table", "Give the path of an existing file.")
    lower = path.name.lower()
    if lower.endswith(".npy"):
        return _from_array(path, role, np.asarray(open_npy(path, f"the {role} array", "Write it again.")))
    if lower.endswith(".json"):
        return _from_json(path, role)
    if not lower.endswith(TEXT_SUFFIXES + tuple(s + ".gz" for s in TEXT_SUFFIXES)):
        raise DataError(f"{path}: a {role} table must be a text table ({', '.join(TEXT_SUFFIXES)}, or .gz of "
                        f"one), a .npy array or a .json file.")
    return from_text(path, role, header)


def _from_array(path: Path, role: str, array: np.ndarray) -> Column:
    said = f"{role} {path.name} ({'x'.join(map(str, array.shape))} array)"
    if role == "edges":
        if array.ndim != 2 or 2 not in array.shape or array.shape == (2, 2) or array.dtype.kind not in "iu":
            raise DataError(f"{path}: holds a {array.dtype} array of shape {array.shape}; an edge array is an "
                            f"(E, 2) or (2, E) array of whole-number ids (2 x 2 is ambiguous: give a text table).")
        return Column(path, None, array if array.shape[1] == 2 else array.T, said)
    if role == "split":
        raise DataError(f"{path}: a split is a table of 'id,set' lines or a JSON object of id lists, not an array.")
    return Column(path, None, array if array.ndim > 1 or role == "labels" else array[:, None], said)


def _from_json(path: Path, role: str) -> Column:
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise read_error(path, exc, f"{path}: cannot be read as JSON ({exc}).") from None
    said = f"{role} {path.name} (JSON)"
    if role == "split":
        if not isinstance(content, dict) or not all(isinstance(ids, list) for ids in content.values()):
            raise DataError(f"{path}: a JSON split is an object mapping train, val and test to lists of ids.")
        ids = [i for members in content.values() for i in members]
        sets = [key for key, members in content.items() for _ in members]
        return Column(path, _ids(ids), np.asarray(sets, dtype=str)[:, None], said)
    if isinstance(content, dict) and role != "edges":
        return Column(path, _ids(list(content)), _values(path, role, list(content.values())), said)
    if isinstance(content, list):
        return Column(path, None, _values(path, role, content), said)
    raise DataError(f"{path}: holds a JSON {type(content).__name__}; give " + (
        "a list of [source, destination] pairs." if role == "edges" else f"an object of id -> {role}, or a list "
                                                                         f"in id order."))


def _values(path: Path, role: str, values: list) -> np.ndarray:
    try:
        array = np.asarray(values)
    except ValueError:
        array = np.asarray([])
    if role == "edges" and (array.ndim != 2 or array.shape[1:] != (2,)):
        raise DataError(f"{path}: a JSON edge list is a list of [source, destination] pairs.")
    if role == "features" and (array.ndim != 2 or array.dtype.kind not in "iuf"):
        raise DataError(f"{path}: JSON features are lists of numbers of one length, one per vertex.")
    return array if array.ndim == 2 else array[:, None]


def _ids(ids: list) -> np.ndarray:
    """JSON ids (object keys are text): whole numbers where every one is one, else names."""
    text = np.asarray([str(i) for i in ids])
    try:
        return np.asarray([int(i) for i in text], dtype=np.int64)
    except ValueError:
        return text


def _numbering(edges: Path, ends: np.ndarray, tables: list[Column]) -> tuple[np.ndarray | None, int]:
    """Each vertex's id in the files, sorted (None where they are 0..n-1 already), and the vertex count.
    Tables in row order (no ids) number their rows 0..rows-1, which needs whole-number ids."""
    listed = [t.ids for t in tables if t.ids is not None]
    ordered = [t for t in tables if t.ids is None]
    names = [a for a in (ends, *listed) if a.dtype.kind not in "iu"]
    if names and ordered:
        raise DataError(f"{ordered[0].path}: lists its rows in id order, but the ids are names (such as "
                        f"{str(names[0].ravel()[0])!r}); give a table whose lines start with the vertex id.")
    every = np.concatenate([a.astype(str) if names else a for a in (ends, *listed)])
    if not names:
        rows = max((t.values.shape[0] for t in ordered), default=0)
        low, high = (int(every.min()), int(every.max())) if every.size else (0, -1)
        if ordered and low < 0:
            raise DataError(f"{edges}: uses vertex id {low}, and {ordered[0].path} holds rows for vertices "
                            f"0..{rows - 1} (in id order).")
        if ordered and high >= rows:
            raise DataError(f"{edges}: uses vertex id {high}, but {ordered[0].path} holds rows for vertices "
                            f"0..{rows - 1} only (in id order).")
        present_ids = np.zeros(max(high + 1, rows), bool)
        if low >= 0 and present_ids.shape[0] <= 4 * every.shape[0] + rows:
            present_ids[every] = True
            present_ids[:rows] = True
            if present_ids.all():
                return None, present_ids.shape[0]
    unique = np.sort(every)
    unique = unique[np.concatenate(([True], unique[1:] != unique[:-1]))]
    return unique, unique.shape[0]


def _placed(table: Column, number, num_nodes: int, dtype) -> np.ndarray:
    """A table's values as a row per vertex (rows in id order, or placed at their ids' numbers)."""
    if table.ids is None:
        if table.values.shape[0] != num_nodes:
            raise DataError(f"{table.path}: holds {table.values.shape[0]:,} rows in id order, and the graph has "
                            f"{num_nodes:,} vertices; give a row per vertex.")
        return table.values
    at = number(table.ids)
    order = np.sort(at)
    if (again := order[1:][order[1:] == order[:-1]]).size:
        raise DataError(f"{table.path}: lists vertex {table.ids[np.flatnonzero(at == again[0])[0]].item()!r} more "
                        f"than once; each vertex's row appears once.")
    if at.shape[0] != num_nodes:
        raise DataError(f"{table.path}: holds rows for {at.shape[0]:,} of the {num_nodes:,} vertices; give every "
                        f"vertex a row (a vertex of the edge table lacks one).")
    out = np.empty((num_nodes, table.values.shape[1]), dtype or table.values.dtype)
    out[at] = table.values
    return out


def _classes(table: Column, number, num_nodes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Class ids (-1: no label) and, where the labels are names, the names in class order."""
    if table.ids is None and table.values.ndim == 2 and table.values.shape[1] > 1:  # 0/1 rows of tasks
        return class_labels(table.values, num_nodes, str(table.path)), None
    values = table.values[:, 0]
    names = None
    if values.dtype.kind not in "iuf":  # names of classes ("" for none)
        names = np.unique(values[values != ""])
        values = np.where(values == "", -1, np.searchsorted(names, values))
    if table.ids is None:
        return class_labels(values, num_nodes, str(table.path)), names
    at = number(table.ids)
    if np.unique(at).shape[0] != at.shape[0]:
        raise DataError(f"{table.path}: lists a vertex more than once; give each vertex one label.")
    labels = np.full(num_nodes, -1, np.int64)
    labels[at] = class_labels(values, at.shape[0], str(table.path))
    return labels, names


def _set_name(path: Path, name) -> str:
    key = _SETS.get(str(name).strip().lower())
    if key is None:
        raise DataError(f"{path}: names set {str(name)!r}; the sets are train, val (or valid) and test.")
    return key


def _split_sets(table: Column, number) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sets = np.asarray([_set_name(table.path, s) for s in table.values[:, 0]])
    at = number(table.ids)
    if np.unique(at).shape[0] != at.shape[0]:
        raise DataError(f"{table.path}: lists a vertex more than once; a vertex is in one set at most.")
    return tuple(np.sort(at[sets == key]).astype(np.int64) for key in ("train_idx", "val_idx", "test_idx"))
