"""The host feature cache: the hottest rows in memory, the others in a compact file of their own.

For memory-mapped features larger than the memory left for them. Each mini-batch's rows are read in file
order (``--read-order file``), so a mini-batch costs about one pass over the stretch of the file its rows
are spread over; with the rows spread over the whole file, the page cache cannot keep any useful part of
it (each pass evicts the previous one's pages before they are used again), and memory given to a cache of
rows in place would shorten no pass. So the cache does two things at once:

- the ``rows`` hottest vertices' rows (ranked as the device cache ranks them, by presampling, below the rows
  the device cache already holds) are copied into memory, where nothing can evict them;
- every other row is copied once, in vertex order, into a file of cold rows, so each mini-batch's pass
  covers only that file: a cache of a share ``c`` of the rows shortens every pass to ``1 - c`` of the
  features.

Both come from one sequential read of the features at start-up. The cold file goes next to the features
(or wherever ``directory`` says, else the temporary directory) and is deleted as soon as it is mapped, so
nothing is left behind, even when the run is killed. Without the room for it (or when writing it fails),
misses are read from the features in place, and the log says so.

``where[v]`` says where v's row is: ``-1 - slot`` for a cached row, otherwise its row in the cold source.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger("neutronorch")

GiB = 1 << 30
# The share of the memory left beside the run's working memory that an automatic cache takes: the rest
# keeps the topology, the cold rows read most recently and whatever the estimate of working memory missed.
AUTO_SHARE = 0.6
COPY_BYTES = 64 << 20  # rows read per step of the start-up copy


def host_cache_rows(setting: str | float, features: np.ndarray, file_order: bool, available: int | None,
                    workspace: int) -> tuple[int, str]:
    """Rows of the host cache for ``setting`` (``TrainConfig.host_cache_gb``: a size in GiB, or ``auto``),
    and why. Only memory-mapped features are cached (rows already in memory need no second copy). ``auto``
    caches only where the features are read in file order, i.e. do not fit in the memory left
    (``file_order``): then ``AUTO_SHARE`` of what ``available`` (bytes, None: unknown) leaves beside
    ``workspace``."""
    row_bytes = max(1, features.strides[0])
    num_rows = features.shape[0]
    if not isinstance(features, np.memmap):
        return 0, "features in memory"
    if setting == "auto":
        if not file_order:
            return 0, "memory-mapped features fit in memory"
        if available is None:
            return 0, "available memory unknown: give host_cache_gb"
        budget = int(AUTO_SHARE * max(0, available - workspace))
        return min(num_rows, budget // row_bytes), (f"{AUTO_SHARE:.0%} of the {available / GiB:.2f} GiB available "
                                                   f"beside {workspace / GiB:.2f} GiB of working memory")
    return min(num_rows, int(float(setting) * GiB) // row_bytes), "host_cache_gb"


def sized_by_memory(setting: str | float, features: np.ndarray, file_order: bool) -> bool:
    """Whether ``host_cache_rows`` needs the available memory and the working memory for ``setting``."""
    return setting == "auto" and file_order and isinstance(features, np.memmap)


class HostCache:
    """``hot`` vertices' rows in memory (``table``), every other row in ``cold`` (see the module docstring)."""

    def __init__(self, features: np.ndarray, hot: np.ndarray, directory: str | None = None):
        start = time.perf_counter()
        num_rows = features.shape[0]
        is_hot = np.zeros(num_rows, bool)
        is_hot[np.asarray(hot, np.int64)] = True
        self.rows = int(is_hot.sum())
        index = np.int32 if num_rows < 2**31 else np.int64
        self.where = np.empty(num_rows, index)
        # Slots and cold rows in vertex order, as the copy below visits them.
        self.where[is_hot] = -1 - np.arange(self.rows, dtype=index)
        self.where[~is_hot] = np.arange(num_rows - self.rows, dtype=index)
        self.table = np.empty((self.rows,) + features.shape[1:], features.dtype)
        path = self._cold_path(features, directory, (num_rows - self.rows) * features.strides[0])
        self.cold_file = path is not None
        step = max(1, COPY_BYTES // max(1, features.strides[0]))
        if features.nbytes >= GiB:
            logger.info(f"host feature cache: copying {self.table.nbytes / GiB:.2f} GiB of rows into memory"
                        + (f" and {(num_rows - self.rows) * features.strides[0] / GiB:.2f} GiB to {path}" if path
                           else "") + " in one pass over the features")
        filled = 0
        try:
            with open(path, "wb") if path else contextlib.nullcontext() as out:
                for begin in range(0, num_rows, step):
                    block = np.asarray(features[begin:begin + step])
                    hot_here = is_hot[begin:begin + step]
                    count = int(hot_here.sum())
                    self.table[filled:filled + count] = block[hot_here]
                    filled += count
                    if out is not None and self.cold_file:
                        self._write(out, np.ascontiguousarray(block[~hot_here]), path)
            if not self.cold_file:  # no file, or writing it failed: misses read from the features in place
                self.where[~is_hot] = np.flatnonzero(~is_hot)
                self.cold = features
            else:
                self.cold = np.memmap(path, dtype=features.dtype, mode="r",
                                      shape=(num_rows - self.rows,) + features.shape[1:])
        finally:
            if path:
                _remove(path)  # the mapping keeps the file until it is closed; nothing is left behind
        self.seconds = time.perf_counter() - start

    def _write(self, out, rows: np.ndarray, path: str) -> None:
        """Append cold rows to the file; where that fails (a full disk), go on without the file."""
        try:
            out.write(rows.tobytes())
        except OSError as exc:
            logger.warning(f"could not write the host cache's file of cold rows {path} ({exc}): rows not cached "
                           f"are read from the features in place (give host_cache_dir)")
            self.cold_file = False

    def summary(self, rows_gathered: int, hits: int) -> dict:
        """Its size, whether the rows it misses were copied to a file of their own, and the share of the host's
        ``rows_gathered`` it served (``hits``)."""
        return {"rows": self.rows, "gib": round(self.table.nbytes / GiB, 3), "cold_file": self.cold_file,
                "build_seconds": round(self.seconds, 2), "hit_rate": hits / rows_gathered if rows_gathered else None}

    @staticmethod
    def _cold_path(features: np.ndarray, directory: str | None, size: int) -> str | None:
        """A new file for the cold rows: in ``directory``, else next to the features, else in the temporary
        directory; the first with room for ``size`` bytes (and a margin). None where none has room."""
        if size == 0:
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
    try:
        os.unlink(path)
    except OSError:  # where an open file cannot be removed, it stays until the run ends
        pass
