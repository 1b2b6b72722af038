"""``predict`` and ``embed`` with ``--out FILE.csv`` (or ``.tsv``): the rows as a text table a spreadsheet or
pandas reads, each keyed by your tables' ids (``node_ids.npy`` where ``convert`` renumbered the vertices, else
the vertex numbers) and, for classes, named by your class names (``class_names.npy``, else the class numbers).
The array is computed in memory, then the table written under a temporary name and renamed into place."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np

from neutronorch.atomic import write_atomically
from neutronorch.cli.ids import kept
from neutronorch.train.output_guard import check_space

TEXT_OUT = (".csv", ".tsv")
_CHUNK = 65_536  # rows formatted at a time
_FLOAT = "%.9g"  # float32 values, written so that they read back exactly


def is_text_out(path) -> bool:
    return Path(path).suffix.lower() in TEXT_OUT


def write_predictions(out, dataset: str, vertices: np.ndarray, rows: np.ndarray, probabilities: bool) -> None:
    """A row per vertex: its id, then its class name (or, with ``probabilities`` or several labels each, a
    column per class, headed by its name)."""
    names = kept(dataset, "class_names")
    if rows.ndim == 1:
        header = ["id", "class"]
        values = [names[rows] if names is not None else rows]
    else:
        classes = names if names is not None and len(names) == rows.shape[1] else np.arange(rows.shape[1])
        header = ["id", *map(str, classes)]
        values = [rows[:, k] for k in range(rows.shape[1])]
    _write(out, header, [_ids(dataset, vertices)], values, probabilities or rows.dtype.kind == "f")


def write_pair_scores(out, dataset: str, pairs: np.ndarray, scores: np.ndarray, probabilities: bool) -> None:
    """A row per pair (``pairs``: (2, P) vertex numbers): its two ids and its score."""
    _write(out, ["source", "destination", "probability" if probabilities else "logit"],
           [_ids(dataset, pairs[0]), _ids(dataset, pairs[1])], [scores], True)


def write_embeddings(out, dataset: str, vertices: np.ndarray, rows: np.ndarray) -> None:
    """A row per vertex: its id, then its embedding's columns (``e0``, ``e1``, ...)."""
    _write(out, ["id", *(f"e{k}" for k in range(rows.shape[1]))], [_ids(dataset, vertices)],
           [rows[:, k] for k in range(rows.shape[1])], True)


def _ids(dataset: str, vertices: np.ndarray) -> np.ndarray:
    node_ids = kept(dataset, "node_ids")
    return vertices if node_ids is None else node_ids[vertices]


def _write(out, header: list[str], keys: list[np.ndarray], values: list[np.ndarray], floats: bool) -> None:
    count = len(keys[0])
    # A generous guess of the text's size (a float takes at most 16 characters), checked before writing.
    check_space("out", out, count * (24 * len(keys) + 17 * len(values)) + 4096)
    delimiter = "\t" if Path(out).suffix.lower() == ".tsv" else ","

    def write(f) -> None:
        starts = [None, *range(0, count, _CHUNK)]  # the header, then the rows a chunk at a time
        for lo in starts:
            chunk = io.StringIO()
            table = csv.writer(chunk, delimiter=delimiter, lineterminator="\n")
            if lo is None:
                table.writerow(header)
            else:
                columns = [np.asarray(k[lo:lo + _CHUNK]).astype(str) for k in keys]
                columns += [np.char.mod(_FLOAT, v[lo:lo + _CHUNK]) if floats and v.dtype.kind == "f"
                            else np.asarray(v[lo:lo + _CHUNK]).astype(str) for v in values]
                table.writerows(zip(*columns))
            f.write(chunk.getvalue().encode("utf-8"))

    write_atomically(out, write)
