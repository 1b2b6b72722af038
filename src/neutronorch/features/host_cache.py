"""The host feature cache, for memory-mapped features larger than the memory left for them: the hottest rows
in memory, every other row copied once, in vertex order, into a file of cold rows, so that a mini-batch read
in file order passes over that file only. How it is built, sized by measurement (a watcher thread:
``memory.measured_rows``, ``memory.rows_to_free``) and shrunk: docs/memory.md, "A host feature cache".

``where[v]`` says where v's row is: ``-1 - slot`` for a cached row (slots hottest first), otherwise its row
in the cold source. Gathers read through ``reading()``, which a resize waits for.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import shutil
import tempfile
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from neutronorch.features import memory
from neutronorch.features.memory import (GiB, AutoSize, available_memory_bytes, mapped_file_bytes,
                                          process_anonymous_bytes)

logger = logging.getLogger("neutronorch")

COPY_BYTES = 16 << 20  # rows read per step of the copy (its copies are the build's only transient memory)
WARMUP_GATHERS = 8  # gathers before sizing: the pipeline's buffers filled and the first training steps run
POLL_WARMUP_S = 0.005  # sampling the working memory while it is measured (a training step's peak is brief)
POLL_S = 0.1  # watching the memory available afterwards


class _State:
    """``where`` every row is; ``table``'s slot ``i`` holds vertex ``hot[i]``'s row (in ``buffer``, whose pages
    can be handed back); ``cold``: the file of cold rows (open as ``fd``), or the features in place."""

    def __init__(self, where, table, hot, cold, cold_file, fd=None, buffer=None):
        self.where, self.table, self.hot, self.cold, self.cold_file = where, table, hot, cold, cold_file
        self.fd, self.buffer = fd, buffer

    def __del__(self):
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)


class _ReadWrite:
    """Many gathers at once, or one resize (which new gathers wait for)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._readers = self._waiting = 0
        self._writing = False

    @contextlib.contextmanager
    def read(self):
        with self._cond:
            self._cond.wait_for(lambda: not (self._writing or self._waiting))
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def write(self):
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not (self._writing or self._readers))
            self._waiting, self._writing = self._waiting - 1, True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class HostCache:
    """``hot`` vertices' rows in memory (``table``), every other row in ``cold`` (see the module docstring).
    With ``auto``, ``hot`` are the candidates, hottest first: the cache starts empty and sizes itself."""

    def __init__(self, features: np.ndarray, hot: np.ndarray, directory: str | None = None,
                 auto: AutoSize | None = None):
        self.features, self.directory, self.auto = features, directory, auto
        self._guard = _ReadWrite()
        self.seconds = 0.0
        self.gathers = 0
        self.sizing: dict | None = None  # auto: what was measured, and the shrinks since
        hot = np.asarray(hot, np.int64)
        if auto is None:
            self._state = self._build(hot)
            return
        num_rows = features.shape[0]
        index = np.int32 if num_rows < 2**31 else np.int64
        self._state = _State(np.arange(num_rows, dtype=index), features[:0], hot[:0], features, False)
        self._candidates = hot
        self._warmup = WARMUP_GATHERS if auto.warmup is None else auto.warmup
        self._peak = 0
        self._keep = self._growth = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._watcher = threading.Thread(target=_watch, args=(weakref.ref(self), self._stop, self._wake),
                                         name="host-cache", daemon=True)
        weakref.finalize(self, self._stop.set)
        self._watcher.start()

    # What the gathers and the summary read (``reading`` gives the gathers a consistent view).
    where = property(lambda self: self._state.where)
    table = property(lambda self: self._state.table)
    cold = property(lambda self: self._state.cold)
    cold_file = property(lambda self: self._state.cold_file)
    rows = property(lambda self: int(self._state.table.shape[0]))

    @contextlib.contextmanager
    def reading(self):
        """(``where``, ``table``, ``cold``) for one gather; a resize waits until it has finished."""
        with self._guard.read():
            state = self._state
            yield state.where, state.table, state.cold
        self.gathers += 1  # approximate under concurrent gathers: it only decides when to size
        if self.auto is not None and self.sizing is None and self.gathers >= self._warmup:
            self._wake.set()

    def close(self) -> None:
        """Stop watching the memory (the cache stays as it is)."""
        if self.auto is not None:
            self._stop.set()
            self._wake.set()
            self._watcher.join()

    def describe(self) -> str:
        return (f"{self.rows:,} rows ({self.table.nbytes / GiB:.2f} GiB) in memory, "
                + (f"{self.cold.shape[0]:,} copied to a file of cold rows" if self.cold_file
                   else "the others read in place") + f"; built in {self.seconds:.1f} s")

    def summary(self, rows_gathered: int, hits: int) -> dict:
        """Its size, whether the rows it misses were copied to a file of their own, and the share of the host's
        ``rows_gathered`` it served (``hits``); sized by measurement, what was measured (``sizing``)."""
        out = {"rows": self.rows, "gib": round(self.table.nbytes / GiB, 3), "cold_file": self.cold_file,
               "build_seconds": round(self.seconds, 2), "hit_rate": hits / rows_gathered if rows_gathered else None}
        return out | ({"sizing": dict(self.sizing) if self.sizing else None} if self.auto is not None else {})

    def _tick(self) -> float:
        """One look at the memory; the seconds until the next."""
        anon = process_anonymous_bytes()
        self._peak = max(self._peak, anon or 0)
        if self.sizing is None:
            if self.gathers < self._warmup:
                return POLL_WARMUP_S
            self._size(anon)
            return POLL_S
        available = available_memory_bytes()
        if available is not None and not self.sizing.get("stopped"):
            row_bytes = max(1, self.features.strides[0])
            count = memory.rows_to_free(row_bytes, self.rows, available, self._keep, self._growth)
            if count:
                self._shrink(count, available)
        return POLL_S

    def _size(self, anon: int | None) -> None:
        available = available_memory_bytes()
        row_bytes = max(1, self.features.strides[0])
        if available is None or anon is None:
            self.sizing = {"gathers": self.gathers, "stopped": "memory unknown"}
            logger.warning("host feature cache: the available or the process's memory cannot be read: no cache "
                           "(give host_cache_gb)")
            return
        files = mapped_file_bytes(self.auto.exclude) or 0
        self._keep = files + self.auto.files + memory.STREAM_BYTES
        rows, self._growth = memory.measured_rows(row_bytes, len(self._candidates), available, anon, self._peak,
                                           self._keep, self.auto.ranks)
        self.sizing = {"gathers": self.gathers, "working_gib": round(self._peak / GiB, 3),
                       "available_gib": round(available / GiB, 3), "keep_gib": round(self._keep / GiB, 3),
                       "growth_gib": round(self._growth / GiB, 3), "sized_rows": int(rows),
                       "sized_gib": round(rows * row_bytes / GiB, 3),
                       "shrinks": 0, "shrunk_gib": 0.0}
        why = (f"{available / GiB:.2f} GiB available beside {anon / GiB:.2f} GiB of working memory, which peaked at "
               f"{self._peak / GiB:.2f} GiB over the first {self.gathers} gathers; kept: "
               f"{self._keep / GiB:.2f} GiB for the page cache of mapped files ({files / GiB:.2f} GiB), the "
               f"topology ({self.auto.files / GiB:.2f} GiB) and cold rows, {self._growth / GiB:.2f} GiB for the "
               f"working memory to grow" + (f"; shared by {self.auto.ranks} ranks" if self.auto.ranks > 1 else ""))
        if rows == 0:
            logger.info(f"no host feature cache ({why}): rows are read from the features in place")
            return
        state = self._build(self._candidates[:rows])
        with self._guard.write():
            self._state = state
        self._candidates = None
        logger.info(f"host feature cache sized after the first mini-batches ({why}): {self.describe()}")

    def _shrink(self, count: int, available: int) -> None:
        """Give up the ``count`` coldest cached rows: appended to the cold file (or read in place without
        one), their memory handed back."""
        state = self._state
        keep = self.rows - count
        row_bytes = self.features.strides[0]
        slots = np.arange(keep, self.rows)
        evicted = state.hot[keep:]
        by_vertex = np.argsort(evicted, kind="stable")
        slots, evicted = slots[by_vertex], evicted[by_vertex]
        cold = state.cold
        if state.cold_file:
            start = cold.shape[0]
            step = max(1, COPY_BYTES // row_bytes)
            try:  # beyond the mapped length: no gather reads there yet
                for begin in range(0, count, step):
                    block = np.ascontiguousarray(state.table[slots[begin:begin + step]])
                    _pwrite(state.fd, memoryview(block.view(np.uint8)), (start + begin) * row_bytes)
                cold = _map(state.fd, self.features, start + count)
            except OSError as exc:
                self.sizing["stopped"] = f"could not extend the file of cold rows: {exc}"
                logger.warning(f"host feature cache: memory is short, but the cold rows it would give up could "
                               f"not be written ({exc}); it keeps its size")
                return
            places = np.arange(start, start + count, dtype=state.where.dtype)
        else:
            places = evicted.astype(state.where.dtype)
        with self._guard.write():
            state.where[evicted] = places
            state.cold = cold
            state.table = state.table[:keep]
            state.hot = state.hot[:keep]
        if state.buffer is not None:  # hand the rows' pages back
            first = -(-keep * row_bytes // mmap.PAGESIZE) * mmap.PAGESIZE
            if first < len(state.buffer):
                state.buffer.madvise(mmap.MADV_DONTNEED, first, len(state.buffer) - first)
        self.sizing["shrinks"] += 1
        self.sizing["shrunk_gib"] = round(self.sizing["shrunk_gib"] + count * row_bytes / GiB, 3)
        logger.info(f"memory short ({available / GiB:.2f} GiB available, {self._keep / GiB:.2f} GiB needed for the "
                    f"page cache): host feature cache shrunk by {count * row_bytes / GiB:.2f} GiB to {keep:,} rows")

    def _build(self, hot: np.ndarray) -> _State:
        """The cache of ``hot`` (hottest first): one pass over the features."""
        features, directory = self.features, self.directory
        start = time.perf_counter()
        num_rows = features.shape[0]
        hot = hot[np.sort(np.unique(hot, return_index=True)[1])]  # each once, in their order
        is_hot = np.zeros(num_rows, bool)
        is_hot[hot] = True
        rows = hot.shape[0]
        index = np.int32 if num_rows < 2**31 else np.int64
        where = np.empty(num_rows, index)
        where[hot] = -1 - np.arange(rows, dtype=index)  # slots hottest first: a shrink gives up the coldest
        where[~is_hot] = np.arange(num_rows - rows, dtype=index)  # cold rows in vertex order
        buffer, table = memory.releasable_array((rows,) + features.shape[1:], features.dtype)
        cold_bytes = (num_rows - rows) * features.strides[0]
        # Sized by measurement, a file even for no row: a shrink appends the rows it gives up to it.
        path = self._cold_path(features, directory, cold_bytes, always=self.auto is not None)
        cold_file = path is not None
        step = max(1, COPY_BYTES // max(1, features.strides[0]))
        if features.nbytes >= GiB:
            logger.info(f"host feature cache: copying {table.nbytes / GiB:.2f} GiB of rows into memory"
                        + (f" and {cold_bytes / GiB:.2f} GiB to {path}" if path else "")
                        + " in one pass over the features")
        fd = None
        try:
            # Removed as soon as it is open (it lives on while open): nothing is left behind, even when the run
            # ends or is killed while it is being built.
            opened = open(path, "w+b") if path else contextlib.nullcontext()
            if path:
                _remove(path)
            with opened as out:
                for begin in range(0, num_rows, step):
                    block = np.asarray(features[begin:begin + step])
                    hot_here = is_hot[begin:begin + step]
                    if rows:
                        table[-1 - where[begin:begin + step][hot_here]] = block[hot_here]
                    if out is not None and cold_file:
                        cold_file = self._write(out, block[~hot_here], path)
                if cold_file:
                    out.flush()
                    fd = os.dup(out.fileno())  # kept for a shrink to append to
        finally:
            if path:
                _remove(path)
        if not cold_file:  # no file, or writing it failed: misses read from the features in place
            where[~is_hot] = np.flatnonzero(~is_hot)
            cold = features
        else:
            cold = _map(fd, features, num_rows - rows) if rows < num_rows else features[:0]
        self.seconds = time.perf_counter() - start
        return _State(where, table, hot, cold, cold_file, fd, buffer)

    @staticmethod
    def _write(out, rows: np.ndarray, path: str) -> bool:
        """Append cold rows to the file; where that fails (a full disk), say so: the run goes on without it."""
        try:
            return out.write(memoryview(np.ascontiguousarray(rows).view(np.uint8))) is not False
        except OSError as exc:
            logger.warning(f"could not write the host cache's file of cold rows {path} ({exc}): rows not cached "
                           f"are read from the features in place (give host_cache_dir)")
            return False
    @staticmethod
    def _cold_path(features: np.ndarray, directory: str | None, size: int, always: bool = False) -> str | None:
        """A new file for the cold rows: in ``directory``, else next to the features, else in the temporary
        directory; the first with room for ``size`` bytes (and a margin). None where none has room."""
        if size == 0 and not always:
            return None
        candidates = [directory] if directory else []
        filename = getattr(features, "filename", None)
        if not directory and filename:
            candidates.append(str(Path(filename).parent))
        if not directory:
            candidates.append(tempfile.gettempdir())
        for folder in candidates:
            try:
                if shutil.disk_usage(folder).free < size + (size >> 4) + (64 << 20):
                    continue
                handle, path = tempfile.mkstemp(prefix=".neutronorch-cold-rows-", suffix=".bin", dir=folder)
                os.close(handle)
                return path
            except OSError:
                continue
        logger.warning(f"no room for the host cache's file of cold rows ({size / GiB:.2f} GiB) in "
                       f"{' or '.join(candidates)}: rows not cached are read from the features in place, "
                       f"each mini-batch passing over the whole file (give host_cache_dir)")
        return None


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):  # where an open file cannot be removed, it stays until the run ends
        os.unlink(path)


def _map(fd: int, features: np.ndarray, rows: int) -> np.memmap:  # the cold file's first ``rows`` rows
    with os.fdopen(os.dup(fd), "rb") as handle:
        return np.memmap(handle, dtype=features.dtype, mode="r", shape=(rows,) + features.shape[1:])


def _pwrite(fd: int, data: memoryview, offset: int) -> None:  # all of ``data``, at ``offset``
    while len(data):
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def _watch(ref, stop: threading.Event, wake: threading.Event) -> None:
    """The watcher thread of a cache sized by measurement (``ref``: a weak reference to it)."""
    interval = POLL_WARMUP_S
    while not stop.is_set():
        wake.wait(interval)
        wake.clear()
        cache = ref()
        if cache is None or stop.is_set():
            return
        try:
            interval = cache._tick()
        except Exception as exc:  # the cache stays as it is; training goes on
            logger.warning(f"host feature cache: sizing stopped ({type(exc).__name__}: {exc})")
            return
        finally:
            del cache
