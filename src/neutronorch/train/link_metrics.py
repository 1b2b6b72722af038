"""Link-prediction metrics, defined as OGB's link evaluators define them.

Scores are one per positive edge, ``positive`` (P,), and the negatives' in one of two forms:

- **per positive**, (P, K): row i holds positive i's own K negatives (ogbl-citation2). A positive's rank is
  1 + (#above + #at least as high) / 2 (ties half); MRR is the mean of 1 / rank, Hits@K the share of
  positives ranked at most K.
- **shared**, (N,): one list for every positive (ogbl-collab, -ppa). Hits@K: the share of positives scored
  strictly above the K-th highest negative (1.0 with fewer than K); MRR ranks each positive against all N.

ROC-AUC (the negatives pooled): the probability that a positive scores above a negative, ties half. Scores
may be numpy arrays or torch tensors on any device. ``PerPositiveScores`` takes (P, K) scores a chunk of
rows at a time and keeps P values, so they are never held whole; ``SharedScores`` holds shared scores whole;
``link_scores`` scores whole arrays through them."""

from __future__ import annotations

import numpy as np

from neutronorch.errors import ConfigError
from neutronorch.train.health import TIE_TOLERANCE
from neutronorch.train.task import roc_auc

CHUNK = 1 << 22  # negative scores compared at a time


def _host(scores) -> np.ndarray:
    if hasattr(scores, "detach"):  # a torch tensor; bfloat16 has no numpy type, float32 holds it exactly
        scores = scores.detach().cpu()
        if str(scores.dtype) in ("torch.bfloat16", "torch.float16"):
            scores = scores.float()
        scores = scores.numpy()
    return np.asarray(scores)


def _positive(scores) -> np.ndarray:
    positive = _host(scores)
    if positive.ndim != 1:
        raise ValueError(f"positive scores must be 1-D (one per positive edge), got shape {positive.shape}")
    return positive


def parse_link_metric(metric: str) -> tuple[str, int]:
    """``"mrr"``, ``"rocauc"`` or ``"hits@K"`` as (name, K); K is 0 for the first two."""
    name, at, k = metric.strip().lower().partition("@")
    if name in ("mrr", "rocauc") and not at:
        return name, 0
    if name == "hits" and at and k.isdigit() and int(k) >= 1:
        return name, int(k)
    raise ConfigError(f"link metric {metric!r} is not understood; use mrr, rocauc or hits@K with K a whole "
                      f"number from 1 (hits@50, as ogbl-collab is ranked).")


def link_scores(positive, negatives) -> "SharedScores | PerPositiveScores":
    """The scores as ``SharedScores`` (negatives (N,)) or ``PerPositiveScores`` (negatives (P, K), given
    ``CHUNK`` scores at a time), whose methods give the metrics."""
    negatives = _host(negatives)
    if negatives.ndim == 1:
        return SharedScores(positive, negatives)
    scores = PerPositiveScores(positive)
    if negatives.ndim != 2:
        raise ValueError(f"negative scores must be (N,) shared or (P, K) per positive, got {negatives.shape}")
    if negatives.shape[0] != scores.positive.shape[0]:
        raise ValueError(f"per-positive negative scores must have a row per positive "
                         f"({scores.positive.shape[0]}), got shape {negatives.shape}")
    rows = max(1, CHUNK // max(1, negatives.shape[1]))
    for start in range(0, negatives.shape[0], rows):
        scores.add(start, negatives[start:start + rows])
    return scores


class _Metrics:
    """``score(metric)``, ``mrr`` and ``hits_at_k`` of a set of scores that has ``ranks``, ``_hits`` and
    ``roc_auc``."""

    def mrr(self) -> float:
        """Mean reciprocal rank (NaN without positives)."""
        ranked = self.ranks()
        return float(np.mean(1.0 / ranked)) if ranked.size else float("nan")

    def score(self, metric: str) -> float:
        """``metric`` (``parse_link_metric``)."""
        name, k = parse_link_metric(metric)
        if name == "mrr":
            return self.mrr()
        return self.roc_auc() if name == "rocauc" else self.hits_at_k(k)

    def hits_at_k(self, k: int) -> float:
        """Hits@``k`` (``_hits``; NaN without positives)."""
        if k < 1:
            raise ValueError(f"Hits@K needs K >= 1, got {k}")
        return self._hits(k) if self.positive.size else float("nan")


class SharedScores(_Metrics):
    """Positive scores (P,) against shared negative scores (N,), both held whole."""

    def __init__(self, positive, negatives):
        self.positive, self.negatives = _positive(positive), _host(negatives)
        if self.negatives.ndim != 1:
            raise ValueError(f"shared negative scores must be 1-D, got shape {self.negatives.shape}")
        self.negatives_per_positive = self.negatives.shape[0]

    def ranks(self) -> np.ndarray:
        """Each positive's rank (float64): 1 + (#negatives higher + #negatives at least as high) / 2."""
        ordered = np.sort(self.negatives)
        higher = ordered.shape[0] - np.searchsorted(ordered, self.positive, side="right")
        return 0.5 * (higher + ordered.shape[0] - np.searchsorted(ordered, self.positive, side="left")) + 1.0

    def _hits(self, k: int) -> float:
        """The share of positives scored strictly above the ``k``-th highest negative (1.0 if N < k), as OGB's
        evaluator."""
        if self.negatives.shape[0] < k:
            return 1.0
        kth_highest = np.partition(self.negatives, self.negatives.shape[0] - k)[self.negatives.shape[0] - k]
        return float(np.count_nonzero(self.positive > kth_highest) / self.positive.shape[0])

    def roc_auc(self) -> float:
        """The probability that a positive scores above a negative, ties half (NaN when either side is
        empty)."""
        scores = np.concatenate([self.positive, self.negatives])
        labels = np.concatenate([np.ones(self.positive.shape[0], np.int8),
                                 np.zeros(self.negatives.shape[0], np.int8)])
        return roc_auc(scores, labels)

    def all_tied(self) -> bool:
        """Whether every score, positive and negative, is the same number to ``TIE_TOLERANCE`` of its size
        (training collapsed)."""
        scores = np.concatenate([self.positive.reshape(-1), self.negatives.reshape(-1)]).astype(np.float64)
        return bool(scores.size) and bool(np.ptp(scores) <= TIE_TOLERANCE * max(1.0, float(np.abs(scores).max())))

    def tie_share(self) -> float:
        """The share of (positive, negative) pairs scored exactly alike (0 without pairs)."""
        ordered = np.sort(self.negatives)
        tied = np.searchsorted(ordered, self.positive, "right") - np.searchsorted(ordered, self.positive, "left")
        return float(tied.sum()) / max(1, self.positive.size * self.negatives.size)


class PerPositiveScores(_Metrics):
    """Positive scores (P,) against per-positive negative scores given a chunk of rows at a time (``add``).
    Kept: the positives and a sorted copy, each positive's rank, and two counts over every negative so far
    (the positives scored above it and those tied with it), so the metrics are the same whatever the chunks:
    ROC-AUC's Mann-Whitney count (ties half) is an exact integer sum."""

    def __init__(self, positive, pooled: bool = False):
        self.positive = _positive(positive)
        self.ordered = np.sort(self.positive)
        self._ranks = np.zeros(self.positive.shape[0], np.float64)  # rows not given stay 0 (``combined``)
        self.rows = self.above = self.tied = self.negatives = self.tied_rows = self.tied_pairs = 0
        self.negatives_per_positive = None
        # ``pooled``: per positive, the negatives of every row scored at least as high (``average_precision``).
        self._pooled_at_least = np.zeros(self.positive.shape[0], np.int64) if pooled else None

    def add(self, start: int, negatives) -> None:
        """The (rows, K) negative scores of positives ``start`` to ``start + rows - 1``; every positive's row
        is given once, in any order of chunks, before the metrics are read."""
        negatives = _host(negatives)
        if negatives.ndim != 2 or negatives.shape[1] != (self.negatives_per_positive or negatives.shape[1]):
            raise ValueError(f"per-positive negative scores must be (rows, {self.negatives_per_positive or 'K'}), "
                             f"got shape {negatives.shape}")
        count = negatives.shape[0]
        positive = self.positive[start:start + count, None]
        higher = np.count_nonzero(negatives > positive, axis=1)
        at_least = np.count_nonzero(negatives >= positive, axis=1)
        self._ranks[start:start + count] = 0.5 * (higher + at_least) + 1.0
        if negatives.shape[1]:  # rows tied whole, from each row's extremes (P values, not P x K): all_tied
            positive = self.positive[start:start + count].astype(np.float64)
            margin = TIE_TOLERANCE * np.maximum(1.0, np.abs(positive))
            self.tied_rows += int(np.count_nonzero((negatives.max(axis=1) - positive <= margin)
                                                   & (positive - negatives.min(axis=1) <= margin)))
            self.tied_pairs += int(np.count_nonzero(negatives == self.positive[start:start + count, None]))
        flat = np.sort(negatives.reshape(-1))  # sorted keys search a few times faster (each from the last)
        # Per negative: the positives at most its score, and those below it (each array summed as made).
        at_most = int(np.searchsorted(self.ordered, flat, side="right").sum())
        below = int(np.searchsorted(self.ordered, flat, side="left").sum())
        self.above += self.ordered.shape[0] * flat.shape[0] - at_most
        if self._pooled_at_least is not None:
            self._pooled_at_least += flat.shape[0] - np.searchsorted(flat, self.positive, side="left")
        self.tied += at_most - below
        self.rows, self.negatives = self.rows + count, self.negatives + flat.shape[0]
        self.negatives_per_positive = negatives.shape[1]

    def _hits(self, k: int) -> float:
        """The share of positives ranked at most ``k``."""
        return float(np.mean(self.ranks() <= k))

    def roc_auc(self) -> float:
        """The probability that a positive scores above a negative, ties half (NaN when either side is empty)."""
        self.ranks()
        if self.positive.size == 0 or self.negatives == 0:
            return float("nan")
        return float((self.above + 0.5 * self.tied) / (self.positive.shape[0] * self.negatives))

    def average_precision(self) -> float:
        """Average precision of every pair pooled (positives 1, all negatives 0; ties as one threshold, as
        scikit-learn's): the mean over positives of the precision among pairs scored at least as high. Needs
        ``pooled``; NaN without positives."""
        if self._pooled_at_least is None:
            raise ValueError("average_precision needs PerPositiveScores(positive, pooled=True)")
        self.ranks()
        if self.positive.size == 0:
            return float("nan")
        positives = self.ordered.shape[0] - np.searchsorted(self.ordered, self.positive, side="left")
        return float(np.mean(positives / (positives + self._pooled_at_least)))

    def all_tied(self) -> bool:
        """Whether every positive scored as each of its negatives, to ``TIE_TOLERANCE`` of its size (training
        collapsed: the MRR is the tie level 1 / (1 + K/2))."""
        return bool(self.positive.size) and self.tied_rows == self.positive.shape[0]

    def tie_share(self) -> float:
        """The share of (positive, own negative) pairs scored exactly alike (0 without pairs)."""
        return self.tied_pairs / max(1, self.negatives)

    def combined(self, total) -> "PerPositiveScores":
        """These scores with other parts' rows in: each part of the work scored every positive but added only
        its own rows (the others' ranks left 0); ``total(array)`` sums a float64 array over the parts. The
        counts are integers, so the metrics are those of one ``PerPositiveScores`` given every row."""
        counts = [self.above, self.tied, self.rows, self.negatives, self.tied_rows, self.tied_pairs]
        pooled = () if self._pooled_at_least is None else (self._pooled_at_least,)
        state = total(np.concatenate([np.asarray(counts, np.float64), self._ranks, *pooled]))
        (self.above, self.tied, self.rows, self.negatives, self.tied_rows, self.tied_pairs) = (
            int(v) for v in state[:6])
        count = self.positive.shape[0]
        self._ranks = state[6:6 + count]
        if pooled:
            self._pooled_at_least = state[6 + count:].astype(np.int64)
        return self

    def ranks(self) -> np.ndarray:
        """``SharedScores.ranks``, every positive's row given."""
        if self.rows != self.positive.shape[0]:
            raise ValueError(f"negative scores were given for {self.rows} rows of {self.positive.shape[0]} positives")
        return self._ranks
