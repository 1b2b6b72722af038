"""CUDA paths; skipped without a GPU. The same logic runs on CPU in the other test files."""

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.nn.activation import relu_dropout
from neutronorch.nn.aggregation import mean_aggregate, mean_aggregate_torch
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key

pytestmark = pytest.mark.cuda


def test_torch_sampler_on_cuda_matches_the_contract(small_csc):
    indptr, indices = small_csc
    sampler = TorchNeighborSampler(torch.from_numpy(indptr).cuda(), torch.from_numpy(indices).cuda(), [6, 3])
    seeds = torch.arange(0, 300, 9, device="cuda")
    sg = sampler.sample(seeds, batch_key(0, 0, 0))
    for block, src, dst in zip(sg.blocks, sg.frontiers[:-1], sg.frontiers[1:]):
        assert block.indptr.is_cuda and torch.equal(src[:block.num_dst], dst)
        degrees = torch.from_numpy(np.diff(indptr)).cuda()[dst]
        fanout = 3 if block is sg.blocks[0] else 6
        assert torch.equal(block.in_degrees(), degrees.clamp(max=fanout))


def test_keyed_dropout_and_sampling_on_cuda_equal_cpu(small_csc):
    # Data parallel relies on these draws depending on (key, vertex) only, on every device.
    from neutronorch.nn.activation import edge_ids, keyed_dropout
    ids = torch.cat([torch.randint(0, 2**40, (200,)), torch.randint(-2**62, 0, (50,))])
    y = torch.randn(250, 61)
    torch.manual_seed(3)
    on_cpu = relu_dropout(y.clone(), 0.4, True, ids)
    torch.manual_seed(3)
    torch.testing.assert_close(relu_dropout(y.cuda(), 0.4, True, ids.cuda()).cpu(), on_cpu)
    pairs = edge_ids(ids, ids.flip(0))
    torch.manual_seed(4)
    on_cpu = keyed_dropout(y.clone(), 0.3, True, pairs)
    torch.manual_seed(4)
    torch.testing.assert_close(keyed_dropout(y.cuda(), 0.3, True, pairs.cuda()).cpu(), on_cpu)
    indptr, indices = small_csc
    seeds, key = torch.arange(0, 300, 7), batch_key(1, 2, 3)
    samplers = [TorchNeighborSampler(torch.from_numpy(indptr).to(d), torch.from_numpy(indices).to(d), [5, 3])
                for d in ("cpu", "cuda")]
    a, b = (s.sample(seeds.to(s.device), key) for s in samplers)
    for x, z in zip(a.blocks, b.blocks):
        assert torch.equal(x.indices, z.indices.cpu()) and torch.equal(x.src_ids, z.src_ids.cpu())


def test_aggregation_and_activation_on_cuda_equal_cpu(small_csc):
    from neutronorch.sampling.neighbor_sampler import NeighborSampler

    indptr, indices = small_csc
    block = NeighborSampler(indptr, indices, [5]).sample(np.arange(0, 300, 4), 3).blocks[0]
    x = torch.randn(block.num_src, 16)
    torch.testing.assert_close(mean_aggregate(block.to("cuda"), x.cuda()).cpu(), mean_aggregate_torch(block, x))
    y = torch.randn(100, 32, device="cuda")
    out = relu_dropout(y, 0.5, training=True)
    assert out.is_cuda and bool(((out == 0) | (out == 2 * y.clamp(min=0))).all())


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "gcn", "gat"])
def test_exact_training_on_cuda(model, tmp_path):
    summary = train(TrainConfig(dataset="synthetic:nodes=4000,degree=10,features=16,classes=4,noise=0.6",
                                model=model, fanouts=[5, 5], hidden=32, batch_size=256, lr=0.01, dropout=0.5,
                                weight_decay=0.0, epochs=12 if model == "gat" else 4,
                                device="cuda", progress=False, summary_json=str(tmp_path / "s.json")))
    assert summary["device"].startswith("cuda")
    assert summary["epochs"][0]["stage_seconds"]["copy"] > 0
    assert summary["test_acc"] > 0.75


@pytest.mark.slow
@pytest.mark.parametrize("model,dropout", [("sage", 0.5), ("gcn", 0.5), ("gat", 0.0)])
def test_neutronorch_p1_s0_cpu_grad_equals_exact_mode_on_cuda(model, dropout):
    from test_neutronorch import config, lockstep

    from neutronorch.data import SyntheticSpec, generate

    graph = generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))
    exact = config(model=model, mode="exact", dropout=dropout)
    # The cold bottom hop sampled on the host (device sampling draws other, equally distributed, neighbours
    # with the torch sampler), so both modes draw exactly the same neighbours.
    orch = config(model=model, mode="neutronorch", dropout=dropout, super_batch=1, staleness_bound=0,
                  hot_grad="cpu", hot_ratio=0.3, device_sampling="off")
    hot_rows = 0
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch, torch.device("cuda")):
        assert batch_b.features.is_cuda
        hot_rows += int(batch_b.splice.index.hot_pos.numel())
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-4, atol=1e-5)
        for p_a, p_b in zip(model_a.parameters(), model_b.parameters()):
            torch.testing.assert_close(p_b.grad, p_a.grad, rtol=1e-3, atol=1e-5)
    assert hot_rows > 0


@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_neutronorch_planned_on_cuda_p1_s0_equals_exact_mode(model):
    # Device sampling: every hop sampled and each super-batch planned on the GPU (DevicePlanner), in the
    # cold sampler's thread; the torch sampler draws the numba sampler's neighbours, so the losses and
    # gradients are exact mode's.
    from test_neutronorch import config, lockstep

    from neutronorch.data import SyntheticSpec, generate

    graph = generate(SyntheticSpec(nodes=1500, degree=8, features=12, classes=4, noise=0.6))
    exact = config(model=model, mode="exact", dropout=0.5)
    orch = config(model=model, mode="neutronorch", dropout=0.5, super_batch=1, staleness_bound=0,
                  hot_grad="cpu", hot_ratio=0.3, device_sampling="on")
    hot_rows = 0
    for batch_a, batch_b, loss_a, loss_b, model_a, model_b in lockstep(graph, exact, orch, torch.device("cuda")):
        assert batch_b.splice.index.hot_pos.is_cuda and batch_b.subgraph.blocks[-1].indptr.is_cuda
        hot_rows += int(batch_b.splice.index.hot_pos.numel())
        torch.testing.assert_close(loss_b, loss_a, rtol=1e-4, atol=1e-5)
        for p_a, p_b in zip(model_a.parameters(), model_b.parameters()):
            torch.testing.assert_close(p_b.grad, p_a.grad, rtol=1e-3, atol=1e-5)
    assert hot_rows > 0


def test_the_device_planner_on_cuda_plans_what_the_host_planner_plans():
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.orchestration.neutronorch.device_planner import DevicePlanner
    from neutronorch.orchestration.neutronorch.planner import Planner
    from neutronorch.sampling.neighbor_sampler import NeighborSampler

    graph = generate(SyntheticSpec(nodes=3000, degree=10, features=4, classes=3))
    host_sampler = NeighborSampler(graph.indptr, graph.indices, [6, 4, 3])
    cuda_sampler = TorchNeighborSampler(torch.from_numpy(graph.indptr).cuda(), torch.from_numpy(graph.indices).cuda(),
                                        [6, 4, 3])
    seeds = [np.asarray(graph.train_idx[i * 40:(i + 1) * 40]) for i in range(4)]
    host = Planner(graph, 3).plan(0, 0, [(i, 9 + i, host_sampler.sample(s, 9 + i, [6, 4]))
                                               for i, s in enumerate(seeds)], ratio=0.4)
    cuda = DevicePlanner(graph, 3, cuda_sampler.indptr).plan(0, 0, [(i, 9 + i, cuda_sampler.sample(torch.from_numpy(s).cuda(),
                                                                                         9 + i, [6, 4]))
                                                            for i, s in enumerate(seeds)], ratio=0.4)
    assert np.array_equal(host.hot, cuda.hot) and vars(host.stats) == vars(cuda.stats)
    for a, b in zip(host.batches, cuda.batches):
        assert b.cold_pos.is_cuda and np.array_equal(a.cold_pos, b.cold_pos.cpu().numpy())
        assert np.array_equal(a.hot_rows, b.hot_rows.cpu().numpy())


@pytest.mark.slow
@pytest.mark.parametrize("hot_grad", ["cpu", "stop"])
def test_neutronorch_training_on_cuda(hot_grad):
    summary = train(TrainConfig(dataset="synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6",
                                mode="neutronorch", device="cuda", fanouts=[5, 5], hidden=32, batch_size=64,
                                epochs=3, lr=0.01, super_batch=4, hot_ratio=0.3, hot_grad=hot_grad,
                                progress=False))
    assert summary["device"].startswith("cuda")
    assert summary["staleness"]["max_observed"] <= summary["staleness"]["bound"]
    assert summary["hot"]["reuse_rate"] > 0 and summary["test_acc"] > 0.7


@pytest.mark.slow
def test_device_mode_on_cuda(tmp_path):
    summary = train(TrainConfig(dataset="synthetic:nodes=4000,degree=10,features=16,classes=4,noise=0.6",
                                mode="device", device="cuda", fanouts=[5, 5], hidden=32, batch_size=256,
                                epochs=4, lr=0.01, weight_decay=0.0, progress=False))
    assert summary["device"].startswith("cuda")
    assert summary["test_acc"] > 0.75
    assert summary["epochs"][-1]["stage_seconds"]["sample"] > 0


@pytest.mark.slow
def test_telemetry_on_cuda(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    summary = train(TrainConfig(dataset="synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6",
                                mode="neutronorch", device="cuda", fanouts=[5, 5], hidden=32, batch_size=64,
                                epochs=2, super_batch=4, hot_ratio=0.3, progress=False, eval_every=-1,
                                timeline=str(png), timeline_steps=8))
    epoch = summary["epochs"][-1]
    # Every feature row fits the device cache, so no row is copied; blocks and hot rows still are.
    assert epoch["moved"]["cache_hits"] == epoch["moved"]["feature_rows"] > 0
    assert epoch["moved"]["device_bytes"] > 0
    assert png.read_bytes().startswith(b"\x89PNG")
    # The cold bottom hop is sampled on the device by default (no copy lane); the host threads run ahead,
    # so their lanes may show in an earlier epoch only.
    assert {"sampler", "trainer"} <= set(epoch["lane_busy"])
    assert {"planner", "host"} <= {lane for e in summary["epochs"] for lane in e["lane_busy"]}


# ----- the CUDA data path: placement, cache, UVA, pinned buffers, overlap --------------------------------

SMALL_PLACEMENT = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"
ROWS_1000 = 1000 * 16 * 4 / 2**30  # --gpu-cache-gb holding the 1000 hottest of 3000 rows


def _placement_run(**overrides):
    values = dict(dataset=SMALL_PLACEMENT, fanouts=[5, 5], hidden=32, batch_size=128, epochs=2, lr=0.01,
                  dropout=0.0, weight_decay=0.0, progress=False, eval_every=0, device="cuda")
    values.update(overrides)
    return train(TrainConfig(**values))


def test_pinned_memory_and_uva_views_read_the_host_rows():
    from neutronorch.features.placement import pin, uva_view

    host = torch.randn(5000, 16)
    pinned, ok = pin(host, "features")
    assert ok and pinned.is_pinned()
    view = uva_view(pinned, torch.device("cuda"))
    assert view is not None and view.is_cuda
    rows = torch.randint(0, 5000, (2000,), device="cuda")
    assert torch.equal(view.index_select(0, rows).cpu(), host[rows.cpu()])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "device", "neutronorch"])
def test_a_partial_cache_on_cuda_serves_hits_and_learns(mode):
    extra = dict(super_batch=2, hot_ratio=0.3) if mode == "neutronorch" else {}
    full = _placement_run(mode=mode, epochs=4, eval_every=1, **extra)
    part = _placement_run(mode=mode, epochs=4, eval_every=1, gpu_cache_gb=ROWS_1000, **extra)
    assert full["placement"]["features"] == "device" and part["placement"]["features"] == "cache"
    assert part["placement"]["cache_rows"] == 1000
    assert 0.4 < part["moved"]["cache_hits"] / part["moved"]["feature_rows"] < 1.0
    assert part["moved"]["device_bytes"] > full["moved"]["device_bytes"] or mode == "neutronorch"
    assert part["test_acc"] > 0.8 and abs(part["test_acc"] - full["test_acc"]) < 0.05


@pytest.mark.slow
def test_exact_mode_cache_equals_plain_copies_on_cuda():
    """Same sampling, same rows: the cache changes only where rows come from (losses agree up to the
    nondeterministic order of CUDA's atomic sums)."""
    plain = _placement_run(mode="exact", gpu_cache_gb=0)
    cached = _placement_run(mode="exact", gpu_cache_gb=ROWS_1000)
    for a, b in zip(plain["epochs"], cached["epochs"]):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-3)
    assert plain["moved"]["cache_hits"] == 0 and cached["moved"]["cache_hits"] > 0


def test_topology_and_features_through_uva_under_a_small_budget():
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.features.placement import workspace_bytes
    from neutronorch.orchestration.factory import build_mode

    graph = generate(SyntheticSpec.parse(SMALL_PLACEMENT))
    # A budget 1000 bytes above the training workspace, the sampler's vertex map (8 bytes a vertex) and
    # the cache's slot map (4): neither the topology nor most rows fit.
    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, 32, graph.num_classes, [5, 5], 128)
    budget = workspace + 12 * graph.num_nodes + 1000
    cfg = TrainConfig(dataset="given", mode="device", fanouts=[5, 5], hidden=32, batch_size=128,
                      gpu_cache_gb=ROWS_1000, gpu_memory_gb=budget / 2**30).validate()
    mode = build_mode(cfg, graph, torch.device("cuda"))
    assert mode.placement.topology == "uva" and mode.placement.miss_path == "uva"
    assert mode.placement.cache_rows == 1000 // (4 * graph.feature_dim)
    with mode.batches(0) as batches:
        for batch in batches:
            batch.ready.synchronize()
            rows = batch.subgraph.input_nodes.cpu().numpy()
            assert torch.equal(batch.features.cpu(), torch.from_numpy(graph.features[rows]))
            assert torch.equal(batch.labels.cpu(), torch.from_numpy(graph.labels[batch.subgraph.seeds.cpu().numpy()]))


@pytest.mark.slow
def test_neutronorch_device_sampling_on_cuda_omits_hot_bottom_hops():
    summary = _placement_run(mode="neutronorch", device_sampling="auto", super_batch=2, hot_ratio=0.3,
                             epochs=4, eval_every=1)
    assert summary["placement"]["topology"] == "device"
    assert summary["hot"]["reuse_rate"] > 0.1 and summary["hot"]["bottom_edges_saved"] > 0
    assert summary["test_acc"] > 0.8


def test_copy_buffers_are_released_after_their_copy_event():
    from neutronorch.features.store import BufferPool

    pool = BufferPool(2, width=1024, pin=True)
    stream = torch.cuda.Stream()
    outs = []
    for i in range(6):
        buf = pool.acquire(4096)
        buf[:4096].fill_(float(i))
        with torch.cuda.stream(stream):
            outs.append(buf[:4096].to("cuda", non_blocking=True))
            done = torch.cuda.Event()
            done.record(stream)
        pool.release_after(buf, done)
    torch.cuda.synchronize()
    # Had a buffer been refilled before its copy finished, an earlier batch would hold a later value.
    assert [float(o[0, 0]) for o in outs] == [float(i) for i in range(6)]


@pytest.mark.parametrize("mode", ["exact", "device"])
def test_training_steps_do_not_synchronise_with_the_device(mode):
    """The trainer's hot path (prepare, forward, backward, step) makes no hidden host-device syncs. The
    sync check is process-wide, so the epoch's batches are produced first (producers sync on their own
    streams by design: sizes of sampled frontiers)."""

    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.nn.models import GNN
    from neutronorch.orchestration.factory import build_mode
    from neutronorch.train.step import train_step

    graph = generate(SyntheticSpec.parse(SMALL_PLACEMENT))
    cfg = TrainConfig(dataset="given", mode=mode, fanouts=[5, 5], hidden=32, batch_size=48, epochs=1,
                      prefetch=64).validate()  # 300 training seeds: 7 batches
    device = torch.device("cuda")
    model = GNN("sage", graph.feature_dim, 32, graph.num_classes, 2, dropout=0.5).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run = build_mode(cfg, graph, device)
    with run.batches(0) as batches:
        produced = list(batches)
    assert len(produced) > 3
    for i, batch in enumerate(produced):
        if i > 0:  # the first step initialises Adam's state
            torch.cuda.set_sync_debug_mode("error")
        try:
            train_step(model, opt, run, batch)
        finally:
            torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("device_sampling", ["on", "off"])
def test_neutronorch_training_steps_do_not_synchronise_with_the_device(device_sampling, monkeypatch):
    """NeutronOrch's spliced steps make no hidden host-device syncs on the trainer's thread. Its producers run
    alongside (their batches depend on the snapshots the steps publish) and sync on their own streams by
    design, so syncs are reported as warnings and only the trainer thread's count."""
    import threading
    import warnings

    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.nn.models import GNN
    from neutronorch.orchestration.factory import build_mode
    from neutronorch.train.step import train_step

    graph = generate(SyntheticSpec.parse(SMALL_PLACEMENT))
    cfg = TrainConfig(dataset="given", mode="neutronorch", fanouts=[5, 5], hidden=32, batch_size=48, epochs=1,
                      super_batch=2, hot_ratio=0.3, snapshot_lead=1, hot_grad="stop",
                      device_sampling=device_sampling).validate()
    device = torch.device("cuda")
    model = GNN("sage", graph.feature_dim, 32, graph.num_classes, 2, dropout=0.5).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    run = build_mode(cfg, graph, device)
    trainer = threading.current_thread()
    synced = []
    shown = warnings.showwarning

    def record(message, *args, **kwargs):
        if threading.current_thread() is trainer and "synchroniz" in str(message):
            synced.append(str(message))
        else:
            shown(message, *args, **kwargs)

    monkeypatch.setattr(warnings, "showwarning", record)
    run.start(model)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            for i, batch in enumerate(run.batches(0)):
                run.step_inputs(batch)  # waits for its hot rows (a wait on an event, not a sync) outside the check
                torch.cuda.set_sync_debug_mode("warn" if i > 0 else 0)  # the first step initialises Adam
                try:
                    train_step(model, opt, run, batch)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
    finally:
        run.close()
    assert not synced, synced


def test_gpu_utilisation_is_read_through_nvml():
    from neutronorch.observe.utilisation import GpuMonitor

    value = GpuMonitor(torch.device("cuda")).percent()
    assert value is not None and 0 <= value <= 100


def test_device_mode_without_uva_stages_feature_misses_and_refuses_unmappable_topology(monkeypatch):
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.errors import ConfigError
    from neutronorch.orchestration import device_reader
    from neutronorch.orchestration.factory import build_mode

    graph = generate(SyntheticSpec.parse(SMALL_PLACEMENT))
    monkeypatch.setattr(device_reader, "uva_view", lambda pinned, device: None)
    cfg = TrainConfig(dataset="given", mode="device", fanouts=[5, 5], hidden=32, batch_size=128,
                      gpu_cache_gb=ROWS_1000).validate()
    mode = build_mode(cfg, graph, torch.device("cuda"))
    assert mode.loader.misses[""][0] is None  # misses go through a host gather and a pinned copy
    with mode.batches(0) as batches:
        for batch in batches:
            batch.ready.synchronize()
            rows = batch.subgraph.input_nodes.cpu().numpy()
            assert torch.equal(batch.features.cpu(), torch.from_numpy(graph.features[rows]))
            assert 0 < batch.cache_hits < rows.shape[0] and batch.device_bytes > 0
    mode.close()
    from neutronorch.features.placement import workspace_bytes

    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, 32, graph.num_classes, [5, 5], 128)
    tight = TrainConfig(dataset="given", mode="device", fanouts=[5, 5], hidden=32, batch_size=128,
                        gpu_memory_gb=(workspace + 8 * graph.num_nodes + 1000) / 2**30).validate()
    with pytest.raises(ConfigError, match="topology.*cannot be read from pinned host memory"):
        build_mode(tight, graph, torch.device("cuda"))


def test_large_arrays_are_pinned_in_place_and_read_through_uva(monkeypatch):
    from neutronorch.features import placement

    monkeypatch.setattr(placement, "REGISTER_IN_PLACE", 0)
    host = torch.randn(10_000, 8)
    pinned, ok = placement.pin(host, "features")
    assert ok and pinned.data_ptr() == host.data_ptr() and host.is_pinned()  # the same pages, now locked
    view = placement.uva_view(pinned, torch.device("cuda"))
    assert view is not None and torch.equal(view[123].cpu(), host[123])
    placement.unpin(host)
    assert not host.is_pinned()


@pytest.mark.slow
def test_the_memory_budget_caps_the_allocator_for_the_run_only():
    total = torch.cuda.get_device_properties(0).total_memory
    summary = _placement_run(mode="device", gpu_memory_gb=2.0)
    assert summary["placement"]["budget"] == 2 * 2**30
    # Lifted afterwards: a tensor above the budget can be allocated again.
    big = torch.empty(int(min(3 * 2**30, 0.5 * total)) // 4, dtype=torch.float32, device="cuda")
    del big


def test_bfloat16_aggregation_on_cuda_sums_in_float32(small_csc):
    from neutronorch.sampling.neighbor_sampler import NeighborSampler

    indptr, indices = small_csc
    block = NeighborSampler(indptr, indices, [5]).sample(np.arange(0, 300, 4), 3).blocks[0]
    x = torch.randn(block.num_src, 16).to(torch.bfloat16)
    on_cuda = mean_aggregate(block.to("cuda"), x.cuda())
    assert on_cuda.dtype == torch.bfloat16
    torch.testing.assert_close(on_cuda.cpu().float(), mean_aggregate(block, x).float(), rtol=2 ** -7, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("mode,model", [("exact", "sage"), ("exact", "gat"), ("device", "gcn"),
                                        ("neutronorch", "sage")])
def test_bfloat16_training_on_cuda(mode, model):
    summary = train(TrainConfig(dataset="synthetic:nodes=4000,degree=10,features=16,classes=4,noise=0.6",
                                mode=mode, model=model, device="cuda", precision="bf16", fanouts=[5, 5],
                                hidden=32, batch_size=256, epochs=12 if model == "gat" else 4, lr=0.01,
                                weight_decay=0.0, dropout=0.5, progress=False))
    assert summary["precision"]["name"] == "bf16"
    assert summary["test_acc"] > 0.75
    # Rows travel as bfloat16: 2 bytes a value.
    moved = summary["epochs"][0]["moved"]
    assert moved["feature_bytes"] > 0 and moved["feature_bytes"] % (16 * 2) == 0
    if mode != "neutronorch":  # its batches carry the cold rows only
        assert moved["feature_bytes"] == moved["feature_rows"] * 16 * 2


def test_memory_maps_reach_the_device_in_slices_and_the_host_cache_feeds_the_device_cache(tmp_path, monkeypatch):
    # Topology and features memory-mapped from a native graph: placed on the GPU a slice at a time, and a
    # run with a host feature cache below a partial device cache trains as one without it.
    import json

    from neutronorch.cli import main
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.data.native import load_native, save_native
    from neutronorch.features import placement
    from neutronorch.features.cache import _rows_as
    from neutronorch.orchestration import device_reader

    directory = save_native(generate(SyntheticSpec(nodes=3000, degree=8, features=12, classes=4)), tmp_path / "g")
    graph = load_native(directory)
    monkeypatch.setattr(placement, "SLICE_BYTES", 4 * 1000)
    placed = device_reader.place(graph.indices, torch.device("cuda"), "topology")
    assert placed.is_cuda and torch.equal(placed.cpu(), torch.from_numpy(np.array(graph.indices)))
    table = _rows_as(graph.features, torch.bfloat16, torch.device("cuda"))
    assert table.is_cuda and torch.equal(table.cpu(), torch.from_numpy(np.array(graph.features)).to(torch.bfloat16))
    runs = []
    for size in ("0", str(800 * 12 * 4 / 2**30)):
        out = tmp_path / f"{size}.json"
        assert main(["train", "--dataset", str(directory), "--mode", "device", "--device", "cuda", "--epochs", "2",
                     "--fanouts", "5,5", "--batch-size", "256", "--gpu-cache-gb", str(300 * 12 * 4 / 2**30),
                     "--host-cache-gb", size, "--read-order", "file", "--no-progress", "--summary-json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
    assert [e["train_loss"] for e in runs[0]["epochs"]] == pytest.approx([e["train_loss"] for e in runs[1]["epochs"]])
    assert runs[1]["host_cache"]["rows"] == 800 and runs[1]["moved"]["host_cache_hits"] > 0


def test_the_temporal_device_sampler_on_cuda_draws_the_host_samplers_blocks():
    from neutronorch.sampling.temporal_device import TorchTemporalSampler
    from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler
    from test_temporal_links import timed_graph

    graph = timed_graph(nodes=500, events=6000)
    seeds = np.arange(0, 500, 3)
    times = np.random.default_rng(0).integers(0, 500, seeds.shape[0])
    for strategy, strict in (("uniform", False), ("last", True)):
        host = TemporalNeighborSampler(graph.indptr, graph.indices, graph.edge_time, [5, 3], strategy, strict)
        cuda = TorchTemporalSampler(*(torch.from_numpy(np.asarray(a)).cuda() for a in
                                      (graph.indptr, graph.indices, graph.edge_time)), [5, 3], strategy, strict)
        want, got = host.sample(seeds, times, 11), cuda.sample(torch.from_numpy(seeds).cuda(), times, 11)
        for a, b in zip(want.blocks, got.blocks):
            assert b.indptr.is_cuda
            for name in ("indptr", "indices", "src_ids", "src_time", "edge_ids"):
                assert torch.equal(getattr(a, name), getattr(b, name).cpu()), name


@pytest.mark.parametrize("strategy", ["uniform", "last"])
def test_the_typed_temporal_device_sampler_on_cuda_draws_the_host_samplers_blocks(strategy):
    from test_temporal_sampler import test_the_typed_device_sampler_draws_the_host_samplers_blocks as same_blocks

    for seed in (0, 1):
        same_blocks(seed, strategy, True, device="cuda")


@pytest.mark.parametrize("task", ["link", "node"])
def test_device_mode_trains_a_typed_graph_by_time_on_cuda_as_exact_mode(task):
    from test_typed_temporal import test_device_mode_trains_a_typed_graph_by_time_as_exact_mode_does as same_runs

    same_runs(task, device="cuda")


@pytest.mark.parametrize("task", ["link", "node"])
def test_device_mode_trains_by_time_on_cuda_as_exact_mode(task):
    from test_temporal_links import dated_graph, node_settings, settings, timed_graph

    graph, make = (timed_graph(), settings) if task == "link" else (dated_graph(), node_settings)
    runs = {mode: train(make(mode=mode, epochs=2, device="cuda"), graph=graph) for mode in ("exact", "device")}
    losses = {mode: [e["train_loss"] for e in run["epochs"]] for mode, run in runs.items()}
    assert losses["device"] == pytest.approx(losses["exact"], rel=1e-4)
