"""The W0 snapshots (``SnapshotPublisher``, trainer thread): the bottom layer's parameters taken when training
reaches ``Schedule.snapshot_version`` and put on the ``snapshots`` channel (on CUDA pinned copies behind an
event: the trainer never waits for the copy). A typed snapshot also holds the table rows its hot frontier
reads, at the same version; their ids come with the plan, made when the super-batch before begins loading,
so a typed snapshot is never taken before that super-batch's first step, nor past the run's end.
"""

from __future__ import annotations

from typing import Callable

import torch

from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.neutronorch.versions import Schedule, Snapshot

TableRows = Callable[[int], tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]


class SnapshotPublisher:
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
