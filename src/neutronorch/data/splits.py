"""Train/val/test splits for data without one (seeded): ``ratio:TRAIN,VAL`` (fractions of the vertices) or
``per-class:TRAIN,VAL`` (that many of each class, Shchur et al. 2018; a class with fewer is an error); and the
checks of a split a file stores (``stored_split``)."""

from __future__ import annotations

import numpy as np

from neutronorch.data.dtypes import as_int64, id_outside
from neutronorch.errors import ConfigError, DataError

DEFAULT_SPLIT = "ratio:0.6,0.2"
_SET_WORDS = {"train_idx": "training", "val_idx": "validation", "test_idx": "test"}


TEST_IS_VALIDATION = "the test split is the validation split"  # how a note says so (MAG240M's loader)


def split_overlap(train, val, test, notes: list[str]) -> tuple[str, str, str] | None:
    """(the second set's name, what, fix) for the first two of the three sets that share vertices; None when
    they are disjoint. A test set that is the validation set, whole (data without labelled test vertices), is
    allowed and said in ``notes``, once."""
    sets = {"train_idx": np.asarray(train), "val_idx": np.asarray(val), "test_idx": np.asarray(test)}
    for first, second in (("train_idx", "val_idx"), ("train_idx", "test_idx"), ("val_idx", "test_idx")):
        shared = np.intersect1d(sets[first], sets[second])
        if first == "val_idx" and 0 < shared.shape[0] == sets[first].shape[0] == sets[second].shape[0]:
            if not any(TEST_IS_VALIDATION in note for note in notes):
                notes.append(f"{TEST_IS_VALIDATION} ({shared.shape[0]:,} vertices): test scores repeat the "
                             f"validation scores")
            continue
        if shared.shape[0]:
            what = (f"{shared.shape[0]:,} {_SET_WORDS[first]} vertices are also in {second} (first: {int(shared[0])}), "
                    f"of {sets[first].shape[0]:,} {_SET_WORDS[first]} and {sets[second].shape[0]:,} "
                    f"{_SET_WORDS[second]} vertices")
            why = ("evaluation on training vertices overstates accuracy" if first == "train_idx" else
                   "a test score on vertices that chose the model overstates it")
            return second, what, f"{why[0].upper()}{why[1:]}; make the splits disjoint."
    return None


def parse_split(spec: str) -> tuple[str, float, float]:
    kind, _, rest = spec.partition(":")
    parts = rest.split(",")
    if kind == "edges":  # parsed by a link task's own reader; here a vertex split is drawn
        raise ConfigError(f"`split` {spec!r}: an edge split is drawn as a link task trains (train --task link "
                          f"--split {spec}), not stored with the data; give ratio:TRAIN,VAL or per-class:TRAIN,VAL "
                          f"of the vertices, or no split.")
    if kind not in ("ratio", "per-class", "time") or len(parts) != 2:
        raise ConfigError(f"`split` {spec!r} is not understood. Use ratio:TRAIN,VAL (e.g. ratio:0.6,0.2), "
                          f"per-class:TRAIN,VAL (e.g. per-class:20,30) or, on a graph with vertex times, "
                          f"time:TRAIN,VAL (e.g. time:0.6,0.2).")
    try:
        train, val = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(f"`split` {spec!r}: TRAIN and VAL must be numbers.") from None
    if kind in ("ratio", "time"):
        if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
            raise ConfigError(f"`split` {spec!r}: fractions must be in (0, 1) and sum to less than 1, "
                              f"leaving vertices for the test set.")
    elif not all(1 <= value < 2 ** 31 and value == int(value) for value in (train, val)):  # inf and nan too
        raise ConfigError(f"`split` {spec!r}: per-class counts must be whole numbers from 1, e.g. "
                          f"per-class:20,30.")
    return kind, train, val


def make_split(labels: np.ndarray, num_classes: int, spec: str, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return sorted (train_idx, val_idx, test_idx) over all vertices, following ``spec``."""
    kind, train, val = parse_split(spec)
    if kind == "time":
        raise ConfigError(f"`split` {spec!r}: a chronological split orders the vertices by their times, which this "
                          f"data has none of; train a graph with vertex times (docs/temporal.md), or split with "
                          f"ratio:TRAIN,VAL.")
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    n = labels.shape[0]
    if kind == "ratio":
        perm = rng.permutation(n)
        n_train, n_val = int(round(train * n)), int(round(val * n))
        parts = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    else:
        parts = ([], [], [])
        n_train, n_val = int(train), int(val)
        for c in range(num_classes):
            members = rng.permutation(np.flatnonzero(labels == c))
            if 0 < members.shape[0] < n_train + n_val:
                # Taking what there is would quietly give this class fewer training or validation vertices
                # than the protocol says, and none to test on.
                raise ConfigError(f"`split` {spec!r}: class {c} has {members.shape[0]:,} vertices, fewer than the "
                                  f"{n_train} + {n_val} it takes from each class; choose smaller counts or a "
                                  f"ratio:TRAIN,VAL split.")
            for part, chosen in zip(parts, np.split(members, [n_train, n_train + n_val])):
                part.append(chosen)
        parts = tuple(np.concatenate(p) if p else np.empty(0, np.int64) for p in parts)
    out = tuple(np.sort(p).astype(np.int64) for p in parts)
    for name, idx in zip(("train", "val", "test"), out):
        if idx.size == 0:
            raise ConfigError(f"`split` {spec!r} leaves the {name} set empty on a graph with {n:,} vertices; "
                              f"choose larger fractions or smaller per-class counts.")
    return out


def stored_split(value, path, what: str, count: int, fix: str) -> np.ndarray:
    """Vertex ids a file stores for one split (a 1-D array or tensor) as sorted int64: at least one, each in
    ``0..count-1`` and listed once; else a ``DataError`` naming ``path`` and ``what``, ending with ``fix``."""
    if hasattr(value, "numpy"):  # a tensor: torch is loaded, reading the file
        value = value.numpy()
    if not isinstance(value, np.ndarray) or value.ndim != 1:
        raise DataError(f"{path}: {what} is a {type(value).__name__} {getattr(value, 'shape', '')}, expected a "
                        f"1-D array of vertex ids. {fix}")
    ids = np.sort(as_int64(value, str(path), what))
    if not ids.size:
        raise DataError(f"{path}: {what} is empty (no vertex ids), and a split needs at least one vertex. {fix}")
    if (bad := id_outside(ids, count)) is not None:
        raise DataError(f"{path}: {what} holds id {bad}, outside 0..{count - 1}. {fix}")
    if ids.size > 1 and (ids[1:] == ids[:-1]).any():
        raise DataError(f"{path}: {what} lists vertex {ids[1:][ids[1:] == ids[:-1]][0]} more than once. {fix}")
    return ids
