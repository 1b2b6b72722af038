"""The GPU profiling scripts rehearsed on the CPU: bench/device_profile.py, bench/feature_bandwidth.py and
bench/planner_profile.py run on a tiny synthetic graph and print their tables; device_profile.py's counting of
profiler events by batch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
GRAPH = "synthetic:nodes=3000,degree=8,features=16,classes=4"
SMALL = ["--dataset", GRAPH, "--device", "cpu", "--batches", "3", "--batch-size", "64", "--fanouts", "4,3"]


def run(script: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The script in its own process; Triton's interpreter only where ``env`` asks for it."""
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment.update({"OMP_NUM_THREADS": "2", **(env or {})})
    return subprocess.run([sys.executable, str(BENCH / script), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=environment)


def load_device_profile():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("device_profile", BENCH / "device_profile.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.slow
def test_device_profile_prints_times_and_counts_per_stage_on_the_cpu():
    done = run("device_profile.py", *SMALL, "--sampler", "torch", "--rows", "5")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "sampler [torch]: torch: TorchNeighborSampler" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("stage"))
    assert header.split() == ["stage", "wall", "ms", "device", "ms", "busy", "ms", "ops", "kernels", "copies", "syncs"]
    rows = {}
    for line in out.splitlines():
        for stage in ("sample", "gather", "sample + gather", "training step"):
            if line.strip().startswith(f"{stage} [torch]"):
                rows[stage] = line.split("]", 1)[1].split()
    assert set(rows) == {"sample", "gather", "sample + gather", "training step"}
    for cells in rows.values():
        assert float(cells[0]) > 0  # wall ms
        assert cells[1:3] == ["n/a", "n/a"]  # device and busy ms
        assert int(cells[3].replace(",", "")) > 0  # ops
        assert cells[4:7] == ["n/a", "n/a", "n/a"]  # kernels, copies, syncs
    assert "target: <= 40 launches, 1 sync per mini-batch" in next(
        line for line in out.splitlines() if line.strip().startswith("sample [torch]"))
    # Gathering every row of a fully cached batch: its features and its labels, one index_select each.
    assert rows["gather"][3] == "2"
    assert int(rows["sample"][3]) + 2 == int(rows["sample + gather"][3])
    assert "Self CPU time total" in out  # the operator table


@pytest.mark.slow
def test_device_profile_triton_sampler_without_a_device_is_a_clear_error_and_compare_goes_on_without_it():
    done = run("device_profile.py", *SMALL, "--sampler", "triton")
    assert done.returncode == 1
    assert "--sampler triton:" in done.stderr and "triton sampler" in done.stderr
    done = run("device_profile.py", *SMALL, "--compare", "--rows", "3")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "--compare:" in done.stdout and "the torch sampler alone" in done.stdout
    assert "sample [torch]" in done.stdout and "sample [triton]" not in done.stdout


@pytest.mark.slow
def test_device_profile_compares_the_samplers_under_the_triton_interpreter():
    pytest.importorskip("triton")
    pytest.importorskip("neutronorch.sampling.device_sampler")
    done = run("device_profile.py", *SMALL, "--compare", "--rows", "3", env={"TRITON_INTERPRET": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "sampler [triton]: triton: TritonNeighborSampler" in out
    ops = {kind: int(next(line for line in out.splitlines() if line.strip().startswith(f"sample [{kind}]"))
                     .split("]", 1)[1].split()[3]) for kind in ("torch", "triton")}
    assert 0 < ops["triton"] < ops["torch"]  # its kernels counted, not the interpreter's own operations


@pytest.mark.slow
def test_feature_bandwidth_prints_peaks_and_reads_on_the_cpu(tmp_path):
    saved = tmp_path / "bandwidth.json"
    done = run("feature_bandwidth.py", *SMALL, "--peak-mib", "16", "--json", str(saved))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert [c.strip() for c in lines[1].split("|")[1:6]] == ["read", "ms / batch", "GB/s", "of peak", "peak"]
    by_name = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:6]] for line in lines[3:]}
    assert float(by_name["peak: memcpy (the device is the host)"][1]) > 0
    assert by_name["peak: pinned host -> device copy"][1] == "n/a (no CUDA)"
    for name in ("device gather", "host gather"):
        ms, gbs, share, peak = by_name[name]
        assert float(ms) >= 0 and float(gbs) >= 0 and share.endswith("%")
        assert peak == "memcpy (the device is the host)"
    for name in ("UVA gather", "host gather + pinned copy"):
        assert by_name[name][0] == "n/a (no CUDA)"
    numbers = json.loads(saved.read_text())
    assert numbers["peaks_gb_s"]["h2d"] is None and numbers["peaks_gb_s"]["device"] > 0
    assert numbers["reads"]["UVA gather"]["gb_s"] is None
    for name in ("device gather", "host gather"):
        assert numbers["reads"][name]["ms"] > 0 and numbers["reads"][name]["gb_s"] > 0
    read = numbers["reads"]["device gather"]
    assert read["peak"] == "device"
    assert read["of_peak"] == pytest.approx(read["gb_s"] * 1e9 / (numbers["peaks_gb_s"]["device"] * 1e9))


def test_profiler_events_are_counted_by_the_batch_they_start_in():
    dp = load_device_profile()
    x = torch.randn(100, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for n in (1, 3):
            with torch.profiler.record_function(dp.MARK):
                for _ in range(n):
                    x.index_select(0, torch.arange(10)).sum()  # arange, index_select, sum: 3 ops
                x.view(-1).t()  # views: none
            x.add(1)  # between batches: not counted
    counts = dp.per_batch_counts(prof, cuda=False)
    assert [c["ops"] for c in counts] == [3, 9]


def test_a_cuda_profile_is_counted_by_batch_launches_in_the_call_and_device_work_until_the_next_one():
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    dp = load_device_profile()

    def event(name, start, end, device=DeviceType.CPU, annotation=False):
        return SimpleNamespace(name=name, device_type=device, is_user_annotation=annotation, cpu_children=[],
                               cpu_parent=None, time_range=SimpleNamespace(start=start, end=end,
                                                                           elapsed_us=lambda: end - start))

    cuda = DeviceType.CUDA
    events = [
        event(dp.MARK, 0, 10), event(dp.MARK, 0, 30, cuda, annotation=True),  # the mark's range on the device
        event("cudaLaunchKernel", 1, 2), event("cuLaunchKernelEx", 3, 4), event("cudaMemcpyAsync", 5, 6),
        event("cudaStreamSynchronize", 6, 9), event("cudaMemcpy", 9, 10),
        event("gather_kernel", 2, 12, cuda), event("Memcpy DtoH (Device -> Pageable)", 12, 13, cuda),
        event("cudaDeviceSynchronize", 11, 20),  # the script's own, after the call: not the batch's
        event(dp.MARK, 30, 40), event("cudaLaunchKernel", 31, 32), event("kernel", 32, 36, cuda),
        event("other_kernel", 36, 37, cuda),
    ]
    counts = dp.per_batch_counts(SimpleNamespace(events=lambda: events), cuda=True)
    assert [dict(c) for c in counts] == [
        {"launches": 2, "copies": 2, "syncs": 2, "kernels": 1, "busy": 11},
        {"launches": 1, "kernels": 2, "busy": 5}]


def test_cuda_runtime_calls_are_classified_once_each():
    dp = load_device_profile()

    class Event:
        def __init__(self, name):
            self.name, self.cpu_children, self.cpu_parent = name, [], None

    kinds = {name: dp.classify(Event(name), cuda=True) for name in
             ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaStreamSynchronize", "cudaMemcpyAsync",
              "cudaMemcpy", "cudaMemsetAsync", "cudaEventRecord", "aten::index_select")}
    assert kinds == {"cudaLaunchKernel": "launches", "cuLaunchKernelEx": "launches",
                     "cudaStreamSynchronize": "syncs", "cudaMemcpyAsync": "copies", "cudaMemcpy": "syncs",
                     "cudaMemsetAsync": "copies", "cudaEventRecord": None, "aten::index_select": None}
    assert not dp.LAUNCH_CALLS & dp.SYNC_CALLS


def test_without_the_device_sampler_module_torch_and_auto_fall_back_and_triton_says_why(monkeypatch):
    dp = load_device_profile()
    monkeypatch.setitem(sys.modules, "neutronorch.sampling.device_sampler", None)  # its import now fails
    indptr, indices = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    for kind in ("auto", "torch"):
        sampler, what = dp.make_sampler(kind, indptr, indices, [2])
        assert type(sampler).__name__ == "TorchNeighborSampler" and "no neutronorch.sampling.device_sampler" in what
    with pytest.raises(dp.SamplerUnavailable, match="device_sampler"):
        dp.make_sampler("triton", indptr, indices, [2])


def test_seed_batches_run_over_epochs_and_skip_partial_batches():
    dp = load_device_profile()
    batches = dp.seed_batches(torch.arange(10), 0, 4, 5)
    assert [b.shape[0] for b in batches] == [4] * 5
    # Two full batches an epoch: the third is the next epoch's first (the partial one skipped).
    assert torch.equal(batches[2], dp.epoch_order(torch.arange(10), 0, 1)[:4])
    assert [b.shape[0] for b in dp.seed_batches(torch.arange(3), 0, 4, 2)] == [3, 3]


@pytest.mark.slow
def test_planner_profile_times_the_host_and_device_planners_on_the_cpu():
    done = run("planner_profile.py", "--dataset", GRAPH, "--fanouts", "4,3", "--batch-size", "32",
               "--super-batch", "2", "--super-batches", "2", "--threads", "1", "--devices", "cpu")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "threads: upper hops" in done.stdout and "distinct bottom-layer destinations" in done.stdout
    assert "on cpu: upper hops" in done.stdout and "(torch sampler and DevicePlanner)" in done.stdout
