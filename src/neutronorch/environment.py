"""The environment variables neutronorch and numba read, checked at the edge before numba is imported (some
bad values fail that import, others numba ignores or meets only at its first parallel kernel): a bad value is
a ``ConfigError`` naming the variable, its value and the values it takes. Imports nothing slow to load."""

from __future__ import annotations

import os
import time

from neutronorch.errors import ConfigError

# name -> the values it takes (numba's compared without case, as numba compares them), and what unset means;
# read by sampling/device_sampler.py, nn/edge_softmax.py, train/resources.py and numba
CHOICES = {
    "NEUTRONORCH_DEVICE_SAMPLER": (("auto", "torch", "triton"), "auto: Triton on CUDA if it runs, or torch"),
    "NEUTRONORCH_EDGE_SOFTMAX": (("kernels", "torch"), "kernels"),
    "NEUTRONORCH_SYSTEM_MALLOC": (("0", "1"), "0: malloc tuned"),
    # workqueue is numba's, but refused: it cannot run kernels from several threads (train/resources.py)
    "NUMBA_THREADING_LAYER": (("default", "omp", "tbb", "threadsafe", "safe", "forksafe"),
                              "neutronorch then uses omp"),
}
LAUNCHED = "a launcher such as torchrun sets it"
# name -> the least whole number it takes, and what unset means
COUNTS = {"NUMBA_NUM_THREADS": (1, "numba then takes one per core"), "WORLD_SIZE": (1, LAUNCHED),
          "LOCAL_WORLD_SIZE": (1, LAUNCHED), "RANK": (0, LAUNCHED), "LOCAL_RANK": (0, LAUNCHED),
          "GROUP_RANK": (0, LAUNCHED)}
WORKQUEUE = ("NUMBA_THREADING_LAYER=workqueue cannot run numba kernels from several threads at once, as "
             "neutronorch's pipeline does (numba would abort the run). Unset it (neutronorch then uses omp) or set "
             "it to omp or tbb.")


def check_environment() -> None:
    """Every variable of ``CHOICES`` and ``COUNTS`` that is set holds a value it takes."""
    for name, (allowed, unset) in CHOICES.items():
        value = os.environ.get(name)
        if value is None or (value == "" and name.startswith("NEUTRONORCH_")):  # empty: unset, as the code reads it
            continue
        if name == "NUMBA_THREADING_LAYER" and value.strip().lower() == "workqueue":
            raise ConfigError(WORKQUEUE)
        if (value.strip().lower() if name.startswith("NUMBA_") else value) not in allowed:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}; set it to one of them, or unset "
                              f"it ({unset}).")
    for name, (least, unset) in COUNTS.items():
        value = os.environ.get(name)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < least:
            raise ConfigError(f"{name}={value!r} is not a whole number from {least}; set it to one, or unset "
                              f"it ({unset}).")


def launcher_world_size() -> int:
    """``WORLD_SIZE`` as a launcher (torchrun) set it; 1 without a launcher."""
    value = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"WORLD_SIZE={value!r} is not a number of processes; unset it, or launch with "
                          f"torchrun --nproc-per-node N.") from None


def launcher_rank() -> int | None:
    """This process's rank when a launcher started several; None otherwise (or when ``RANK`` is unreadable,
    which ``check_environment`` reports)."""
    try:
        return int(os.environ["RANK"]) if launcher_world_size() > 1 else None
    except (KeyError, ValueError, ConfigError):
        return None


# Other programs' use of the machine, in cores, from which OpenMP's idle threads (libgomp's: torch's and numba's)
# sleep rather than spin: beside one busy program on 2 cores the demo's epochs took 0.71x with them sleeping,
# beside two 0.11x; on an idle machine 1.2-1.4x (docs/results/wait-policy-2026-12-06.md).
BUSY_CORES = 0.5
WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def busy_cores(seconds: float = 0.15) -> float | None:
    """The cores busy over the next ``seconds`` (the machine's, from /proc/stat, while this process sleeps: the
    work of other programs); None where it cannot be read."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as stat:
            ticks = [int(n) for n in stat.readline().split()[1:]]
        return sum(ticks[:8]), ticks[3] + ticks[4]  # user ... steal; idle and iowait
    try:
        total, idle = sample()
        time.sleep(seconds)
        total_after, idle_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    spent = total_after - total
    return None if spent <= 0 else (1 - (idle_after - idle) / spent) * (os.cpu_count() or 1)


def choose_wait_policy() -> str | None:
    """Before torch or numba loads libgomp: where other programs keep at least ``BUSY_CORES`` of the machine busy,
    ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP threads sleep at once, instead of spinning for about 3 ms on cores
    the other programs need); the note that says so, or None where it is left to libgomp. Never where the user
    set either variable, nor in a launched rank (its sibling ranks' start would count as other programs)."""
    if any(name in os.environ for name in WAIT_VARIABLES) or launcher_world_size() > 1:
        return None
    busy = busy_cores()
    if busy is None or busy < BUSY_CORES:
        return None
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return (f"other programs keep {busy:.1f} of the machine's {os.cpu_count()} cores busy: idle OpenMP threads sleep "
            f"instead of spinning (OMP_WAIT_POLICY=PASSIVE; set OMP_WAIT_POLICY yourself to choose)")
