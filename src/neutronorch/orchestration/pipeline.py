"""Run a producer ahead of its consumer in a background thread, through a bounded ``Channel`` of ``depth``
items. A producer's exception reaches the consumer at its next ``next()`` with the original traceback;
closing stops and joins the thread and releases what unconsumed items hold, so no thread outlives its
consumer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import numba

from neutronorch.orchestration.channel import Channel, Closed

_DONE = object()


def use_threads(count: int) -> None:
    """The calling thread's numba kernels run on at most ``count`` threads (numba keeps the count per thread)."""
    numba.set_num_threads(max(1, min(count, numba.config.NUMBA_NUM_THREADS)))


class Prefetcher:
    """Iterate over ``produce()``'s items, produced up to ``depth`` items ahead, on a thread whose numba
    kernels run on ``threads`` threads (``use_threads``; None: numba's count)."""

    def __init__(self, produce: Callable[[], Iterator], depth: int = 2, name: str = "prefetcher",
                 threads: int | None = None):
        self._channel = Channel(name, capacity=max(1, depth))
        self._produce = produce
        self._threads = threads
        self._next = 0
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        count = 0
        try:
            if self._threads is not None:
                use_threads(self._threads)
            items = self._produce()
            with contextlib.closing(items) if hasattr(items, "close") else contextlib.nullcontext():
                for item in items:  # a generator left early is closed here, on its thread
                    try:
                        self._channel.put(count, item)
                    except Closed:
                        _release(item)  # made as the consumer left: what it holds goes back too
                        raise
                    count += 1
            self._channel.put(count, _DONE)
        except Closed:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._channel.fail(exc)

    @property
    def pending(self) -> int:
        """Items produced ahead and not yet taken."""
        return len(self._channel)

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration  # stay exhausted on further calls
        item = self._channel.take(self._next)
        self._next += 1
        if item is _DONE:
            self._done = True
            raise StopIteration
        return item

    def close(self) -> None:
        for item in self._channel.close():
            _release(item)  # hand back what unconsumed items hold
        self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def _release(item) -> None:
    release = getattr(item, "release", None)
    if callable(release):
        release()


def leaving(items: Iterator, scope):
    """``items``, with ``scope`` (a context manager) entered before the first and left, on the thread that
    takes them, as they end: done, closed early (``Prefetcher`` closes them) or failed."""
    with scope:
        yield from items


def run_in(scope, work: Callable, *args):
    """``work(*args)`` within ``scope`` (a thread's body, as ``leaving`` wraps a producer's items)."""
    with scope:
        return work(*args)
