"""The environment variables neutronorch and numba read, checked at the edge before numba is imported (some
bad values fail that import, others numba ignores or meets only at its first parallel kernel): a bad value is
a ``ConfigError`` naming the variable, its value and the values it takes. Imports nothing slow to load."""

from __future__ import annotations

import os

from neutronorch.errors import ConfigError

# name -> the values it takes (compared without case for numba's threading layer, as numba compares them)
CHOICES = {
    "NEUTRONORCH_DEVICE_SAMPLER": ("auto", "torch", "triton"),  # sampling/device_sampler.py
    "NEUTRONORCH_EDGE_SOFTMAX": ("kernels", "torch"),  # nn/edge_softmax.py
    "NEUTRONORCH_SYSTEM_MALLOC": ("0", "1"),  # train/memory.py
    # workqueue is numba's, but refused: it cannot run kernels from several threads (train/resources.py)
    "NUMBA_THREADING_LAYER": ("default", "omp", "tbb", "threadsafe", "safe", "forksafe"),
}
# name -> the least whole number it takes
COUNTS = {"NUMBA_NUM_THREADS": 1, "WORLD_SIZE": 1, "LOCAL_WORLD_SIZE": 1, "RANK": 0, "LOCAL_RANK": 0,
          "GROUP_RANK": 0}
WORKQUEUE = ("NUMBA_THREADING_LAYER=workqueue cannot run numba kernels from several threads at once, as "
             "neutronorch's pipeline does (numba would abort the run). Unset it (neutronorch then uses omp) or set "
             "it to omp or tbb.")


def check_environment(environ=None) -> None:
    """Every variable of ``CHOICES`` and ``COUNTS`` that is set holds a value it takes."""
    environ = os.environ if environ is None else environ
    for name, allowed in CHOICES.items():
        value = environ.get(name)
        if value is None or (value == "" and name.startswith("NEUTRONORCH_")):  # empty: unset, as the code reads it
            continue
        if name == "NUMBA_THREADING_LAYER" and value.strip().lower() == "workqueue":
            raise ConfigError(WORKQUEUE)
        if (value.strip().lower() if name.startswith("NUMBA_") else value) not in allowed:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}; set it to one of them, or unset "
                              f"it{_default(name)}.")
    for name, least in COUNTS.items():
        value = environ.get(name)
        if value is None:
            continue
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is None or number < least:
            raise ConfigError(f"{name}={value!r} is not a whole number from {least}; set it to one, or unset "
                              f"it{_default(name)}.")


def _default(name: str) -> str:
    return {"NEUTRONORCH_DEVICE_SAMPLER": " (auto: Triton on CUDA where it runs, else torch)",
            "NEUTRONORCH_EDGE_SOFTMAX": " (kernels)", "NEUTRONORCH_SYSTEM_MALLOC": " (0: malloc tuned)",
            "NUMBA_THREADING_LAYER": " (neutronorch then uses omp)",
            "NUMBA_NUM_THREADS": " (numba then takes one per core)"}.get(name, " (a launcher such as torchrun sets it)")


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
