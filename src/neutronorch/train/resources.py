"""What a run takes from the process and the machine: its device, its threads per stage, the torch thread
count and the CUDA allocator's cap while it runs (each restored afterwards); its memory: peak and resident
RSS, and freed memory kept in the heap for the next step to reuse (``keep_freed_memory``, for the life of the
process; why: README, Memory). The memory still available is ``features/memory.py``'s."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource

import numba
import numba.np.ufunc.parallel
import torch

from neutronorch.config import TrainConfig
from neutronorch.environment import WORKQUEUE, check_environment
from neutronorch.errors import ConfigError
from neutronorch.orchestration.factory import Threads
from neutronorch.sampling.device_sampler import check_device_sampler

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_MMAP_MAX = -4
_MMAP_MAX_DEFAULT = 65536  # glibc's
RETURNED_BYTES = 1 << 20  # ``freed_blocks_returned``: blocks of this size and more get mappings of their own
_kept = {"applied": False}  # whether ``keep_freed_memory``'s settings are in effect


def resolve_device(name: str | torch.device) -> torch.device:
    """The device ``name`` says (auto: CUDA where there is one), refused unless it is a CPU or an available
    CUDA device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise ConfigError(f"`device` {name!r}: give cpu, cuda, cuda:N or auto.")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"`device` {name}: no CUDA device is available to this PyTorch "
                          f"(torch {torch.__version__}, cuda build: {torch.version.cuda or 'no'}). "
                          "Use `device` cpu, or install a CUDA build of PyTorch on a machine with a GPU.")
    return device


def thread_budget(config: TrainConfig, ranks_here: int = 1) -> Threads:
    """Threads per stage, set once so that the stages do not fight over cores. Producers get half the
    cores each: they do not run all the time, and the trainer waits for neither when they keep ahead.
    ``ranks_here`` data-parallel ranks on this machine share its cores equally."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cores = max(1, cores // max(1, ranks_here))
    numba_max = numba.config.NUMBA_NUM_THREADS
    half = max(1, min(cores, numba_max) // 2)
    return Threads(train=config.threads or cores, sampler=min(config.sampler_threads or half, numba_max),
                   host=min(config.host_threads or half, numba_max))


def check_threading_layer(device: torch.device | None = None) -> None:
    """The environment a run reads (``environment.py``; with ``device``, the device sampler asked for, checked
    to run there), and numba's threading layer: started here, so that one numba cannot load is named before
    any work, and refused if it is workqueue (asked for, or what ``default`` or ``forksafe`` fell back to):
    the producers and the trainer call numba's parallel kernels from several threads at once, which
    workqueue does not allow (it aborts the process)."""
    check_environment()
    layer = str(numba.config.THREADING_LAYER).lower()
    if layer == "workqueue":
        raise ConfigError(WORKQUEUE)
    torch_count = torch.get_num_threads()  # starting numba's OpenMP pool resets torch's count (numba_threads)
    try:
        numba.np.ufunc.parallel._launch_threads()
    except ValueError as exc:
        reason = str(exc).strip().splitlines()[0].rstrip(".")
        hint = " (pip install tbb)" if layer in ("tbb", "safe") else ""
        raise ConfigError(f"NUMBA_THREADING_LAYER={layer}: numba cannot load it here ({reason}). Install it"
                          f"{hint}, or unset the variable (neutronorch then uses omp).") from None
    finally:
        torch.set_num_threads(torch_count)
    if numba.threading_layer() == "workqueue":
        raise ConfigError(f"NUMBA_THREADING_LAYER={layer} gave numba's workqueue layer, which cannot run numba "
                          f"kernels from several threads at once, as neutronorch's pipeline does. Set it to omp "
                          f"or tbb, or unset it (neutronorch then uses omp).")
    if device is not None:
        check_device_sampler(device)


@contextlib.contextmanager
def torch_threads(count: int):
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def numba_threads(count: int):
    """numba's threads for the calling thread (numba keeps the count per thread), at most
    ``NUMBA_NUM_THREADS``; restored on leaving. torch's thread count is kept: numba's first call starts its
    OpenMP pool, which resets the count torch's OpenMP uses (torch ran 2 threads inside ``torch_threads(1)``
    entered before this)."""
    torch_count = torch.get_num_threads()  # first: numba's first call of any kind starts its pool
    before = numba.get_num_threads()
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))
    torch.set_num_threads(torch_count)
    try:
        yield
    finally:
        numba.set_num_threads(before)
        torch.set_num_threads(torch_count)


@contextlib.contextmanager
def memory_budget(device: torch.device, gigabytes: float | None):
    """Emulate a smaller GPU for the run: the caching allocator refuses what the budget does not hold.
    Lifted afterwards, so later runs in the same process get the whole device again."""
    if device.type != "cuda" or gigabytes is None:
        yield
        return
    # The allocator's cap needs a device index: ``--device cuda`` names none (the current device then).
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gigabytes * 2**30 / total), index)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def resident_mb() -> dict[str, float]:
    """Resident memory now, by kind (``/proc/self/status``): ``anon`` (this process's own), ``file``
    (mapped files: page cache that processes mapping the same files share), ``shmem``; empty where unknown."""
    kinds = {"RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem"}
    try:
        with open("/proc/self/status") as f:
            fields = [line.split() for line in f]
    except OSError:
        return {}
    return {kinds[words[0]]: round(int(words[1]) / 1024.0, 1)
            for words in fields if words and words[0] in kinds}


def return_freed_memory() -> bool:
    """Hand the heap's free pages back to the system now (glibc's ``malloc_trim``, which ``keep_freed_memory``'s
    thresholds do not stop); whether it applied. For a phase that follows a larger one: a partitioned rank's
    evaluation, whose layer rows would otherwise sit beside the freed batches of its epoch."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False  # not glibc: nothing to trim
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True


def keep_freed_memory() -> bool:
    """Configure glibc malloc to recycle large blocks; return whether it applied (glibc only)."""
    if os.environ.get("NEUTRONORCH_SYSTEM_MALLOC") == "1":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False  # not glibc (musl, macOS): nothing to tune
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # 2**31 - 1 bytes: the largest trim threshold mallopt accepts; the heap is never trimmed in practice.
    _kept["applied"] = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _kept["applied"]


@contextlib.contextmanager
def freed_blocks_returned():
    """While inside, where ``keep_freed_memory``'s settings are in effect: glibc gives each block of
    ``RETURNED_BYTES`` or more a mapping of its own, unmapped when it is freed, and trims the heap's free top
    beyond 8 MiB; on leaving, the settings that keep freed memory again. For a phase whose blocks differ in
    size from step to step and are not reused as a training step's are (a partitioned rank's evaluation:
    docs/results/partitioned-memory-2026-12-07.md): kept, the freed ones lie beside each new one and the heap
    grows to well over what is held at once; returned, each costs its page faults. Elsewhere, nothing."""
    mallopt = _mallopt() if _kept["applied"] else None
    if mallopt is None:
        yield
        return
    mallopt(_M_MMAP_THRESHOLD, RETURNED_BYTES)
    mallopt(_M_TRIM_THRESHOLD, 8 << 20)
    mallopt(_M_MMAP_MAX, _MMAP_MAX_DEFAULT)
    try:
        yield
    finally:  # blocks mapped inside are unmapped whenever they are freed, whatever the settings then
        mallopt(_M_MMAP_MAX, 0)
        mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)


def _mallopt():
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt
