"""Link-prediction metrics against hand-computed values and against OGB's evaluator formulas, written out
here (the ogb package is not installed): random scores with many ties, read in small chunks; the chunked
``PerPositiveScores`` against the whole arrays' ``link_scores``."""

import tracemalloc

import numpy as np
import pytest
import torch

from neutronorch import ConfigError
from neutronorch.train import link_metrics
from neutronorch.train.link_metrics import PerPositiveScores, SharedScores, link_scores, parse_link_metric

RNG = np.random.default_rng(5)


def ogb_ranks(positive, negatives):
    """ogbl-citation2's evaluator: rank = 0.5 * (#neg > pos + #neg >= pos) + 1 against the row's negatives."""
    positive = positive.reshape(-1, 1)
    return 0.5 * ((negatives > positive).sum(1) + (negatives >= positive).sum(1)) + 1


def ogb_hits_shared(positive, negatives, k):
    """ogbl-collab/ppa's evaluator: strictly above the K-th highest negative; 1.0 with fewer than K."""
    if len(negatives) < k:
        return 1.0
    return float(np.sum(positive > np.sort(negatives)[-k])) / len(positive)


def pairwise_auc(positive, negatives):
    wins = (positive[:, None] > negatives[None, :]).sum() + 0.5 * (positive[:, None] == negatives[None, :]).sum()
    return wins / (positive.size * negatives.size)


def test_hand_computed_mrr_and_per_positive_hits():
    positive = np.array([0.5, 0.9])
    negatives = np.array([[0.6, 0.4, 0.5], [0.1, 0.2, 0.3]])
    # Positive 0: one negative above it, two at least as high: rank 0.5 * (1 + 2) + 1 = 2.5. Positive 1: first.
    scores = link_scores(positive, negatives)
    assert np.array_equal(scores.ranks(), [2.5, 1.0])
    assert scores.mrr() == pytest.approx((1 / 2.5 + 1) / 2)
    assert scores.hits_at_k(1) == 0.5 and scores.hits_at_k(2) == 0.5
    assert scores.hits_at_k(3) == 1.0


def test_hand_computed_shared_hits_strictly_above_the_kth_negative():
    positive = np.array([0.9, 0.5, 0.7])
    negatives = np.array([0.8, 0.7, 0.1, 0.6])
    scores = link_scores(positive, negatives)
    assert scores.hits_at_k(2) == pytest.approx(1 / 3)  # 2nd highest 0.7: 0.7 itself is no hit
    assert scores.hits_at_k(1) == pytest.approx(1 / 3)
    assert scores.hits_at_k(3) == pytest.approx(2 / 3)  # 3rd highest 0.6
    assert scores.hits_at_k(4) == 1.0  # 4th highest 0.1
    assert scores.hits_at_k(5) == 1.0  # fewer negatives than K, as OGB scores it
    # Shared negatives also rank each positive against all of them.
    assert np.array_equal(scores.ranks(), [1.0, 4.0, 2.5])


def test_hand_computed_roc_auc_counts_ties_half():
    assert link_scores(np.array([0.9, 0.5]), np.array([0.5, 0.1])).roc_auc() == pytest.approx(3.5 / 4)
    assert link_scores(np.array([0.9, 0.5]), np.array([[0.5], [0.1]])).roc_auc() == pytest.approx(3.5 / 4)


@pytest.mark.parametrize("chunk", [1 << 22, 64, 1])
def test_per_positive_metrics_match_ogb_formulas_with_ties_in_any_chunking(monkeypatch, chunk):
    monkeypatch.setattr(link_metrics, "CHUNK", chunk)
    positive = np.round(RNG.random(700), 1)
    negatives = np.round(RNG.random((700, 37)), 1)
    negatives[:5] = positive[:5, None]  # rows tied throughout
    want = ogb_ranks(positive, negatives)
    scores = link_scores(positive, negatives)
    assert np.array_equal(scores.ranks(), want)
    assert scores.mrr() == pytest.approx(np.mean(1 / want))
    for k in (1, 3, 10, 37, 50):
        assert scores.hits_at_k(k) == pytest.approx(np.mean(want <= k))


def test_shared_metrics_match_ogb_formulas_with_ties():
    positive = np.round(RNG.random(400), 2).astype(np.float32)
    negatives = np.round(RNG.random(900), 2).astype(np.float32)
    scores = link_scores(positive, negatives)
    for k in (1, 10, 50, 100, 900, 901):
        assert scores.hits_at_k(k) == pytest.approx(ogb_hits_shared(positive, negatives, k))
    broadcast = np.broadcast_to(negatives, (positive.size, negatives.size))
    assert np.array_equal(scores.ranks(), ogb_ranks(positive, broadcast))
    assert scores.roc_auc() == pytest.approx(pairwise_auc(positive, negatives))


def test_torch_scores_score_as_numpy_ones_bfloat16_included():
    positive = torch.rand(60)
    negatives = torch.rand(60, 20)
    assert link_scores(positive, negatives).mrr() == pytest.approx(
        link_scores(positive.numpy(), negatives.numpy()).mrr())
    shared = negatives[:, 0]
    assert link_scores(positive, shared).hits_at_k(5) == link_scores(positive.numpy(), shared.numpy()).hits_at_k(5)
    low = positive.to(torch.bfloat16), negatives.to(torch.bfloat16)
    assert link_scores(*low).mrr() == pytest.approx(link_scores(*(t.float().numpy() for t in low)).mrr())


def test_link_score_reads_metric_names_and_refuses_others():
    positive, negatives = np.array([0.5, 0.9]), np.array([[0.6, 0.4, 0.5], [0.1, 0.2, 0.3]])
    scores = link_scores(positive, negatives)
    assert scores.score("mrr") == scores.mrr()
    assert scores.score("Hits@2") == 0.5
    assert scores.score("rocauc") == scores.roc_auc()
    assert parse_link_metric("hits@50") == ("hits", 50)
    for bad in ("hits@0", "hits", "hits@x", "ndcg", "mrr@10"):
        with pytest.raises(ConfigError, match="use mrr, rocauc or hits@K"):
            parse_link_metric(bad)


def test_mismatched_shapes_are_refused_and_empty_sets_give_nan():
    with pytest.raises(ValueError, match="a row per positive"):
        link_scores(np.zeros(3), np.zeros((4, 2))).mrr()
    with pytest.raises(ValueError, match="1-D"):
        link_scores(np.zeros((3, 1)), np.zeros((3, 2))).mrr()
    assert np.isnan(link_scores(np.zeros(0), np.zeros((0, 5))).mrr())
    assert np.isnan(link_scores(np.zeros(0), np.zeros(4)).hits_at_k(2))


def test_per_positive_ranks_need_memory_bounded_by_the_chunk_not_the_scores(monkeypatch):
    monkeypatch.setattr(link_metrics, "CHUNK", 1 << 14)
    positive = RNG.random(20_000, dtype=np.float32)
    negatives = RNG.random((20_000, 500), dtype=np.float32)  # 40 MB of scores
    tracemalloc.start()
    try:
        result = link_scores(positive, negatives).mrr()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"peak {peak:,} bytes"
    assert result == pytest.approx(np.mean(1 / ogb_ranks(positive, negatives)))


def _in_chunks(positive, negatives, sizes, rng):
    """``PerPositiveScores`` of the scores given in chunks of ``sizes`` rows (cycled), in a shuffled order."""
    starts, start = [], 0
    while start < positive.shape[0]:
        size = sizes[len(starts) % len(sizes)]
        starts.append((start, size))
        start += size
    scores = PerPositiveScores(positive)
    for index in rng.permutation(len(starts)):
        start, size = starts[index]
        scores.add(start, negatives[start:start + size])
    return scores


@pytest.mark.parametrize("sizes", [(700,), (1,), (64, 3, 250)])
def test_per_positive_scores_in_chunks_equal_the_whole_array_functions(sizes):
    rng = np.random.default_rng(11)
    positive = np.round(rng.random(700), 1).astype(np.float32)
    negatives = np.round(rng.random((700, 37)), 1).astype(np.float32)  # many ties, positives with negatives too
    negatives[:5] = positive[:5, None]
    scores = _in_chunks(positive, negatives, sizes, rng)
    assert scores.negatives_per_positive == 37
    whole = link_scores(positive, negatives)
    assert scores.mrr() == whole.mrr()
    for k in (1, 3, 10, 37):
        assert scores.hits_at_k(k) == whole.hits_at_k(k)
    assert scores.roc_auc() == pytest.approx(whole.roc_auc(), abs=1e-12)
    assert scores.roc_auc() == pytest.approx(pairwise_auc(positive, negatives.reshape(-1)), abs=1e-12)
    for metric in ("mrr", "hits@10", "rocauc"):
        want = whole.score(metric)
        assert scores.score(metric) == pytest.approx(want, abs=1e-12)


def test_per_positive_scores_take_torch_chunks_and_refuse_missing_rows_or_widths():
    positive, negatives = torch.rand(50), torch.rand(50, 8)
    scores = PerPositiveScores(positive)
    scores.add(0, negatives[:30])
    with pytest.raises(ValueError, match="30 rows of 50"):
        scores.mrr()
    with pytest.raises(ValueError, match=r"\(rows, 8\)"):
        scores.add(30, negatives[30:, :4])
    scores.add(30, negatives[30:].to(torch.bfloat16).float())
    whole = negatives.clone()
    whole[30:] = negatives[30:].to(torch.bfloat16).float()
    assert scores.mrr() == link_scores(positive, whole).mrr()
    empty = PerPositiveScores(np.zeros(0, np.float32))
    assert np.isnan(empty.mrr()) and np.isnan(empty.roc_auc()) and np.isnan(empty.hits_at_k(3))


def test_shared_scores_are_the_whole_array_functions():
    positive = np.round(RNG.random(300), 2).astype(np.float32)
    negatives = np.round(RNG.random(500), 2).astype(np.float32)
    scores = SharedScores(positive, negatives)
    assert scores.negatives_per_positive == 500
    whole = link_scores(positive, negatives)
    assert scores.mrr() == whole.mrr()
    assert scores.hits_at_k(50) == whole.hits_at_k(50)
    assert scores.roc_auc() == whole.roc_auc()
    assert scores.score("hits@20") == whole.score("hits@20")


def test_per_positive_scores_hold_the_positives_not_the_negatives():
    positive = RNG.random(20_000, dtype=np.float32)
    negatives = RNG.random((20_000, 500), dtype=np.float32)  # 40 MB of scores, given 500 rows (1 MB) at a time
    tracemalloc.start()
    try:
        scores = PerPositiveScores(positive)
        for start in range(0, 20_000, 500):
            scores.add(start, negatives[start:start + 500])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The positives twice (160 kB), the ranks (160 kB), a chunk sorted (1 MB) and its search's 250k positions (2 MB).
    assert peak < 4_000_000, f"peak {peak:,} bytes"
    assert scores.roc_auc() == pytest.approx(link_scores(positive, negatives).roc_auc(), abs=1e-12)


def test_every_score_tied_is_found_to_the_last_bits_and_a_real_spread_is_not():
    rng = np.random.default_rng(0)
    positive = np.full(40, 0.73, np.float32)
    negatives = np.full((40, 25), 0.73, np.float32) + rng.normal(0, 1e-7, (40, 25)).astype(np.float32)
    for chunk in (7, 40):
        scores = PerPositiveScores(positive)
        for start in range(0, 40, chunk):
            scores.add(start, negatives[start:start + chunk])
        assert scores.all_tied() and scores.mrr() == pytest.approx(1 / (1 + 25 / 2), rel=0.2)
    spread = PerPositiveScores(positive)
    spread.add(0, np.where(np.arange(25) == 3, 0.9, 0.73).astype(np.float32)[None].repeat(40, 0))
    assert not spread.all_tied()  # one negative of each row apart: not every score equal
    assert SharedScores(positive, np.full(300, 0.73, np.float32)).all_tied()
    assert not SharedScores(positive, np.linspace(0, 1, 300)).all_tied()
    # Most pairs tied, not all: the share of pairs scored exactly alike, per positive or shared.
    assert spread.tie_share() == pytest.approx(24 / 25)
    shared = SharedScores(np.array([0.73, 0.73, 0.2]), np.array([0.73, 0.73, 0.73, 0.1]))
    assert not shared.all_tied() and shared.tie_share() == pytest.approx(6 / 12)
