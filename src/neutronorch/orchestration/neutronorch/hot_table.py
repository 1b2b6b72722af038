"""The hot embeddings, the trainer's side (``HotTableReader``, trainer thread): the table of the super-batch a
mini-batch belongs to, taken from the ``hot`` channel at its first mini-batch (on CUDA the trainer's stream
waits for its copy), kept for the others and dropped after the last. Only its gradient accumulator is
written after it crossed, and only by the trainer.
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.observe import Spans
from neutronorch.orchestration.batch import each, per_type
from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.neutronorch.versions import HotEmbeddings


class HotTableReader:
    def __init__(self, spans: Spans, device: torch.device):
        self.spans, self.device = spans, device
        self.channel = Channel("hot")
        self.current: HotEmbeddings | None = None
        self.resumed: dict | None = None  # the super-batch in progress when the loaded checkpoint was written

    def table(self, super_batch_id: int) -> tuple[HotEmbeddings, bool]:
        """The hot embeddings of ``super_batch_id``, and whether they are new (to be accounted: not a resumed
        super-batch's continuation)."""
        if self.current is not None and self.current.super_batch_id == super_batch_id:
            return self.current, False
        with self.spans.stage("wait_hot"):
            hot = self.channel.take(super_batch_id, remove=False)
        if hot.ready is not None:
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(hot.ready)
            hot.table.record_stream(stream)
            if hot.grad_acc is not None:
                hot.grad_acc.record_stream(stream)
        self.current = hot
        if self.resumed is not None and self.resumed["gsid"] == super_batch_id:
            self._continue(hot)
            return hot, False
        return hot, True

    def _continue(self, hot: HotEmbeddings) -> None:
        """A resumed super-batch's rows, recomputed from its saved snapshot: check the set, restore the
        gradient."""
        resumed, self.resumed = self.resumed, None
        before, now = per_type(resumed["vertices"]), per_type(hot.vertices)
        if before.keys() != now.keys() or not all(np.array_equal(now[t], before[t]) for t in now):
            raise RuntimeError(f"super-batch {hot.super_batch_id} was resumed with another hot set than it "
                               "started with")
        saved = per_type(resumed["grad_acc"])
        for t, grad in per_type(hot.grad_acc).items():
            grad.copy_(saved[t])

    def trained(self, super_batch_id: int) -> None:
        self.channel.drop(super_batch_id)
        self.current = None

    def close(self) -> None:
        self.channel.close()

    def state_dict(self) -> dict | None:
        """The super-batch in progress: its hot set and accumulated gradient (its rows are recomputed)."""
        current = self.current
        if current is None:
            return None
        return {"gsid": current.super_batch_id, "vertices": each(current.vertices, torch.tensor),
                "grad_acc": each(current.grad_acc, lambda g: g.detach().to("cpu", copy=True))}

    def load_state_dict(self, in_progress: dict | None) -> None:
        self.resumed = None if in_progress is None else {
            **in_progress, "vertices": each(in_progress["vertices"], lambda v: v.numpy())}

