"""The W0 snapshots, the trainer's side: each super-batch's bottom-layer parameters, published on time.

Super-batch s's hot rows are computed from the bottom layer's parameters at the version the schedule
assigns it (``Schedule.snapshot_version``, with the controller's current lead). ``SnapshotPublisher``,
owned by the trainer's thread, takes that snapshot when training reaches the version and puts it on the
``snapshots`` channel, which the hot-row computer (``hot_rows.py``) takes from. A snapshot is a
frozen copy: on CUDA pinned host buffers behind an event, so the trainer never waits for the copy.
"""

from __future__ import annotations

import torch

from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.neutronorch.versions import Schedule, Snapshot


class SnapshotPublisher:
    def __init__(self, schedule: Schedule, on_cuda: bool):
        self.schedule, self.on_cuda = schedule, on_cuda
        self.channel = Channel("snapshots")
        self._next = 0  # the next super-batch to receive its snapshot
        self._published: dict[int, Snapshot] = {}  # snapshots of super-batches not yet trained

    def start(self) -> None:
        """Hand over again what a resumed run had published before it stopped."""
        for super_batch_id, snapshot in self._published.items():
            self.channel.put(super_batch_id, snapshot)

    def publish_due(self, bottom: torch.nn.Module, version: int, lead: int) -> None:
        """Publish the snapshot to every super-batch whose assigned version is now reached, those past the
        run's last epoch included: a checkpoint keeps them, so a run resumed with more epochs uses the very
        weights the longer run would have used (they cannot be taken again later)."""
        snapshot = None
        while self.schedule.snapshot_version(self._next, lead) <= version:
            if snapshot is None:
                snapshot = self._take(bottom, version)
            self.channel.put(self._next, snapshot)
            self._published[self._next] = snapshot
            self._next += 1

    def trained(self, super_batch_id: int) -> None:
        """Super-batch ``super_batch_id`` is over: its snapshot is no longer a checkpoint's business."""
        self._published.pop(super_batch_id, None)

    def _take(self, bottom: torch.nn.Module, version: int) -> Snapshot:
        params = [p.detach() for p in bottom.parameters()]
        if not self.on_cuda:
            return Snapshot(version, [p.clone() for p in params])
        host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        for h, p in zip(host, params):
            h.copy_(p, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return Snapshot(version, host, ready)

    def close(self) -> None:
        self.channel.close()

    def state_dict(self) -> dict:
        snapshots = {}
        for super_batch_id, snapshot in self._published.items():
            if snapshot.ready is not None:
                snapshot.ready.synchronize()
            snapshots[super_batch_id] = {"version": snapshot.version,
                                         "params": [p.clone() for p in snapshot.params]}
        return {"next_snapshot": self._next, "snapshots": snapshots}

    def load_state_dict(self, state: dict) -> None:
        self._next = state["next_snapshot"]
        self._published = {g: Snapshot(s["version"], s["params"]) for g, s in state["snapshots"].items()}
