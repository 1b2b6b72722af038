"""Labels and features a run cannot learn from, refused before training (``check_learnable``: a
``DataError`` naming the dataset and the fix; docs/errors.md lists them), and classes without a training
vertex, said once as a warning kept in the summary's ``warnings``.
"""

from __future__ import annotations

import logging

import numpy as np

from neutronorch.errors import DataError

logger = logging.getLogger("neutronorch")

_CHUNK = 1 << 24  # labels counted this many at a time (they may be a memory map)
_SHOWN = 10  # classes a message lists


def check_learnable(graph, node_task: bool = True, feature_dim: int | None = None) -> list[str]:
    """Raise ``DataError`` for a node task on ``graph`` (a ``Graph`` or ``TypedGraph``) that cannot be learnt
    (module docstring); return the warnings (logged here) for one that can. ``feature_dim``: the features'
    width when a built-in model reads them (None: not checked); without ``node_task`` (a link task) only
    the features are checked."""
    name, labels, num_classes = graph.name, graph.labels, graph.num_classes
    if feature_dim == 0:
        raise DataError(f"{name}: its vertices have no features (feature_dim 0), and the built-in models compute "
                        f"every output from them: every vertex would get the same one. Give features (a constant "
                        f"column, a one-hot id, a positional encoding), or train your own module that learns an "
                        f"embedding per vertex (`model` in Python).")
    if not node_task:
        return []
    for split in ("val", "test"):  # a split without labels would score NaN at every evaluation
        if not (np.asarray(labels[np.asarray(getattr(graph, f"{split}_idx"))]) >= 0).any():
            raise DataError(f"{name}: no vertex of the {split} set has a label, so it cannot be scored. Give a "
                            f"split whose {split} set holds labelled vertices.")
    train = np.asarray(labels[np.asarray(graph.train_idx)])
    if labels.ndim == 2:
        known = train >= 0
        if not any(np.unique(train[known[:, t], t]).size > 1 for t in range(train.shape[1])):
            raise DataError(f"{name}: every task's known training labels are one value each: there is nothing "
                            f"to learn. Give labels (or a split) in which some task has both 0 and 1.")
        return []
    counts = _class_counts(labels, num_classes)
    present = np.flatnonzero(counts)
    if present.size == 0:
        raise DataError(f"{name}: no vertex has a label: there is nothing to learn. Give labels (class ids, -1 "
                        f"for none).")
    if present.size == 1:
        raise DataError(f"{name}: every labelled vertex has class {int(present[0])}: there is nothing to learn. "
                        f"Give labels of two classes or more.")
    used = int(present[-1]) + 1  # below num_classes: the graph was validated (``Graph.check_given``)
    if num_classes > 2 * used:
        raise DataError(f"{name}: num_classes is {num_classes}, but the labels use classes 0..{used - 1} only: "
                        f"{num_classes - used} of the model's outputs would be classes no vertex has. Set "
                        f"num_classes to {used} (the dataset's meta.json, or the loader's `num_classes`).")
    trained = np.bincount(train[train >= 0], minlength=num_classes)
    if np.count_nonzero(trained) == 1:
        raise DataError(f"{name}: every training vertex has class {int(np.flatnonzero(trained)[0])} (of "
                        f"{present.size} classes labelled): nothing to tell apart. Give a split whose training "
                        f"set holds two classes or more (such as `split` per-class:20,30).")
    missing = np.flatnonzero((trained == 0) & (counts > 0))
    if not missing.size:
        return []
    shown = ", ".join(map(str, missing[:_SHOWN])) + (", ..." if missing.size > _SHOWN else "")
    message = (f"{name}: {missing.size} labelled class{'es' if missing.size > 1 else ''} ({shown}) "
               f"{'have' if missing.size > 1 else 'has'} no training vertex: the model never sees "
               f"{'them' if missing.size > 1 else 'it'}, and their {int(counts[missing].sum()):,} vertices are "
               f"never predicted right. Give a split that trains on every class (such as `split` per-class:20,30).")
    logger.warning(message)
    return [message]


def _class_counts(labels, num_classes: int) -> np.ndarray:
    """Labelled vertices per class."""
    counts = np.zeros(max(1, num_classes), dtype=np.int64)
    for start in range(0, int(labels.shape[0]), _CHUNK):
        chunk = np.asarray(labels[start:start + _CHUNK])
        counts += np.bincount(chunk[chunk >= 0], minlength=counts.shape[0])
    return counts
