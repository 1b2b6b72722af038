"""Your own graph from table files (``neutronorch convert EDGES OUT --features F --labels L``,
docs/datasets.md, "Your own tables"): an edge table and feature, label and optional split tables, each a
text table (CSV, TSV, whitespace-separated; gzip-compressed too; text_tables.py), a ``.npy`` array or JSON.
Vertex ids may be whole numbers or names: ids that are not exactly 0..n-1 are numbered in sorted order and
the map is kept (``node_ids``), as class names are (``class_names``). Every problem is a ``DataError`` naming
the file and the line or id, never a guess: a label table of several columns is read only with the labels'
column named (``label_column``), and labels that look like ids are said in the notes."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import zlib
from pathlib import Path

import numpy as np

from neutronorch.data.arrays import class_labels
from neutronorch.data.files import Progress, open_npy, present, read_error, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.splits import DEFAULT_SPLIT, parse_split
from neutronorch.data.text_tables import TEXT_SUFFIXES, Column, from_text, is_number, places
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError

TABLE_SUFFIXES = (*TEXT_SUFFIXES, *(s + ".gz" for s in TEXT_SUFFIXES), ".npy", ".json")
# Edge lists that are datasets alone (SNAP's: features and labels synthetic, ``snap.py``).
SNAP_SUFFIXES = (".txt", ".txt.gz", ".edges", ".tsv", ".tsv.gz")
HEADERS = ("auto", "yes", "no")
# How the note on labels that look like ids begins (the command line prints it as a warning).
LIKE_IDS = "labels look like ids, not classes"
# The notes of a graph whose tables give no labels, or no features.
NO_LABELS = ("no labels: a graph for link prediction (train --task link); a node task needs labels (convert "
             "again with --labels)")
FEATURELESS = ("no features: written as a typed graph of one vertex type without features, whose vertices the "
               "typed models give a learned embedding each")
_SETS = {"train": "train_idx", "training": "train_idx", "val": "val_idx", "valid": "val_idx",
         "validation": "val_idx", "test": "test_idx"}


def is_table(path: str | os.PathLike) -> bool:
    return Path(path).name.lower().endswith(TABLE_SUFFIXES)


def only_a_table(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a table that is not a dataset alone: it needs the others (``load_tables``). A file
    with SNAP's suffixes is a SNAP edge list where its first line (after ``#`` comments and blank lines) is
    numbers apart by whitespace; one whose first line holds a header or names is your table."""
    if not is_table(path):
        return False
    return not Path(path).name.lower().endswith(SNAP_SUFFIXES) or not _first_line_numbers(Path(path))


def _first_line_numbers(path: Path) -> bool:
    """Whether the first line of ``path`` with anything on it is whitespace-separated numbers (a SNAP edge
    list's); a file that cannot be read counts as one, for the SNAP reader to say what is wrong with it."""
    try:
        with (gzip.open(path, "rt", encoding="utf-8-sig") if path.name.lower().endswith(".gz")
              else open(path, encoding="utf-8-sig")) as text:
            for line in itertools.islice(text, 100_000):
                tokens = line.partition("#")[0].split()
                if tokens:
                    return all(map(is_number, tokens))
    except (OSError, EOFError, UnicodeDecodeError, zlib.error):
        pass
    return True


@reads_files
def load_tables(edges: str | os.PathLike, features: str | os.PathLike | None = None,
                labels: str | os.PathLike | None = None, split: str | None = None, seed: int = 0,
                directed: bool = False, header: str = "auto", name: str | None = None,
                progress: Progress | None = None,
                label_column: str | int | None = None) -> tuple[Graph | TypedGraph, dict[str, np.ndarray]]:
    """The graph of an edge table, a feature table and a label table, with ``split`` (a split table, or
    ``ratio:``/``per-class:`` drawn with ``seed``; default ``ratio:0.6,0.2``); messages pass both ways
    unless ``directed`` (then from each edge's first column to its second). ``label_column``: the column of
    a text label table that holds the labels, by header name or index from 0 (needed where it has more than
    one column after the id). Without ``labels`` the graph has no node task (``num_classes`` 0, no split: a
    link task's graph) and a ``split`` is refused; without ``features`` it is the ``TypedGraph`` of one vertex
    type without features, whose vertices the typed models give a learned embedding each (``write_typed``
    writes it). Returns it and what to keep beside it: ``node_ids`` (each vertex's id in the files, where they
    were renumbered) and ``class_names``. ``progress(file, bytes done, bytes total)`` before and after each
    table is read."""
    if header not in HEADERS:
        raise ConfigError(f"`header` {header!r}: expected one of {', '.join(HEADERS)}.")
    if labels is None and split is not None:
        what = ("an edge split, drawn as a link task trains, not stored with the data" if str(split).startswith(
            "edges:") else "splits the labelled vertices of a node task, and no labels are given, so there is none")
        raise ConfigError(f"`split` {split}: {what}; leave `split` out (a link task splits the edges as it "
                          f"trains: train --task link --split edges:TRAIN,VAL), or give the labels.")
    if split is not None and not is_table(split):
        parse_split(split)  # a bad spec is said before any table is read
    _check_label_column(label_column, None if labels is None else Path(labels))
    def read(path, role: str) -> Column:
        size = Path(path).stat().st_size if Path(path).is_file() else 0
        if progress is not None:
            progress(Path(path).name, 0, size)
        table = _read(Path(path), role, header, label_column)
        if progress is not None:
            progress(Path(path).name, size, size)
        return table

    edge_table = read(edges, "edges")
    if edge_table.values.shape[1] < 2:
        raise DataError(f"{edges}: holds one column; an edge table's lines hold a source and a destination id.")
    feature_table = read(features, "features") if features is not None else None
    label_table = read(labels, "labels") if labels is not None else None
    split_table = read(split, "split") if split is not None and is_table(split) else None
    ends = edge_table.values[:, :2]
    tables = [table for table in (feature_table, label_table, split_table) if table is not None]
    uses = [(edge_table, ends), *((t, t.ids[:, None]) for t in tables if t.ids is not None)]  # where ids appear
    node_ids, num_nodes = _numbering(uses, [t for t in tables if t.ids is None])
    number = (lambda ids: ids.astype(np.int64)) if node_ids is None else (
        lambda ids: np.searchsorted(node_ids, ids.astype(node_ids.dtype)))
    x = (_placed(feature_table, number, num_nodes, np.float32, uses, node_ids) if feature_table is not None
         else np.zeros((num_nodes, 0), np.float32))
    y, class_names = _classes(label_table, number, num_nodes) if label_table else (np.full(num_nodes, -1), None)
    if label_table:
        _check_classes(y, label_table)
    ends = number(ends.ravel()).reshape(ends.shape)
    notes = [f"from your tables: {edge_table.said}; {feature_table.said if feature_table else 'no features'}; "
             f"{label_table.said if label_table else 'no labels'}"
             + (f"; {split_table.said}" if split_table else f"; split {split or DEFAULT_SPLIT} (seed {seed})"
                if label_table else ""),
             "messages pass from each edge's first id to its second" if directed else "edges made undirected"]
    notes += [f"{table.path.name}: {table.ignored} not used" for table in (edge_table, *tables) if table.ignored]
    if node_ids is not None:
        notes.append(f"{num_nodes:,} vertex ids renumbered 0..{num_nodes - 1} in sorted order; node_ids.npy "
                     f"keeps each vertex's id in the files")
    notes += _like_ids(y, label_table) if label_table else [NO_LABELS]
    none = np.empty(0, np.int64)
    graph = Graph.from_arrays(ends[:, 0], ends[:, 1], x, y, _split_sets(split_table, number) if split_table else
                              None if label_table else (none, none, none), name=name or _stem(edge_table.path),
                              num_nodes=num_nodes, undirected=not directed, split=split or DEFAULT_SPLIT, seed=seed,
                              num_classes=None if label_table else 0)
    graph.notes[:0] = notes
    kept = {"node_ids": node_ids, "class_names": class_names}
    return graph if feature_table else _featureless(graph), {k: v for k, v in kept.items() if v is not None}


def _featureless(graph: Graph) -> TypedGraph:
    """A graph whose tables give no features as the typed graph of its one vertex type without features: the
    typed models learn an embedding per vertex of such a type (docs/heterogeneous.md)."""
    typed = TypedGraph.of(graph)
    typed.features, typed.labels = {}, graph.labels if graph.num_classes else None
    typed.notes.append(FEATURELESS)
    return typed.validate(graph.name)


def _check_label_column(label_column, labels: Path | None) -> None:
    """``label_column`` picks a column of a text table; given for an array or JSON file, or without labels, it
    is refused."""
    if label_column is None:
        return
    if labels is None:
        raise ConfigError(f"`label_column` {label_column!r}: picks the labels' column of a label table, and none is "
                          f"given; give the labels, or leave `label_column` out.")
    if isinstance(label_column, bool) or not isinstance(label_column, (str, int, np.integer)):
        raise ConfigError(f"`label_column` {label_column!r}: expected a column's header name or its index from 0.")
    if labels.name.lower().endswith((".npy", ".json")):  # a text table's is checked as it is read
        kind = "a .npy array" if labels.name.lower().endswith(".npy") else "a JSON file"
        raise ConfigError(f"`label_column` {label_column!r}: picks the labels' column of a text label table, and "
                          f"{labels} is {kind}, whose labels are read as they are; leave `label_column` out, or "
                          f"give the labels alone.")


def _like_ids(labels: np.ndarray, table: Column) -> list[str]:
    """The note where labels look like ids: as many classes as labelled vertices, or over half as many."""
    given = labels[labels >= 0] if labels.ndim == 1 else labels[:0]
    classes = np.unique(given).shape[0]
    if not given.size or 2 * classes <= given.size:
        return []
    return [f"{LIKE_IDS}: {table.path.name} gives {classes:,} classes to {given.size:,} labelled vertices "
            f"({'one a class' if classes == given.size else 'under 2 a class'}); if that column holds ids or names, "
            f"not classes, pick the labels' column (convert's --label-column)"]


def _stem(path: Path) -> str:
    return Path(path.name.removesuffix(".gz")).stem


def _read(path: Path, role: str, header: str, label_column: str | int | None = None) -> Column:
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
    return from_text(path, role, header, label_column)


def _from_array(path: Path, role: str, array: np.ndarray) -> Column:
    said = f"{role} {path.name} ({' x '.join(f'{size:,}' for size in array.shape)} array)"
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
        content = json.loads(path.read_text(encoding="utf-8-sig"))
    except (OSError, ValueError) as exc:
        raise read_error(path, exc, f"{path}: cannot be read as JSON ({exc}).") from None
    said = f"{role} {path.name} (JSON)"
    if role == "split":
        if not isinstance(content, dict) or not all(isinstance(ids, list) for ids in content.values()):
            raise DataError(f"{path}: a JSON split is an object mapping train, val and test to lists of ids.")
        ids = [i for members in content.values() for i in members]
        sets = [key for key, members in content.items() for _ in members]
        return Column(path, _ids(ids), np.asarray(sets, dtype=str)[:, None], said, "item")
    if isinstance(content, dict) and role != "edges":
        values = _values(path, role, list(content.values()))
        if role == "labels" and values.shape[1] != 1:  # {id: [a, b]}: which is the label is not for us to guess
            raise DataError(f"{path}: gives {values.shape[1]} values per id (such as "
                            f"{next(iter(content.items()))}); a label is one value, a class number or name: "
                            f"give an object of id -> label.")
        return Column(path, _ids(list(content)), values, said, "item")
    if isinstance(content, list):
        return Column(path, None, _values(path, role, content), said, "item")
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


def _numbering(uses: list[tuple[Column, np.ndarray]], ordered: list[Column]) -> tuple[np.ndarray | None, int]:
    """Each vertex's id in the files, sorted (None where they are 0..n-1 already), and the vertex count, of
    the ids ``uses`` gives (each table with its ids, a row of them per table row). Tables in row order
    (``ordered``) number their rows 0..rows-1, which needs whole-number ids."""
    names = [(table, ids) for table, ids in uses if ids.dtype.kind not in "iu"]
    if names and ordered:
        table, ids = names[0]
        raise DataError(f"{ordered[0].path}: lists its rows in id order, but the ids are names (such as "
                        f"{str(ids.ravel()[0])!r}, {table.path.name} {places(table, [0])}); give a table whose "
                        f"lines start with the vertex id.")
    every = np.concatenate([ids.ravel().astype(str) if names else ids.ravel() for _, ids in uses])
    if not names:
        rows = max((t.values.shape[0] for t in ordered), default=0)
        low, high = (int(every.min()), int(every.max())) if every.size else (0, -1)
        for bad, why in ((low, "and" if low < 0 else ""), (high, "but" if high >= rows else "")):
            if ordered and why:
                table, row = _first_use(bad, uses)
                raise DataError(f"{table.path}: {places(table, [row])} uses vertex id {bad}, {why} "
                                f"{ordered[0].path} holds rows for vertices 0..{rows - 1} only (in id order).")
        present_ids = np.zeros(max(high + 1, rows), bool)
        if low >= 0 and present_ids.shape[0] <= 4 * every.shape[0] + rows:
            present_ids[every] = True
            present_ids[:rows] = True
            if present_ids.all():
                return None, present_ids.shape[0]
    unique = np.sort(every)
    unique = unique[np.concatenate(([True], unique[1:] != unique[:-1]))]
    return unique, unique.shape[0]


def _first_use(value, uses: list[tuple[Column, np.ndarray]]) -> tuple[Column, int]:
    """The first table and row that holds the id ``value``."""
    for table, ids in uses:
        rows = np.flatnonzero((ids == value).any(axis=1))
        if rows.size:
            return table, int(rows[0])
    raise AssertionError(f"no table holds id {value!r}")


def _id(value) -> str:
    """An id as the messages quote it: a number as it is, a name in quotes."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _once(table: Column, at: np.ndarray, why: str) -> None:
    """Refuses a table that lists a vertex twice, naming the first such vertex and its rows."""
    order = np.sort(at)
    again = order[1:][order[1:] == order[:-1]]
    if again.size:
        first = np.flatnonzero(np.isin(at, again))[0]
        rows = np.flatnonzero(at == at[first])
        raise DataError(f"{table.path}: lists vertex {_id(table.ids[first])} more than once ({places(table, rows)}); "
                        f"{why}.")


def _placed(table: Column, number, num_nodes: int, dtype, uses: list[tuple[Column, np.ndarray]],
            node_ids: np.ndarray | None) -> np.ndarray:
    """A table's values as a row per vertex (rows in id order, or placed at their ids' numbers)."""
    if table.ids is None:
        if table.values.shape[0] != num_nodes:
            raise DataError(f"{table.path}: holds {table.values.shape[0]:,} rows in id order, and the graph has "
                            f"{num_nodes:,} vertices; give a row per vertex.")
        return table.values
    at = number(table.ids)
    _once(table, at, "each vertex's row appears once")
    if at.shape[0] != num_nodes:
        has = np.zeros(num_nodes, bool)
        has[at] = True
        raise DataError(f"{table.path}: holds rows for {at.shape[0]:,} of the {num_nodes:,} vertices: "
                        f"{_lacking(table, has, uses, number, node_ids)}; give every vertex a row.")
    out = np.empty((num_nodes, table.values.shape[1]), dtype or table.values.dtype)
    out[at] = table.values
    return out


def _lacking(table: Column, has: np.ndarray, uses: list[tuple[Column, np.ndarray]], number,
             node_ids: np.ndarray | None) -> str:
    """The first vertex without a row of ``table`` (``has``: which have one), as written where it first
    appears, and how many more lack one."""
    missing = int((~has).sum())
    more = f", and {missing - 1:,} more lack one" if missing > 1 else ""
    for other, ids in uses:
        if other is not table:
            at = number(ids.ravel()).reshape(ids.shape)
            rows = np.flatnonzero((~has[at]).any(axis=1))
            if rows.size:
                row = int(rows[0])
                value = ids[row, int(np.flatnonzero(~has[at[row]])[0])]
                return f"vertex {_id(value)} ({other.path.name} {places(other, [row])}) has none{more}"
    vertex = int(np.flatnonzero(~has)[0])  # a row of a table in id order
    return f"vertex {_id(vertex if node_ids is None else node_ids[vertex])} has none{more}"


def _classes(table: Column, number, num_nodes: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Class ids (-1: no label) and, where the labels are names, the names in class order."""
    if table.ids is None and table.values.ndim == 2 and table.values.shape[1] > 1:  # 0/1 rows of tasks
        return class_labels(table.values, num_nodes, str(table.path)), None
    values = table.values[:, 0] if table.values.ndim == 2 else table.values  # a .npy of labels is 1-D
    names = None
    if values.dtype.kind not in "iuf":  # names of classes ("" for none)
        names = np.unique(values[values != ""])
        values = np.where(values == "", -1, np.searchsorted(names, values))
    if table.ids is None:
        return class_labels(values, num_nodes, str(table.path)), names
    at = number(table.ids)
    _once(table, at, "give each vertex one label")
    labels = np.full(num_nodes, -1, np.int64)
    labels[at] = class_labels(values, at.shape[0], str(table.path))
    return labels, names


def _check_classes(labels: np.ndarray, table: Column) -> None:
    """Class numbers run from 0, at most one class a vertex (as a native dataset holds them): a larger one
    is an id, or a code to give as a name, and would make an output layer of that width."""
    top = int(labels.max(initial=-1)) if labels.ndim == 1 else -1
    if top + 1 > max(2, labels.shape[0]):
        rows = np.flatnonzero(table.values.ravel() == top) if table.ids is not None else [int(np.argmax(labels))]
        raise DataError(f"{table.path}: {places(table, rows[:1])} gives class {top}, and {labels.shape[0]:,} "
                        f"vertices have classes 0..{max(2, labels.shape[0]) - 1} at most: that is an id, not a "
                        f"class number. Give the labels' column (`label_column`), or class codes as names (such as "
                        f"'c{top}'), which are numbered in sorted order.")


def _split_sets(table: Column, number) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    named = np.char.lower(np.char.strip(table.values[:, 0].astype(str)))
    for name in np.unique(named):
        if str(name) not in _SETS:
            row = np.flatnonzero(named == name)[0]
            raise DataError(f"{table.path}: {places(table, [row])} names set {str(table.values[row, 0])!r}; the "
                            f"sets are train, val (or valid) and test.")
    sets = np.asarray([_SETS[str(name)] for name in named])
    at = number(table.ids)
    _once(table, at, "a vertex is in one set at most")
    return tuple(np.sort(at[sets == key]).astype(np.int64) for key in ("train_idx", "val_idx", "test_idx"))
