"""Link-prediction metrics, defined as OGB's link evaluators define them.

Scores are one per positive edge, ``positive`` (P,), and the negatives' in one of two forms:

- **per positive**, (P, K): row i holds the scores of positive i's own K negatives (ogbl-citation2). A
  positive's rank is 1 + (optimistic + pessimistic) / 2, where optimistic counts the negatives scored above
  it and pessimistic those scored at least as high (ties count half). MRR is the mean of 1 / rank; Hits@K
  the share of positives whose rank is at most K (OGB's ``hits@K_list``).
- **shared**, (N,): one list of negatives for every positive (ogbl-collab, -ppa). Hits@K: the share of
  positives scored strictly above the K-th highest negative score, and 1.0 when there are fewer than K
  negatives. MRR ranks each positive against all N.

ROC-AUC (either form: the negatives are pooled) is the probability that a positive scores above a negative,
ties counting half (``task.roc_auc``). Scores may be numpy arrays or torch tensors on any device (brought to
the host). Per-positive ranks are counted ``CHUNK`` scores at a time, so millions of positives with a
thousand negatives each need only a bounded working set beyond the scores; ROC-AUC sorts all P + N scores.
"""

from __future__ import annotations

import numpy as np

from neutronorch.errors import ConfigError
from neutronorch.train.task import roc_auc

__all__ = ["ranks", "mrr", "hits_at_k", "link_roc_auc", "link_score", "parse_link_metric"]

CHUNK = 1 << 22  # negative scores compared at a time


def _host(scores) -> np.ndarray:
    if hasattr(scores, "detach"):  # a torch tensor; bfloat16 has no numpy type, float32 holds it exactly
        scores = scores.detach().cpu()
        if str(scores.dtype) in ("torch.bfloat16", "torch.float16"):
            scores = scores.float()
        scores = scores.numpy()
    return np.asarray(scores)


def _inputs(positive, negatives) -> tuple[np.ndarray, np.ndarray]:
    positive, negatives = _host(positive), _host(negatives)
    if positive.ndim != 1:
        raise ValueError(f"positive scores must be 1-D (one per positive edge), got shape {positive.shape}")
    if negatives.ndim == 2 and negatives.shape[0] != positive.shape[0]:
        raise ValueError(f"per-positive negative scores must have a row per positive ({positive.shape[0]}), "
                         f"got shape {negatives.shape}")
    if negatives.ndim not in (1, 2):
        raise ValueError(f"negative scores must be (N,) shared or (P, K) per positive, got shape {negatives.shape}")
    return positive, negatives


def ranks(positive, negatives) -> np.ndarray:
    """Each positive's rank among its negatives (float64, ties half): 1 + (#higher + #at least as high) / 2."""
    positive, negatives = _inputs(positive, negatives)
    if negatives.ndim == 1:
        ordered = np.sort(negatives)
        higher = ordered.shape[0] - np.searchsorted(ordered, positive, side="right")
        at_least = ordered.shape[0] - np.searchsorted(ordered, positive, side="left")
        return 0.5 * (higher + at_least) + 1.0
    out = np.empty(positive.shape[0], np.float64)
    rows = max(1, CHUNK // max(1, negatives.shape[1]))
    for start in range(0, positive.shape[0], rows):
        chunk, pos = negatives[start:start + rows], positive[start:start + rows, None]
        higher = np.count_nonzero(chunk > pos, axis=1)
        at_least = np.count_nonzero(chunk >= pos, axis=1)
        out[start:start + rows] = 0.5 * (higher + at_least) + 1.0
    return out


def mrr(positive, negatives) -> float:
    """Mean reciprocal rank of the positives among their negatives (NaN without positives)."""
    ranked = ranks(positive, negatives)
    return float(np.mean(1.0 / ranked)) if ranked.size else float("nan")


def hits_at_k(positive, negatives, k: int) -> float:
    """Hits@K: per-positive negatives (P, K'): the share of positives ranked at most ``k``; shared negatives
    (N,): the share scored strictly above the ``k``-th highest negative (1.0 if N < k), as OGB's evaluator."""
    if k < 1:
        raise ValueError(f"Hits@K needs K >= 1, got {k}")
    positive, negatives = _inputs(positive, negatives)
    if positive.size == 0:
        return float("nan")
    if negatives.ndim == 2:
        return float(np.mean(ranks(positive, negatives) <= k))
    if negatives.shape[0] < k:
        return 1.0
    kth_highest = np.partition(negatives, negatives.shape[0] - k)[negatives.shape[0] - k]
    return float(np.count_nonzero(positive > kth_highest) / positive.shape[0])


def link_roc_auc(positive, negatives) -> float:
    """ROC-AUC of positives against all negatives pooled (either form); NaN when either side is empty."""
    positive, negatives = _inputs(positive, negatives)
    negatives = negatives.reshape(-1)
    scores = np.concatenate([positive, negatives])
    labels = np.concatenate([np.ones(positive.shape[0], np.int8), np.zeros(negatives.shape[0], np.int8)])
    return roc_auc(scores, labels)


def parse_link_metric(metric: str) -> tuple[str, int]:
    """``"mrr"``, ``"rocauc"`` or ``"hits@K"`` as (name, K); K is 0 for the first two."""
    name, at, k = metric.strip().lower().partition("@")
    if name in ("mrr", "rocauc") and not at:
        return name, 0
    if name == "hits" and at and k.isdigit() and int(k) >= 1:
        return name, int(k)
    raise ConfigError(f"link metric {metric!r} is not understood; use mrr, rocauc or hits@K with K a whole "
                      f"number from 1 (hits@50, as ogbl-collab is ranked).")


def link_score(metric: str, positive, negatives) -> float:
    """``metric`` (``parse_link_metric``) of the positive scores against the negative scores."""
    name, k = parse_link_metric(metric)
    if name == "mrr":
        return mrr(positive, negatives)
    if name == "rocauc":
        return link_roc_auc(positive, negatives)
    return hits_at_k(positive, negatives, k)
