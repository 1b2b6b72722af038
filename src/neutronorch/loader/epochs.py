"""Epochs as every loader has them: each iteration one epoch, its order and draws from (seed, epoch, batch),
resume from a batch, and the producer thread's lifetime.

``EpochSource`` is the part of ``base.py``'s ``EpochLoader`` (``NeighborLoader``, ``LinkNeighborLoader``)
that knows no mode: the loader says how an epoch's batches are produced (``_produce(epoch, start)``: a
generator that runs its mode's producer under a ``with``, so the thread stops when the generator is closed)
and what its mode releases (``_close_mode``). Each ``iter(loader)`` runs epoch
``loader.epoch`` and moves it on by one, as an unchanged PyG loop that iterates the loader once per epoch
expects.
"""

from __future__ import annotations

import threading
import weakref
from typing import Iterator

import torch

from neutronorch.errors import ConfigError
from neutronorch.limits import check_seed, check_switch
from neutronorch.loader.arguments import check_count
from neutronorch.orchestration.seeds import epoch_order

__all__ = ["EpochSource", "EpochIterator"]


class EpochSource:
    """Batches of ``batch_size`` of ``_count`` items (seeds or seed edges), one epoch per iteration. A
    subclass calls ``_epochs`` from its constructor, then ``_check_start``."""

    items = "seeds"  # what an epoch is made of, in messages
    mode = None  # the subclass's mode, None once closed

    def _epochs(self, count: int, batch_size, seed, epoch, shuffle, drop_last) -> None:
        self._count = count
        self.batch_size = check_count("batch_size", batch_size, 1)
        self.seed = check_seed(check_count("seed", seed, 0))
        self.epoch = check_count("epoch", epoch, 0)
        self.shuffle, self.drop_last = check_switch(shuffle, "`shuffle`"), check_switch(drop_last, "`drop_last`")
        if self.drop_last and count < self.batch_size:
            raise ConfigError(f"`drop_last` with `batch_size` {self.batch_size}: the {count:,} {self.items} fill no "
                              f"whole batch, so every epoch would be empty. Give a batch_size of at most "
                              f"{count:,}, or drop_last=False.")
        self._active: weakref.ref | None = None
        self._iterating = threading.Lock()  # one thread at a time opens or closes an iteration

    def _check_start(self, start) -> int:
        start = check_count("start", start, 0)
        if start > len(self):
            raise ConfigError(f"`start` {start}: an epoch has {len(self)} batches of the {self._count:,} "
                              f"{self.items} (batch size {self.batch_size}); start at 0..{len(self)}.")
        return start

    def _produce(self, epoch: int, start: int) -> Iterator:
        """Batches ``start``, ``start + 1``, ... of ``epoch`` (a subclass's)."""
        raise NotImplementedError

    def _close_mode(self) -> None:
        """Release what the mode holds (a subclass's)."""
        raise NotImplementedError

    # -- epochs ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches in an epoch."""
        return self._count // self.batch_size if self.drop_last else -(-self._count // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (its order and draws)."""
        self.epoch = check_count("epoch", epoch, 0)

    def __iter__(self) -> "EpochIterator":
        start, self._start = self._start, 0
        return self.iter_from(start)

    def iter_from(self, start: int = 0, epoch: int | None = None) -> "EpochIterator":
        """Epoch ``epoch`` (default: the next, ``loader.epoch``) from batch ``start`` on: exactly the batches
        ``start``, ``start + 1``, ... that a whole iteration of that epoch yields. Closes an iteration still
        open; the epoch after this one comes next."""
        if self.mode is None:
            raise ConfigError(f"this {type(self).__name__} is closed (close(), or its `with` block ended); make a "
                              f"new one to iterate again.")
        epoch = self.epoch if epoch is None else check_count("epoch", epoch, 0)
        start = self._check_start(start)
        with self._iterating:
            self._close_active()
            self.epoch = epoch + 1
            iterator = EpochIterator(self._produce(epoch, start), epoch, start, len(self) - start,
                                     type(self).__name__)
            self._active = weakref.ref(iterator)
        return iterator

    def input_order(self, epoch: int) -> torch.Tensor:
        """Positions among the loader's items in the order epoch ``epoch`` takes them (the mode's own
        permutation)."""
        positions = torch.arange(self._count)
        return epoch_order(positions, self.seed, epoch) if self.shuffle else positions

    # -- lifetime -------------------------------------------------------------------------------------
    def _close_active(self) -> None:
        """Close the open iteration, which must be this thread's: a new iteration (or ``close``) from another
        thread while one runs would end it under its loop, a short epoch or batches of two epochs mixed."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active._check_thread("a new iteration cannot start" if self.mode is not None else "the loader cannot close")
            active.close()

    def close(self) -> None:
        """Stop the iteration in progress (its thread joined) and release what the mode holds."""
        with self._iterating:
            self._close_active()
            if self.mode is not None:
                self._close_mode()
                self.mode = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _describe(self) -> str:
        return f"{self.items}={self._count:,}"

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.graph.name}, fanouts={self.fanouts}, batch_size={self.batch_size}, "
                f"{self._describe()}, mode={self.mode_name}, device={self.device}, epoch={self.epoch}, "
                f"batches={len(self)})")


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
