"""Feature gathering into reused buffers.

Gathering a few hundred thousand random rows into a freshly allocated tensor costs far more than the copy
itself (page faults on every new page), so gathers go into a small pool of buffers that are handed back
when the training step that used them has finished. On a CUDA machine the buffers are pinned, so the
copy to the device can be asynchronous. This module never copies the whole feature matrix.
"""

from __future__ import annotations

import collections
import copy
import queue
import threading
from typing import Mapping

import numpy as np
import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.features.memory import available_memory_bytes
from neutronorch.sampling import kernels


class BufferPool:
    """A fixed number of row buffers; ``acquire`` blocks while every buffer is in use.

    ``release_after(buffer, event)`` hands a buffer back once ``event`` (a CUDA event recorded after an
    asynchronous copy out of it) has completed: the producer never waits for its own copy, and a buffer is
    never refilled while a copy still reads it."""

    def __init__(self, count: int, width: int, dtype: torch.dtype = torch.float32, pin: bool = False):
        self.width, self.dtype, self.pin = width, dtype, pin
        self._free: queue.Queue = queue.Queue()
        self._pending: collections.deque = collections.deque()  # (event, buffer), oldest first
        self._lock = threading.Lock()
        for _ in range(count):
            self._free.put(torch.empty((0, width), dtype=dtype))

    def acquire(self, rows: int) -> torch.Tensor:
        buffer = self._take()
        if buffer.shape[0] < rows:
            # Grow with headroom so a slightly larger batch later does not reallocate again.
            capacity = int(rows * 1.25) + 1024
            buffer = torch.empty((capacity, self.width), dtype=self.dtype, pin_memory=self.pin)
        return buffer

    def _take(self) -> torch.Tensor:
        while True:
            with self._lock:
                still = collections.deque()
                for event, buffer in self._pending:
                    if event.query():
                        self._free.put(buffer)
                    else:
                        still.append((event, buffer))
                self._pending = still
                if self._free.empty() and self._pending:
                    event, buffer = self._pending.popleft()
                    event.synchronize()  # every buffer is in flight: wait for the oldest copy only
                    return buffer
            try:
                return self._free.get(timeout=0.05)
            except queue.Empty:
                continue  # held by the trainer; a buffer may meanwhile have been handed back after an event

    def release(self, buffer: torch.Tensor) -> None:
        self._free.put(buffer)

    def release_after(self, buffer: torch.Tensor, event) -> None:
        with self._lock:
            self._pending.append((event, buffer))


def beyond_memory(arrays: list[np.ndarray], available: int | None = None, reserve: int = 0) -> bool:
    """Whether the memory maps among ``arrays`` should be read in file order (``kernels.region_order``): when
    together they are larger than half the memory left (``available``, by default measured now) beside
    ``reserve`` (the run's own working memory, still to be allocated), the page cache may not keep them, and
    rows gathered in batch order make readahead bring pages evicted before use, again and again. While they
    fit, file order is slower (its writes are scattered): docs/memory.md, "Reads in file order"."""
    mapped = sum(a.nbytes for a in arrays if isinstance(a, np.memmap))
    if not mapped:
        return False
    available = available_memory_bytes() if available is None else available
    return available is not None and mapped > (available - reserve) // 2


class FeatureStore:
    """Host-resident features (a numpy array or memory map) gathered by row ids, as rows of ``dtype``
    (float32, or bfloat16 for bfloat16 training: half the bytes written and copied). With a ``HostCache``
    (``host_cache``) rows come from its memory or its file of cold rows; ``take_counts`` says how many."""

    def __init__(self, features: np.ndarray, labels: np.ndarray | None = None, dtype: torch.dtype = torch.float32,
                 ordered: bool | None = None):
        self.features = features
        self.dtype = dtype
        self.ordered = beyond_memory([features]) if ordered is None else ordered
        self.rows_per_region = max(1, kernels.REGION_BYTES // max(1, features.strides[0]))
        # Small; a writable copy (a class id per vertex, or a 0/1/-1 row per vertex for multi-label tasks). None:
        # a typed graph's featured type, whose labels (the target's) the run reads on its own.
        self.labels = None if labels is None else torch.from_numpy(np.array(labels, dtype=np.int64))
        self.host_cache = None
        self._counts = _Counts()

    def as_dtype(self, dtype: torch.dtype) -> "FeatureStore":
        """The same features gathered as ``dtype`` (this store when it already is)."""
        if dtype == self.dtype:
            return self
        other = copy.copy(self)
        other.dtype = dtype
        return other

    @property
    def width(self) -> int:
        return int(self.features.shape[1])

    def take_counts(self) -> tuple[int, int]:
        """(rows gathered, of which served by the host cache) since the last call."""
        return self._counts.take()

    def gather_into(self, rows: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
        """Copy ``features[rows]`` into the front of ``buffer`` (converted to its dtype); return that view."""
        out = buffer[:rows.shape[0]]
        ids = rows.numpy()
        cache = self.host_cache
        if cache is None:
            order = (kernels.region_order(ids, self.rows_per_region, self.features.shape[0]) if self.ordered
                     else kernels.NO_ORDER)
            kernels.gather_stored(self.features, ids, order, out)
            self._counts.add(ids.shape[0], 0)
            return out
        with cache.reading() as (where_of, table, cold):  # a consistent view: the cache may resize itself
            where = where_of[ids]
            cold_rows = cold.shape[0]
            order, hits = kernels.split_order(where, self.rows_per_region if self.ordered else max(1, cold_rows),
                                              max(1, cold_rows))
            if hits:  # a part of ``order`` visits only those positions; an empty one would visit every one
                kernels.gather_stored(table, -1 - where, order[:hits], out)
            if hits < ids.shape[0]:
                kernels.gather_stored(cold, where, order[hits:], out)
        self._counts.add(ids.shape[0], int(hits))
        return out

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Allocate and fill (for cold paths such as inference)."""
        return self.gather_into(rows, torch.empty((rows.shape[0], self.width), dtype=self.dtype))


class _Counts:
    """Rows gathered and host-cache hits, added from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._rows = self._hits = 0

    def add(self, rows: int, hits: int) -> None:
        with self._lock:
            self._rows += rows
            self._hits += hits

    def take(self) -> tuple[int, int]:
        with self._lock:
            taken, self._rows, self._hits = (self._rows, self._hits), 0, 0
        return taken


class TypedInputs:
    """``inputs(frontier, device) -> (features, ids)``, what the typed modes are handed: the rows of every
    featured type's ids in ``frontier`` (float32) and every type's ids, both on ``device``. Each featured type's
    rows come from a ``FeatureStore`` over its array (``stores``: a run's from ``reading.typed_stores``;
    default: one per featured type, as ``FeatureStore`` decides)."""

    def __init__(self, graph: TypedGraph, stores: Mapping[str, FeatureStore] | None = None):
        self.stores = dict(stores) if stores is not None else {t: FeatureStore(rows)
                                                               for t, rows in graph.features.items()}
        self._moved: dict[str, tuple[int, int]] = {}  # (rows gathered, host-cache hits) per type, summarised

    def __call__(self, frontier: Mapping[str, torch.Tensor], device: torch.device
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        features = {t: rows.to(device) for t, rows in self.rows(frontier).items()}
        return features, {t: ids.to(device) for t, ids in frontier.items()}

    def rows(self, frontier: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every featured type's rows of ``frontier``'s ids, on the host (tensors of their own)."""
        return {t: self.stores[t].gather(ids) for t, ids in frontier.items() if t in self.stores}

    def summary(self) -> dict:
        """``host_cache`` and ``read_order`` as a homogeneous run's summary has them, summed over the cached
        types with each type's own under ``types`` (docs/memory.md, "Typed graphs' features")."""
        for t, store in self.stores.items():
            self._moved[t] = tuple(a + b for a, b in zip(self._moved.get(t, (0, 0)), store.take_counts()))
        caches = {t: store.host_cache.summary(*self._moved[t]) for t, store in self.stores.items()
                  if store.host_cache is not None}
        rows, hits = (sum(self._moved[t][i] for t in caches) for i in (0, 1))
        host_cache = None if not caches else {
            "rows": sum(c["rows"] for c in caches.values()), "gib": round(sum(c["gib"] for c in caches.values()), 3),
            "cold_file": all(c["cold_file"] for c in caches.values()),
            "build_seconds": round(sum(c["build_seconds"] for c in caches.values()), 2),
            "hit_rate": hits / rows if rows else None, "types": caches}
        ordered = any(store.ordered for store in self.stores.values())
        return {"host_cache": host_cache, "read_order": {"features": "file" if ordered else "batch",
                                                         "topology": "batch"}}

