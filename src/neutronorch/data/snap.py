"""Loader for SNAP edge lists, with synthetic features and labels.

A SNAP file (``.txt`` or ``.txt.gz``) is topology only: ``#`` comment lines, then one ``src dst`` pair of
vertex ids per line (further numeric columns, such as weights or timestamps, are ignored). Ids may be
sparse; they are relabelled to ``0..n-1`` in sorted order. The graph is made undirected.

To train on it, labels and features are synthesised so that they are learnable from the structure: random
seed vertices (a few per class) spread their class over the graph breadth-first, which cuts it into
connected communities, smoothed by one neighbourhood majority vote. Each vertex's features are its class centroid
plus Gaussian noise, large enough that a vertex's own features are ambiguous (80-90 % nearest-centroid
accuracy), so that on a homophilous graph the neighbours add evidence. ``Graph.notes`` records all this.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from pathlib import Path

import numpy as np

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.graph import Graph
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.errors import DataError

# Standard deviation of the feature noise around the unit-variance class centroids.
FEATURE_NOISE = 3.0
# With one seed per class, whichever seed reaches the hubs first takes most of a small-world graph (up to
# 97 % of soc-Epinions1); several seeds per class average that out (largest class about 40-75 %).
SEEDS_PER_CLASS = 8
_COMMENT_LINES = re.compile(rb"^[ \t]*#[^\n]*\n?", re.MULTILINE)


def load_snap(path: str | os.PathLike, split: str = DEFAULT_SPLIT, seed: int = 0, feature_dim: int = 64,
              num_classes: int = 8) -> Graph:
    """Load a SNAP edge list and attach synthetic labels (``num_classes``) and features (``feature_dim``)."""
    path = Path(path)
    src, dst = _read_edges(path)
    ids = np.concatenate([src, dst])
    if ids.size and int(ids.min()) < 0:
        raise DataError(f"{path}: vertex id {int(ids.min())} is negative. SNAP ids are non-negative integers; "
                        f"fix the file.")
    num_nodes, ids = _relabel(ids)
    if num_nodes < num_classes:
        raise DataError(f"{path}: only {num_nodes} vertices. An edge list gets {num_classes} synthetic classes, "
                        f"so it needs at least {num_classes} vertices; use a larger graph.")
    indptr, indices = edges_to_csc(ids[:src.shape[0]], ids[src.shape[0]:], num_nodes, source=str(path))
    rng = np.random.default_rng(seed)
    labels = _community_labels(indptr, indices, num_classes, rng)
    centroids = rng.standard_normal((num_classes, feature_dim), dtype=np.float32)
    features = rng.standard_normal((num_nodes, feature_dim), dtype=np.float32)
    features *= FEATURE_NOISE
    features += centroids[labels]
    train_idx, val_idx, test_idx = make_split(labels, num_classes, split, seed)
    notes = [f"topology from {path.name}; features and labels are synthetic (seed {seed}): {num_classes} classes "
             f"grown breadth-first from {SEEDS_PER_CLASS} random seed vertices each and smoothed by a neighbour "
             f"majority vote, features = class centroid + N(0, {FEATURE_NOISE}^2) noise"]
    graph = Graph(name=Path(path.name.removesuffix(".gz")).stem, indptr=indptr, indices=indices,
                  features=features, labels=labels, train_idx=train_idx, val_idx=val_idx, test_idx=test_idx,
                  num_classes=num_classes, notes=notes)
    graph.validate(str(path))
    return graph


def _read_edges(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise DataError(f"{path}: file is missing. Give the path of a SNAP edge list (.txt or .txt.gz).")
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot be read ({type(exc).__name__}: {exc}). The file is truncated or not "
                        f"gzip data; fetch it again.") from None
    raw = data
    if b"#" in data:
        data = _COMMENT_LINES.sub(b"", data)
    first_line = data.lstrip().split(b"\n", 1)[0]
    num_columns = len(first_line.split())
    if num_columns < 2:
        raise DataError(f"{path}: no edges found (the first data line is {first_line[:80]!r}). A SNAP edge "
                        f"list has one 'src dst' pair per line after the '#' comments.")
    try:
        # The C text parser of fromstring is about ten times faster than splitting into Python objects.
        values = np.fromstring(data.decode("ascii"), dtype=np.int64, sep=" ")
    except (ValueError, UnicodeDecodeError):
        values = _integer_id_columns(data, num_columns)
        if values is None:
            raise DataError(_first_bad_line(path, raw)) from None
    if values.size % num_columns:
        raise DataError(f"{path}: lines have different numbers of columns (expected {num_columns} like the "
                        f"first line). The file is truncated or malformed; fetch it again.")
    values = values.reshape(-1, num_columns)
    return values[:, 0], values[:, 1]


def _integer_id_columns(data: bytes, num_columns: int) -> np.ndarray | None:
    """A list with more columns than ``src dst`` (weights, timestamps) whose extra columns are not integers:
    its numbers, when all are numbers and the first two columns are whole; else None."""
    if num_columns < 3:
        return None
    try:
        values = np.fromstring(data.decode("ascii"), dtype=np.float64, sep=" ")
    except (ValueError, UnicodeDecodeError):
        return None
    if values.size % num_columns:
        return None
    ids = values.reshape(-1, num_columns)[:, :2]
    if not (np.all(np.isfinite(ids)) and np.all(ids == np.floor(ids)) and np.abs(ids).max(initial=0) < 2**53):
        return None
    out = np.zeros((ids.shape[0], num_columns), np.int64)  # the extra columns are not used
    out[:, :2] = ids
    return out.reshape(-1)


def _first_bad_line(path: Path, raw: bytes) -> str:
    """The message for a file that is not an edge list: its first line that is neither a comment nor two
    integer ids, with its number."""
    for number, line in enumerate(raw.split(b"\n"), start=1):
        text = line.decode("utf-8", "replace").strip()
        if not text or text.startswith("#"):
            continue
        fields = text.split()
        try:
            if len(fields) >= 2 and int(fields[0]) >= 0 and int(fields[1]) >= 0:
                for extra in fields[2:]:
                    float(extra)
                continue
        except ValueError:
            pass
        return (f"{path}: line {number} is not an edge: {text[:80]!r}. Each line must be 'src dst' with "
                f"non-negative integer vertex ids (further numeric columns, such as weights, are ignored), "
                f"or a '#' comment.")
    return f"{path}: holds something other than integer vertex ids. Each line must be 'src dst' (or a '#' comment)."


def _relabel(ids: np.ndarray) -> tuple[int, np.ndarray]:
    """Map the distinct ids to ``0..n-1`` in sorted order; return ``n`` and the mapped ids."""
    if ids.size == 0:
        return 0, ids
    largest = int(ids.max())
    # Ids are usually dense, and a lookup table then beats sorting all ids.
    if largest < 4 * ids.size:
        present = np.zeros(largest + 1, dtype=bool)
        present[ids] = True
        new_id = np.cumsum(present, dtype=np.int64) - 1
        return int(new_id[-1]) + 1, new_id[ids]
    distinct, mapped = np.unique(ids, return_inverse=True)
    return int(distinct.shape[0]), mapped.astype(np.int64)


def _community_labels(indptr: np.ndarray, indices: np.ndarray, num_classes: int,
                      rng: np.random.Generator) -> np.ndarray:
    """Grow communities breadth-first from random seeds, then smooth by one majority vote.

    Vertices no seed reaches (other components) get random classes.
    """
    num_nodes = indptr.shape[0] - 1
    degrees = np.diff(indptr)
    # Seeds with neighbours, so that every class grows beyond its seed where the graph allows it.
    candidates = np.flatnonzero(degrees > 0)
    if candidates.shape[0] < num_classes:
        candidates = np.arange(num_nodes)
    seeds = np.sort(rng.choice(candidates, size=min(candidates.shape[0], SEEDS_PER_CLASS * num_classes),
                               replace=False))
    labels = np.full(num_nodes, -1, dtype=np.int64)
    labels[seeds] = rng.permutation(seeds.shape[0]) % num_classes
    # Multi-source BFS, one level per round; a vertex reached by several communities in the same round
    # joins any one of them. ``indices`` lists in-neighbours, which are all neighbours as the graph is undirected.
    frontier = seeds
    while frontier.size:
        counts = degrees[frontier]
        owners = np.repeat(frontier, counts)
        first_slot = indptr[frontier] - (np.cumsum(counts) - counts)
        positions = np.arange(owners.shape[0]) + np.repeat(first_slot, counts)
        neighbours = indices[positions]
        fresh = labels[neighbours] < 0
        # Shuffled, so that the last write, which wins, comes from a random one of the competing fronts.
        order = rng.permutation(int(fresh.sum()))
        neighbours, owners = neighbours[fresh][order], owners[fresh][order]
        labels[neighbours] = labels[owners]
        frontier = np.unique(neighbours)
    unreached = labels < 0
    labels[unreached] = rng.integers(0, num_classes, size=int(unreached.sum()))
    # Where several BFS fronts meet (everywhere around hubs in a small-world graph) the labels come out
    # mixed; one majority vote over the neighbours makes the communities markedly more homophilous
    # (soc-Epinions1: about 40 % -> 65-80 % of edges join equal labels, depending on the seed).
    destination = np.repeat(np.arange(num_nodes, dtype=np.int64), degrees)
    votes = np.bincount(destination * num_classes + labels[indices], minlength=num_nodes * num_classes)
    votes = votes.reshape(num_nodes, num_classes)
    has_neighbours = degrees > 0
    labels[has_neighbours] = votes[has_neighbours].argmax(axis=1)
    return labels
