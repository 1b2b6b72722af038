"""Train/val/test splits for data that comes without one.

Spec strings (seeded, so a split is reproducible):

- ``ratio:TRAIN,VAL``: fractions of all labelled vertices; the rest is test.
- ``per-class:TRAIN,VAL``: that many vertices of each class for training and validation; the rest is test
  (the protocol of Shchur et al. 2018).
"""

from __future__ import annotations

import numpy as np

from neutronorch.errors import ConfigError

DEFAULT_SPLIT = "ratio:0.6,0.2"


def parse_split(spec: str) -> tuple[str, float, float]:
    kind, _, rest = spec.partition(":")
    parts = rest.split(",")
    if kind not in ("ratio", "per-class") or len(parts) != 2:
        raise ConfigError(f"`split` {spec!r} is not understood. Use ratio:TRAIN,VAL (e.g. ratio:0.6,0.2) "
                          f"or per-class:TRAIN,VAL (e.g. per-class:20,30).")
    try:
        train, val = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(f"`split` {spec!r}: TRAIN and VAL must be numbers.") from None
    if kind == "ratio":
        if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
            raise ConfigError(f"`split` {spec!r}: fractions must be in (0, 1) and sum to less than 1, "
                              f"leaving vertices for the test set.")
    else:
        if train < 1 or val < 1 or train != int(train) or val != int(val):
            raise ConfigError(f"`split` {spec!r}: per-class counts must be positive integers.")
    return kind, train, val


def make_split(labels: np.ndarray, num_classes: int, spec: str, seed: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return sorted (train_idx, val_idx, test_idx) over all vertices, following ``spec``."""
    kind, train, val = parse_split(spec)
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    n = labels.shape[0]
    if kind == "ratio":
        perm = rng.permutation(n)
        n_train, n_val = int(round(train * n)), int(round(val * n))
        parts = perm[:n_train], perm[n_train:n_train + n_val], perm[n_train + n_val:]
    else:
        tr, va, te = [], [], []
        n_train, n_val = int(train), int(val)
        for c in range(num_classes):
            members = rng.permutation(np.flatnonzero(labels == c))
            tr.append(members[:n_train])
            va.append(members[n_train:n_train + n_val])
            te.append(members[n_train + n_val:])
        parts = tuple(np.concatenate(p) if p else np.empty(0, np.int64) for p in (tr, va, te))
    out = tuple(np.sort(p).astype(np.int64) for p in parts)
    for name, idx in zip(("train", "val", "test"), out):
        if idx.size == 0:
            raise ConfigError(f"`split` {spec!r} leaves the {name} set empty on a graph with {n} vertices; "
                              f"choose larger fractions or smaller per-class counts.")
    return out
