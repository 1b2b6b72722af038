"""The device sampler: the Triton kernels against the torch sampler (through Triton's interpreter without a
GPU), the choice of implementation, and device mode trained with either."""

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.data.csc import edges_to_csc
from neutronorch.errors import ConfigError
from neutronorch.sampling.device_sampler import TritonNeighborSampler, make_device_sampler, triton_available
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key, layer_key

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
needs_triton = pytest.mark.skipif(not triton_available(DEVICE), reason="Triton is not installed")


def _graph(n=400, max_degree=40, seed=5, isolated=()):
    rng = np.random.default_rng(seed)
    degrees = rng.integers(0, max_degree, n)
    degrees[list(isolated)] = 0
    dst = np.repeat(np.arange(n), degrees)
    src = rng.integers(0, n, dst.shape[0])
    return edges_to_csc(src, dst, n, symmetric=False)


def _pair(indptr, indices, fanouts, degrees=False, index_dtype=torch.int64):
    ip = torch.from_numpy(indptr).to(DEVICE)
    ix = torch.from_numpy(indices).to(DEVICE, index_dtype)
    return TorchNeighborSampler(ip, ix, fanouts, degrees), TritonNeighborSampler(ip, ix, fanouts, degrees)


def _assert_same(a, b):
    assert len(a.blocks) == len(b.blocks)
    for x, y in zip(a.frontiers, b.frontiers):
        assert torch.equal(x, y)
    for x, y in zip(a.blocks, b.blocks):
        assert (x.num_dst, x.num_src) == (y.num_dst, y.num_src)
        assert torch.equal(x.indptr, y.indptr) and torch.equal(x.indices, y.indices)
        assert torch.equal(x.src_ids, y.src_ids)
        assert (x.src_degree is None) == (y.src_degree is None)
        if x.src_degree is not None:
            assert torch.equal(x.src_degree, y.src_degree)


@needs_triton
@pytest.mark.parametrize("fanouts, index_dtype, degrees", [([6, 3], torch.int64, False),
                                                           ([1, 16, 2], torch.int32, True),
                                                           ([40], torch.int64, False)])
def test_triton_sampler_equals_the_torch_sampler(fanouts, index_dtype, degrees):
    # Isolated seeds, rows below, at and above each fanout, int32 topology, degrees for symmetric GCN.
    indptr, indices = _graph(isolated=(0, 1, 2))
    torch_sampler, triton_sampler = _pair(indptr, indices, fanouts, degrees, index_dtype)
    rng = np.random.default_rng(1)
    for batch in range(3):
        seeds = torch.from_numpy(np.concatenate([[0, 1], rng.choice(np.arange(3, 400), 30, replace=False)]))
        key = batch_key(2, 0, batch)
        _assert_same(torch_sampler.sample(seeds.to(DEVICE), key), triton_sampler.sample(seeds.to(DEVICE), key))


@needs_triton
def test_triton_sample_hop_and_edge_cases():
    indptr, indices = _graph(isolated=(7,))
    torch_sampler, triton_sampler = _pair(indptr, indices, [4, 4])
    key = layer_key(batch_key(0, 1, 2), 1)
    dst = torch.tensor([7, 3, 99, 250], device=DEVICE)
    (ba, fa), (bb, fb) = torch_sampler.sample_hop(dst, 4, key), triton_sampler.sample_hop(dst, 4, key)
    assert torch.equal(fa, fb) and torch.equal(ba.indptr, bb.indptr) and torch.equal(ba.indices, bb.indices)
    # Only isolated seeds: no edges, the frontier is the seeds.
    sg = triton_sampler.sample(torch.tensor([7], device=DEVICE), key)
    assert all(b.num_edges == 0 for b in sg.blocks) and sg.input_nodes.tolist() == [7]
    # No seeds at all.
    sg = triton_sampler.sample(torch.empty(0, dtype=torch.int64, device=DEVICE), key)
    assert sg.input_nodes.numel() == 0 and all(b.num_dst == 0 for b in sg.blocks)
    # Every neighbour (fanout -1) has no bound per row: the torch sampler's hop.
    (ba, fa), (bb, fb) = torch_sampler.sample_hop(dst, -1, key), triton_sampler.sample_hop(dst, -1, key)
    assert torch.equal(fa, fb) and torch.equal(ba.indices, bb.indices)


@needs_triton
def test_triton_sampler_survives_the_map_running_out_of_generations():
    # The vertex -> code map is never cleared between hops; when its generations run out it is refilled.
    indptr, indices = _graph()
    torch_sampler, triton_sampler = _pair(indptr, indices, [5, 5])
    seeds = torch.arange(0, 400, 9, device=DEVICE)
    triton_sampler.sample(seeds, 1)
    triton_sampler._generation = triton_sampler._k.GEN_TOP - 3  # the next call needs a refill
    for key in (2, 3, 4):  # a refill, then two calls with stale codes of other generations in the map
        _assert_same(torch_sampler.sample(seeds, key), triton_sampler.sample(seeds, key))


def test_make_device_sampler_picks_and_refuses_clearly(monkeypatch):
    ip, ix = (torch.from_numpy(a) for a in _graph())
    assert type(make_device_sampler(ip, ix, [3], backend="torch")) is TorchNeighborSampler
    monkeypatch.delenv("NEUTRONORCH_DEVICE_SAMPLER", raising=False)
    # auto on host tensors: the torch sampler (Triton's interpreter is for tests, not for training).
    assert type(make_device_sampler(ip, ix, [3])) is TorchNeighborSampler
    with pytest.raises(ConfigError, match="`backend`='cub' is not one of auto, torch, triton"):
        make_device_sampler(ip, ix, [3], backend="cub")
    monkeypatch.setenv("NEUTRONORCH_DEVICE_SAMPLER", "fast")
    with pytest.raises(ConfigError, match="NEUTRONORCH_DEVICE_SAMPLER='fast' is not one of auto, torch, triton"):
        make_device_sampler(ip, ix, [3])
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ConfigError, match="(CUDA device|not installed).*Give torch or auto"):
        make_device_sampler(ip, ix, [3], backend="triton")


@needs_triton
def test_device_mode_trains_the_same_with_either_sampler(monkeypatch):
    cfg = dict(dataset="synthetic:nodes=1500,degree=8,features=8,classes=3", fanouts=[4, 3], hidden=16,
               batch_size=256, epochs=1, progress=False, mode="device", device=DEVICE.type, eval_every=0)
    runs, calls = {}, []
    launch = TritonNeighborSampler._launch
    monkeypatch.setattr(TritonNeighborSampler, "_launch", lambda self, *a: calls.append(1) or launch(self, *a))
    for backend in ("torch", "triton"):
        monkeypatch.setenv("NEUTRONORCH_DEVICE_SAMPLER", backend)
        runs[backend] = train(TrainConfig(**cfg))
    a, b = runs["torch"]["epochs"][-1], runs["triton"]["epochs"][-1]
    assert a["train_loss"] == b["train_loss"] and a["sampled_edges"] == b["sampled_edges"]
    assert len(calls) == a["batches"]  # every batch of the second run went through the Triton kernels


@pytest.mark.cuda
@needs_triton
def test_triton_sampler_reads_the_device_once_and_launches_few_kernels():
    # The targets of the GPU path: one host synchronisation and at most 40 launches per 3-hop mini-batch.
    indptr, indices = _graph(n=20000, max_degree=60)
    _, sampler = _pair(indptr, indices, [15, 10, 5])
    seeds = torch.randperm(20000, device="cuda")[:1024]
    sampler.sample(seeds, 0)  # compiles
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning) as caught:
            sampler.sample(seeds, 1)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert len([w for w in caught if "synchroniz" in str(w.message)]) == 1
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        sampler.sample(seeds, 2)
    launches = sum(e.count for e in prof.key_averages() if "LaunchKernel" in e.key or e.key == "cuLaunchKernel")
    assert 0 < launches <= 40, launches


@needs_triton
def test_triton_sampler_reads_sizes_from_the_device_once_per_call(log_reads, monkeypatch):
    # What makes one host synchronisation per mini-batch on a GPU, checked on any device: the only reads of
    # a tensor's values into Python are one ``tolist`` per call (every hop's sizes at once).
    indptr, indices = _graph()
    _, sampler = _pair(indptr, indices, [6, 4, 2])
    seeds = torch.arange(0, 400, 11, device=DEVICE)
    sampler.sample(seeds, 0)
    reads = log_reads()
    sampler.sample(seeds, 1)
    sampler.sample_hop(seeds, 3, 2)
    many = sampler.sample_many([seeds, seeds[:5], seeds[3:]], [4, 5, 6])  # several mini-batches, one read
    monkeypatch.undo()
    assert reads == ["tolist", "tolist", "tolist"], reads
    torch_sampler = TorchNeighborSampler(sampler.indptr, sampler.indices, [6, 4, 2])
    for sg, s, key in zip(many, [seeds, seeds[:5], seeds[3:]], [4, 5, 6]):
        _assert_same(torch_sampler.sample(s, key), sg)
