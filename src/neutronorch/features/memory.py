"""How much memory the process could still use: the machine's ``MemAvailable``, and under a memory cgroup
(v1 or v2) what its limit leaves beside the group's own anonymous memory. Page cache counts as available:
it is what memory-mapped features live in."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

GiB = 1 << 30
CGROUP_ROOT = Path("/sys/fs/cgroup")
# A host feature cache sized by measurement (``features/host_cache.py``) keeps, beside the cache:
STREAM_BYTES = 256 << 20  # page cache kept for reading the cold rows (readahead, the regions in flight)
GROWTH_SHARE = 0.05  # of the measured working memory kept for it to grow beyond its peak (at least GROWTH_MIN)
GROWTH_MIN = 128 << 20
SHRINK_MIN = 64 << 20  # the least one shrink frees


def available_memory_bytes() -> int | None:
    """The least of what ``/proc/meminfo`` and the process's memory cgroup allow; None if neither is known."""
    found = [value for value in (_meminfo_available(), _cgroup_room()) if value is not None]
    return min(found) if found else None


def fits_in_memory(array: np.ndarray) -> bool:
    """Whether a copy of ``array`` fits in the memory available now (arrays already in memory always do)."""
    available = available_memory_bytes() if isinstance(array, np.memmap) else None
    return available is None or array.nbytes <= available


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _cgroup_room(root: Path = CGROUP_ROOT, self_cgroup: str = "/proc/self/cgroup") -> int | None:
    """The memory cgroup's limit minus its anonymous memory (v1: ``memory.limit_in_bytes`` and ``total_rss``;
    v2: ``memory.max`` and ``anon``), or None without a limit."""
    try:
        lines = Path(self_cgroup).read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1
            group = root / "memory" / path.lstrip("/")
            return _room(group / "memory.limit_in_bytes", group / "memory.stat", "total_rss")
    for line in lines:
        if line.startswith("0::"):  # v2
            group = root / line[3:].lstrip("/")
            return _room(group / "memory.max", group / "memory.stat", "anon")
    return None


def _room(limit_file: Path, stat_file: Path, anon_key: str) -> int | None:
    try:
        text = limit_file.read_text().strip()
        if text == "max" or int(text) >= 1 << 60:  # v1 writes a huge number for "no limit"
            return None
        anon = 0
        for line in stat_file.read_text().splitlines():
            key, value = line.split()
            if key == anon_key:
                anon = int(value)
        return max(0, int(text) - anon)
    except (OSError, ValueError):
        return None


PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_anonymous_bytes(statm: str = "/proc/self/statm") -> int | None:
    """The process's anonymous resident memory now (resident minus file-backed and shared pages), None where
    ``/proc`` cannot say. Cheap enough to poll every few milliseconds."""
    try:
        with open(statm) as f:
            fields = f.read().split()
        return max(0, int(fields[1]) - int(fields[2])) * PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return None


def mapped_file_bytes(exclude: tuple[str, ...] = (), smaps: str = "/proc/self/smaps") -> int | None:
    """Resident bytes of the files the process has mapped (its libraries' code and data, above all), those
    whose path starts with one of ``exclude`` left out; None where ``/proc`` cannot say. These pages need
    the page cache too: squeezed out, they are read again and again."""
    total, counted = 0, False
    try:
        with open(smaps) as f:
            for line in f:
                head = line.split(None, 5)
                if not head:
                    continue
                if head[0] == "Rss:":
                    if counted:
                        total += int(head[1]) * 1024
                elif "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):  # a mapping's first line
                    path = head[5].strip() if len(head) > 5 else ""
                    counted = path.startswith("/") and not any(path.startswith(p) for p in exclude)
    except (OSError, IndexError, ValueError):
        return None
    return total


@dataclass
class AutoSize:
    """How a cache sized by measurement sizes itself: ``files`` bytes of mapped files that are read during
    training and need the page cache (the topology's, where it is memory-mapped), ``exclude`` the paths of
    mapped files not to count as the process's other mapped files (the features and those of ``files``),
    ``ranks`` processes of this machine sizing theirs from the same memory (each takes its share)."""

    files: int = 0
    exclude: tuple[str, ...] = ()
    ranks: int = 1
    warmup: int | None = None  # gathers before sizing (None: WARMUP_GATHERS)


def measured_rows(row_bytes: int, num_rows: int, available: int, anon_now: int, anon_peak: int, keep: int,
                  ranks: int = 1) -> tuple[int, int]:
    """Rows of a cache sized by measurement, and the margin left for the working memory to grow: the
    ``available`` memory (bytes; under a memory cgroup its limit minus its anonymous memory) less what the
    working memory may still take (up to its measured peak ``anon_peak``, from ``anon_now``, plus the
    margin), less ``keep`` for the page cache; shared among ``ranks``."""
    growth = max(GROWTH_MIN, int(GROWTH_SHARE * anon_peak))
    room = available - max(0, anon_peak - anon_now) - growth - keep
    return min(num_rows, max(0, room) // max(1, ranks) // max(1, row_bytes)), growth


def rows_to_free(row_bytes: int, rows: int, available: int, keep: int, growth: int) -> int:
    """Cached rows to give up when the ``available`` memory is below ``keep`` (what the page cache needs):
    enough to restore ``keep`` and the margin ``growth`` (at least ``SHRINK_MIN``), at most ``rows``."""
    if rows == 0 or available >= keep:
        return 0
    need = max(SHRINK_MIN, keep + growth - available)
    return min(rows, -(-need // max(1, row_bytes)))


def releasable_array(shape: tuple, dtype) -> tuple[mmap.mmap | None, np.ndarray]:
    """An array of ``shape`` in an anonymous mapping of its own, whose pages a shrink can hand back."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if nbytes == 0:
        return None, np.empty(shape, dtype)
    # Private: counted as the process's (and its cgroup's) anonymous memory, and freed by MADV_DONTNEED; a
    # shared anonymous mapping would be shared memory, counted as page cache, and keep its pages.
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return buffer, np.frombuffer(buffer, np.uint8).view(dtype).reshape(shape)
