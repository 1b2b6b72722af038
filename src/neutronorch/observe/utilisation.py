"""Processor utilisation while training: this process's CPU time, the whole machine's, and the GPU's (from
the NVIDIA driver's ``libnvidia-ml`` through ctypes; without it, not reported), sampled in a daemon thread."""

from __future__ import annotations

import ctypes
import os
import threading
import time


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


def _machine_share(now, last) -> float | None:
    """The machine's busy share between two ``(busy, total)`` jiffy readings, where both exist."""
    if now is None or last is None or now[1] <= last[1]:
        return None
    return (now[0] - last[0]) / (now[1] - last[1])


class _NvmlUtilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


def pci_bus_id(device) -> str | None:
    """The device's PCI address as NVML writes it (so the right GPU is read whatever
    CUDA_VISIBLE_DEVICES says), when torch reports it."""
    try:
        import torch  # noqa: PLC0415

        props = torch.cuda.get_device_properties(device)
        return f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except Exception:  # noqa: BLE001 - older torch: fall back to the index
        return None


class GpuMonitor:
    """GPU utilisation through the driver's NVML library (``lib``: a stand-in for tests); None without it."""

    def __init__(self, device, lib=None):
        self.handle = None
        if device is None or device.type != "cuda":
            return
        import torch  # noqa: PLC0415

        index = device.index if device.index is not None else torch.cuda.current_device()
        handle, bus = ctypes.c_void_p(), pci_bus_id(device)
        try:
            self.lib = lib if lib is not None else ctypes.CDLL("libnvidia-ml.so.1")
            if self.lib.nvmlInit_v2() != 0:
                return
            where = ctypes.byref(handle)
            found = bus and self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), where) == 0
            if found or self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), where) == 0:
                self.handle = handle
        except Exception:  # noqa: BLE001 - NVML missing or unusable: not reported
            self.handle = None

    def percent(self) -> float | None:
        if self.handle is None:
            return None
        rates = _NvmlUtilization()
        try:
            done = self.lib.nvmlDeviceGetUtilizationRates(self.handle, ctypes.byref(rates)) == 0
        except Exception:  # noqa: BLE001
            return None
        return float(rates.gpu) if done else None


class Utilisation:
    """Samples CPU (this process, and the whole machine) and GPU utilisation every ``interval`` seconds.
    ``samples`` keeps the series for the timeline: (time, process cores busy, machine share busy, GPU percent
    or None), each the mean since the sample before."""

    def __init__(self, device=None, interval: float = 0.25):
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.interval = interval
        self.samples: list[tuple[float, float, float | None, float | None]] = []
        self._gpu = GpuMonitor(device)
        self._gpu_sum, self._gpu_n = 0.0, 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._mark = self._last = self._now()
        self._thread = threading.Thread(target=self._run, name="neutronorch-utilisation", daemon=True)
        self._thread.start()

    @staticmethod
    def _now():
        # process_time: every thread of this process, to the nanosecond (os.times() counts 10 ms ticks)
        return time.perf_counter(), time.process_time(), _read_system_jiffies()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """Record a sample now: the means since the previous sample (from any thread)."""
        gpu = self._gpu.percent()
        with self._lock:  # samples stay in time order, each covering the time since the one before
            now, last = self._now(), self._last
            wall = now[0] - last[0]
            if wall <= 0:
                return
            self._last = now
            system = _machine_share(now[2], last[2])
            if len(self.samples) < 100_000:
                self.samples.append((now[0], (now[1] - last[1]) / wall, system, gpu))
            if gpu is not None:
                self._gpu_sum += gpu
                self._gpu_n += 1

    def take(self) -> dict:
        """Mean utilisation since the last call: CPU cores this process kept busy (and that as a share of the
        cores it may use), the machine's busy share (all processes), and the GPU's percent (or None)."""
        now = self._now()
        wall = now[0] - self._mark[0]
        cores = (now[1] - self._mark[1]) / wall if wall > 0 else 0.0
        system = _machine_share(now[2], self._mark[2])
        with self._lock:
            gpu = round(self._gpu_sum / self._gpu_n, 1) if self._gpu_n else None
            self._gpu_sum, self._gpu_n = 0.0, 0
        self._mark = now
        return {"process_cores": round(cores, 3), "process_share": round(cores / self.cores, 4),
                "machine_share": None if system is None else round(system, 4), "gpu_percent": gpu}

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
