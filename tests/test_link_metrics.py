"""Link-prediction metrics against hand-computed values and against OGB's evaluator formulas, written out
here (the ogb package is not installed): random scores with many ties, read in small chunks; the chunked
``PerPositiveScores`` against the whole-array functions."""

import tracemalloc

import numpy as np
import pytest
import torch

from neutronorch import ConfigError
from neutronorch.train import link_metrics
from neutronorch.train.link_metrics import (PerPositiveScores, SharedScores, hits_at_k, link_roc_auc, link_scores,
                                           mrr, parse_link_metric, ranks)

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
    assert np.array_equal(ranks(positive, negatives), [2.5, 1.0])
    assert mrr(positive, negatives) == pytest.approx((1 / 2.5 + 1) / 2)
    assert hits_at_k(positive, negatives, 1) == 0.5 and hits_at_k(positive, negatives, 2) == 0.5
    assert hits_at_k(positive, negatives, 3) == 1.0


def test_hand_computed_shared_hits_strictly_above_the_kth_negative():
    positive = np.array([0.9, 0.5, 0.7])
    negatives = np.array([0.8, 0.7, 0.1, 0.6])
    assert hits_at_k(positive, negatives, 2) == pytest.approx(1 / 3)  # 2nd highest 0.7: 0.7 itself is no hit
    assert hits_at_k(positive, negatives, 1) == pytest.approx(1 / 3)
    assert hits_at_k(positive, negatives, 3) == pytest.approx(2 / 3)  # 3rd highest 0.6
    assert hits_at_k(positive, negatives, 4) == 1.0  # 4th highest 0.1
    assert hits_at_k(positive, negatives, 5) == 1.0  # fewer negatives than K, as OGB scores it
    # Shared negatives also rank each positive against all of them.
    assert np.array_equal(ranks(positive, negatives), [1.0, 4.0, 2.5])


def test_hand_computed_roc_auc_counts_ties_half():
    assert link_roc_auc(np.array([0.9, 0.5]), np.array([0.5, 0.1])) == pytest.approx(3.5 / 4)
    assert link_roc_auc(np.array([0.9, 0.5]), np.array([[0.5], [0.1]])) == pytest.approx(3.5 / 4)


@pytest.mark.parametrize("chunk", [1 << 22, 64, 1])
def test_per_positive_metrics_match_ogb_formulas_with_ties_in_any_chunking(monkeypatch, chunk):
    monkeypatch.setattr(link_metrics, "CHUNK", chunk)
    positive = np.round(RNG.random(700), 1)
    negatives = np.round(RNG.random((700, 37)), 1)
    negatives[:5] = positive[:5, None]  # rows tied throughout
    want = ogb_ranks(positive, negatives)
    assert np.array_equal(ranks(positive, negatives), want)
    assert mrr(positive, negatives) == pytest.approx(np.mean(1 / want))
    for k in (1, 3, 10, 37, 50):
        assert hits_at_k(positive, negatives, k) == pytest.approx(np.mean(want <= k))


def test_shared_metrics_match_ogb_formulas_with_ties():
    positive = np.round(RNG.random(400), 2).astype(np.float32)
    negatives = np.round(RNG.random(900), 2).astype(np.float32)
    for k in (1, 10, 50, 100, 900, 901):
        assert hits_at_k(positive, negatives, k) == pytest.approx(ogb_hits_shared(positive, negatives, k))
    broadcast = np.broadcast_to(negatives, (positive.size, negatives.size))
    assert np.array_equal(ranks(positive, negatives), ogb_ranks(positive, broadcast))
    assert link_roc_auc(positive, negatives) == pytest.approx(pairwise_auc(positive, negatives))


def test_torch_scores_score_as_numpy_ones_bfloat16_included():
    positive = torch.rand(60)
    negatives = torch.rand(60, 20)
    assert mrr(positive, negatives) == pytest.approx(mrr(positive.numpy(), negatives.numpy()))
    assert hits_at_k(positive, negatives[:, 0], 5) == hits_at_k(positive.numpy(), negatives[:, 0].numpy(), 5)
    low = positive.to(torch.bfloat16), negatives.to(torch.bfloat16)
    assert mrr(*low) == pytest.approx(mrr(low[0].float().numpy(), low[1].float().numpy()))


def test_link_score_reads_metric_names_and_refuses_others():
    positive, negatives = np.array([0.5, 0.9]), np.array([[0.6, 0.4, 0.5], [0.1, 0.2, 0.3]])
    assert link_scores(positive, negatives).score("mrr") == mrr(positive, negatives)
    assert link_scores(positive, negatives).score("Hits@2") == 0.5
    assert link_scores(positive, negatives).score("rocauc") == link_roc_auc(positive, negatives)
    assert parse_link_metric("hits@50") == ("hits", 50)
    for bad in ("hits@0", "hits", "hits@x", "ndcg", "mrr@10"):
        with pytest.raises(ConfigError, match="use mrr, rocauc or hits@K"):
            parse_link_metric(bad)


def test_mismatched_shapes_are_refused_and_empty_sets_give_nan():
    with pytest.raises(ValueError, match="a row per positive"):
        mrr(np.zeros(3), np.zeros((4, 2)))
    with pytest.raises(ValueError, match="1-D"):
        mrr(np.zeros((3, 1)), np.zeros((3, 2)))
    assert np.isnan(mrr(np.zeros(0), np.zeros((0, 5))))
    assert np.isnan(hits_at_k(np.zeros(0), np.zeros(4), 2))


def test_per_positive_ranks_need_memory_bounded_by_the_chunk_not_the_scores(monkeypatch):
    monkeypatch.setattr(link_metrics, "CHUNK", 1 << 14)
    positive = RNG.random(20_000, dtype=np.float32)
    negatives = RNG.random((20_000, 500), dtype=np.float32)  # 40 MB of scores
    tracemalloc.start()
    try:
        result = mrr(positive, negatives)
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
    assert scores.mrr() == mrr(positive, negatives)
    for k in (1, 3, 10, 37):
        assert scores.hits_at_k(k) == hits_at_k(positive, negatives, k)
    assert scores.roc_auc() == pytest.approx(link_roc_auc(positive, negatives), abs=1e-12)
    assert scores.roc_auc() == pytest.approx(pairwise_auc(positive, negatives.reshape(-1)), abs=1e-12)
    for metric in ("mrr", "hits@10", "rocauc"):
        want = link_scores(positive, negatives).score(metric)
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
    assert scores.mrr() == mrr(positive, whole)
    empty = PerPositiveScores(np.zeros(0, np.float32))
    assert np.isnan(empty.mrr()) and np.isnan(empty.roc_auc()) and np.isnan(empty.hits_at_k(3))


def test_shared_scores_are_the_whole_array_functions():
    positive = np.round(RNG.random(300), 2).astype(np.float32)
    negatives = np.round(RNG.random(500), 2).astype(np.float32)
    scores = SharedScores(positive, negatives)
    assert scores.negatives_per_positive == 500
    assert scores.mrr() == mrr(positive, negatives)
    assert scores.hits_at_k(50) == hits_at_k(positive, negatives, 50)
    assert scores.roc_auc() == link_roc_auc(positive, negatives)
    assert scores.score("hits@20") == link_scores(positive, negatives).score("hits@20")


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
    assert scores.roc_auc() == pytest.approx(link_roc_auc(positive, negatives), abs=1e-12)


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
