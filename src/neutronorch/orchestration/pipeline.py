"""Run a producer ahead of its consumer in a background thread, through a bounded queue.

The producer's heavy work (numba kernels, torch ops) releases the GIL, so it overlaps with the training
step. An exception in the producer reaches the consumer at its next ``next()`` with the original
traceback; closing the prefetcher (or leaving its ``with`` block) stops and joins the thread, so no thread
outlives its consumer.
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterator

_DONE = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher:
    """Iterate over ``produce()``'s items, produced up to ``depth`` items ahead."""

    def __init__(self, produce: Callable[[], Iterator], depth: int = 2, name: str = "prefetcher",
                 on_start: Callable[[], None] | None = None):
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._produce = produce
        self._on_start = on_start
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            if self._on_start is not None:
                self._on_start()
            for item in self._produce():
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(_Failure(exc))

    @property
    def pending(self) -> int:
        """Items produced ahead and not yet taken."""
        return self._queue.qsize()

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                item = self._queue.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("prefetch thread ended without a result") from None
        if item is _DONE:
            self._queue.put(_DONE)  # stay exhausted on further calls
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive() or not self._queue.empty():
            # Unblock a producer waiting on a full queue, and hand back what unconsumed items hold.
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            release = getattr(item, "release", None)
            if callable(release):
                release()
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
