"""The one way items cross threads between pipeline stages: a keyed channel that can be closed or failed.

``put`` an item under a key (waiting for room with a ``capacity``), ``take`` it (waiting until it is there).
``fail(exc)`` hands the error to every consumer once the items put before it are taken; ``close()`` wakes
every waiter with ``Closed`` and returns the items nobody took. No thread ever waits on a dead stage.
"""

from __future__ import annotations

import threading


class Closed(Exception):
    """Raised in a thread waiting on a channel that was closed (the run is shutting down)."""


class Channel:
    """Items keyed by an integer, handed from one thread to another."""

    def __init__(self, name: str, capacity: int | None = None):
        self.name = name
        self.capacity = capacity
        self._items: dict[int, object] = {}
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False

    def __len__(self) -> int:
        """Items put and not yet taken."""
        with self._cond:
            return len(self._items)

    def put(self, key: int, value) -> None:
        """Hand ``value`` over under ``key``; with a capacity, wait for room first (``Closed`` if closed)."""
        with self._cond:
            while self.capacity is not None and len(self._items) >= self.capacity and not self._closed:
                self._cond.wait(0.5)
            if self._closed:
                raise Closed(self.name)
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
            if not remove:
                return self._items[key]
            self._cond.notify_all()  # room for a waiting producer
            return self._items.pop(key)

    def drop(self, key: int) -> None:
        with self._cond:
            self._items.pop(key, None)
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def close(self) -> list:
        """Wake every waiter with ``Closed``; return the items nobody took."""
        with self._cond:
            self._closed = True
            left = list(self._items.values())
            self._items.clear()
            self._cond.notify_all()
        return left
