"""The all-to-all exchange between the ranks of a partitioned run (docs/distributed.md, "Partitioned
training"): each rank hands one array to every rank, itself included, and gets one from each. The samplers and
row fetchers of the parts speak only through ``Exchange``, so they know no process group: ``train`` gives them
one over ``torch.distributed`` (gloo), and ``ThreadExchange`` runs the ranks as threads of one process.

Every rank must take part in every exchange, in the same order, even with nothing to send. ``Exchange``
counts the bytes a rank sends to and receives from the other ranks (its own share, which never leaves it, is
not counted), the sizes it announces included."""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import numpy as np

from neutronorch.errors import TrainingError

SIZE_BYTES = 8  # an announced size: one int64 per rank


def received_buffer(nbytes: int, into: Callable[[int], np.ndarray] | None) -> np.ndarray:
    """Where ``nbytes`` received bytes go: the start of ``into(nbytes)``, or a new array."""
    return np.empty(nbytes, np.uint8) if into is None else into(nbytes)[:nbytes]


class Exchange:
    """One rank's side of the exchange: ``all_to_all`` over ``_swap``, which a transport implements."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.sent_bytes = 0
        self.received_bytes = 0
        self.calls = 0

    def all_to_all(self, sends: list[np.ndarray], counts: list[int] | None = None) -> list[np.ndarray]:
        """``sends[r]`` to rank ``r``; returns what each rank sent to this one, in rank order. Every rank's
        arrays have one dtype and the same trailing shape (the first array's here), any number of rows.
        ``counts``: the rows each rank sends this one when this rank knows them (no sizes are exchanged)."""
        if len(sends) != self.size:
            raise ValueError(f"all_to_all: {len(sends)} arrays for {self.size} ranks")
        dtype, tail = sends[0].dtype, sends[0].shape[1:]
        row_bytes = dtype.itemsize * int(np.prod(tail, dtype=np.int64))
        chunks = [np.ascontiguousarray(array, dtype=dtype).reshape(-1).view(np.uint8) for array in sends]
        got = self.swap_bytes(chunks, None if counts is None else [n * row_bytes for n in counts])
        return [chunk.view(dtype).reshape((-1, *tail)) for chunk in got]

    def swap_bytes(self, chunks: list[np.ndarray], sizes: list[int] | None = None) -> list[np.ndarray]:
        """``all_to_all`` of byte arrays (uint8), ``sizes`` the bytes each rank sends this one if known."""
        send = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
        got, sizes = self.swap_packed(send, [int(chunk.shape[0]) for chunk in chunks], sizes)
        return np.split(got, np.cumsum(sizes)[:-1])

    def swap_packed(self, send: np.ndarray, send_sizes: list[int], sizes: list[int] | None = None,
                    into: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, list[int]]:
        """``swap_bytes`` of one byte buffer holding the bytes for each rank one after another
        (``send_sizes`` of them for each): returns one buffer of what each rank sent this one, in rank order,
        and their sizes. No array is split or joined on the way: a sender fills its buffer in place. ``into(n)``:
        a byte buffer (uint8) of at least n bytes that the n bytes received go to (None: a new one)."""
        announced = sizes is None
        got, sizes = self._swap(send, list(send_sizes), sizes, into)
        self.calls += 1
        others = [r for r in range(self.size) if r != self.rank]
        self.sent_bytes += sum(send_sizes[r] for r in others)
        self.received_bytes += sum(sizes[r] for r in others)
        if announced:
            self.sent_bytes += SIZE_BYTES * len(others)
            self.received_bytes += SIZE_BYTES * len(others)
        return got, sizes

    def unit(self):
        """The collectives of one unit of work (``Lane``: the ranks agree to begin it); here nothing."""
        return contextlib.nullcontext()

    def traffic(self) -> dict:
        """The bytes this rank sent and received so far, and its exchanges."""
        return {"sent_bytes": self.sent_bytes, "received_bytes": self.received_bytes, "exchanges": self.calls}

    def _swap(self, send: np.ndarray, send_sizes: list[int], sizes: list[int] | None,
              into: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, list[int]]:
        """The transport: ``send`` (``send_sizes[r]`` bytes for rank r, in rank order) out, one buffer of each
        rank's bytes to this one in (``received``'s), and their sizes (announced first when ``sizes`` is None)."""
        raise NotImplementedError


class Lane(Exchange):
    """The exchange of one thread whose ranks stop together, over ``inner`` (its transport; the bytes are
    counted here). Its collectives come in units (``unit()``), none of which waits for anything but the ranks
    within it; each unit begins with the ranks agreeing to go on (one byte from each). A thread leaving, done or
    stopped early, calls ``finish()`` once: that says stop to the others' next agreement, so a rank's thread
    never waits in a unit that another rank's will not begin (``LaneStopped`` ends theirs there)."""

    def __init__(self, inner: Exchange, what: str):
        super().__init__(inner.rank, inner.size)
        self.inner, self.what = inner, what
        self.state = "open"  # "inside" a unit, "stopped" (agreed), "broken" (a unit failed within)

    def _swap(self, send, send_sizes, sizes, into=None):
        return self.inner._swap(send, send_sizes, sizes, into)

    @contextlib.contextmanager
    def unit(self):
        if self.state == "inside":  # within the caller's unit
            yield
            return
        if self.state != "open" or self._agree(0):
            self.state = "stopped"
            raise LaneStopped(f"{self.what}: another rank's stopped (its log says why, if it failed)")
        self.state = "inside"
        try:
            yield
        except BaseException:
            self.state = "broken"  # the others may be within the unit: no agreement follows
            raise
        self.state = "open"

    def finish(self) -> None:
        """This rank's thread leaves: the others' next agreement says stop (none follows a failed unit)."""
        if self.state == "open":
            self.state = "stopped"
            self._agree(1)

    def _agree(self, stop: int) -> bool:
        got = self.all_to_all([np.array([stop], np.int8)] * self.size, [1] * self.size)
        return any(int(g[0]) for g in got)


class LaneStopped(TrainingError):
    """A ``Lane``'s ranks agreed to stop (another rank's thread left)."""


class ThreadExchange(Exchange):
    """Ranks as threads of one process (``group(size)`` makes their exchanges): each exchange posts a rank's
    arrays and waits for every rank's. ``timeout``: seconds an exchange waits for the other ranks before it
    fails (``threading.BrokenBarrierError``), so a rank that stopped never hangs the others."""

    def __init__(self, rank: int, size: int, shared: dict):
        super().__init__(rank, size)
        self._shared = shared

    @classmethod
    def group(cls, size: int, timeout: float = 60.0) -> list["ThreadExchange"]:
        shared = {"box": [[None] * size for _ in range(size)], "barrier": threading.Barrier(size, timeout=timeout)}
        return [cls(rank, size, shared) for rank in range(size)]

    def _swap(self, send: np.ndarray, send_sizes: list[int], sizes: list[int] | None,
              into: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, list[int]]:
        box, barrier = self._shared["box"], self._shared["barrier"]
        # Views of the sender's buffer: the others read them before the second wait, and nobody changes them.
        box[self.rank] = np.split(send, np.cumsum(send_sizes)[:-1])
        barrier.wait()
        got = [box[r][self.rank] for r in range(self.size)]
        if sizes is not None and [g.shape[0] for g in got] != list(sizes):
            raise ValueError(f"rank {self.rank}: expected {sizes} bytes, got {[g.shape[0] for g in got]}")
        received = received_buffer(sum(g.shape[0] for g in got), into)
        if got:
            np.concatenate(got, out=received)
        barrier.wait()  # every rank has read its arrays before any posts the next exchange's
        return received, [int(g.shape[0]) for g in got]
