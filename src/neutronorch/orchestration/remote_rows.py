"""Rows of any vertex for a rank holding one part of a partitioned graph (docs/distributed.md, "Partitioned
training"): the input vertices' feature rows and the seeds' labels of a mini-batch, or the rows of any table
the parts hold by local index (a layer's outputs in full-neighbour inference), fetched from their owners.

One request and one reply per fetch (``sampling.exchange.Exchange``; every rank takes part, also with nothing
to ask): each owner gets the ids it owns, in the asker's order, after the number of them whose labels are
asked (a prefix: the seeds lead a mini-batch's input frontier); it replies with their rows, then those labels,
as one run of bytes whose size the asker knows. A rank reads its own vertices' rows itself."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.sampling.exchange import Exchange
from neutronorch.sampling.partitioned import by_owner


def row_bytes(table: np.ndarray) -> int:
    return table.dtype.itemsize * int(np.prod(table.shape[1:], dtype=np.int64))


class RemoteRows:
    """Fetches rows of ``part``'s (``data.partition_files.Partition``) graph through ``exchange``."""

    def __init__(self, part, exchange: Exchange):
        self.part, self.exchange = part, exchange
        self.fetched = 0  # rows this rank fetched from other ranks

    def fetch(self, ids, labelled: int = 0, table: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(the rows of ``ids`` in ``table``, the labels of ``ids[:labelled]``). ``table``: what every part
        holds a row of for each of its vertices, by local index (default: the features); each rank passes
        its own, of one dtype and width on every rank. A collective: every rank calls it at the same time."""
        part, exchange = self.part, self.exchange
        table = part.features if table is None else table
        labels = part.labels
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        order, asks = by_owner(ids, part.part_of, part.parts)
        owners = np.asarray(part.part_of[ids[:labelled]])
        wanted = np.bincount(owners, minlength=part.parts) if labelled else np.zeros(part.parts, np.int64)
        self.fetched += sum(a.shape[0] for k, a in enumerate(asks) if k != part.part)
        me = part.part  # this rank's own rows are read here, never sent to itself
        width, label_width = row_bytes(table), row_bytes(labels)
        with exchange.unit():  # one unit of a ``Lane``: no rank stops within it
            requests = exchange.all_to_all([np.concatenate([[wanted[k]], asks[k]]).astype(np.int64) if k != me
                                            else np.zeros(1, np.int64) for k in range(part.parts)])
            # Each asker's rows, then its labels, gathered straight into one buffer of the reply's bytes.
            asked = [request.reshape(-1) for request in requests]
            rows = [part.local(request[1:]) if request.shape[0] > 1 else np.zeros(0, np.int64) for request in asked]
            counts = [int(request[0]) for request in asked]
            sizes = [r.shape[0] * width + m * label_width for r, m in zip(rows, counts)]
            send, at = np.empty(sum(sizes), np.uint8), 0
            for r, m in zip(rows, counts):
                np.take(table, r, axis=0, out=send[at:at + r.shape[0] * width].view(table.dtype).reshape(
                    (r.shape[0], *table.shape[1:])))
                at += r.shape[0] * width
                np.take(labels, r[:m], axis=0, out=send[at:at + m * label_width].view(labels.dtype).reshape(
                    (m, *labels.shape[1:])))
                at += m * label_width
            got, got_sizes = exchange.swap_packed(send, sizes, [a.shape[0] * width + int(m) * label_width if k != me
                                                               else 0 for k, (a, m) in enumerate(zip(asks, wanted))])
        out = np.empty((ids.shape[0], *table.shape[1:]), table.dtype)
        out_labels = np.empty((labelled, *labels.shape[1:]), labels.dtype)
        at, start = 0, 0
        for k, size in enumerate(got_sizes):
            n, m = asks[k].shape[0], int(wanted[k])
            positions = order[at:at + n]
            if k == me:
                own = np.asarray(part.local_index[asks[k]], dtype=np.int64)  # by_owner found them this part's
                out[positions] = table[own]
                out_labels[positions[:m]] = labels[own[:m]]
            else:
                out[positions] = got[start:start + n * width].view(table.dtype).reshape((n, *table.shape[1:]))
                out_labels[positions[:m]] = got[start + n * width:start + size].view(labels.dtype).reshape(
                    (m, *labels.shape[1:]))
            at, start = at + n, start + size
        return out, out_labels


class PartitionedLoader:
    """``host_loader.HostLoader``'s counterpart for a rank holding one part (exact mode on the CPU): a
    mini-batch's input rows (as ``dtype``, float32 or bfloat16, what the host store gathers for a run of that
    precision: rounded to the nearest, ties to even) and its seeds' labels (int64, as the store holds them)
    fetched from their owners in one exchange (``RemoteRows``). ``access``: the run's ``FeatureAccess`` over
    the part's own rows (what a mode reports)."""

    def __init__(self, access, fetcher: RemoteRows, spans, dtype: torch.dtype = torch.float32):
        self.access, self.fetcher, self.spans, self.dtype = access, fetcher, spans, dtype

    def load(self, epoch: int, index: int, subgraph, make=None, targets=None):
        with self.spans.stage("gather", index):
            seeds = subgraph.seeds.shape[0]
            # A link task's targets are given (positions of its pairs' ends): no labels asked.
            rows, labels = self.fetcher.fetch(subgraph.input_nodes.numpy(), labelled=seeds if targets is None else 0)
            features = tensor_from_numpy(rows).to(self.dtype)
            labels = torch.from_numpy(np.asarray(labels, dtype=np.int64)) if targets is None else targets
            return (make or MiniBatch)(epoch, index, subgraph, features, labels)

    def start(self, model) -> None:
        pass

    def close(self) -> None:
        pass

    def summary(self) -> dict:
        return {}  # the bytes exchanged: the partitioned mode's summary
