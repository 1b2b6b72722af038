"""SNAP edge lists (docs/datasets.md gives the format), with synthetic features and labels learnable from the
structure: seed vertices (``SEEDS_PER_CLASS`` per class) spread their class breadth-first, smoothed by one
neighbourhood majority vote; features are the class centroid plus noise large enough that a vertex's own are
ambiguous, so the neighbours add evidence. ``Graph.notes`` records all this. The graph is made undirected."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np
from numba import njit

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.files import present, read_error, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.errors import DataError

# Standard deviation of the feature noise around the unit-variance class centroids.
FEATURE_NOISE = 3.0
# With one seed per class, whichever seed reaches the hubs first takes most of a small-world graph (up to
# 97 % of soc-Epinions1); several seeds per class average that out (largest class about 40-75 %).
SEEDS_PER_CLASS = 8


@reads_files
def load_snap(path: str | os.PathLike, split: str = DEFAULT_SPLIT, seed: int = 0, feature_dim: int = 64,
              num_classes: int = 8) -> Graph:
    """Load a SNAP edge list and attach synthetic labels (``num_classes``) and features (``feature_dim``)."""
    path = Path(path)
    src, dst, columns = _read_edges(path)  # at least one edge, ids whole numbers from 0
    num_nodes, ids = _relabel(np.concatenate([src, dst]))
    if num_nodes < num_classes:
        raise DataError(f"{path}: only {num_nodes:,} vertices. An edge list gets {num_classes} synthetic classes, "
                        f"so it needs at least {num_classes} vertices; use a larger graph.")
    indptr, indices = edges_to_csc(ids[:src.shape[0]], ids[src.shape[0]:], num_nodes, source=str(path))
    if indices.shape[0] == 0:  # self loops are dropped: a graph without edges has nothing to sample
        raise DataError(f"{path}: every one of its {src.shape[0]:,} edges is a self loop (u u), which are dropped, "
                        f"leaving no edges; give an edge list of edges between vertices.")
    rng = np.random.default_rng(seed)
    labels = _community_labels(indptr, indices, num_classes, rng)
    centroids = rng.standard_normal((num_classes, feature_dim), dtype=np.float32)
    features = rng.standard_normal((num_nodes, feature_dim), dtype=np.float32)
    features *= FEATURE_NOISE
    features += centroids[labels]
    train_idx, val_idx, test_idx = make_split(labels, num_classes, split, seed)
    notes = [f"topology from {path.name}; features and labels are synthetic (seed {seed}): {num_classes:,} classes "
             f"grown breadth-first from {SEEDS_PER_CLASS} random seed vertices each and smoothed by a neighbour "
             f"majority vote, features = class centroid + N(0, {FEATURE_NOISE}^2) noise"]
    if columns > 2:  # weights, times: an edge is a line's first two ids
        notes.append(f"{path.name}: {columns - 2} column{'s' if columns > 3 else ''} after the first two not used")
    return Graph(name=Path(path.name.removesuffix(".gz")).stem, indptr=indptr, indices=indices,
                 features=features, labels=labels, train_idx=train_idx, val_idx=val_idx, test_idx=test_idx,
                 num_classes=num_classes, notes=notes).validate(str(path))


def _read_edges(path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """The edges' ends and the lines' width in columns."""
    present(path, "an edge list", "Give the path of a SNAP edge list (.txt, .txt.gz, .edges, .tsv or .tsv.gz).")
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as exc:
        raise read_error(path, exc, f"{path}: cannot be read ({type(exc).__name__}: {exc}). The file is "
                                    f"truncated or not gzip data; fetch it again.") from None
    if data.startswith(b"\xef\xbb\xbf"):  # the byte order mark some Windows editors write; a blank, as CR is
        data = b"   " + data[3:]
    buf = np.frombuffer(data, dtype=np.uint8)
    src, dst, problem, at, columns = _parse_edges(buf)
    if problem:
        line_start = data.rfind(b"\n", 0, at) + 1
        number = data.count(b"\n", 0, line_start) + 1
        text = data[line_start:data.find(b"\n", line_start) if b"\n" in data[line_start:] else len(data)]
        shown = text.decode("utf-8", "replace").strip()[:80]
        if problem == _COLUMNS:
            raise DataError(f"{path}: lines have different numbers of columns: line {number} has "
                            f"{len(shown.split())}, the first edge line {columns} ({shown!r}). Lines of differing "
                            f"widths would be read into each other; the file is truncated or malformed, fix it "
                            f"or fetch it again.")
        if problem == _NEGATIVE:
            negative = next(field for field in shown.split() if field.startswith("-"))
            raise DataError(f"{path}: line {number}: vertex id {negative} is negative ({shown!r}). SNAP ids are "
                            f"non-negative integers; fix the file.")
        if problem == _TOO_LARGE:
            raise DataError(f"{path}: line {number} holds a vertex id beyond the largest int64 "
                            f"({np.iinfo(np.int64).max}): {shown!r}. The file is corrupt; fix it or fetch it again.")
        raise DataError(f"{path}: line {number} is not an edge: {shown!r}. Each line must be 'src dst' with "
                        f"non-negative integer vertex ids (further numeric columns, such as weights, are "
                        f"ignored), or a '#' comment.")
    if src.shape[0] == 0:
        raise DataError(f"{path}: no edges found. A SNAP edge list has one 'src dst' pair per line after the "
                        f"'#' comments.")
    return src, dst, columns


# What _parse_edges reports: nothing wrong, a line that is not an edge, a line of another width than the
# first, an id beyond int64.
_OK, _NOT_AN_EDGE, _COLUMNS, _TOO_LARGE, _NEGATIVE = 0, 1, 2, 3, 4


@njit(cache=True, nogil=True)
def _skip_number(buf, i, n):
    """The offset after a decimal number (sign, digits, point, exponent, or nan/inf) at ``i``; -1 if none."""
    if i < n and (buf[i] == 43 or buf[i] == 45):
        i += 1
    word = i
    while i < n and (65 <= buf[i] <= 90 or 97 <= buf[i] <= 122):
        i += 1
    if i > word:  # nan, inf, infinity, any case
        length = i - word
        first = buf[word] | 32
        return i if (length == 3 and first == 110) or ((length == 3 or length == 8) and first == 105) else -1
    digits = 0
    while i < n and 48 <= buf[i] <= 57:
        i += 1
        digits += 1
    if i < n and buf[i] == 46:
        i += 1
        while i < n and 48 <= buf[i] <= 57:
            i += 1
            digits += 1
    if digits == 0:
        return -1
    if i < n and (buf[i] | 32) == 101:
        i += 1
        if i < n and (buf[i] == 43 or buf[i] == 45):
            i += 1
        exponent = i
        while i < n and 48 <= buf[i] <= 57:
            i += 1
        if i == exponent:
            return -1
    return i


@njit(cache=True, nogil=True)
def _parse_edges(buf):
    """The ``src dst`` ids of an edge list's lines: (src, dst, problem, byte offset of the problem's line,
    columns of the first edge line). Ids are whole non-negative numbers within int64, never truncated or
    clamped; every edge line has as many columns as the first; '#' lines are comments."""
    n = buf.shape[0]
    lines = 1
    for i in range(n):
        if buf[i] == 10:
            lines += 1
    src = np.empty(lines, np.int64)
    dst = np.empty(lines, np.int64)
    edges = 0
    columns = 0
    i = 0
    largest = np.iinfo(np.int64).max
    while i < n:
        start = i
        while i < n and (buf[i] == 32 or buf[i] == 9 or buf[i] == 13):
            i += 1
        if i >= n or buf[i] == 10 or buf[i] == 35:  # blank line or '#' comment
            while i < n and buf[i] != 10:
                i += 1
            i += 1
            continue
        fields = 0
        while i < n and buf[i] != 10:
            if buf[i] == 32 or buf[i] == 9 or buf[i] == 13:
                i += 1
                continue
            if fields < 2:
                if buf[i] == 45 and i + 1 < n and 48 <= buf[i + 1] <= 57:
                    return src[:0], dst[:0], _NEGATIVE, start, columns
                value = 0
                digits = 0
                while i < n and 48 <= buf[i] <= 57:
                    if value > (largest - (buf[i] - 48)) // 10:  # 2**63 - 1 itself is taken
                        return src[:0], dst[:0], _TOO_LARGE, start, columns
                    value = value * 10 + (buf[i] - 48)
                    digits += 1
                    i += 1
                if digits == 0:
                    return src[:0], dst[:0], _NOT_AN_EDGE, start, columns
                if fields == 0:
                    src[edges] = value
                else:
                    dst[edges] = value
            else:
                i = _skip_number(buf, i, n)
                if i < 0:
                    return src[:0], dst[:0], _NOT_AN_EDGE, start, columns
            if i < n and not (buf[i] == 32 or buf[i] == 9 or buf[i] == 13 or buf[i] == 10):
                return src[:0], dst[:0], _NOT_AN_EDGE, start, columns
            fields += 1
        if fields < 2:
            return src[:0], dst[:0], _COLUMNS if columns else _NOT_AN_EDGE, start, columns
        if columns == 0:
            columns = fields
        elif fields != columns:
            return src[:0], dst[:0], _COLUMNS, start, columns
        edges += 1
        i += 1
    return src[:edges], dst[:edges], _OK, 0, columns


def _relabel(ids: np.ndarray) -> tuple[int, np.ndarray]:
    """Map the distinct ids (at least one) to ``0..n-1`` in sorted order; return ``n`` and the mapped ids."""
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
    """Grow communities breadth-first from random seeds, then smooth by one majority vote; vertices no seed
    reaches get random classes."""
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
