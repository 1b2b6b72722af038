"""``FrontierMap`` (a frontier-sized vertex map) relabels as the whole graph's vertex map does, bit for bit."""

import numpy as np
import pytest

from neutronorch.sampling.frontier_map import DenseMap, FrontierMap
from neutronorch.sampling.neighbor_sampler import relabel_into


@pytest.mark.parametrize("num_nodes", [50, 5000, 2_000_000])
def test_the_frontier_map_gives_the_dense_maps_positions_hop_after_hop(num_nodes):
    rng = np.random.default_rng(num_nodes)
    hashed, dense, whole = FrontierMap(), DenseMap(num_nodes), np.full(num_nodes, -1, np.int64)
    largest = 0
    for sample in range(4):  # the map is emptied and reused, a larger frontier growing its table
        seeds = rng.choice(num_nodes, size=min(num_nodes, 3 + 40 * sample), replace=False).astype(np.int64)
        for m in (hashed, dense):
            m.start(seeds)
        whole[seeds] = np.arange(seeds.shape[0])
        a = b = c = seeds
        for hop in range(3):
            parts = [rng.integers(0, num_nodes, size=int(rng.integers(0, 3000))) for _ in range(1 + hop % 2)]
            local_a, a = hashed.relabel(a, parts)
            local_b, b = dense.relabel(b, parts)
            local_c, c = relabel_into(c, parts, whole)
            assert np.array_equal(a, c) and np.array_equal(b, c)
            for x, y, z in zip(local_a, local_b, local_c):
                assert np.array_equal(x, z) and np.array_equal(y, z)
            assert np.array_equal(c[np.concatenate(local_c)], np.concatenate(parts))
        largest = max(largest, c.shape[0])
        hashed.clear()
        dense.clear(b)
        whole[c] = -1
    assert (dense.node_map == -1).all() and (hashed._table == -1).all()
    # Sized to the frontier, not the graph: at most 4 slots of 4 bytes per vertex of the largest frontier.
    assert hashed._table.nbytes <= 16 * max(256, largest)


def test_a_map_emptied_after_a_hop_that_failed_half_way_holds_nothing():
    """``clear`` empties what the map holds, whatever frontier its caller last saw."""
    m = FrontierMap()
    m.start(np.array([5, 9], np.int64))
    (local,), frontier = m.relabel(np.array([5, 9], np.int64), [np.array([9, 7, 7, 5, 3])])
    assert local.tolist() == [1, 2, 2, 0, 3] and frontier.tolist() == [5, 9, 7, 3]
    m.clear()  # the caller never saw ``frontier``
    assert (m._table == -1).all()
    m.start(np.array([3], np.int64))
    (local,), frontier = m.relabel(np.array([3], np.int64), [np.array([7, 3])])
    assert local.tolist() == [1, 0] and frontier.tolist() == [3, 7]
