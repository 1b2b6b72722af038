"""Rows of any vertex for a rank holding one part of a partitioned graph (docs/distributed.md, "Partitioned
training"): the input vertices' feature rows and the seeds' labels of a mini-batch, or the rows of any table
the parts hold by local index (a layer's outputs in full-neighbour inference), fetched from their owners.

One request and one reply per fetch (``sampling.exchange.Exchange``; every rank takes part, also with nothing
to ask): each owner gets the ids it owns, in the asker's order, after the number of them whose labels are
asked (a prefix: the seeds lead a mini-batch's input frontier); it replies with their rows, then those labels,
as one run of bytes whose size the asker knows. A rank reads its own vertices' rows itself."""

from __future__ import annotations

import threading

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.sampling.exchange import Exchange
from neutronorch.sampling.partitioned import by_owner


OWN_ROWS = 8192  # a rank's own rows are read into a fetch's output this many at a time
ROUND_BYTES = 4 << 20  # the bytes of rows a rank sends in one round of a fetch, to all askers together


def row_bytes(table: np.ndarray) -> int:
    return table.dtype.itemsize * int(np.prod(table.shape[1:], dtype=np.int64))


def rows_bytes(count: int, table: np.ndarray) -> int:
    """The bytes of ``count`` rows of ``table`` (what ``RemoteRows.fetch``'s ``into`` must hold)."""
    return count * row_bytes(table)


class RowBuffers:
    """Byte buffers reused for fetched rows, as ``features.store.BufferPool``'s are for a full-copy run's
    gathers: without them each batch's rows (tens of MB) are a fresh block, and the blocks freed, of sizes
    that differ from batch to batch, stay in the heap beside the next ones (``train.resources``'s glibc
    settings keep freed memory), so a rank's heap grows well past what it holds at once. ``take`` hands out a
    free buffer that is large enough, or makes one (10% over, for the next slightly larger batch); never
    blocks. ``give_back`` keeps at most ``keep`` buffers; ``drop`` lets them all go (before an evaluation)."""

    def __init__(self, keep: int):
        self.keep = keep
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        with self._lock:
            sizes = [b.shape[0] for b in self._free]
            fits = [i for i, size in enumerate(sizes) if size >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=sizes.__getitem__))
            if sizes and len(sizes) >= self.keep:  # none large enough: the smallest makes way for a larger one
                self._free.pop(sizes.index(min(sizes)))
        return np.empty(nbytes + nbytes // 10, np.uint8)

    def give_back(self, buffer: np.ndarray) -> None:
        with self._lock:
            if len(self._free) < self.keep:
                self._free.append(buffer)

    def drop(self) -> None:
        with self._lock:
            self._free.clear()


class GrowingBuffer:
    """One byte buffer reused by one thread's successive uses, grown to the largest (10% over): the blocks of a
    new one each time, of sizes that differ, would stay in the heap beside the next (``RowBuffers``)."""

    def __init__(self):
        self._array = np.empty(0, np.uint8)

    def take(self, nbytes: int) -> np.ndarray:
        """At least ``nbytes`` bytes, valid until the next ``take`` or ``drop``."""
        if self._array.shape[0] < nbytes:
            self._array = np.empty(0, np.uint8)  # the smaller one goes first
            self._array = np.empty(nbytes + nbytes // 10, np.uint8)
        return self._array

    def drop(self) -> None:
        self._array = np.empty(0, np.uint8)

    @property
    def nbytes(self) -> int:
        return self._array.nbytes


class RemoteRows:
    """Fetches rows of ``part``'s (``data.partition_files.Partition``) graph through ``exchange``. The bytes it
    sends and receives go through two reused buffers (one thread fetches at a time), let go by
    ``drop_buffers``."""

    def __init__(self, part, exchange: Exchange):
        self.part, self.exchange = part, exchange
        self.fetched = 0  # rows this rank fetched from other ranks
        self._send, self._received = GrowingBuffer(), GrowingBuffer()

    def drop_buffers(self) -> None:
        self._send.drop()
        self._received.drop()

    def fetch(self, ids, labelled: int = 0, table: np.ndarray | None = None, into: np.ndarray | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(the rows of ``ids`` in ``table``, the labels of ``ids[:labelled]``). ``table``: what every part
        holds a row of for each of its vertices, by local index (default: the features); each rank passes
        its own, of one dtype and width on every rank. ``into``: a byte buffer (uint8) of at least
        ``rows_bytes(len(ids), table)`` the rows are written to, at its start (the rows returned are a view
        of it); None: a new array. A collective: every rank calls it at the same time.

        The replies come in rounds of at most ``ROUND_BYTES`` of rows a rank sends (``reply_step``): a rank's
        buffers for them stay that small whatever the batch. Every rank learns the rounds from the requests:
        each request's first word holds, beside the count of seeds asked, the most ids its sender asks any
        rank for (``header``)."""
        part, exchange = self.part, self.exchange
        table = part.features if table is None else table
        labels = part.labels
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        order, asks = by_owner(ids, part.part_of, part.parts)
        owners = np.asarray(part.part_of[ids[:labelled]])
        wanted = np.bincount(owners, minlength=part.parts) if labelled else np.zeros(part.parts, np.int64)
        me = part.part  # this rank's own rows are read here, never sent to itself
        self.fetched += sum(a.shape[0] for k, a in enumerate(asks) if k != me)
        largest = max([a.shape[0] for k, a in enumerate(asks) if k != me], default=0)
        out = (np.empty((ids.shape[0], *table.shape[1:]), table.dtype) if into is None else
               into[:ids.shape[0] * row_bytes(table)].view(table.dtype).reshape((ids.shape[0], *table.shape[1:])))
        out_labels = np.empty((labelled, *labels.shape[1:]), labels.dtype)
        starts = np.concatenate([[0], np.cumsum([a.shape[0] for a in asks])])  # each owner's run in ``order``
        with exchange.unit():  # one unit of a ``Lane``: no rank stops within it
            requests = exchange.all_to_all([np.concatenate([[header(wanted[k] if k != me else 0, largest)],
                                                            asks[k] if k != me else []]).astype(np.int64)
                                            for k in range(part.parts)])
            asked = [request.reshape(-1) for request in requests]
            counts = [int(request[0]) & LOW for request in asked]
            rows = [part.local(request[1:]) if request.shape[0] > 1 else np.zeros(0, np.int64) for request in asked]
            step = reply_step(table, part.parts)
            rounds = max(1, -(-max(int(request[0]) >> 32 for request in asked) // step))
            for lo in range(0, rounds * step, step):
                got, got_sizes = exchange.swap_packed(
                    *self._reply(rows, counts, table, lo, step),
                    [piece_bytes(a.shape[0], int(m), lo, step, table, labels) if k != me else 0
                     for k, (a, m) in enumerate(zip(asks, wanted))], self._received.take)
                at = 0
                for k, size in enumerate(got_sizes):
                    if size:
                        n, m = pieces(asks[k].shape[0], int(wanted[k]), lo, step)
                        positions = order[starts[k] + lo:starts[k] + lo + n]
                        out[positions] = got[at:at + n * row_bytes(table)].view(table.dtype).reshape(
                            (n, *table.shape[1:]))
                        out_labels[positions[:m]] = got[at + n * row_bytes(table):at + size].view(
                            labels.dtype).reshape((m, *labels.shape[1:]))
                    at += size
        positions = order[starts[me]:starts[me + 1]]
        own = np.asarray(part.local_index[asks[me]], dtype=np.int64)  # by_owner found them this part's
        for first in range(0, own.shape[0], OWN_ROWS):  # a slice at a time: no copy of all of them on the way
            out[positions[first:first + OWN_ROWS]] = table[own[first:first + OWN_ROWS]]
        m = int(wanted[me])
        out_labels[positions[:m]] = labels[own[:m]]
        return out, out_labels

    def _reply(self, rows: list[np.ndarray], counts: list[int], table: np.ndarray, lo: int, step: int
               ) -> tuple[np.ndarray, list[int]]:
        """This round's reply to every asker (its rows ``lo:lo + step``, then the labels of those among its
        first ``counts`` rows), gathered straight into the reused send buffer, and its bytes for each."""
        labels = self.part.labels
        sizes = [piece_bytes(r.shape[0], m, lo, step, table, labels) for r, m in zip(rows, counts)]
        send, at = self._send.take(sum(sizes))[:sum(sizes)], 0
        for r, m in zip(rows, counts):
            n, m = pieces(r.shape[0], m, lo, step)
            piece = r[lo:lo + n]
            np.take(table, piece, axis=0, out=send[at:at + n * row_bytes(table)].view(table.dtype).reshape(
                (n, *table.shape[1:])))
            at += n * row_bytes(table)
            np.take(labels, piece[:m], axis=0, out=send[at:at + m * row_bytes(labels)].view(labels.dtype).reshape(
                (m, *labels.shape[1:])))
            at += m * row_bytes(labels)
        return send, sizes


LOW = (1 << 32) - 1


def header(labelled: int, largest: int) -> int:
    """A request's first word: the count of its ids whose labels are asked (low 32 bits) and the most ids its
    sender asks any rank for (high 32 bits)."""
    if max(labelled, largest) > LOW >> 1:
        raise ValueError(f"a fetch of {largest:,} rows from one rank: at most {LOW >> 1:,}")
    return int(labelled) | (int(largest) << 32)


def reply_step(table: np.ndarray, parts: int) -> int:
    """The rows a rank sends each asker in one round of a fetch: ``ROUND_BYTES`` over every other rank."""
    return max(1, ROUND_BYTES // max(1, row_bytes(table) * max(1, parts - 1)))


def pieces(n: int, labelled: int, lo: int, step: int) -> tuple[int, int]:
    """Of a request of ``n`` ids, the first ``labelled`` labelled: (the rows of the round from ``lo``, the
    labels among them)."""
    rows = max(0, min(n, lo + step) - lo)
    return rows, max(0, min(labelled, lo + step) - lo)


def piece_bytes(n: int, labelled: int, lo: int, step: int, table: np.ndarray, labels: np.ndarray) -> int:
    rows, m = pieces(n, labelled, lo, step)
    return rows * row_bytes(table) + m * row_bytes(labels)


class PartitionedLoader:
    """``host_loader.HostLoader``'s counterpart for a rank holding one part (exact mode on the CPU): a
    mini-batch's input rows (as ``dtype``, float32 or bfloat16, what the host store gathers for a run of that
    precision: rounded to the nearest, ties to even) and its seeds' labels (int64, as the store holds them)
    fetched from their owners in one exchange (``RemoteRows``). ``access``: the run's ``FeatureAccess`` over
    the part's own rows (what a mode reports)."""

    def __init__(self, access, fetcher: RemoteRows, spans, dtype: torch.dtype = torch.float32,
                 buffers: RowBuffers | None = None):
        self.access, self.fetcher, self.spans, self.dtype = access, fetcher, spans, dtype
        self.buffers = buffers  # None: each batch's rows a new array

    def load(self, epoch: int, index: int, subgraph, make=None, targets=None):
        with self.spans.stage("gather", index):
            seeds = subgraph.seeds.shape[0]
            # A link task's targets are given (positions of its pairs' ends): no labels asked.
            ids, buffers = subgraph.input_nodes.numpy(), self.buffers
            buffer = None if buffers is None else buffers.take(rows_bytes(ids.shape[0], self.fetcher.part.features))
            rows, labels = self.fetcher.fetch(ids, labelled=seeds if targets is None else 0, into=buffer)
            features = tensor_from_numpy(rows).to(self.dtype)
            labels = torch.from_numpy(np.asarray(labels, dtype=np.int64)) if targets is None else targets
            batch = (make or MiniBatch)(epoch, index, subgraph, features, labels)
            if buffer is not None:  # the rows' buffer back once the step is done with them (copied: now)
                if features.data_ptr() == rows.ctypes.data:
                    batch.releaser = lambda: buffers.give_back(buffer)
                else:
                    buffers.give_back(buffer)
            return batch

    def start(self, model) -> None:
        pass

    def close(self) -> None:
        pass

    def drop_buffers(self) -> None:
        """Let the reused row buffers go (the epoch's batches are done): an evaluation follows."""
        if self.buffers is not None:
            self.buffers.drop()
        self.fetcher.drop_buffers()

    def summary(self) -> dict:
        return {}  # the bytes exchanged: the partitioned mode's summary
