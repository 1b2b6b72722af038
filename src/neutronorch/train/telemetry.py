"""Where the time goes: stage spans on lanes, processor utilisation, data moved, and the timeline picture.

Every stage of every mode is a span ``(stage, start, end)`` recorded with ``Spans.add`` from whichever
thread runs it (host producer, device sampler, copy, trainer). A span costs a lock and a dict update, a
microsecond or so against stages of milliseconds. Per-stage totals are always kept; the raw spans only
inside the timeline window (``--timeline``). Each stage belongs to one lane (``STAGE_LANE``); stages named
in ``WAITS`` are time a lane spent blocked, not busy.

``Utilisation`` samples the process's CPU time (and the whole machine's, to show competing load) and, on
CUDA with NVML available, the GPU's utilisation, a few times a second in a daemon thread.
"""

from __future__ import annotations

import ctypes
import json
import os
import threading
import time
from pathlib import Path

from neutronorch.errors import ConfigError

# Lanes in display order, and the lane of every stage the modes record.
LANES = ("host", "sampler", "copy", "trainer")
STAGE_LANE = {
    # NeutronOrch host producer
    "hot_select": "host", "host_sample": "host", "host_gather": "host", "host_wait_weights": "host",
    "host_compute": "host", "host_aggregate": "host", "host_matmul": "host", "host_copy": "host",
    # sampling and gathering of mini-batches (background thread)
    "sample": "sampler", "gather": "sampler",
    # host -> device copies (CUDA)
    "copy": "copy",
    # the training thread
    "wait": "trainer", "wait_hot": "trainer", "forward": "trainer", "backward": "trainer", "hot_grad": "trainer",
    "step": "trainer", "publish": "trainer",
}
WAITS = frozenset({"wait", "wait_hot", "host_wait_weights"})


def lane_of(stage: str) -> str:
    return STAGE_LANE.get(stage, "trainer")


class Spans:
    """Stage spans from every thread: totals since the last ``take``, raw spans while ``keep`` is set."""

    MAX_EVENTS = 200_000

    def __init__(self):
        self._lock = threading.Lock()
        self._totals: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self.keep = False
        self.events: list[tuple[str, float, float, int]] = []

    def add(self, stage: str, start: float, end: float, step: int = -1) -> None:
        with self._lock:
            self._totals[stage] = self._totals.get(stage, 0.0) + (end - start)
            if self.keep and len(self.events) < self.MAX_EVENTS:
                self.events.append((stage, start, end, step))

    def count(self, name: str, value: int) -> None:
        """Add to a counter (rows, bytes) reported with the next ``take``."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + int(value)

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        """Seconds per stage and the counters, since the last call (every lane)."""
        with self._lock:
            totals, self._totals = self._totals, {}
            counts, self._counts = self._counts, {}
        return totals, counts


def lane_seconds(stage_seconds: dict[str, float]) -> dict[str, float]:
    """Busy seconds per lane (stages that are not waits), for the lanes that recorded anything."""
    busy: dict[str, float] = {}
    for stage, seconds in stage_seconds.items():
        lane = lane_of(stage)
        busy[lane] = busy.get(lane, 0.0) + (0.0 if stage in WAITS else seconds)
    return {lane: busy[lane] for lane in LANES if lane in busy}


def lane_busy(stage_seconds: dict[str, float], wall: float) -> dict[str, float]:
    """Share of ``wall`` each lane spent in stages that are not waits (lanes that recorded anything)."""
    if wall <= 0:
        return {}
    return {lane: round(seconds / wall, 4) for lane, seconds in lane_seconds(stage_seconds).items()}


def _read_system_jiffies() -> tuple[int, int] | None:
    """(busy, total) jiffies of the whole machine from /proc/stat, or None off Linux."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])
    return total - idle, total


def _process_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class _NvmlUtilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _NvmlLibrary:
    """The three NVML calls we need, straight from the driver's ``libnvidia-ml`` (present wherever the
    NVIDIA driver is, unlike the ``pynvml`` package)."""

    def __init__(self, lib=None):
        self.lib = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")

    def handle(self, index: int, pci_bus_id: str | None):
        handle = ctypes.c_void_p()
        if pci_bus_id and self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci_bus_id.encode(), ctypes.byref(handle)) == 0:
            return handle
        if self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            raise RuntimeError("no NVML handle for the device")
        return handle

    def percent(self, handle) -> float | None:
        rates = _NvmlUtilization()
        if self.lib.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) != 0:
            return None
        return float(rates.gpu)


def _pci_bus_id(device) -> str | None:
    """The device's PCI address as NVML writes it (so the right GPU is read whatever
    CUDA_VISIBLE_DEVICES says), when torch reports it."""
    try:
        import torch  # noqa: PLC0415

        props = torch.cuda.get_device_properties(device)
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - older torch: fall back to the index
        return None


class _Gpu:
    """GPU utilisation through NVML: the ``pynvml`` package when installed, else the driver's library
    through ctypes; unavailable (None) without either."""

    def __init__(self, device, library=None):
        self.handle = None
        if device is None or device.type != "cuda":
            return
        import torch  # noqa: PLC0415

        index = device.index if device.index is not None else torch.cuda.current_device()
        for candidate in ([library] if library is not None else [_PynvmlLibrary, _NvmlLibrary]):
            try:
                lib = candidate() if isinstance(candidate, type) else candidate
                self.handle = lib.handle(index, _pci_bus_id(device))
                self._lib = lib
                return
            except Exception:  # noqa: BLE001 - NVML missing or unusable: try the next, else not reported
                self.handle = None

    def percent(self) -> float | None:
        if self.handle is None:
            return None
        try:
            return self._lib.percent(self.handle)
        except Exception:  # noqa: BLE001
            return None


class _PynvmlLibrary:
    def __init__(self):
        import pynvml  # noqa: PLC0415 - optional

        pynvml.nvmlInit()
        self.nvml = pynvml

    def handle(self, index: int, pci_bus_id: str | None):
        if pci_bus_id:
            try:
                return self.nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id)
            except Exception:  # noqa: BLE001
                pass
        return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def percent(self, handle) -> float | None:
        return float(self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu)


class Utilisation:
    """Samples CPU (this process, and the whole machine) and GPU utilisation every ``interval`` seconds.

    ``take()`` gives the means since its last call; ``samples`` keeps the series (time, process cores busy,
    machine share busy, GPU percent or None) for the timeline.
    """

    def __init__(self, device=None, interval: float = 0.25):
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.interval = interval
        self.samples: list[tuple[float, float, float | None, float | None]] = []
        self._gpu = _Gpu(device)
        self._gpu_sum = 0.0
        self._gpu_n = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._mark = self._now()
        self._thread = threading.Thread(target=self._run, name="neutronorch-utilisation", daemon=True)
        self._thread.start()

    @staticmethod
    def _now():
        return time.perf_counter(), _process_cpu_seconds(), _read_system_jiffies()

    def _run(self) -> None:
        last = self._now()
        while not self._stop.wait(self.interval):
            now = self._now()
            wall = now[0] - last[0]
            cores = (now[1] - last[1]) / wall if wall > 0 else 0.0
            system = None
            if now[2] is not None and last[2] is not None and now[2][1] > last[2][1]:
                system = (now[2][0] - last[2][0]) / (now[2][1] - last[2][1])
            gpu = self._gpu.percent()
            with self._lock:
                if len(self.samples) < 100_000:
                    self.samples.append((now[0], cores, system, gpu))
                if gpu is not None:
                    self._gpu_sum += gpu
                    self._gpu_n += 1
            last = now

    def take(self) -> dict:
        """Mean utilisation since the last call: CPU cores this process kept busy (and that as a share of the
        cores it may use), the machine's busy share (all processes), and the GPU's percent (or None)."""
        now = self._now()
        wall = now[0] - self._mark[0]
        cores = (now[1] - self._mark[1]) / wall if wall > 0 else 0.0
        system = None
        if now[2] is not None and self._mark[2] is not None and now[2][1] > self._mark[2][1]:
            system = round((now[2][0] - self._mark[2][0]) / (now[2][1] - self._mark[2][1]), 4)
        with self._lock:
            gpu = round(self._gpu_sum / self._gpu_n, 1) if self._gpu_n else None
            self._gpu_sum, self._gpu_n = 0.0, 0
        self._mark = now
        return {"process_cores": round(cores, 3), "process_share": round(cores / self.cores, 4),
                "machine_share": system, "gpu_percent": gpu}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def epoch_table(record: dict) -> str:
    """A compact per-lane breakdown of one epoch: busy share, then seconds per stage."""
    stages = record["stage_seconds"]
    lines = []
    for lane, share in record.get("lane_busy", {}).items():
        parts = " ".join(f"{s} {v:.2f}" for s, v in stages.items() if lane_of(s) == lane and v >= 0.005)
        lines.append(f"    {lane:<8} busy {100 * share:5.1f}% | {parts}")
    util = record.get("utilisation")
    if util:
        line = (f"    cpu      {util['process_cores']:.2f} cores busy "
                f"({100 * util['process_share']:.0f}% of this process's)")
        if util.get("machine_share") is not None:
            line += f", machine {100 * util['machine_share']:.0f}% busy"
        if util.get("gpu_percent") is not None:
            line += f" | gpu {util['gpu_percent']:.0f}%"
        lines.append(line)
    moved = record.get("moved")
    if moved:
        lines.append(f"    data     {moved['feature_rows'] / max(1, record['batches']):,.0f} feature rows per batch, "
                     f"{moved['feature_bytes'] / 2**20:,.0f} MiB gathered, "
                     f"{moved['device_bytes'] / 2**20:,.0f} MiB to the device"
                     + (f", cache hit rate {100 * moved['cache_hits'] / max(1, moved['feature_rows']):.0f}%"
                        if moved.get("cache_hits") else ""))
    return "\n".join(lines)


# ----- timeline picture -------------------------------------------------------------------------------------

def check_timeline_path(path: str) -> None:
    """Fail before training (never after it) if the timeline cannot be written."""
    if not path.lower().endswith(".png"):
        raise ConfigError(f"--timeline {path}: give a .png path (the raw spans go next to it as .json).")
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional
    except ImportError:
        raise ConfigError("--timeline needs matplotlib: pip install matplotlib (or the project's [plot] "
                          "extra).") from None
    parent = Path(path).parent
    if not parent.exists():
        raise ConfigError(f"--timeline {path}: the folder {parent} does not exist.")


def write_timeline(path: str, events: list, samples: list, title: str) -> dict:
    """Draw the spans (and the utilisation samples in their window) as a Gantt chart at ``path`` and write
    the raw data next to it as ``.json``. Returns what was written."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    if not events:
        raise ValueError("no spans recorded in the timeline window")
    origin = min(e[1] for e in events)
    end = max(e[2] for e in events)
    lanes = [lane for lane in LANES if any(lane_of(e[0]) == lane for e in events)]
    window_samples = [s for s in samples if origin <= s[0] <= end]
    data = {
        "title": title,
        "lanes": lanes,
        "spans": [{"lane": lane_of(s), "stage": s, "start": round(a - origin, 6), "end": round(b - origin, 6),
                   "step": step} for s, a, b, step in events],
        "utilisation": [{"t": round(t - origin, 3), "process_cores": round(c, 3), "machine_share": m,
                         "gpu_percent": g} for t, c, m, g in window_samples],
    }
    json_path = str(Path(path).with_suffix(".json"))
    Path(json_path).write_text(json.dumps(data) + "\n")

    stages = sorted({e[0] for e in events}, key=lambda s: (LANES.index(lane_of(s)), s))
    cmap = plt.get_cmap("tab20")
    colours = {s: cmap(i % 20) for i, s in enumerate(stages)}
    has_util = bool(window_samples)
    fig, axes = plt.subplots(2 if has_util else 1, 1, figsize=(14, 4.5 if has_util else 3.2), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if has_util else None, squeeze=False)
    ax = axes[0][0]
    for row, lane in enumerate(reversed(lanes)):
        for stage in stages:
            if lane_of(stage) != lane:
                continue
            bars = [(a - origin, b - a) for s, a, b, _ in events if s == stage]
            hatch = "//" if stage in WAITS else None
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colours[stage], edgecolor="none", hatch=hatch,
                           label=stage + (" (wait)" if stage in WAITS else ""))
    ax.set_yticks(range(len(lanes)), list(reversed(lanes)))
    ax.set_xlim(0, end - origin)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if has_util:
        ux = axes[1][0]
        ux.plot([s[0] - origin for s in window_samples], [s[1] for s in window_samples], label="process cores busy")
        gpu = [(s[0] - origin, s[3]) for s in window_samples if s[3] is not None]
        if gpu:
            ux.plot([g[0] for g in gpu], [g[1] / 100 for g in gpu], label="GPU (fraction)")
        ux.set_ylim(bottom=0)
        ux.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
        ux.set_xlabel("seconds")
    else:
        ax.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {"png": path, "json": json_path, "spans": len(events)}
