"""One hot set per node: the merge every rank computes alike, the slices, the planner's use of a hot set
chosen by the node, the ranks' weights in the hot rows' gradient, and the gradient reduction that averages
it. The multi-process runs are in ``test_distributed.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data import SyntheticSpec, generate
from neutronorch.orchestration.neutronorch.controller import RatioSetting
from neutronorch.orchestration.neutronorch.node import NodeHotSet, _encode, merge_counts, slice_bounds
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.orchestration.seeds import epoch_batches, rank_shares
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.train.distributed import GradientSync, World


class Link:
    """A node of ``len(messages)`` ranks seen from ``local_rank``: the others' planning messages are given."""

    def __init__(self, local_rank: int, others: dict[int, torch.Tensor], size: int = 2):
        self.local_rank, self.local_size, self.others = local_rank, size, others

    def gather_plans(self, values):
        return [values if r == self.local_rank else self.others[r] for r in range(self.local_size)]

    def gather_rows(self, rows, counts):
        return torch.full((sum(counts),) + tuple(rows.shape[1:]), 7, dtype=rows.dtype)


@pytest.mark.parametrize("rows,parts", [(0, 2), (1, 2), (7, 2), (10, 3), (2, 4)])
def test_slices_cover_the_hot_set_once_and_differ_by_at_most_one_row(rows, parts):
    bounds = slice_bounds(rows, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == rows and len(bounds) == parts
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [hi - lo for lo, hi in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_merged_counts_add_up_per_vertex():
    parts = [(np.array([5, 2, 9]), np.array([1, 3, 2])), (np.array([2, 7]), np.array([4, 1]))]
    ids, counts = merge_counts(parts)
    assert ids.tolist() == [5, 2, 9, 7] and counts.tolist() == [1, 7, 2, 1]  # first appearance, rank order
    slot = np.full(10, -1, np.int32)
    again = merge_counts(parts, slot)
    assert np.array_equal(again[0], ids) and np.array_equal(again[1], counts) and (slot == -1).all()
    empty = merge_counts([])
    assert empty[0].shape == empty[1].shape == (0,)


def test_every_rank_of_a_node_chooses_the_same_hot_set_with_the_first_ranks_setting():
    rng = np.random.default_rng(0)
    parts = []
    for _ in range(2):
        ids = rng.choice(500, 200, replace=False).astype(np.int64)
        parts.append((ids, rng.integers(1, 6, 200).astype(np.int32)))
    settings = [RatioSetting(0.25), RatioSetting(0.9)]  # rank 1's planner read a newer ratio: rank 0's counts
    messages = {r: _encode(*parts[r], settings[r]) for r in range(2)}
    chosen = [NodeHotSet(Link(r, messages)).choose(*parts[r], settings[r]) for r in range(2)]
    for a, b in zip(chosen[0], chosen[1]):
        assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
    hot, probe, capped, reached = chosen[0]
    ids, counts = merge_counts(parts)
    assert reached == ids.shape[0] and not capped and hot.shape[0] == round(0.25 * reached)
    # Hottest first, ties in merged order (rank 0's list, then rank 1's): the same on every rank.
    order = np.argsort(-counts, kind="stable")
    assert np.array_equal(hot, ids[order[:hot.shape[0]]]) and np.array_equal(probe, ids[order[:probe.shape[0]]])
    # With auto, the measured error caps the node's set (nothing is hot before it is measured).
    auto = RatioSetting(0.5, auto=True, stale_error=None)
    none = NodeHotSet(Link(0, {1: _encode(*parts[1], auto)})).choose(*parts[0], auto)
    assert none[0].shape[0] == 0 and none[2]


def test_a_node_gathers_the_slices_only_from_one_parameter_version():
    node = NodeHotSet(Link(0, {}))
    table = node.gather(torch.zeros(3, 2), 5, version=7)  # the fake node answers 7 for every row
    assert table.shape == (5, 2)
    with pytest.raises(RuntimeError, match="parameter versions"):
        node.gather(torch.zeros(3, 2), 5, version=6)
    assert node.gather(torch.zeros(0, 2), 0, version=6).shape == (0, 2)  # nothing hot: nothing gathered
    assert [node.bounds(5), NodeHotSet(Link(1, {})).bounds(5)] == [(0, 3), (3, 5)]


def test_the_planner_places_a_hot_set_chosen_by_the_node():
    graph = generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))
    sampler = NeighborSampler(graph.indptr, graph.indices, [4, 3, 3])
    uppers = [(i, 100 + i, sampler.sample(np.asarray(graph.train_idx[i * 50:(i + 1) * 50]), 100 + i, [4, 3]))
              for i in range(3)]
    seen = {}

    def choose(distinct, counts, slot):
        assert (slot == -1).all()
        seen["pairs"] = (distinct.copy(), counts.copy())
        return np.array([distinct[0], 1499, distinct[5]]), distinct[:2], True, 4321  # 1499: another rank's

    plan = Planner(graph.indptr, bottom_fanout=3).plan(1, 0, uppers, ratio=0.1, choose=choose)
    assert plan.hot.tolist() == [seen["pairs"][0][0], 1499, seen["pairs"][0][5]]
    assert plan.stats.reached == 4321 and plan.stats.error_capped and plan.stats.hot == 3
    assert int(seen["pairs"][1].sum()) == sum(u.frontiers[0].shape[0] for _, _, u in uppers)
    for item, (_, _, upper) in zip(plan.batches, uppers):
        dst = upper.frontiers[0].numpy()
        assert np.array_equal(plan.hot[item.hot_rows], dst[item.hot_pos])
        assert not np.isin(dst[item.cold_pos], plan.hot).any()


def test_rank_shares_weigh_an_uneven_last_batch_and_unlabelled_seeds():
    graph = generate(SyntheticSpec(nodes=400, degree=4, features=4, classes=3, noise=0.5, train=0.5))
    train = np.asarray(graph.train_idx)[:103]
    graph.train_idx = train
    shares = [rank_shares(graph, SamplingConfig([3], 10, 5, 1, rank=r, world=2), epoch=1) for r in range(2)]
    assert np.allclose(shares[0][:-1], 1) and np.allclose(shares[1][:-1], 1)  # 20 seeds, 10 each
    assert shares[0][-1] == pytest.approx(2 * 2 / 3) and shares[1][-1] == pytest.approx(2 * 1 / 3)  # 3 seeds: 2 + 1
    # An unlabelled seed in rank 1's part of batch 0: its weight drops, rank 0's rises; they still add to 2.
    part = epoch_batches(torch.from_numpy(train), SamplingConfig([3], 10, 5, 1, rank=1, world=2), 1)[0]
    graph.labels = graph.labels.copy()
    graph.labels[part[0].item()] = -1
    weighed = [rank_shares(graph, SamplingConfig([3], 10, 5, 1, rank=r, world=2), epoch=1)[0] for r in range(2)]
    assert weighed == pytest.approx([2 * 10 / 19, 2 * 9 / 19])


class TwoAlikeRanks(World):
    """Two ranks that hold the same values: every sum is twice this rank's."""

    def __init__(self):
        super().__init__(rank=0, size=2)

    def all_reduce_(self, tensor, what):
        return tensor.mul_(2)


@pytest.mark.parametrize("weight", [4.0, 0.0])
def test_the_gradient_reduction_averages_the_handed_over_gradients_with_equal_weights(weight):
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    a.grad, b.grad = torch.tensor([1.0, 2.0, 3.0]), None
    apart = {a: torch.tensor([10.0, 10.0, 10.0]), b: torch.tensor([5.0, 6.0])}
    sync = GradientSync(TwoAlikeRanks(), [a, b], None, lambda: apart)
    loss = sync(torch.tensor(weight), torch.tensor(0.5))
    # (2 w g) / (2 w) + (2 e) / 2: the weighted mean of the others plus the equal-weight mean of these.
    expected_a = [11.0, 12.0, 13.0] if weight else [10.0, 10.0, 10.0]
    assert a.grad.tolist() == expected_a and b.grad.tolist() == [5.0, 6.0]
    assert float(loss) == (0.5 if weight else 0.0)
    # Without handed-over gradients, the old layout: a parameter without gradients keeps none.
    a.grad, b.grad = torch.tensor([1.0, 2.0, 3.0]), None
    GradientSync(TwoAlikeRanks(), [a, b], None, lambda: None)(torch.tensor(4.0), torch.tensor(0.5))
    assert a.grad.tolist() == [1.0, 2.0, 3.0] and b.grad is None
