"""The cold sampler (thread ``neutronorch-sampler``): per mini-batch the bottom hop of the cold destinations
only, drawn with the mini-batch's key (so with the planner's upper hops exactly what exact mode draws), then
loaded as exact or device mode loads it. Hot destinations are never sampled, gathered or moved. Its batches
are ``SplicedBatch``es: the bottom block covers only the cold destinations; the splice index says where among
all bottom-layer destinations the cold rows and the reused hot rows go (``GNN.forward``). The trainer takes
an epoch's of them from the stream at a time (``EpochView``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterable, Iterator

import numpy as np
import torch

from neutronorch.nn.splice import SpliceIndex
from neutronorch.observe import Spans
from neutronorch.orchestration.batch import MiniBatch, each, per_type
from neutronorch.orchestration.neutronorch.planner import Plan, PlanStats
from neutronorch.orchestration.pipeline import Prefetcher


@dataclass
class Splice:
    """A mini-batch's place in its super-batch and how its bottom-layer output is assembled (a typed
    graph's index per hot vertex type)."""

    super_batch_id: int  # the super-batch (numbered across epochs)
    index: SpliceIndex | dict[str, SpliceIndex]
    last: bool  # the last mini-batch of its super-batch
    plan: PlanStats  # what the super-batch's plan did (shared by its mini-batches)
    probe: np.ndarray | dict[str, np.ndarray]  # the plan's hottest vertices (the drift probe's candidates)

    def to(self, device: torch.device, non_blocking: bool = False) -> "Splice":
        return replace(self, index=each(self.index, lambda index: index.to(device, non_blocking)))


@dataclass
class SplicedBatch(MiniBatch):
    splice: Splice | None = field(default=None, kw_only=True)

    def tensors(self) -> list[torch.Tensor]:
        indexes = per_type(self.splice.index).values()
        return super().tensors() + [t for index in indexes for t in index.tensors()]

    def to(self, device: torch.device, non_blocking: bool = False) -> "SplicedBatch":
        super().to(device, non_blocking)
        self.splice = self.splice.to(device, non_blocking)
        return self


def cold_batches(kind, spans: Spans, plans: Callable[[object], Iterable[Plan]], skip: int = 0
                 ) -> Iterator[SplicedBatch]:
    """The body of thread ``neutronorch-sampler``: a batch per planned mini-batch of ``plans(sampler)`` (given
    its sampler, which device planning samples with), but for the first ``skip`` of the first plan, loaded by
    ``kind``'s device reader (on a CUDA stream of its own) or else its host loader."""
    source = kind.reader if kind.reader is not None else kind.loader
    on_cuda = kind.reader is not None and kind.reader.device.type == "cuda"
    sampler = kind.cold_sampler()
    with torch.cuda.stream(torch.cuda.Stream(kind.reader.device) if on_cuda else None):  # None: a no-op
        for plan in plans(sampler):
            for position in range(skip, len(plan.batches)):
                item = plan.batches[position]
                with spans.stage("sample", item.index if kind.numbered else -1):
                    subgraph, index = kind.cold_batch(sampler, plan, item)
                splice = Splice(plan.super_batch_id, index, position == len(plan.batches) - 1, plan.stats,
                                plan.probe)  # moved with the batch
                make = partial(SplicedBatch, splice=splice)
                yield source.load(plan.epoch, item.index, subgraph, make=make, targets=item.targets)
            skip = 0


def splice_index(num_rows: int, cold_pos, hot_pos, hot_rows) -> SpliceIndex:
    """The splice index of a planned mini-batch's destinations (of one type), from numpy positions or from
    tensors on the device (built without leaving it)."""
    if isinstance(cold_pos, np.ndarray):
        return SpliceIndex.build(num_rows, cold_pos, hot_pos, hot_rows)
    origin = torch.empty(num_rows, dtype=torch.int64, device=cold_pos.device)
    origin.index_copy_(0, cold_pos, torch.arange(cold_pos.shape[0], device=cold_pos.device))
    origin.index_copy_(0, hot_pos, -1 - hot_rows)
    return SpliceIndex(num_rows, cold_pos, hot_pos, hot_rows, origin)


class EpochView:
    """One epoch's mini-batches out of the mode's persistent stream (closing it does not stop the stream)."""

    def __init__(self, stream: Prefetcher, epoch: int, count: int):
        self._stream, self._epoch, self._left = stream, epoch, count

    @property
    def pending(self) -> int:
        """Mini-batches the pipeline has produced ahead and not yet handed out (any epoch's)."""
        return self._stream.pending

    def __iter__(self):
        return self

    def __next__(self) -> SplicedBatch:
        if self._left == 0:
            raise StopIteration
        batch = next(self._stream)
        if batch.epoch != self._epoch:
            raise RuntimeError(f"pipeline out of step: got a batch of epoch {batch.epoch} in epoch {self._epoch}")
        self._left -= 1
        return batch

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        pass
