"""The sampling contract, for the numba sampler and the vectorised torch sampler alike.

The ``_check_*`` helpers take a device; ``test_cuda_sampler.py`` runs them on CUDA.
"""

import math
from collections import Counter

import numpy as np
import pytest
import torch

from neutronorch.data.csc import edges_to_csc
from neutronorch.errors import ConfigError
from neutronorch.sampling.device_sampler import TritonNeighborSampler, triton_available
from neutronorch.sampling.fanouts import parse_fanouts
from neutronorch.sampling.neighbor_sampler import (NeighborSampler, TorchNeighborSampler, batch_key,
                                                   layer_key, mix_key)

# The Triton sampler where Triton is installed: on a GPU, or through its interpreter (conftest.py).
TRITON = triton_available(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
SAMPLERS = ["numba", "torch"] + (["triton"] if TRITON else [])
needs_triton = pytest.mark.skipif(not TRITON, reason="Triton is not installed")


def make_sampler(kind, indptr, indices, fanouts, device="cpu"):
    if kind == "numba":
        return NeighborSampler(indptr, indices, fanouts)
    cls = TritonNeighborSampler if kind == "triton" else TorchNeighborSampler
    return cls(torch.from_numpy(indptr).to(device), torch.from_numpy(indices).to(device), fanouts)


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


def test_topology_read_in_file_order_samples_the_same_blocks(small_csc):
    # Visiting a hop's vertices region by region of the adjacency (memory-mapped topology that does not
    # fit) changes the reads only: every block, frontier and sampled hop is the same.
    indptr, indices = small_csc
    seeds = np.random.default_rng(3).permutation(300)[:90]
    plain = NeighborSampler(indptr, indices, [6, 4, 3], degrees=True)
    ordered = NeighborSampler(indptr, indices, [6, 4, 3], degrees=True, file_order=True)
    ordered.vertices_per_region = 5  # many small regions
    a, b = plain.sample(seeds, 17), ordered.sample(seeds, 17)
    assert all(torch.equal(x, y) for x, y in zip(a.frontiers, b.frontiers))
    for x, y in zip(a.blocks, b.blocks):
        assert torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
    block_a, frontier_a = plain.sample_hop(seeds, 4, 23)
    block_b, frontier_b = ordered.sample_hop(seeds, 4, 23)
    assert np.array_equal(frontier_a, frontier_b) and torch.equal(block_a.indices, block_b.indices)


def _star(degree):
    """Vertex 0 with in-neighbours 1..degree."""
    indptr = np.zeros(degree + 2, dtype=np.int64)
    indptr[1:] = degree
    indptr[0] = 0
    indices = np.arange(1, degree + 1, dtype=np.int32)
    return indptr, indices


# Not the Triton sampler: thousands of draws are slow in its interpreter, and it draws exactly the torch
# sampler's neighbours (test_triton_sampler_draws_the_numba_samplers_neighbours).
@pytest.mark.parametrize("kind", ["numba", "torch"])
@pytest.mark.parametrize("degree,fanout", [(10, 3), (50, 4)])  # near and far above the fanout
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


# Two-sample comparison of the samplers. Over `trials` samples each, count per (destination v, in-neighbour u)
# the samples in which u is among v's sampled neighbours (each pair once per sample, so a sampler drawing with
# replacement shows fewer inclusions, strongly so for degrees just above the fanout). Without replacement,
# the inclusion indicators of a row of degree d > k = fanout have variance p(1-p), p = k/d, and covariance
# -p(1-p)/(d-1); the difference a - b of the two samplers' counts of a row then has covariance
# 2 T p(1-p) d/(d-1) (I - J/d), so S_row = (d-1)/d * sum_u (a_u - b_u)^2 / (2 T p(1-p)) is asymptotically
# chi-square with d-1 degrees of freedom, rows are independent, and S = sum of S_row is chi-square with
# sum(d-1) dof. The test rejects above the chi-square quantile at 1 - 1e-6 (Wilson-Hilferty with z = 4.753,
# accurate to well under 1% at these ~1000-2000 dof); with T = 300 the smallest expected count T p is 30,
# so the normal approximation behind it holds. The omnibus chi-square spreads its power over every cell, so
# a mild preference for low (or high) CSC offsets is also tested directly: with c_u = (offset_u - (d-1)/2)/d
# (summing to 0 over a row), L = sum_rows sum_u c_u (a_u - b_u) has mean 0 and variance
# sum_rows 2 T p(1-p) d/(d-1) sum_u c_u^2, and |L| / sd(L) is rejected above 5 (two-sided p = 5.7e-7).
# Rows with d <= k must include every neighbour every time.
TWO_SAMPLE_TRIALS = 300
CHI2_Z = 4.753  # standard normal upper quantile at 1e-6
MEAN_Z = 5.0  # two-sided p = 5.7e-7 per compared mean


def _chi2_quantile(dof, z=CHI2_Z):
    h = 2.0 / (9.0 * dof)
    return dof * (1.0 - h + z * math.sqrt(h)) ** 3


def _pair_inclusions(block, src, num_nodes):
    """Indicator (flattened [num_nodes, num_nodes], v * num_nodes + u) of the (destination, neighbour) pairs
    of one block; repeated pairs count once."""
    indptr = block.indptr.cpu().numpy()
    src = src.cpu().numpy() if isinstance(src, torch.Tensor) else src
    rows = np.repeat(src[:block.num_dst], np.diff(indptr))
    cells = np.unique(rows * num_nodes + src[block.indices.cpu().numpy()])
    return np.bincount(cells, minlength=num_nodes * num_nodes)


def _assert_same_inclusions(a, b, indptr, indices, dst, fanout, trials):
    n = indptr.shape[0] - 1
    edge_cells = np.repeat(np.arange(n), np.diff(indptr)) * n + indices
    a_rows, b_rows = a.reshape(n, n), b.reshape(n, n)
    for counts in (a, b):
        assert counts.sum() == counts[edge_cells].sum(), "sampled a pair that is not an edge"
    stat, dof, trend, trend_var = 0.0, 0, 0.0, 0.0
    for v in np.asarray(dst):
        nbrs = indices[indptr[v]:indptr[v + 1]]
        d = nbrs.shape[0]
        if d <= fanout:
            assert (a_rows[v, nbrs] == trials).all() and (b_rows[v, nbrs] == trials).all(), \
                f"vertex {v} (degree {d} <= fanout {fanout}) must take every neighbour"
            continue
        p = fanout / d
        var = 2 * trials * p * (1 - p) * d / (d - 1)  # variance of one a_u - b_u
        diff = a_rows[v, nbrs].astype(np.float64) - b_rows[v, nbrs]
        stat += float((diff ** 2).sum()) / var
        dof += d - 1
        c = (np.arange(d) - (d - 1) / 2) / d
        trend += float((c * diff).sum())
        trend_var += var * float((c ** 2).sum())
    assert dof > 0
    limit = _chi2_quantile(dof)
    assert stat < limit, f"inclusion frequencies differ between the samplers: chi2={stat:.0f} on {dof} dof " \
                         f"(limit {limit:.0f} at 1e-6)"
    z = trend / math.sqrt(trend_var)
    assert abs(z) < MEAN_Z, f"the samplers prefer different CSC offsets: trend z={z:.1f} (numba minus torch)"


def _assert_same_mean(x, y, what):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    se = math.sqrt(x.var(ddof=1) / x.shape[0] + y.var(ddof=1) / y.shape[0])
    assert se > 0, f"{what}: no variation to compare"
    assert abs(x.mean() - y.mean()) < MEAN_Z * se, \
        f"{what}: mean {x.mean():.2f} vs {y.mean():.2f} (standard error {se:.2f})"


def _seed_set(indptr, fanout):
    seeds = np.arange(0, indptr.shape[0] - 1, 5)
    deg = np.diff(indptr)[seeds]
    # The set needs rows just above the fanout (where drawing with replacement shows most), rows far above
    # it and rows taking everything.
    assert ((deg > fanout) & (deg <= 2 * fanout)).sum() >= 2
    assert (deg > 4 * fanout).sum() >= 5 and (deg <= fanout).sum() >= 3
    return seeds


def _check_samplers_agree_in_distribution(small_csc, device):
    indptr, indices = small_csc
    n = indptr.shape[0] - 1
    fanouts = [6, 3]
    seeds = _seed_set(indptr, fanouts[0])
    host = NeighborSampler(indptr, indices, fanouts)
    vec = make_sampler("torch", indptr, indices, fanouts, device)
    seeds_t = torch.from_numpy(seeds).to(device)
    counts = {"numba": 0, "torch": 0}
    sizes = {"numba": [], "torch": []}
    for t in range(TWO_SAMPLE_TRIALS):
        key = batch_key(11, 0, t)
        for kind, sg in (("numba", host.sample(seeds, key)), ("torch", vec.sample(seeds_t, key))):
            # The first (seed) hop is the last block; its source frontier is frontiers[-2].
            counts[kind] = counts[kind] + _pair_inclusions(sg.blocks[-1], sg.frontiers[-2], n)
            sizes[kind].append([f.shape[0] for f in sg.frontiers[:-1]])
    _assert_same_inclusions(counts["numba"], counts["torch"], indptr, indices, seeds, fanouts[0],
                            TWO_SAMPLE_TRIALS)
    for hop in range(len(fanouts)):
        # frontiers[-2 - hop] is the source frontier of hop `hop` (seed hop 0).
        column = len(fanouts) - 1 - hop
        _assert_same_mean([s[column] for s in sizes["numba"]], [s[column] for s in sizes["torch"]],
                          f"frontier size after hop {hop}")


def test_samplers_agree_in_distribution(small_csc):
    _check_samplers_agree_in_distribution(small_csc, "cpu")


def _check_hop(block, dst, frontier, indptr, indices, expected_degrees):
    """The one-hop contract on host copies: dst lead the frontier, the in-degrees are `expected_degrees`,
    each row's neighbours are distinct real in-neighbours, and the new vertices are exactly the sampled
    ones outside dst, in first-appearance order."""
    n = indptr.shape[0] - 1
    dst = dst.cpu().numpy()
    frontier = frontier.cpu().numpy()
    ptr, local = block.indptr.cpu().numpy(), block.indices.cpu().numpy()
    assert block.num_dst == dst.shape[0] and block.num_src == frontier.shape[0]
    assert np.array_equal(frontier[:dst.shape[0]], dst), "destinations must lead the frontier"
    assert np.unique(frontier).shape[0] == frontier.shape[0], "frontier holds duplicates"
    assert np.array_equal(np.diff(ptr), expected_degrees), "in-degrees differ from the expected ones"
    nbrs = frontier[local]
    cells = np.repeat(dst, np.diff(ptr)) * n + nbrs
    edge_cells = np.repeat(np.arange(n), np.diff(indptr)) * n + indices
    assert np.isin(cells, edge_cells).all(), "sampled a non-neighbour"
    assert np.unique(cells).shape[0] == cells.shape[0], "a row holds a neighbour twice"
    new = nbrs[~np.isin(nbrs, dst)]
    _, first = np.unique(new, return_index=True)
    assert np.array_equal(frontier[dst.shape[0]:], new[np.sort(first)]), \
        "new vertices not in first-appearance order"


def _check_sample_hop(small_csc, device):
    indptr, indices = small_csc
    n = indptr.shape[0] - 1
    fanout = 5
    # Every vertex (degrees 0 to 57: all-neighbour rows, rows near and far above the fanout), shuffled: the frontier must keep
    # dst's order.
    dst = np.random.default_rng(1).permutation(n)
    deg = np.diff(indptr)[dst]
    host = NeighborSampler(indptr, indices, [fanout])
    vec = make_sampler("torch", indptr, indices, [fanout], device)
    dst_t = torch.from_numpy(dst).to(device)
    counts = {"numba": 0, "torch": 0}
    for t in range(TWO_SAMPLE_TRIALS):
        key = layer_key(batch_key(12, 0, t), 0)
        block, frontier = vec.sample_hop(dst_t, fanout, key)
        assert frontier.dtype == torch.int64 and frontier.device == dst_t.device
        assert block.indptr.device == dst_t.device and block.indices.device == dst_t.device
        if t < 20:
            _check_hop(block, dst_t, frontier, indptr, indices, np.minimum(deg, fanout))
        counts["torch"] = counts["torch"] + _pair_inclusions(block, frontier, n)
        block, frontier = host.sample_hop(dst, fanout, key)
        counts["numba"] = counts["numba"] + _pair_inclusions(block, frontier, n)
    _assert_same_inclusions(counts["numba"], counts["torch"], indptr, indices, dst, fanout, TWO_SAMPLE_TRIALS)
    again, frontier = vec.sample_hop(dst_t, fanout, layer_key(batch_key(12, 0, 0), 0))
    first, first_frontier = vec.sample_hop(dst_t, fanout, layer_key(batch_key(12, 0, 0), 0))
    assert torch.equal(frontier, first_frontier) and torch.equal(again.indices, first.indices)


def test_torch_sample_hop_follows_the_contract_and_matches_numba(small_csc):
    _check_sample_hop(small_csc, "cpu")


def _check_samplers_draw_the_same(device, kind="torch"):
    """The torch (or Triton) sampler draws exactly the numba sampler's neighbours for a key: whole samples
    (every hop's frontier and block) and single hops, over rows of degree below, at and far above the
    fanout."""
    rng = np.random.default_rng(11)
    n = 2000
    degrees = rng.integers(0, 400, n)
    dst = np.repeat(np.arange(n), degrees)
    src = rng.integers(0, n, dst.shape[0])
    indptr, indices = edges_to_csc(src, dst, n, symmetric=False)
    fanouts = [10, 5, 25]
    host = make_sampler("numba", indptr, indices, fanouts)
    vec = make_sampler(kind, indptr, indices, fanouts, device)
    # Fewer batches and hop rows through Triton's interpreter (slow); all of them on a device.
    interpreted = kind != "torch" and device == "cpu"
    for batch in range(2 if interpreted else 12):
        seeds = rng.choice(n, 64, replace=False)
        key = batch_key(5, 2, batch)
        a, b = sample(host, seeds, key), sample(vec, torch.from_numpy(seeds).to(device), key)
        for fa, fb in zip(a.frontiers, b.frontiers):
            assert np.array_equal(np.asarray(fa), torch.as_tensor(fb).cpu().numpy())
        for ba, bb in zip(a.blocks, b.blocks):
            assert np.array_equal(np.asarray(ba.indptr), bb.indptr.cpu().numpy())
            assert np.array_equal(np.asarray(ba.indices), bb.indices.cpu().numpy())
    every = np.random.default_rng(3).permutation(n)[:500 if interpreted else n]  # degrees 0 to 400 either way
    for fanout in (1, 7, 100):
        key = layer_key(batch_key(9, 0, fanout), 0)
        ha, fa = host.sample_hop(every, fanout, key)
        hb, fb = vec.sample_hop(torch.from_numpy(every).to(device), fanout, key)
        assert np.array_equal(fa, fb.cpu().numpy())
        assert np.array_equal(np.asarray(ha.indices), hb.indices.cpu().numpy())


def test_samplers_draw_the_same_neighbours_for_a_key():
    _check_samplers_draw_the_same("cpu")


@needs_triton
def test_triton_sampler_draws_the_numba_samplers_neighbours():
    _check_samplers_draw_the_same("cuda" if torch.cuda.is_available() else "cpu", "triton")


@pytest.mark.parametrize("kind", SAMPLERS)
def test_a_vertex_draws_the_same_neighbours_in_any_batch(kind, small_csc):
    # What lets data-parallel ranks that split a batch sample exactly what one process samples for it.
    indptr, indices = small_csc
    sampler = make_sampler(kind, indptr, indices, [4, 3])
    key = batch_key(3, 1, 7)

    def neighbours(seeds):
        block = sample(sampler, seeds, key).blocks[-1]  # the seed hop
        ids = block.src_ids.numpy() if isinstance(block.src_ids, torch.Tensor) else block.src_ids
        return {int(ids[i]): sorted(ids[block.indices[block.indptr[i]:block.indptr[i + 1]].numpy()].tolist())
                for i in range(block.num_dst)}

    whole = neighbours([5, 40, 77, 120, 299, 3])
    part = neighbours([120, 3, 77])
    assert all(part[v] == whole[v] for v in part)
    if kind != "numba":  # sample_hop with a hop's key reproduces that hop of sample
        block, frontier = sampler.sample_hop(torch.tensor([77, 120]), 4, layer_key(key, 0))
        got = {int(frontier[i]): sorted(frontier[block.indices[block.indptr[i]:block.indptr[i + 1]]].tolist())
               for i in range(2)}
        assert got == {77: whole[77], 120: whole[120]}


# Keys computed by the pure-Python key mixing the samplers used before ``mix_key`` called the numba
# ``splitmix_key`` (commit ddc17b1): the one definition must reproduce them, arguments taken modulo 2**64
# (negative ones such as epoch -1, and ones wider than 64 bits, included).
MIX_KEY_CASES = [
    (0, 0, 5197578548964807871),
    (1, 2, 7235116703822611636),
    (0, -1, 4922461756044938104),
    (-1, 0, 17896504823353187392),
    (-1, -1, 3314115673469747073),
    (7, -1, 16052364059188829447),
    (2**64 - 1, 2**64 - 1, 3314115673469747073),
    (2**63, 2**63 - 1, 5445495931352378111),
    (2**64, 0, 5197578548964807871),
    (0, 2**64, 5197578548964807871),
    (2**64 + 5, -(2**64) - 5, 15990013116080400592),
    (-(2**70), 3, 15474746157786732217),
    (2**100 + 17, -(2**90), 12853815525856324054),
    (123456789, 987654321, 15972841318695789165),
    (0x9E3779B97F4A7C15, 0x9E37, 17101269509021589746),
]
BATCH_KEY_CASES = [  # (seed, epoch, batch index, key)
    (0, 0, 0, 18026553637591259843),
    (0, -1, 0, 4985089119042904421),
    (1, 2, 3, 16465847740472734853),
    (-1, -1, 5, 18042875547015252069),
    (42, -1, 31, 14865463584921924796),
    (2**64 - 1, 0, 2**40, 7812063481587336588),
    (2**64 + 9, -3, -7, 610493687137665348),
    (-(2**65), 1000, 1, 12865329724079239406),
]
LAYER_KEY_CASES = [  # (key, hop, key)
    (0, 0, 15916886550466581944),
    (15973815936950743105, 0, 4184464057237412030),
    (2**64 - 1, 2, 14279539996514257902),
    (5, -1, 14534714757872152763),
    (5, -2, 9441308842891191896),
]


def test_keys_are_unchanged_python_ints():
    for a, b, want in MIX_KEY_CASES:
        got = mix_key(a, b)
        assert type(got) is int and got == want, (a, b)
    for seed, epoch, index, want in BATCH_KEY_CASES:
        got = batch_key(seed, epoch, index)
        assert type(got) is int and got == want, (seed, epoch, index)
    for key, hop, want in LAYER_KEY_CASES:
        got = layer_key(key, hop)
        assert type(got) is int and got == want, (key, hop)


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
