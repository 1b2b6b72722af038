"""The vertex ids ``predict`` and ``embed`` read from files (``--nodes FILE``, ``--pairs FILE``). On a dataset
``convert`` renumbered (``node_ids.npy`` beside it: row k is vertex k's id in your tables) they are the ids of
your tables, numbers or names, each read as its vertex; one your tables do not hold is refused, named with its
line. Elsewhere they are vertex numbers, read by ``select_nodes`` and ``read_pairs``. Either way the rows
written follow the file's order."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from neutronorch.data.files import open_npy
from neutronorch.errors import ConfigError
from neutronorch.train.link_predict import PAIR_FORMS, read_pairs
from neutronorch.train.prediction_io import NODE_SETS, id_lines, is_whole, load_array, read_ids

_SHOWN = 5  # ids not found that an error names


def given_ids(args: argparse.Namespace) -> tuple[object, dict]:
    """``--nodes`` as ``predict`` and ``embed`` take it (a file of your tables' ids on a renumbered dataset:
    their vertices, in the file's order) and ``score_pairs``' options for ``--pairs`` (read here, so a bad
    file fails before the data loads: a (2, P) array of vertex numbers, ``source`` naming the file)."""
    nodes, pairs = args.nodes, getattr(args, "pairs", None)
    table, node_ids = Path(args.dataset) / "node_ids.npy", kept(args.dataset, "node_ids")
    if node_ids is not None and nodes not in (None, *NODE_SETS):
        nodes = _nodes(Path(nodes), node_ids, table)
        print(f"read {len(nodes):,} id{'' if len(nodes) == 1 else 's'} of {args.nodes} as your tables' ids (their vertices: {table})")
    if pairs is None:
        return nodes, {}
    array = read_pairs(pairs) if node_ids is None else _pairs(Path(pairs), node_ids, table)
    if node_ids is not None:
        print(f"read {array.shape[1]:,} pair{'' if array.shape[1] == 1 else 's'} of {pairs} as your tables' ids (their vertices: {table})")
    return nodes, {"pairs": array, "layout": "columns", "source": pairs}


def kept(dataset: str, name: str) -> np.ndarray | None:
    """``node_ids`` or ``class_names`` as ``convert`` kept them beside a dataset (None where it did not)."""
    path = Path(dataset) / f"{name}.npy"
    if not path.is_file():
        return None
    return np.asarray(open_npy(path, f"the dataset's {name}", "Convert your tables again.", mmap=False))


def _nodes(path: Path, node_ids: np.ndarray, table: Path) -> np.ndarray:
    what = f"`nodes` {path}"
    if not path.is_file():
        raise ConfigError(f"{what}: no such file; give one of {', '.join(NODE_SETS)}, or a file of your tables' "
                          f"ids (.npy, or text: one a line, or separated by commas or spaces).")
    if path.suffix != ".npy":
        return to_vertices(*read_ids(path, what, spaced(node_ids)), node_ids, what, table)
    ids = load_array(path, what)
    if ids.ndim != 1:
        raise ConfigError(f"{what}: holds an array of shape {ids.shape}; give a 1-D array of your tables' ids.")
    return to_vertices(ids, None, node_ids, what, table)


def _pairs(path: Path, node_ids: np.ndarray, table: Path) -> np.ndarray:
    what = f"`pairs` {path}"
    if not path.is_file():
        raise ConfigError(f"{what}: no such file; give {PAIR_FORMS}, of your tables' ids.")
    if path.suffix == ".npy":  # its layout as read_pairs reads an array of vertex numbers
        array = load_array(path, what)
        return read_pairs(to_vertices(array.ravel(), None, node_ids, what, table, array.shape).reshape(array.shape),
                          source=str(path))
    lines = id_lines(path, what, spaced(node_ids))
    if not lines:
        raise ConfigError(f"{what}: holds no pairs; give at least one (u, v) pair to score.")
    if wrong := next(((number, len(ids)) for number, ids in lines if len(ids) != 2), None):
        form = "'u,v' or u and v apart by a tab (your ids hold spaces)" if spaced(node_ids) else "'u v' or 'u,v'"
        raise ConfigError(f"{what}: line {wrong[0]} holds {wrong[1]} id{'' if wrong[1] == 1 else 's'}; give two per line, {form}.")
    ids = np.asarray([i for _, pair in lines for i in pair], dtype=str)
    at = np.repeat(np.asarray([number for number, _ in lines], dtype=np.int64), 2)
    return read_pairs(to_vertices(ids, at, node_ids, what, table).reshape(-1, 2), layout="rows", source=str(path))


def spaced(node_ids: np.ndarray) -> bool:
    """Whether some of your tables' ids hold whitespace: then a text file of them separates ids by commas or
    tabs only, and a line without either is one id."""
    return node_ids.dtype.kind in "US" and bool(np.char.count(node_ids.astype(str), " ").any())


def to_vertices(ids: np.ndarray, lines: np.ndarray | None, node_ids: np.ndarray, what: str, table: Path,
                shape: tuple | None = None) -> np.ndarray:
    """The vertex of each of ``ids`` (your tables' ids, as text or as an array holds them): its row in the
    sorted ``node_ids`` (``table``), int64. Ids not among them are refused, counted, the first few named with
    their lines (``lines``: of a text file) or their places in an array of ``shape``."""
    ids = np.asarray(ids).ravel()
    if ids.dtype.kind not in "iuUS":
        raise ConfigError(f"{what}: holds {ids.dtype} values; give your tables' ids (whole numbers or names).")
    whole = np.ones(ids.shape, bool)
    if node_ids.dtype.kind in "iu" and ids.dtype.kind in "iu":  # ids that were whole numbers, as numbers
        whole = ids <= np.iinfo(np.int64).max if ids.dtype.kind == "u" else whole  # larger ones are no id
        keys = np.where(whole, ids, 0).astype(np.int64)
    elif node_ids.dtype.kind in "iu":  # text read as numbers (others are not found)
        try:
            keys = ids.astype(np.int64)
        except (ValueError, OverflowError):
            whole = np.fromiter((is_whole(i) for i in ids), bool, ids.shape[0])
            keys = np.where(whole, ids, "0").astype(np.int64)
    else:
        keys = ids.astype(str)
    at = np.minimum(np.searchsorted(node_ids, keys), node_ids.shape[0] - 1)
    found = whole & (node_ids[at] == keys)
    if not found.all():
        missing = np.flatnonzero(~found)
        place = (lambda k: f"line {lines[k]}") if lines is not None else (  # noqa: E731
            lambda k: f"entry {k}" if shape is None or len(shape) < 2 else
            f"entry {tuple(int(i) for i in np.unravel_index(k, shape))}")
        shown = ", ".join(f"{ids[k].item()!r} ({place(k)})" for k in missing[:_SHOWN])
        numbers = all(is_whole(str(ids[k])) and 0 <= int(ids[k]) < node_ids.shape[0] for k in missing)
        raise ConfigError(
            f"{what}: {missing.shape[0]:,} id{'s' if missing.shape[0] > 1 else ''} not among your tables' ids "
            f"({table}), such as {shown}{', ...' if missing.shape[0] > _SHOWN else ''}; give ids as your tables "
            f"write them" + (f" (this dataset renumbered them, and reads your ids, not vertex numbers: vertex k's "
                             f"id is row k of {table.name})" if numbers else "") + ".")
    return at.astype(np.int64)
