"""Hot rows computed once per node: who computes which row, the exchange of rows and of their gradient,
the ranks' weights in the hot rows' gradient, and the gradient reduction that averages it. The
multi-process runs are in ``test_distributed.py``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data import SyntheticSpec, generate
from neutronorch.orchestration.neutronorch.node import NodeHotSet, plan_exchange
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.train.distributed import GradientSync, World


class Node:
    """The ranks of one node in one process: each rank's link sees the others' values."""

    def __init__(self, sets: list[np.ndarray]):
        self.sets = sets
        self.sent: dict[int, torch.Tensor] = {}
        self.summed: dict[int, torch.Tensor] = {}

    def link(self, rank: int) -> "Link":
        return Link(self, rank)


class Link:
    def __init__(self, node: Node, rank: int):
        self.node, self.local_rank, self.local_size = node, rank, len(node.sets)

    def gather_ids(self, ids):
        assert np.array_equal(ids.numpy(), self.node.sets[self.local_rank])
        return [torch.from_numpy(s) for s in self.node.sets]

    def gather_rows(self, rows, counts):
        if rows.dtype == torch.int64:  # the version check: every rank at version 7
            return torch.full((sum(counts), 1), 7)
        self.node.sent[self.local_rank] = rows
        return torch.cat([self.node.sent[r] for r in range(self.local_size)])

    def sum_(self, tensor):
        self.node.summed[self.local_rank] = tensor.clone()
        tensor.copy_(sum(self.node.summed[r] for r in range(self.local_size)))
        return tensor


def _rows_of(vertices: np.ndarray) -> torch.Tensor:
    """What any rank computes for these hot vertices (a row is a function of its vertex)."""
    v = torch.from_numpy(vertices).double()
    return torch.stack([v, v * v], dim=1)


@pytest.mark.parametrize("sets", [
    [[5, 2, 9, 4], [2, 7, 9, 11, 5]],
    [[1, 2, 3, 4, 5, 6], [6, 5, 4], [4, 8, 1, 6]],
    [[3, 1], []],
    [[], []]])
def test_rows_held_by_several_ranks_are_computed_once_and_reach_every_holder(sets):
    sets = [np.array(s, np.int64) for s in sets]
    plans = [plan_exchange(sets, r) for r in range(len(sets))]
    computed = np.concatenate([sets[r][p.computed] for r, p in enumerate(plans)])
    union = np.unique(np.concatenate(sets))
    assert sorted(computed.tolist()) == union.tolist()  # every hot vertex of the node computed once
    for v in union.tolist():  # by the (v mod k)-th of its k holders
        holders = [r for r, s in enumerate(sets) if v in s.tolist()]
        owner = [r for r, s in enumerate(sets) if v in s[plans[r].computed].tolist()]
        assert owner == [holders[v % len(holders)]]
    # The exchange: every rank ends with its whole table, as if it had computed every row itself.
    node = Node(sets)
    hot = [NodeHotSet(node.link(r)) for r in range(len(sets))]
    for r in range(len(sets)):  # the gather returns what every rank sent: send all first
        node.sent[r] = _rows_of(sets[r][plans[r].computed])[torch.from_numpy(plans[r].sent)]
    for r in range(len(sets)):
        assert hot[r].exchange(sets[r]).computed.tolist() == plans[r].computed.tolist()
        table = hot[r].assemble(_rows_of(sets[r][plans[r].computed]), plans[r], sets[r].shape[0], version=7)
        assert torch.equal(table, _rows_of(sets[r]))
        assert plans[r].shared == sum(plans[r].sizes) and plans[r].mine[1] - plans[r].mine[0] == plans[r].sent.shape[0]


def test_the_shared_rows_gradient_is_summed_over_their_holders():
    sets = [np.array([5, 2, 9, 4]), np.array([2, 7, 9, 11, 5])]
    plans = [plan_exchange(sets, r) for r in range(2)]
    grads = [torch.arange(4 * 3, dtype=torch.float32).reshape(4, 3), 100 + torch.arange(5 * 3.0).reshape(5, 3)]
    node = Node(sets)
    for r in range(2):  # every rank's contribution first: the fake sum reads them all
        shared = torch.zeros(plans[r].shared, 3)
        held = np.flatnonzero(plans[r].held >= 0)
        shared[held] = grads[r][plans[r].held[held]]
        node.summed[r] = shared
    out = [NodeHotSet(node.link(r)).gradient(grads[r], plans[r]) for r in range(2)]
    by_vertex = {}
    for r in range(2):
        for v, g in zip(sets[r].tolist(), grads[r]):
            by_vertex[v] = by_vertex.get(v, 0) + g
    for r in range(2):  # each computed row's gradient: the sum over the ranks holding its vertex
        for v, g in zip(sets[r][plans[r].computed].tolist(), out[r]):
            assert torch.equal(g, by_vertex[v])


def test_ranks_that_computed_from_different_versions_are_a_bug():
    sets = [np.array([1, 2]), np.array([2, 3])]
    plan = plan_exchange(sets, 0)
    with pytest.raises(RuntimeError, match="parameter versions"):
        NodeHotSet(Node(sets).link(0)).assemble(torch.zeros(plan.computed.shape[0], 2), plan, 2, version=6)


def test_rank_shares_weigh_an_uneven_last_batch_and_unlabelled_seeds():
    graph = generate(SyntheticSpec(nodes=400, degree=4, features=4, classes=3, noise=0.5, train=0.5))
    train = np.asarray(graph.train_idx)[:103]
    graph.train_idx = train
    shares = [NodeSeeds(graph, SamplingConfig([3], 10, 5, 1, rank=r, world=2)).rank_shares(1) for r in range(2)]
    assert np.allclose(shares[0][:-1], 1) and np.allclose(shares[1][:-1], 1)  # 20 seeds, 10 each
    assert shares[0][-1] == pytest.approx(2 * 2 / 3) and shares[1][-1] == pytest.approx(2 * 1 / 3)  # 3 seeds: 2 + 1
    # An unlabelled seed in rank 1's part of batch 0: its weight drops, rank 0's rises; they still add to 2.
    part = NodeSeeds(graph, SamplingConfig([3], 10, 5, 1, rank=1, world=2)).epoch(1)[0].seeds
    graph.labels = graph.labels.copy()
    graph.labels[part[0].item()] = -1
    weighed = [NodeSeeds(graph, SamplingConfig([3], 10, 5, 1, rank=r, world=2)).rank_shares(1)[0] for r in range(2)]
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
