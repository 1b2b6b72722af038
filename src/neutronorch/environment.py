"""The environment variables neutronorch and numba read, checked at the edge before numba is imported (some
bad values fail that import, others numba ignores or meets only at its first parallel kernel): a bad value is
a ``ConfigError`` naming the variable, its value and the values it takes. Imports nothing slow to load."""

from __future__ import annotations

import os

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
