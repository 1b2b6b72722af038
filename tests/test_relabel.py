"""The relabel on every thread (``relabel_kernels.relabel_parallel``) gives the walk's result bit for bit, and a
sampler that takes it draws the same blocks; so does the hop that draws and relabels at once."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.jit import read_only
from neutronorch.sampling import kernels, relabel_kernels
from neutronorch.sampling.hop_pipeline import draw_and_relabel, segments_for
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.relabel_kernels import RelabelScratch, range_shift, relabel_parallel
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

CHUNK = relabel_kernels.CHUNK


def walk_and_parallel(num_nodes: int, frontier: np.ndarray, nbrs: np.ndarray, shift: int):
    """(local ids, frontier, vertex map) from ``kernels.relabel`` and from ``relabel_parallel``."""
    results = []
    for parallel in (False, True):
        node_map = np.full(num_nodes, -1, np.int64)
        kernels.map_nodes(frontier, node_map)
        grown = np.full(frontier.shape[0] + nbrs.shape[0], -7, np.int64)
        grown[:frontier.shape[0]] = frontier
        if parallel:
            scratch = np.full(3 * nbrs.shape[0], 123, np.int64)  # stale values must not leak
            local, size = relabel_parallel(grown, frontier.shape[0], nbrs, node_map, shift, scratch)
        else:
            local, size = kernels.relabel(grown, frontier.shape[0], nbrs, node_map)
        results.append((local, grown[:size], node_map))
    return results


@pytest.mark.parametrize("m", [0, 1, CHUNK - 1, CHUNK + 5, 3 * CHUNK + 7])
@pytest.mark.parametrize("shift", [0, 3, 20])
def test_parallel_relabel_equals_the_walk(m, shift):
    rng = np.random.default_rng(m + shift)
    num_nodes = 5000
    frontier = rng.choice(num_nodes, 700, replace=False)
    # repeats of frontier vertices, of new ones, a few hubs met many times, ids at both ends of the range
    nbrs = np.concatenate([rng.integers(0, num_nodes, m), rng.integers(0, 8, m // 4),
                           [0, num_nodes - 1] * min(m, 2)])[:m].astype(np.int64)
    rng.shuffle(nbrs)
    (walk_local, walk_frontier, walk_map), (par_local, par_frontier, par_map) = walk_and_parallel(
        num_nodes, frontier, nbrs, shift)
    np.testing.assert_array_equal(par_local, walk_local)
    np.testing.assert_array_equal(par_frontier, walk_frontier)
    np.testing.assert_array_equal(par_map, walk_map)


def test_range_shift_keeps_ranges_few_and_small():
    assert range_shift(10) == 15  # one range
    assert (10**9 >> range_shift(10**9)) < 4096
    assert range_shift(10**6) == 15  # 256 KiB of int64 entries per range


def graph(n=4000, seed=3):
    rng = np.random.default_rng(seed)
    degrees = rng.integers(0, 40, n)
    dst = np.repeat(np.arange(n), degrees)
    return edges_to_csc(rng.integers(0, n, dst.shape[0]), dst, n, symmetric=False)


def samples(indptr, indices, batches):
    sampler = NeighborSampler(indptr, indices, [15, 10, 5])
    return [sampler.sample(seeds, batch_key(0, 0, i)) for i, seeds in enumerate(batches)]


def same_subgraphs(a, b) -> bool:
    return all(torch.equal(x, y) for sa, sb in zip(a, b) for x, y in zip(sa.frontiers, sb.frontiers)) and all(
        torch.equal(x.indices, y.indices) and torch.equal(x.indptr, y.indptr)
        for sa, sb in zip(a, b) for x, y in zip(sa.blocks, sb.blocks))


def test_a_sampler_relabelling_on_every_thread_draws_the_same_blocks(monkeypatch):
    indptr, indices = graph()
    batches = [np.random.default_rng(i).choice(4000, 300, replace=False) for i in range(3)]
    walked = samples(indptr, indices, batches)
    monkeypatch.setattr(relabel_kernels, "PARALLEL_FROM_THREADS", 1)
    monkeypatch.setattr(relabel_kernels, "PARALLEL_FROM_IDS", 0)
    for threads in sorted({1, numba.config.NUMBA_NUM_THREADS}):
        numba.set_num_threads(threads)
        try:
            assert same_subgraphs(samples(indptr, indices, batches), walked), threads
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def test_a_typed_sampler_relabelling_on_every_thread_draws_the_same_blocks(monkeypatch):
    typed = synthetic_typed(nodes=3000, degree=8, features=8, seed=1).with_reverse()
    seeds = np.arange(0, 600, 2)
    walked = TypedNeighborSampler(typed, [10, 5]).sample(seeds, 5)
    monkeypatch.setattr(relabel_kernels, "PARALLEL_FROM_THREADS", 1)
    monkeypatch.setattr(relabel_kernels, "PARALLEL_FROM_IDS", 0)
    parallel = TypedNeighborSampler(typed, [10, 5]).sample(seeds, 5)
    for a, b in zip(walked.frontiers, parallel.frontiers):
        assert a.keys() == b.keys() and all(torch.equal(a[t], b[t]) for t in a)
    for a, b in zip(walked.blocks, parallel.blocks):
        for relation, block in a.blocks.items():
            assert torch.equal(block.indices, b.blocks[relation].indices)


def test_scratch_grows_and_is_reused():
    scratch = RelabelScratch(1000)
    first = scratch.take(100)
    assert first.shape == (100,) and np.shares_memory(first, scratch.take(50))
    assert scratch.take(1000).shape == (1000,)


@pytest.mark.parametrize("workers", [1, 2, 3, 5])
def test_pipelined_hop_equals_draws_then_walk(workers):
    """``draw_and_relabel`` with any number of workers and segments: the draws and relabel of
    ``sample_neighbors`` then ``relabel`` (workers beyond numba's threads run one after another)."""
    indptr, indices = map(read_only, graph(n=6000, seed=workers))  # as the samplers pass them
    rng = np.random.default_rng(workers)
    node_map = np.full(6000, -1, np.int64)
    for trial in range(6):
        frontier = rng.choice(6000, int(rng.integers(1, 2500)), replace=False)
        fanout, key = int(rng.integers(1, 20)), np.uint64(rng.integers(0, 2**62))
        kernels.map_nodes(frontier, node_map)
        ptr, nbrs = kernels.sample_neighbors(indptr, indices, frontier, fanout, key, kernels.NO_ORDER)
        walked = np.empty(frontier.shape[0] + nbrs.shape[0], np.int64)
        walked[:frontier.shape[0]] = frontier
        local, size = kernels.relabel(walked, frontier.shape[0], nbrs, node_map)
        walked_map = node_map.copy()
        kernels.reset_map(walked[:size], node_map)
        kernels.map_nodes(frontier, node_map)
        grown = np.full(frontier.shape[0] + ptr[-1], -7, np.int64)
        grown[:frontier.shape[0]] = frontier
        segments = [1, 7, segments_for(frontier.shape[0], int(ptr[-1]), workers)][trial % 3]
        piped, piped_size = draw_and_relabel(indptr, indices, grown, frontier.shape[0], key, ptr, node_map,
                                             min(segments, frontier.shape[0]), workers)
        assert piped_size == size
        np.testing.assert_array_equal(piped, local)
        np.testing.assert_array_equal(grown[:size], walked[:size])
        np.testing.assert_array_equal(node_map, walked_map)
        kernels.reset_map(grown[:size], node_map)
