"""Settings a run cannot meet, refused before training (``check_learnable``), or said once where training
can still mean something.

Refused (a ``DataError`` naming the dataset and the fix):

- every labelled vertex of the same class (multi-label: every task's known training entries one value):
  there is nothing to learn;
- a training set of one class: nothing to tell apart;
- ``num_classes`` far above the classes the labels use (more than twice the largest class id plus one):
  the model would give most of its outputs to classes no vertex has (a ``meta.json`` or a loader's count
  gone wrong); the fix is the count the labels show;
- class ids at or above ``num_classes``, and a validation or test set without a labelled vertex (it would
  score NaN): what ``Graph.validate`` and the loaders check of the data they read, checked here of a graph
  given to ``train`` as it is;
- no features (``feature_dim`` 0) on a homogeneous graph with a built-in model, which computes every output
  from features: every vertex would get the same one. A typed graph's featureless types get learnable
  embeddings, and your own module may hold its own, so neither is refused.

Warned (training goes on, and the summary's ``warnings`` keep it): classes without a training vertex, whose
vertices elsewhere are never predicted right.
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
    used = int(present[-1]) + 1
    if used > num_classes:
        raise DataError(f"{name}: labels hold class {used - 1}, beyond num_classes {num_classes} (classes "
                        f"0..{num_classes - 1}). Remap the labels, or set num_classes to {used}.")
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
    """Labelled vertices per class (classes at or above ``num_classes`` are counted too, in longer arrays)."""
    counts = np.zeros(max(1, num_classes), dtype=np.int64)
    for start in range(0, int(labels.shape[0]), _CHUNK):
        chunk = np.asarray(labels[start:start + _CHUNK])
        chunk = np.bincount(chunk[chunk >= 0], minlength=counts.shape[0])
        if chunk.shape[0] > counts.shape[0]:
            counts = np.concatenate([counts, np.zeros(chunk.shape[0] - counts.shape[0], np.int64)])
        counts += chunk
    return counts
