"""One epoch's iteration of a loader (``EpochIterator``): its batches, their thread, its producer."""

from __future__ import annotations

import threading
from typing import Iterator

from neutronorch.errors import ConfigError

__all__ = ["EpochIterator"]


class EpochIterator:
    """One epoch's batches: an iterator (with ``len``) and a context manager. Its producer thread stops when
    the epoch is done, when it is closed, or when it is dropped (``break``, an exception).

    An iteration belongs to the thread that last took a batch from it (at first, the one that made it): a
    second thread taking batches at the same time, or opening a new iteration of the loader while this one
    is unfinished, is refused with a ``ConfigError`` (the loader has one iteration at a time; each thread
    needs a loader of its own)."""

    def __init__(self, batches: Iterator, epoch: int, start: int, length: int, loader: str = "loader"):
        self._batches = batches
        self.epoch, self.start, self._length = epoch, start, length
        self._loader, self._taken, self._done = loader, 0, False
        self._owner = threading.current_thread()
        self._next_lock = threading.Lock()

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self):
        if not self._next_lock.acquire(blocking=False):
            self._refuse("a batch cannot be taken while another is")
        try:
            self._owner = threading.current_thread()
            batch = next(self._batches)
            self._taken += 1
            return batch
        except BaseException:  # the epoch's end, or an error that ended its generator
            self._done = True
            raise
        finally:
            self._next_lock.release()

    def __len__(self) -> int:
        return self._length

    def _check_thread(self, what: str) -> None:
        """Refuse ``what`` from this thread while another thread iterates this unfinished epoch."""
        owner = self._owner
        if not self._done and owner is not threading.current_thread() and owner.is_alive():
            self._refuse(what)

    def _refuse(self, what: str) -> None:
        raise ConfigError(
            f"{self._loader}: {what} in thread {threading.current_thread().name!r}: thread "
            f"{self._owner.name!r} is iterating it (epoch {self.epoch}, {self._taken} of {self._length} batches "
            f"taken), and a loader runs one iteration at a time. Give each thread a loader of its own, or "
            f"iterate in one thread (set_epoch(e) or iter_from(start, epoch) choose the epoch).")

    def close(self) -> None:
        if not self._next_lock.acquire(blocking=False):
            self._refuse("the iteration cannot close while it takes a batch")
        try:
            self._done = True
            self._batches.close()
        finally:
            self._next_lock.release()

    def __enter__(self) -> "EpochIterator":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
