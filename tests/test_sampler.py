"""The sampling contract, for the numba sampler and the vectorised torch sampler alike."""

from collections import Counter

import numpy as np
import pytest
import torch

from neutronorch.errors import ConfigError
from neutronorch.sampling.neighbor_sampler import (NeighborSampler, TorchNeighborSampler, batch_key,
                                                   parse_fanouts)

SAMPLERS = ["numba", "torch"]


def make_sampler(kind, indptr, indices, fanouts):
    if kind == "numba":
        return NeighborSampler(indptr, indices, fanouts)
    return TorchNeighborSampler(torch.from_numpy(indptr), torch.from_numpy(indices), fanouts)


def sample(sampler, seeds, key, fanouts=None):
    seeds = np.asarray(seeds, dtype=np.int64)
    arg = seeds if isinstance(sampler, NeighborSampler) else torch.from_numpy(seeds)
    return sampler.sample(arg, key, fanouts)


@pytest.mark.parametrize("kind", SAMPLERS)
def test_blocks_follow_the_contract(kind, small_csc):
    indptr, indices = small_csc
    fanouts = [7, 4, 3]
    sampler = make_sampler(kind, indptr, indices, fanouts)
    seeds = np.random.default_rng(0).choice(300, 40, replace=False)
    sg = sample(sampler, seeds, batch_key(1, 2, 3))
    assert len(sg.blocks) == 3
    assert torch.equal(sg.frontiers[-1], torch.from_numpy(seeds))
    # Blocks run bottom layer first, so the seed hop (fanout 7) is the last block.
    for block, src_nodes, dst_nodes, fanout in zip(sg.blocks, sg.frontiers[:-1], sg.frontiers[1:],
                                                   reversed(fanouts)):
        assert block.num_dst == dst_nodes.shape[0] and block.num_src == src_nodes.shape[0]
        assert torch.equal(src_nodes[:block.num_dst], dst_nodes), "destinations must lead the frontier"
        assert len(set(src_nodes.tolist())) == src_nodes.shape[0], "frontier holds duplicates"
        used = torch.zeros(block.num_src, dtype=torch.bool)
        used[:block.num_dst] = True
        used[block.indices] = True
        assert bool(used.all()), "a frontier vertex is neither a destination nor sampled"
        for i in range(block.num_dst):
            v = int(dst_nodes[i])
            full = Counter(indices[indptr[v]:indptr[v + 1]].tolist())
            got = src_nodes[block.indices[block.indptr[i]:block.indptr[i + 1]]].tolist()
            assert len(got) == min(fanout, sum(full.values()))
            counts = Counter(got)
            assert all(counts[u] <= full[u] for u in counts), "sampled a non-neighbour or with replacement"


@pytest.mark.parametrize("kind", SAMPLERS)
def test_same_key_same_sample_and_new_key_new_sample(kind, small_csc):
    indptr, indices = small_csc
    sampler = make_sampler(kind, indptr, indices, [5, 5])
    seeds = np.arange(0, 300, 7)
    a = sample(sampler, seeds, batch_key(0, 0, 0))
    b = sample(sampler, seeds, batch_key(0, 0, 0))
    c = sample(sampler, seeds, batch_key(0, 0, 1))
    assert all(torch.equal(x, y) for x, y in zip(a.frontiers, b.frontiers))
    assert not all(torch.equal(x, y) for x, y in zip(a.frontiers, c.frontiers))


def test_numba_sample_does_not_depend_on_thread_count(small_csc):
    import numba

    indptr, indices = small_csc
    seeds = np.arange(0, 300, 3)
    results = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        results.append(NeighborSampler(indptr, indices, [6, 6]).sample(seeds, 99))
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert all(torch.equal(x, y) for x, y in zip(results[0].frontiers, results[1].frontiers))


def _star(degree):
    """Vertex 0 with in-neighbours 1..degree."""
    indptr = np.zeros(degree + 2, dtype=np.int64)
    indptr[1:] = degree
    indptr[0] = 0
    indices = np.arange(1, degree + 1, dtype=np.int32)
    return indptr, indices


@pytest.mark.parametrize("kind", SAMPLERS)
@pytest.mark.parametrize("degree,fanout", [(10, 3), (50, 4)])  # torch: random-key sort and redraw paths
def test_neighbours_are_uniform_without_replacement(kind, degree, fanout):
    indptr, indices = _star(degree)
    sampler = make_sampler(kind, indptr, indices, [fanout])
    trials = 4000
    single = Counter()
    pairs = Counter()
    for t in range(trials):
        sg = sample(sampler, [0], batch_key(5, 0, t))
        got = sorted(sg.frontiers[0][sg.blocks[0].indices].tolist())
        assert len(set(got)) == fanout
        single.update(got)
        pairs[(got[0], got[1])] += 1
    expected = trials * fanout / degree
    # Chi-square over the degree cells; 99.9% quantile for <= 49 dof is below 86.
    chi2 = sum((single[u] - expected) ** 2 / expected for u in range(1, degree + 1))
    assert chi2 < 86, f"inclusion counts far from uniform: chi2={chi2:.1f}"
    assert set(single) == set(range(1, degree + 1))


def test_all_neighbours_when_fanout_is_minus_one(small_csc):
    indptr, indices = small_csc
    sg = NeighborSampler(indptr, indices, [-1]).sample(np.array([5, 9]), 0)
    assert sg.blocks[0].num_edges == (indptr[6] - indptr[5]) + (indptr[10] - indptr[9])


@pytest.mark.parametrize("text", ["", "a,b", "15,0", "15,-3"])
def test_bad_fanouts_are_rejected_with_advice(text):
    with pytest.raises(ConfigError, match="fanout"):
        parse_fanouts(text)


def test_sampler_refuses_sharing_across_threads(small_csc):
    import threading

    indptr, indices = small_csc
    sampler = NeighborSampler(indptr, indices, [3])
    sampler.sample(np.array([1]), 0)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_try(sampler)))
    thread.start()
    thread.join()
    assert isinstance(errors[0], RuntimeError)


def _try(sampler):
    try:
        sampler.sample(np.array([2]), 0)
    except RuntimeError as exc:
        return exc
    return None
