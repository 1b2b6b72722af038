"""Placement of topology and features, the device feature cache, and the pinned-buffer pool.

The decisions are arithmetic and the cache logic runs on host tensors, so all of it is tested here on the
CPU; tests/test_cuda.py runs the same paths on a GPU.
"""

import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.errors import ConfigError
from neutronorch.features.cache import FeatureCache, hotness_order, out_degrees
from neutronorch.features.placement import GiB, pin, plan_placement, uva_view, workspace_bytes
from neutronorch.features.store import BufferPool, FeatureStore

SMALL = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"


def plan(mode="device", device_sampling=True, **overrides):
    """The placement for ``mode`` (the factory decides whether it samples on the device)."""
    values = dict(device="cuda", num_nodes=10_000_000, num_edges=200_000_000, indices_itemsize=4, feature_dim=100,
                  workspace=4 * GiB, device_memory=80 * GiB, gpu_memory_gb=None, gpu_cache_gb="auto")
    values.update(overrides)
    on_device = mode == "device" or (mode == "neutronorch" and device_sampling)
    return plan_placement(samples_on_device=on_device, **values)


# ----- placement decisions ------------------------------------------------------------------------------

def test_everything_on_a_large_gpu():
    p = plan()
    assert (p.topology, p.features, p.miss_path) == ("device", "device", "none")
    assert p.topology_bytes == 8 * 10_000_001 + 4 * 200_000_000
    assert p.cache_rows == 10_000_000 and p.cached_share == 1.0


def test_budget_leaves_a_cache_of_what_remains_after_workspace_and_topology():
    p = plan(gpu_memory_gb=7.0)
    n = 10_000_000
    # The device sampler's vertex map (8 bytes a vertex) and the cache's slot map (4) live there too.
    free = 7 * GiB - (4 * GiB + 8 * n) - p.topology_bytes - 4 * n
    assert p.topology == "device" and p.features == "cache" and p.miss_path == "uva"
    assert p.workspace == 4 * GiB + 8 * n
    assert p.cache_rows == free // 400
    assert p.cache_bytes <= free < p.cache_bytes + 400


def test_bfloat16_rows_fit_twice_as_many_in_the_same_budget():
    fp32, bf16 = plan(gpu_memory_gb=5.5), plan(gpu_memory_gb=5.5, row_itemsize=2)
    assert bf16.feature_bytes * 2 == fp32.feature_bytes
    assert fp32.cache_rows * 2 <= bf16.cache_rows <= fp32.cache_rows * 2 + 1


def test_host_samplers_never_place_topology_and_copy_their_misses():
    p = plan(mode="exact", gpu_memory_gb=5.0)
    assert p.topology == "host" and p.features == "cache" and p.miss_path == "staged"
    assert p.cache_rows == (5 * GiB - 4 * GiB) // 400
    q = plan(mode="neutronorch", device_sampling=False, gpu_memory_gb=5.0)
    assert q.topology == "host" and q.miss_path == "staged"
    r = plan(mode="neutronorch", device_sampling=True, gpu_memory_gb=7.0)
    assert r.topology == "device" and r.miss_path == "uva"


def test_topology_beyond_the_budget_is_read_from_pinned_host_memory():
    p = plan(gpu_memory_gb=4.5)
    assert p.topology == "uva" and p.features == "cache"
    assert any("topology" in note for note in p.notes)


def test_a_budget_below_the_workspace_is_refused_with_advice():
    with pytest.raises(ConfigError, match="`gpu_memory_gb`.*lower `batch_size`"):
        plan(gpu_memory_gb=3.0)


def test_cache_size_is_capped_by_the_budget_and_can_be_turned_off():
    p = plan(mode="exact", gpu_memory_gb=5.0, gpu_cache_gb=3.0)
    assert p.cache_rows == (1 * GiB) // 400 and any("`gpu_cache_gb`" in n for n in p.notes)
    q = plan(mode="exact", gpu_cache_gb=0.5)
    assert q.cache_rows == int(0.5 * GiB) // 400 and not q.notes
    off = plan(mode="exact", gpu_cache_gb=None)
    assert off.features == "host" and off.cache_rows == 0
    big = plan(gpu_memory_gb=1000.0)
    assert big.budget == 80 * GiB and any("more than the device has" in n for n in big.notes)


def test_cpu_runs_place_nothing_unless_a_cache_is_asked_for():
    cpu = dict(device="cpu", device_memory=None)
    assert plan(mode="exact", **cpu).features == "host"
    assert plan(mode="device", **cpu).features == "device"
    p = plan(mode="exact", gpu_cache_gb=1.0, **cpu)
    assert p.features == "cache" and p.cache_rows == GiB // 400 and p.miss_path == "staged"
    q = plan(mode="device", gpu_cache_gb=1.0, **cpu)
    assert q.features == "cache" and q.miss_path == "uva" and q.topology == "device"


def test_workspace_grows_with_the_batch_and_is_bounded_by_the_graph():
    small = workspace_bytes(100_000, 100, 256, 47, [15, 10, 5], 256)
    large = workspace_bytes(100_000, 100, 256, 47, [15, 10, 5], 1024)
    assert small < large
    # Frontiers never exceed the graph: a tiny graph needs little beyond the context reserve.
    assert workspace_bytes(1000, 100, 256, 47, [15, 10, 5], 1024) < GiB


# ----- hotness and the cache ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph():
    return generate(SyntheticSpec.parse(SMALL))


def test_hotness_orders_every_vertex_by_measured_appearances(graph):
    order = hotness_order(graph, [5, 5], 128, seed=0)
    assert np.array_equal(np.sort(order), np.arange(graph.num_nodes))
    degree = out_degrees(graph.indices, graph.num_nodes)
    top, bottom = order[:300], order[-300:]
    assert degree[top].mean() > 2 * degree[bottom].mean()
    by_degree = hotness_order(graph, [5, 5], 128, 0, policy="degree")
    assert np.all(np.diff(degree[by_degree]) <= 0)


@pytest.mark.parametrize("batches, train", [(0, None), (32, "none")])
def test_hotness_without_a_presampled_batch_ranks_by_degree(graph, batches, train):
    """No batch to presample (``batches=0``, or no training seed): the ranking is the degree's, as the
    ``degree`` policy gives it, not the vertices in id order."""
    seeds = graph if train is None else dataclasses.replace(graph, train_idx=np.empty(0, np.int64))
    order = hotness_order(seeds, [5, 5], 128, seed=0, batches=batches)
    by_degree = hotness_order(graph, [5, 5], 128, 0, policy="degree")
    assert np.array_equal(order, by_degree)


@pytest.mark.parametrize("rows", [0, 700, 3000])
def test_cache_paths_assemble_exactly_the_requested_rows(graph, rows):
    store = FeatureStore(graph.features, graph.labels)
    order = hotness_order(graph, [5, 5], 128, seed=0)
    cache = FeatureCache(store, order, rows, torch.device("cpu"))
    assert cache.full == (rows == graph.num_nodes)
    ids = torch.from_numpy(np.random.default_rng(1).choice(graph.num_nodes, 900, replace=False))
    want = torch.from_numpy(graph.features[ids.numpy()])
    # Host-sampled path: split on the host, assemble "on the device".
    slots, miss_pos, missed = cache.split(ids)
    assert slots.shape[0] == 900 and np.array_equal(ids.numpy()[miss_pos], missed)
    misses = store.gather(torch.from_numpy(missed))
    got = cache.assemble(torch.from_numpy(slots), torch.from_numpy(miss_pos), misses)
    assert torch.equal(got, want)
    # Device-sampled path, misses read in place (UVA on a GPU) and through a staged copy.
    for host_view in (torch.from_numpy(graph.features), None):
        got, hits, moved = cache.gather(ids, host_view, store.gather)
        assert torch.equal(got, want) and hits == 900 - miss_pos.shape[0]
        assert moved == (900 - hits) * 4 * graph.feature_dim
    if 0 < rows < graph.num_nodes:
        # The hottest rows are the cached ones.
        assert set(np.flatnonzero(cache.slot_map >= 0)) == set(order[:rows])


def _run(**overrides):
    values = dict(dataset=SMALL, fanouts=[5, 5], hidden=32, batch_size=128, epochs=2, lr=0.01, dropout=0.5,
                  weight_decay=0.0, progress=False, eval_every=0)
    values.update(overrides)
    return train(TrainConfig(**values))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "device"])
def test_a_partial_cache_changes_nothing_but_the_data_moved(mode, caplog):
    caplog.set_level("INFO", logger="neutronorch")
    plain = _run(mode=mode)
    cached = _run(mode=mode, gpu_cache_gb=1000 * 16 * 4 / 2**30)  # the 1000 hottest rows of 3000
    assert [e["train_loss"] for e in cached["epochs"]] == [e["train_loss"] for e in plain["epochs"]]
    assert cached["test_acc"] == plain["test_acc"]
    hits, rows = cached["moved"]["cache_hits"], cached["moved"]["feature_rows"]
    # A third of the vertices, the hottest: they serve well over a third of the rows.
    assert 0.4 < hits / rows < 1.0
    assert cached["placement"]["features"] == "cache" and cached["placement"]["cache_rows"] == 1000
    assert "cache hit rate" in caplog.text and "1,000 hottest rows cached" in caplog.text
    every = _run(mode=mode, gpu_cache_gb=1.0)  # every row cached: only ids travel
    assert every["placement"]["features"] == "device"
    assert [e["train_loss"] for e in every["epochs"]] == [e["train_loss"] for e in plain["epochs"]]
    assert every["moved"]["cache_hits"] == every["moved"]["feature_rows"]


@pytest.mark.slow
def test_neutronorch_samples_its_bottom_hop_on_the_device_when_asked():
    summary = _run(mode="neutronorch", device_sampling="on", super_batch=2, hot_ratio=0.3, epochs=4,
                   gpu_cache_gb=1000 * 16 * 4 / 2**30)
    assert summary["placement"]["topology"] == "device" and summary["placement"]["miss_path"] == "uva"
    assert summary["hot"]["reuse_rate"] > 0.1
    assert summary["moved"]["cache_hits"] > 0
    assert summary["test_acc"] > 0.8


# ----- pinned memory and buffers -----------------------------------------------------------------------

def test_pinning_failure_warns_once_with_the_fix_and_falls_back(caplog):
    def refuse(_):
        raise RuntimeError("CUDA error: out of memory")

    t = torch.zeros(4, 3)
    out, pinned = pin(t, "features", pinner=refuse)
    assert out is t and not pinned
    assert "could not pin the features" in caplog.text and "ulimit -l" in caplog.text
    caplog.clear()
    pin(t, "features", pinner=refuse)
    assert caplog.text == ""  # once


class FakeCudart:
    def __init__(self, result):
        self.result, self.registered, self.unregistered = result, [], []

    def cudaHostRegister(self, pointer, size, flags):
        self.registered.append((pointer, size))
        return self.result

    def cudaHostUnregister(self, pointer):
        self.unregistered.append(pointer)
        return 0


def test_large_tensors_are_pinned_in_place_and_unpinned(monkeypatch):
    from neutronorch.features import placement

    cudart = FakeCudart(0)
    big = torch.zeros(1000, 16)
    monkeypatch.setattr(placement, "REGISTER_IN_PLACE", big.nbytes)
    out = placement.pin_copy(big, cudart)
    assert out is big and cudart.registered == [(big.data_ptr(), big.nbytes)]
    placement.unpin(big, cudart)
    placement.unpin(big, cudart)  # once only
    assert cudart.unregistered == [big.data_ptr()]


def test_a_refused_registration_falls_back_to_a_pinned_copy(monkeypatch, capsys):
    from neutronorch.features import placement

    cleared = []
    monkeypatch.setattr(placement, "REGISTER_IN_PLACE", 0)
    monkeypatch.setattr(placement, "_clear_cuda_error", lambda: cleared.append(True))
    monkeypatch.setattr(placement, "_warned", set())
    t = torch.zeros(10, 4)
    copies = []

    def copy_pin(tensor):
        out = placement.pin_copy(tensor, FakeCudart(1))
        copies.append(out)
        return out

    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self.clone())
    out, pinned = pin(t, "features", pinner=copy_pin)
    assert pinned and out is not t and torch.equal(out, t) and cleared == [True]


def test_uva_views_need_cuda():
    assert uva_view(torch.zeros(4, 3), torch.device("cpu")) is None


class FakeEvent:
    def __init__(self):
        self.done = False
        self.waited = False

    def query(self):
        return self.done

    def synchronize(self):
        self.waited = self.done = True


def test_buffers_return_to_the_pool_only_after_their_copy_event():
    pool = BufferPool(2, width=3)
    a = pool.acquire(10)
    b = pool.acquire(10)
    ea, eb = FakeEvent(), FakeEvent()
    pool.release_after(a, ea)
    pool.release_after(b, eb)
    eb.done = True
    # b's copy finished, a's has not: b is handed out without waiting.
    assert pool.acquire(10) is b and not ea.waited
    # Every buffer in flight: the pool waits for the oldest copy, then reuses its buffer.
    assert pool.acquire(10) is a and ea.waited


# ----- options ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides,match", [
    (dict(gpu_cache_gb="lots"), "`gpu_cache_gb` 'lots'"),
    (dict(gpu_cache_gb=-1), "`gpu_cache_gb`"),
    (dict(gpu_memory_gb=0), "`gpu_memory_gb` 0"),
    (dict(cache_policy="lru"), "`cache_policy` 'lru'"),
    (dict(device_sampling="yes"), "`device_sampling` 'yes'"),
])
def test_bad_placement_options_are_refused(overrides, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**overrides).validate()


def test_help_lists_the_placement_options(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help-all"])  # --help lists --gpu-memory-gb; the cache knobs are advanced
    out = capsys.readouterr().out
    for flag in ("--gpu-memory-gb", "--gpu-cache-gb", "--cache-policy", "--device-sampling"):
        assert flag in out


# ----- the GPU check's table and targets ---------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_table_reports_every_run_and_judges_the_targets(tmp_path):
    spec = importlib.util.spec_from_file_location("gpu_table", ROOT / "bench" / "gpu_table.py")
    gpu_table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_table)
    base = _run(mode="exact", epochs=2)
    for cap in ("full", "quarter"):
        for mode, seconds, acc in (("exact", 3.0, 0.90), ("device", 1.2, 0.905), ("neutronorch", 0.8, 0.899)):
            s = json.loads(json.dumps(base))
            for e in s["epochs"]:
                e["seconds"], e["utilisation"]["gpu_percent"] = seconds, 90.0
            s["test_acc"] = acc
            (tmp_path / f"{mode}-{cap}.json").write_text(json.dumps(s))
    runs = gpu_table.load(tmp_path)
    lines = gpu_table.table(runs, "Test GPU")
    assert sum(line.startswith("| ") for line in lines) == 7  # header + 6 runs
    assert any("25% cached | neutronorch | 0.800 | 0.267 | 0.667" in line for line in lines)
    verdicts = gpu_table.targets(runs)
    assert verdicts[0].startswith("- PASS best mode") and "neutronorch 0.800 s" in verdicts[0]
    assert verdicts[1].startswith("- PASS") and "1.50x" in verdicts[1]
    assert verdicts[2] == "- PASS 25%: neutronorch at least 3x faster than exact: 3.75x"
    assert verdicts[3] == "- PASS 25%: equal accuracy (within 1 point): largest gap 0.60 points"
    assert verdicts[4] == "- PASS 25%: GPU utilisation above 85% in neutronorch mode: 90%"
    slow = json.loads((tmp_path / "neutronorch-quarter.json").read_text())
    for e in slow["epochs"]:
        e["seconds"], e["utilisation"]["gpu_percent"] = 1.0, 60.0
    (tmp_path / "neutronorch-quarter.json").write_text(json.dumps(slow))
    verdicts = gpu_table.targets(gpu_table.load(tmp_path))
    assert verdicts[1] == "- FAIL 25%: neutronorch at least 1.3x faster than device: 1.20x"
    assert verdicts[4] == "- FAIL 25%: GPU utilisation above 85% in neutronorch mode: 60%"
    (tmp_path / "exact-quarter.json").unlink()
    assert any(v.startswith("- MISSING 25%: neutronorch at least 3x") for v in gpu_table.targets(gpu_table.load(tmp_path)))


@pytest.mark.slow
def test_gpu_check_refuses_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the check would run")
    result = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True,
                            env={**os.environ, "PYTHON": sys.executable}, timeout=120)
    assert result.returncode == 2 and "no CUDA device" in result.stderr


@pytest.mark.slow
def test_gpu_check_rehearses_every_step_on_the_cpu(tmp_path):
    """The whole script (graph, nine runs, table, targets, profiles) with --device cpu on a tiny graph: a broken flag
    or step shows here, not in a scarce GPU window."""
    env = {**os.environ, "PYTHON": sys.executable, "DEVICE": "cpu", "NODES": "3000", "EPOCHS": "2",
           "RESULTS": str(tmp_path / "results"), "GRAPH_DIR": str(tmp_path / "graph"),
           # The profiles on few batches, and the torch sampler alone (Triton's interpreter is slow); the regime
           # benchmark's every step (its graph, the control's reuse, a budget, the table) with two modes, one group.
           "PROFILE_BATCHES": "3", "TRITON_INTERPRET": "0", "REGIME_MODES": "device,neutronorch",
           "REGIME_BOTTOM_HEAVY": ""}
    result = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh")], capture_output=True, text=True,
                            env=env, timeout=450)
    assert result.returncode == 0, result.stderr[-2000:]
    table = (tmp_path / "results" / "table.md").read_text()
    assert table.count("| all on the GPU |") == 3 and table.count("| 25% cached |") == 3
    assert table.count("| all on the GPU, bf16 |") == 3
    assert "Targets:" in table and "MISSING" not in table
    statuses = re.findall(r"exit status (\d+)", (tmp_path / "results" / "log.txt").read_text())
    assert statuses == ["0"] * 11  # nine runs and the two profiles
    regime = json.loads((tmp_path / "results" / "regime" / "regime.json").read_text())
    assert [(r["group"], r["mode"], r["returncode"]) for r in regime["runs"]] == [
        ("regime", "device", 0), ("regime", "neutronorch", 0), ("control", "device", 0), ("control", "neutronorch", 0)]


def test_info_tells_what_a_graph_takes_on_a_gpu(capsys):
    assert main(["info", "synthetic:nodes=2000,degree=8,features=16,classes=4"]) == 0
    out = json.loads(capsys.readouterr().out)
    graph = generate(SyntheticSpec.parse("synthetic:nodes=2000,degree=8,features=16,classes=4"))
    topology = (graph.indptr.nbytes + graph.indices.nbytes) / 2**30
    assert out["device_gib"] == {"topology": round(topology, 4), "features": round(2000 * 16 * 4 / 2**30, 4)}


def test_the_memory_budget_caps_the_allocator_of_an_unindexed_cuda_device(monkeypatch):
    """``--device cuda`` names no index; the allocator's cap needs one (the current device's)."""
    import types

    from neutronorch.train import resources

    calls = []

    def fraction(value, device):
        if not isinstance(device, int):  # as torch does for torch.device("cuda")
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        calls.append((round(value, 6), device))

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    properties = types.SimpleNamespace(total_memory=8 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: properties)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", fraction)
    with resources.memory_budget(torch.device("cuda"), 2.0):
        assert calls == [(0.25, 3)]
    assert calls == [(0.25, 3), (1.0, 3)]
    calls.clear()
    with resources.memory_budget(torch.device("cuda", 1), 4.0):
        pass
    assert calls == [(0.5, 1), (1.0, 1)]
