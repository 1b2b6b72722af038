"""What the data, an evaluation's outputs and the training loss say about a run (docs/errors.md lists what a
user sees): data a run cannot learn from is refused before training (``check_learnable``); non-finite outputs
are an error (``EvaluationCheck``, ``output_check``), one ``isfinite().all()`` per tensor; a collapse
(``Health``) marks the epoch and warns once, and the run goes on.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from neutronorch.errors import CheckpointError, DataError, TrainingError

logger = logging.getLogger("neutronorch")

EVAL_MODE_HINT = ("Check what the model does in eval mode (dropout, batch normalisation's running statistics, "
                  "code that branches on `self.training`) and its precision (float16 overflows past 65504)")
SUGGESTION = ("Nothing is learnt this way: lower `lr`, normalise the features (raw counts or 0/1 rows: "
              "`normalize_features` row), lower `dropout`, and check that the labels carry the classes")
SPLIT_NAMES = {"val": "validation", "test": "test"}
# Scores count as equal within this share of their size: a collapsed model's rows, computed in chunks of
# other sizes, may differ in their last bits.
TIE_TOLERANCE = 1e-5
# A link evaluation in which at least this share of (positive, negative) pairs tie is a collapse: a model
# that tells vertices apart ties almost none.
MOST_TIED = 0.5
# How close (relative) a loss must sit to a constant output's value to count as pinned there: a loss printed
# as 1.3863 sits within 5e-5 of 2 ln 2; a link run learning slowly from it was 6e-4 away after its second epoch.
LOSS_TOLERANCE = 1e-4
_CHUNK = 1 << 24  # labels counted this many at a time (they may be a memory map)
_SHOWN = 10  # classes a message lists


def nonfinite_rows(values: torch.Tensor) -> int:
    """0 when every entry of ``values`` is finite (one ``isfinite().all()``); else how many rows (entries of
    the first dimension) hold a NaN or an infinity."""
    finite = torch.isfinite(values)
    if bool(finite.all()):
        return 0
    return int((~finite.reshape(values.shape[0], -1).all(1)).sum()) if values.dim() else 1


class EvaluationCheck:
    """The checks of one evaluation (after ``epoch``, None when the run has no epoch to name): ``nonfinite``
    raises for outputs that are not numbers; ``collapsed`` is told each split's collapse (or None), and a
    reason every split gave is kept in ``reasons`` (one split alone, a small one, may be chance)."""

    def __init__(self, epoch: int | None = None, reasons: list[str] | None = None):
        self.epoch = epoch
        self.reasons = reasons if reasons is not None else []
        self.splits: list[str | None] = []

    def nonfinite(self, bad: int, total: int, split: str, what: str, rows: str) -> None:
        """``bad`` of ``total`` rows were not finite: a ``TrainingError`` unless none."""
        if bad:
            when = f"after epoch {self.epoch}" if self.epoch is not None else "of the run"
            raise TrainingError(f"the evaluation {when} gave NaN or infinite {what} for {bad:,} of the {total:,} "
                                f"{split} {rows}, while the training loss was finite: its scores would be "
                                f"meaningless. {EVAL_MODE_HINT}; or lower `lr`.")

    def collapsed(self, reason: str | None) -> None:
        self.splits.append(reason)
        self.reasons.clear()
        if reason is not None and all(r == reason for r in self.splits):
            self.reasons.append(reason)


def output_check(what: str, rows: str = "vertices"):
    """``check(values)`` for ``predict``, ``embed`` and ``score_pairs``: a chunk of output rows (``what``, one
    per of ``rows``, before any transform) is finite, else a ``CheckpointError``: nothing is written."""

    def check(values: torch.Tensor) -> None:
        bad = nonfinite_rows(values)
        if bad:
            raise CheckpointError(
                f"the checkpoint's model gave NaN or infinite {what} for {bad:,} of a chunk of {values.shape[0]:,} "
                f"{rows}; nothing was written. Its weights may hold NaN or infinities (saved by a run that "
                f"diverged), or this graph's features lie far outside those it was trained on. {EVAL_MODE_HINT}.")

    return check


def tied(values: torch.Tensor, reference: torch.Tensor) -> bool:
    """Whether ``values`` all equal ``reference`` (broadcast against them) to ``TIE_TOLERANCE`` of its size."""
    scale = max(1.0, float(reference.abs().max())) if reference.numel() else 1.0
    return bool(((values - reference).abs() <= TIE_TOLERANCE * scale).all())


def node_collapse(logits: torch.Tensor, labels: torch.Tensor, multilabel: bool) -> str | None:
    """Why ``logits`` of a split's vertices show a collapse, or None: where the labels hold several classes
    (multi-label: a task both values), the same scores for every vertex, or one class predicted for all."""
    if logits.shape[0] < 2:
        return None
    if multilabel:
        known = labels >= 0
        varied = any(torch.unique(labels[known[:, t], t]).numel() > 1 for t in range(labels.shape[1]))
        return "every vertex given the same scores" if varied and tied(logits, logits[:1]) else None
    labelled = labels >= 0
    if torch.unique(labels[labelled]).numel() < 2:
        return None
    if tied(logits[labelled], logits[labelled][:1]):
        return "every vertex given the same scores"
    predicted = logits[labelled].argmax(1)
    if bool((predicted == predicted[0]).all()):
        return f"one class ({int(predicted[0])}) predicted for every vertex"
    return None


def counted_collapse(counts: np.ndarray, tied_scores: bool) -> str | None:
    """``node_collapse`` of one label per vertex from the split's counts by (label, predicted class) and
    whether its labelled vertices' scores all tie: what ranks that each hold part of a split can add up."""
    if np.count_nonzero(counts.sum(1)) < 2:
        return None
    if tied_scores:
        return "every vertex given the same scores"
    predicted = np.flatnonzero(counts.sum(0))
    return f"one class ({int(predicted[0])}) predicted for every vertex" if predicted.size == 1 else None


def link_collapse(scores) -> str | None:
    """Why a set's link scores (``link_metrics``' ``SharedScores`` or ``PerPositiveScores``) show a collapse,
    or None: every score equal, or most pairs (``MOST_TIED``) scored exactly alike, so that ties decide the
    ranks (vertices whose embeddings all died to one row)."""
    if scores.all_tied():
        return "every score equal"
    return "most pairs scored alike (ties decide the ranks)" if scores.tie_share() >= MOST_TIED else None


def entropy(counts: np.ndarray) -> float:
    """The entropy (nats) of a distribution given by counts (zeros ignored)."""
    counts = np.asarray(counts, dtype=np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum()) if p.size else 0.0


class Health:
    """A run's collapse record. ``evaluation(epoch)`` gives the check an evaluation reports to;
    ``after_epoch(record)`` marks the record (``collapsed``: the reasons) and warns the first time;
    ``warnings`` is what the summary keeps (``warnings`` given: those of the settings, said already).
    ``constant_losses``: what the loss is under a constant output (description -> value)."""

    def __init__(self, constant_losses: dict[str, float], warnings: list[str] | tuple = ()):
        self.constants = constant_losses
        self.pending: list[str] = []
        self.previous_loss: float | None = None
        self.warnings: list[str] = list(warnings)  # the settings' (check_learnable), then the first collapse
        self.warned = False

    def evaluation(self, epoch: int | None) -> EvaluationCheck:
        self.pending = []
        return EvaluationCheck(epoch, self.pending)

    def after_epoch(self, record: dict, loss: bool = True) -> None:
        reasons, self.pending = list(self.pending), []
        for name, value in self.constants.items() if loss else ():  # this loss and the last at a constant's
            near = lambda x: x is not None and abs(x - value) <= LOSS_TOLERANCE * max(1.0, value)  # noqa: E731
            if near(record["train_loss"]) and near(self.previous_loss):
                reasons.append(f"loss pinned at {value:.4f} ({name})")
                break
        if loss:
            self.previous_loss = record["train_loss"]
        if not reasons:
            return
        merged = list(record.get("collapsed", []))
        record["collapsed"] = merged + [reason for reason in reasons if reason not in merged]
        if not self.warned:
            self.warned = True
            message = (f"training has collapsed (epoch {record['epoch']}: {'; '.join(record['collapsed'])}); the "
                       f"scores reported measure no learning. {SUGGESTION}.")
            logger.warning(message)
            self.warnings.append(message)


def check_learnable(graph, node_task: bool = True, feature_dim: int | None = None) -> list[str]:
    """Raise ``DataError``, naming the dataset and the fix, for a node task on ``graph`` (a ``Graph`` or
    ``TypedGraph``) that cannot be learnt; return the warnings (logged here, and kept in the summary) for one
    that can: classes without a training vertex. ``feature_dim``: the features' width when a built-in model
    reads them (None: not checked); without ``node_task`` (a link task) only the features are checked."""
    name, labels, num_classes = graph.name, graph.labels, graph.num_classes
    if node_task and (labels is None or num_classes == 0):
        raise DataError(f"{name}: has no labels, so a node task has nothing to learn; it is a graph for link "
                        f"prediction (`task` link). To classify its vertices, give it labels (of your own tables: "
                        f"convert them again with their labels, docs/datasets.md, \"Your own tables\").")
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
    counts = np.zeros(max(1, num_classes), dtype=np.int64)  # labelled vertices per class
    for start in range(0, int(labels.shape[0]), _CHUNK):
        chunk = np.asarray(labels[start:start + _CHUNK])
        counts += np.bincount(chunk[chunk >= 0], minlength=counts.shape[0])
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
