"""NeutronOrch's mini-batch: a batch whose bottom block covers only its cold destinations.

``SplicedBatch.blocks[0]`` has the cold bottom-layer destinations only (the hot ones' neighbours are
never sampled, gathered or moved); the splice index says where, among all the bottom-layer destinations
(``blocks[1]``'s source frontier), the cold rows and the reused hot rows go. The model restores the block
rule (destinations lead the next frontier) by splicing: ``GNN.forward(blocks, x, hot)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from neutronorch.nn.splice import SpliceIndex
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.neutronorch.planner import PlanStats
from neutronorch.orchestration.neutronorch.versions import each, per_type


@dataclass
class Splice:
    """A mini-batch's place in its super-batch and how its bottom-layer output is assembled."""

    super_batch_id: int  # the super-batch (numbered across epochs)
    index: SpliceIndex | dict[str, SpliceIndex]  # a typed graph's: per hot vertex type
    last: bool  # the last mini-batch of its super-batch
    plan: PlanStats  # what the super-batch's plan did (shared by its mini-batches)
    probe: np.ndarray | dict[str, np.ndarray]  # the plan's hottest vertices (the drift probe's candidates)

    def to(self, device: torch.device, non_blocking: bool = False) -> "Splice":
        index = each(self.index, lambda index: index.to(device, non_blocking))
        return Splice(self.super_batch_id, index, self.last, self.plan, self.probe)


@dataclass
class SplicedBatch(MiniBatch):
    """Either kind of graph's (a typed graph's ``splice.index`` holds each hot type's splice)."""

    splice: Splice | None = field(default=None, kw_only=True)

    def tensors(self) -> list[torch.Tensor]:
        indexes = per_type(self.splice.index).values()
        return super().tensors() + [t for index in indexes for t in index.tensors()]

    def to(self, device: torch.device, non_blocking: bool = False) -> "SplicedBatch":
        super().to(device, non_blocking)
        self.splice = self.splice.to(device, non_blocking)
        return self


def spliced(splice: Splice):
    """A ``make`` for the loaders: builds a ``SplicedBatch`` carrying ``splice``."""
    def make(*args, **kwargs) -> SplicedBatch:
        return SplicedBatch(*args, splice=splice, **kwargs)
    return make
