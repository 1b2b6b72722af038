"""What is predicted and how it is scored: the task a graph's labels pose, its loss and its metric
(``METRICS``; ``auto``: the dataset's own, else ROC-AUC for multi-label labels and accuracy otherwise), as
docs/datasets.md ("Labels and tasks") defines them; unlabelled vertices and unknown entries (-1) count in
neither the loss nor a metric.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from neutronorch.config import METRICS
from neutronorch.data.graph import Graph
from neutronorch.train.health import entropy


@dataclass(frozen=True)
class Task:
    multilabel: bool
    num_classes: int  # classes, or tasks of a multi-label graph
    metric: str

    @classmethod
    def of(cls, graph: Graph, metric: str = "auto") -> "Task":
        multilabel = graph.labels.ndim == 2
        if metric == "auto":
            metric = graph.metric or ("rocauc" if multilabel else "accuracy")
        return cls(multilabel, graph.num_classes, metric)

    @property
    def key(self) -> str:
        """The metric's name in summary keys (``val_rocauc``, ``test_f1_micro``)."""
        return self.metric.replace("-", "_")

    def describe(self) -> str:
        return (f"{'multi-label' if self.multilabel else 'multi-class'}, {self.num_classes} "
                f"{'tasks' if self.multilabel else 'classes'}, metric {self.metric}")

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The mean loss over the known labels (a zero that keeps the graph when there are none: a data
        parallel rank's empty share of a last batch)."""
        if labels.shape[0] == 0:
            return logits.sum() * 0.0
        if not self.multilabel:
            return F.cross_entropy(logits, labels, ignore_index=-1)
        known = labels >= 0
        total = F.binary_cross_entropy_with_logits(logits, labels.clamp(min=0).to(logits.dtype),
                                                   weight=known.to(logits.dtype), reduction="sum")
        return total / known.sum().clamp(min=1)

    def constant_losses(self, labels: np.ndarray) -> dict[str, float]:
        """What ``loss`` is when the model gives every vertex one output, for the training ``labels``: uniform
        outputs (ln C; multi-label ln 2), and the best constant output, the labels' frequencies (their
        entropy; multi-label the mean of each task's binary entropy over its known entries)."""
        labels = np.asarray(labels)
        if self.multilabel:
            known = (labels >= 0).sum(0)
            ones = (labels == 1).sum(0)
            per_task = [entropy([o, k - o]) * k for o, k in zip(ones, known)]
            out = {"ln 2: outputs of probability 1/2": float(np.log(2))}
            best = float(sum(per_task) / max(1, known.sum()))
        else:
            out = {f"ln {self.num_classes}: uniform outputs": float(np.log(self.num_classes))}
            best = entropy(np.bincount(labels[labels >= 0], minlength=self.num_classes))
        if all(abs(best - value) > 1e-6 for value in out.values()):
            out["the labels' entropy: the class frequencies for every vertex"] = best
        return out

    def loss_weight(self, labels: torch.Tensor) -> torch.Tensor:
        """How many terms ``loss`` averages (known labels, or known entries of a multi-label task), as a
        float32 tensor on the labels' device: a rank's weight in the data-parallel gradient mean."""
        return (labels >= 0).sum().to(torch.float32)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) if self.multilabel else torch.softmax(logits, dim=1)

    def predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """Class ids (int64), or a 0/1 row per vertex (int8) for a multi-label task."""
        return (logits > 0).to(torch.int8) if self.multilabel else logits.argmax(1)

    @property
    def counted(self) -> bool:
        """Whether the metric is a function of the class counts (``confusion``): one label per vertex, scored
        by accuracy or F1. Ranks holding parts of a split may then add up their counts."""
        return not self.multilabel and self.metric != "rocauc"

    def score(self, logits: torch.Tensor, labels: torch.Tensor) -> float:
        """The metric of ``logits`` against ``labels`` over labelled vertices (known entries); NaN if none."""
        return score(self.metric, self.multilabel, self.num_classes,
                     self.probabilities(logits.double()).cpu().numpy(), labels.cpu().numpy())


def score(metric: str, multilabel: bool, num_classes: int, probabilities: np.ndarray, labels: np.ndarray) -> float:
    """``metric`` of predicted ``probabilities`` (softmax rows, or a sigmoid per task) against ``labels``."""
    if metric not in METRICS:  # validated where it is set; reaching here is a bug, not a choice of F1
        raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
    if multilabel:
        known = labels >= 0
        if metric == "rocauc":
            areas = [roc_auc(probabilities[known[:, t], t], labels[known[:, t], t]) for t in range(labels.shape[1])]
            areas = [a for a in areas if not np.isnan(a)]
            return float(np.mean(areas)) if areas else float("nan")
        predicted = (probabilities > 0.5).astype(np.int64)
        if metric == "accuracy":
            return float((predicted == labels)[known].mean()) if known.any() else float("nan")
        return _f1(predicted, labels, known, metric == "f1-micro")
    labelled = labels >= 0
    probabilities, labels = probabilities[labelled], labels[labelled]
    if labels.size == 0:
        return float("nan")
    if metric == "rocauc":
        if num_classes == 2:
            return roc_auc(probabilities[:, 1], labels)
        # One-vs-rest over the class probabilities, averaged over the classes that occur (as scikit-learn).
        areas = [roc_auc(probabilities[:, c], (labels == c).astype(np.int64)) for c in range(num_classes)]
        areas = [a for a in areas if not np.isnan(a)]
        return float(np.mean(areas)) if areas else float("nan")
    return counted_score(metric, confusion(probabilities.argmax(1), labels, num_classes))


def confusion(predicted: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """The labelled vertices' counts by (label, predicted class): int64, ``num_classes`` square."""
    labelled = labels >= 0
    pairs = labels[labelled].astype(np.int64) * num_classes + predicted[labelled]
    return np.bincount(pairs, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def counted_score(metric: str, counts: np.ndarray) -> float:
    """Accuracy or F1 of one label per vertex from its ``confusion`` counts; NaN if none. Micro-F1 is the
    accuracy; macro-F1 is averaged over the classes that occur, labelled or predicted (as scikit-learn)."""
    total = int(counts.sum())
    if total == 0:
        return float("nan")
    if metric in ("accuracy", "f1-micro"):
        return float(np.trace(counts) / total)
    tp = np.diag(counts)
    fp, fn = counts.sum(0) - tp, counts.sum(1) - tp
    per_class = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(1, 2 * tp + fp + fn), 0.0)
    return float(per_class[np.flatnonzero(counts.sum(0) + counts.sum(1))].mean())


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Mann-Whitney form: the probability that a positive scores above a negative (ties count half)."""
    positives = labels == 1
    p = int(positives.sum())
    n = labels.shape[0] - p
    if p == 0 or n == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    _, inverse, counts = np.unique(scores[order], return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based, ties share their mean rank
    ranks = np.empty(scores.shape[0])
    ranks[order] = average_rank[inverse]
    return float((ranks[positives].sum() - p * (p + 1) / 2.0) / (p * n))


def _f1(predicted: np.ndarray, labels: np.ndarray, known: np.ndarray, micro: bool) -> float:
    """F1 of 0/1 matrices over the ``known`` entries: pooled over all columns (micro) or averaged over
    columns (macro)."""
    tp = ((predicted == 1) & (labels == 1) & known).sum(0)
    fp = ((predicted == 1) & (labels == 0) & known).sum(0)
    fn = ((predicted == 0) & (labels == 1) & known).sum(0)
    if micro:
        denominator = 2 * tp.sum() + fp.sum() + fn.sum()
        return float(2 * tp.sum() / denominator) if denominator else float("nan")
    per_column = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(1, 2 * tp + fp + fn), 0.0)
    return float(per_column.mean()) if per_column.size else float("nan")
