"""Process memory: peak and resident RSS, and keeping freed memory in the heap for the next step to reuse
(``keep_freed_memory``; why: README, Memory). The memory still available is ``features/memory.py``'s.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


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
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
