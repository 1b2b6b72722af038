"""The typed device sampler against the host one: the same blocks, frontiers, edge ids and edge rows for the
same seeds and key, with torch ops and with Triton's kernels (through Triton's interpreter without a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.sampling.device_sampler import triton_available
from neutronorch.sampling.neighbor_sampler import batch_key, start_relabel, together
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler, hop_keys

CPU = torch.device("cpu")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(not triton_available(DEVICE), reason="Triton is not installed")


@pytest.fixture(scope="module")
def mag():
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=2).with_reverse()


@pytest.fixture(scope="module")
def weighted():
    """cites and rev_cites carry a weight per edge."""
    return synthetic_typed(nodes=2000, degree=6, features=8, seed=2, edge_weights=True).with_reverse()


def assert_same_block(x, y):
    assert (x.num_dst, x.num_src) == (y.num_dst, y.num_src)
    assert list(x.blocks) == list(y.blocks) and list(x.src_ids) == list(y.src_ids)
    for t in x.src_ids:
        assert x.src_ids[t].dtype == y.src_ids[t].dtype and torch.equal(x.src_ids[t], y.src_ids[t].cpu()), t
    for name in ("edge_ids", "edge_features"):
        u, v = getattr(x, name), getattr(y, name)
        assert list(u) == list(v) and all(u[r].dtype == v[r].dtype and torch.equal(u[r], v[r].cpu()) for r in u), name
    for relation, a in x.blocks.items():
        b = y.blocks[relation]
        assert (a.num_dst, a.num_src, b.src_ids) == (b.num_dst, b.num_src, None), relation
        for name in ("indptr", "indices", "src_degree"):
            u, v = getattr(a, name), getattr(b, name)
            assert (u is None) == (v is None), (relation, name)
            if u is not None:
                assert u.dtype == v.dtype and torch.equal(u, v.cpu()), (relation, name)


def assert_same(host, device):
    assert torch.equal(host.seeds, device.seeds.cpu())
    assert len(host.blocks) == len(device.blocks) == len(host.frontiers) - 1 == len(device.frontiers) - 1
    for a, b in zip(host.frontiers, device.frontiers):
        assert list(a) == list(b) and all(torch.equal(a[t], b[t].cpu()) for t in a)
    for a, b in zip(host.blocks, device.blocks):
        assert_same_block(a, b)


def pair(graph, fanouts, degrees=False, backend="torch", device=CPU, edge_ids=None):
    host = TypedNeighborSampler(graph, fanouts, degrees, edge_ids=edge_ids)
    device_ids = None if edge_ids is None else host.edge_ids
    return host, TypedDeviceSampler(graph, device, host.fanouts, degrees, device_ids, backend=backend)


FANOUTS = [
    [4, 3],
    {"writes": [2, 0], "cites": [-1, 3], "default": [3, 2]},  # none, all, and a relation drawing nothing
    [1, 6, 2],
]


@pytest.mark.parametrize("fanouts", FANOUTS, ids=["shared", "per-relation", "three-layers"])
@pytest.mark.parametrize("degrees", [False, True])
def test_the_device_sampler_draws_the_host_samplers_blocks(mag, fanouts, degrees):
    host, device = pair(mag, fanouts, degrees)
    rng = np.random.default_rng(0)
    for batch in range(4):
        seeds = rng.choice(np.asarray(mag.train_idx), 40, replace=False)
        key = batch_key(3, 1, batch)
        assert_same(host.sample(seeds, key), device.sample(torch.from_numpy(seeds), key))


def test_the_device_samplers_partial_calls_are_the_host_samplers(mag):
    """``sample_hops`` (the upper layers) and ``sample_bottom`` (given destinations, unordered, of several
    types), as NeutronOrch plans with them; a batch of one seed and one of none."""
    host, device = pair(mag, [4, 3])
    seeds = np.asarray(mag.train_idx[:30])
    assert_same(host.sample_hops(seeds, 7, 1), device.sample_hops(torch.from_numpy(seeds), 7, 1))
    destinations = {"author": np.array([40, 3, 17]), "paper": np.array([9, 2]), "field": np.array([5])}
    assert_same_block(host.sample_bottom(destinations, 7),
                      device.sample_bottom({t: torch.from_numpy(v) for t, v in destinations.items()}, 7))
    for few in (seeds[:1], seeds[:0]):
        assert_same(host.sample(few, 11), device.sample(torch.from_numpy(few), 11))


@needs_triton
@pytest.mark.parametrize("fanouts", FANOUTS[:2], ids=["shared", "per-relation"])
def test_the_triton_backend_draws_the_host_samplers_blocks(weighted, fanouts):
    """Edge ids of every relation too (the kernel's edge positions)."""
    host, device = pair(weighted, fanouts, degrees=True, backend="triton", device=DEVICE, edge_ids=True)
    assert device.backend == "TritonNeighborSampler"
    seeds = np.asarray(weighted.train_idx[:48])
    for batch in range(2):
        key = batch_key(0, 0, batch)
        assert_same(host.sample(seeds, key), device.sample(torch.from_numpy(seeds).to(DEVICE), key))


@pytest.mark.parametrize("edge_ids", [None, True], ids=["with-features", "every-relation"])
def test_the_device_sampler_records_the_host_samplers_edge_ids_and_rows(weighted, edge_ids):
    """Edge ids for the relations with edge features (or every relation), and those edges' rows."""
    host, device = pair(weighted, FANOUTS[1], edge_ids=edge_ids)
    seeds = np.asarray(weighted.train_idx[:40])
    sampled = device.sample(torch.from_numpy(seeds), 3)
    assert_same(host.sample(seeds, 3), sampled)
    recorded = set(sampled.blocks[-1].edge_ids)
    assert {r[1] for r in sampled.blocks[-1].edge_features} == {"cites", "rev_cites"} <= {r[1] for r in recorded}
    assert (len(recorded) > 2) == (edge_ids is True)
    destinations = {"paper": np.array([9, 2, 500]), "author": np.array([4])}
    assert_same_block(host.sample_bottom(destinations, 3),
                      device.sample_bottom({t: torch.from_numpy(v) for t, v in destinations.items()}, 3))


@pytest.mark.cuda
def test_the_device_sampler_on_cuda_draws_the_host_samplers_blocks(weighted):
    for backend in ("torch", "triton"):
        host, device = pair(weighted, FANOUTS[1], degrees=True, backend=backend, device=torch.device("cuda"),
                            edge_ids=True)
        seeds = np.asarray(weighted.train_idx[:64])
        assert_same(host.sample(seeds, 5), device.sample(torch.from_numpy(seeds).cuda(), 5))


@pytest.mark.parametrize("backend", ["torch", pytest.param("triton", marks=needs_triton)])
def test_a_hop_reads_the_device_once_for_its_draws_and_once_for_its_relabels(mag, backend, log_reads, monkeypatch):
    # Whatever the number of relations and types: every relation's edge count in one read, every type's
    # frontier size in another (on a GPU, two host synchronisations per hop).
    host, device = pair(mag, [4, 3], backend=backend, device=DEVICE)
    seeds = torch.from_numpy(np.asarray(mag.train_idx)[:50]).to(DEVICE)
    device.sample(seeds, 0)
    reads = log_reads()
    sample = device.sample(seeds, batch_key(5, 0, 1))
    monkeypatch.undo()
    assert reads == ["tolist"] * 4, reads
    assert_same(host.sample(seeds.cpu().numpy(), batch_key(5, 0, 1)), sample)


def test_grouped_draws_are_each_relations_own(mag):
    # The top hop drawn relation by relation (a read each) and relabelled type by type equals the grouped one.
    _, device = pair(mag, [4, 3])
    seeds = torch.from_numpy(np.asarray(mag.train_idx)[:60])
    key = batch_key(2, 3, 4)
    top = device.sample(seeds, key).blocks[-1]
    keys = hop_keys(key, 0, mag.relations)
    for src_type in top.src_ids:
        into = [r for r in mag.relations if r[2] == mag.target and r[0] == src_type]
        drawn = together([device._samplers[r].start_draw(seeds, 4, keys[r]) for r in into])
        start = seeds if src_type == mag.target else torch.empty(0, dtype=torch.int64)
        node_map = torch.empty(mag.num_nodes[src_type], dtype=torch.int64)
        sources = torch.cat([nbrs for _, nbrs in drawn])
        local, frontier = together([start_relabel(node_map, start, sources)])[0]
        assert torch.equal(top.src_ids[src_type], frontier)
        for r, (ptr, nbrs), part in zip(into, drawn, torch.split(local, [n.shape[0] for _, n in drawn])):
            assert torch.equal(top.blocks[r].indptr, ptr) and torch.equal(top.blocks[r].indices, part)
