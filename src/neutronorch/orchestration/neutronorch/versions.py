"""Versions: the schedule of W0 snapshots and their publisher, the versioned buffers, and the staleness bound
checked at every use.

Parameter version = optimizer steps taken. Super-batch ``g``'s hot embeddings are computed at version
``snapshot_version(g)``, fixed in advance so that its last mini-batch uses them at most ``staleness_bound``
steps later; ``StalenessCheck`` verifies it at every use (a violation is a bug and raises).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from neutronorch.orchestration.channel import Channel


class Schedule:
    """Global numbering of super-batches and optimizer steps across epochs: super-batch ``g`` is number
    ``g % per_epoch`` of epoch ``g // per_epoch`` (an epoch's last may hold fewer than P mini-batches)."""

    def __init__(self, epochs: int, batches_per_epoch: int, super_batch: int, staleness_bound: int):
        self.epochs = epochs
        self.batches_per_epoch = batches_per_epoch
        self.super_batch = super_batch
        self.staleness_bound = staleness_bound
        self.per_epoch = -(-batches_per_epoch // super_batch)
        self.total = epochs * self.per_epoch

    def locate(self, super_batch_id: int) -> tuple[int, int, int]:
        """(epoch, first mini-batch, end mini-batch) of super-batch ``super_batch_id``."""
        epoch, index = divmod(super_batch_id, self.per_epoch)
        first = index * self.super_batch
        return epoch, first, min(first + self.super_batch, self.batches_per_epoch)

    def at(self, step: int) -> tuple[int, int]:
        """(super-batch, position in it) of global step ``step``."""
        epoch, index = divmod(step, self.batches_per_epoch)
        return epoch * self.per_epoch + index // self.super_batch, index % self.super_batch

    def first_step(self, super_batch_id: int) -> int:
        epoch, first, _ = self.locate(super_batch_id)
        return epoch * self.batches_per_epoch + first

    def last_step(self, super_batch_id: int) -> int:
        epoch, _, end = self.locate(super_batch_id)
        return epoch * self.batches_per_epoch + end - 1

    @property
    def max_lead(self) -> int:
        """The most steps a snapshot may precede its super-batch's first step within the bound."""
        return max(0, self.staleness_bound - self.super_batch + 1)

    def snapshot_version(self, super_batch_id: int, lead: int | None = None) -> int:
        """``lead`` steps before the super-batch's first step, never older than the bound allows for its last
        (``lead=None``: that oldest)."""
        oldest = self.last_step(super_batch_id) - self.staleness_bound
        version = oldest if lead is None else max(oldest, self.first_step(super_batch_id) - lead)
        return max(0, version)


@dataclass(frozen=True)
class Snapshot:
    """The bottom layer's parameters at one version (host copies outside autograd), with a typed graph's
    table rows the hot rows read. Frozen: it crosses from the trainer to the host; nobody writes to it."""

    version: int
    params: list[torch.Tensor]
    ready: object = None  # on CUDA: the event after which the pinned copies are complete
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # featureless type -> its rows at ``ids``
    ids: dict[str, torch.Tensor] = field(default_factory=dict)  # ... the hot frontier's vertices of the type


@dataclass(frozen=True)
class HotEmbeddings:
    """The bottom-layer output of one super-batch's hot set: complete and frozen when it crosses to the
    trainer, which writes only into ``grad_acc``. On a typed graph ``table``, ``grad_acc``, ``output`` and
    ``vertices`` hold one entry per vertex type."""

    super_batch_id: int
    version: int
    table: torch.Tensor | dict[str, torch.Tensor]  # (|H_s|, width) on the training device
    num_hot: int
    vertices: np.ndarray | dict[str, np.ndarray] | None = None  # H_s, the vertex of each table row
    host_edges: int = 0  # bottom-hop edges the host sampled for the hot set (for the rows this rank computed)
    exchange: object = None  # hot_set="node": which rows this rank computed (``node.Exchange``)
    grad_acc: torch.Tensor | None = None  # hot_grad="cpu": dL/dY summed over the super-batch's steps
    output: torch.Tensor | None = None  # hot_grad="cpu": the host output, still attached to its graph
    params: list[torch.Tensor] | None = None  # hot_grad="cpu": the snapshot parameters it was computed from
    ready: object = None  # on CUDA: the event after which ``table`` holds the data
    keep: tuple = ()  # host buffers that must outlive an asynchronous copy
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # typed, hot_grad="cpu": the snapshot's table rows
    ids: dict[str, torch.Tensor] = field(default_factory=dict)  # ... (leaves of ``output``'s graph) and their ids


class StalenessCheck:
    """Checks every use of hot embeddings against the bound and keeps what was observed."""

    def __init__(self, bound: int):
        self.bound = bound
        self.max_observed = 0
        self._sum = self._uses = 0
        self._epoch = [0, 0, 0]  # this epoch's sum, uses and largest

    def check(self, hot: HotEmbeddings, version: int) -> None:
        staleness = version - hot.version
        if staleness > self.bound or staleness < 0:
            raise RuntimeError(f"staleness bound violated: hot embeddings of super-batch {hot.super_batch_id} were "
                               f"computed at parameter version {hot.version} and are used at version "
                               f"{version} (bound {self.bound}). This is a bug.")
        if hot.num_hot:
            self.max_observed = max(self.max_observed, staleness)
            self._sum += staleness
            self._uses += 1
            epoch = self._epoch
            epoch[0], epoch[1], epoch[2] = epoch[0] + staleness, epoch[1] + 1, max(epoch[2], staleness)

    def end_epoch(self) -> dict:
        """The staleness of the epoch's uses of hot rows (mean and largest, None where none was used)."""
        total, uses, largest = self._epoch
        self._epoch = [0, 0, 0]
        return {"mean": round(total / uses, 2) if uses else None, "max": largest if uses else None,
                "bound": self.bound}

    def state_dict(self) -> dict:
        return {"max_observed": self.max_observed, "sum": self._sum, "uses": self._uses, "epoch": self._epoch}

    def load_state_dict(self, state: dict) -> None:
        self.max_observed, self._sum, self._uses = state["max_observed"], state["sum"], state["uses"]
        self._epoch = list(state.get("epoch", [0, 0, 0]))

    @property
    def mean_observed(self) -> float:
        return self._sum / max(1, self._uses)


TableRows = Callable[[int], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]


class SnapshotPublisher:
    """The W0 snapshots (trainer thread): the bottom layer's parameters taken when training reaches
    ``Schedule.snapshot_version`` and put on the ``snapshots`` channel (on CUDA pinned copies behind an
    event: the trainer never waits for the copy). A typed snapshot also holds the table rows its hot
    frontier reads, at the same version; their ids come with the plan, made when the super-batch before
    begins loading, so a typed snapshot is never taken before that super-batch's first step, nor past the
    run's end."""

    def __init__(self, schedule: Schedule, on_cuda: bool, table_rows: TableRows | None = None):
        self.schedule, self.on_cuda = schedule, on_cuda
        self.table_rows = table_rows  # typed: (rows, ids) of the tables a super-batch's hot rows read, now
        self.channel = Channel("snapshots")
        self._next = 0  # the next super-batch to receive its snapshot
        self._published: dict[int, Snapshot] = {}  # snapshots of super-batches not yet trained

    def start(self) -> None:
        """Hand over again what a resumed run had published before it stopped."""
        for super_batch_id, snapshot in self._published.items():
            self.channel.put(super_batch_id, snapshot)

    def version_of(self, super_batch_id: int, lead: int) -> int | None:
        """The version super-batch ``super_batch_id``'s snapshot is taken at; None for none."""
        version = self.schedule.snapshot_version(super_batch_id, lead)
        if self.table_rows is None:
            return version
        if super_batch_id >= self.schedule.total:
            return None
        return version if super_batch_id == 0 else max(version, self.schedule.first_step(super_batch_id - 1))

    def publish_due(self, bottom: torch.nn.Module, version: int, lead: int) -> None:
        """Publish the snapshot to every super-batch whose version is now reached, past the run's end too: a
        checkpoint keeps them, so a run resumed with more epochs uses the weights a longer run would."""
        params = ready = None
        while (due := self.version_of(self._next, lead)) is not None and due <= version:
            if params is None:
                params, ready = self._take(bottom)
            rows, ids = self.table_rows(self._next) if self.table_rows is not None else ({}, {})
            snapshot = Snapshot(version, params, ready, rows, ids)
            self.channel.put(self._next, snapshot)
            self._published[self._next] = snapshot
            self._next += 1

    def trained(self, super_batch_id: int) -> None:
        self._published.pop(super_batch_id, None)

    def _take(self, bottom: torch.nn.Module) -> tuple[list[torch.Tensor], object]:
        params = [p.detach() for p in bottom.parameters()]
        if not self.on_cuda:
            return [p.clone() for p in params], None
        host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        for h, p in zip(host, params):
            h.copy_(p, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return host, ready

    def close(self) -> None:
        self.channel.close()

    def state_dict(self) -> dict:
        snapshots = {}
        for super_batch_id, snapshot in self._published.items():
            if snapshot.ready is not None:
                snapshot.ready.synchronize()
            snapshots[super_batch_id] = {"version": snapshot.version, "params": [p.clone() for p in snapshot.params],
                                         "rows": snapshot.rows, "ids": snapshot.ids}
        return {"next_snapshot": self._next, "snapshots": snapshots}

    def load_state_dict(self, state: dict) -> None:
        self._next = state["next_snapshot"]
        self._published = {g: Snapshot(s["version"], s["params"], None, dict(s.get("rows", {})), dict(s.get("ids", {})))
                           for g, s in state["snapshots"].items()}
