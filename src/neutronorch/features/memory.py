"""How much memory the process could still use: the machine's ``MemAvailable``, and under a memory cgroup
(v1 or v2) what its limit leaves beside the group's own anonymous memory. Page cache counts as available:
it is what memory-mapped features live in."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CGROUP_ROOT = Path("/sys/fs/cgroup")


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
