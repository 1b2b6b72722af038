"""The one way state crosses threads between pipeline stages: a keyed channel that can be closed or failed.

A producer ``put``s an item under a key (a super-batch id); a consumer ``take``s it, waiting until it is
there. ``fail(exc)`` hands an error to every waiting (and later) consumer, ``close()`` wakes them with
``Closed``: no thread ever waits on a stage that has died or been stopped.
"""

from __future__ import annotations

import threading


class Closed(Exception):
    """Raised in a thread waiting on a channel that was closed (the run is shutting down)."""


class Channel:
    """Items keyed by an integer, handed from one thread to another."""

    def __init__(self, name: str):
        self.name = name
        self._items: dict[int, object] = {}
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False

    def put(self, key: int, value) -> None:
        with self._cond:
            if self._closed:
                return
            self._items[key] = value
            self._cond.notify_all()

    def take(self, key: int, remove: bool = True):
        """The item under ``key``, waiting for it; raises the failure, or ``Closed``."""
        with self._cond:
            while key not in self._items:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise Closed(self.name)
                self._cond.wait(0.5)
            return self._items.pop(key) if remove else self._items[key]

    def drop(self, key: int) -> None:
        with self._cond:
            self._items.pop(key, None)

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()
