"""NeutronOrch's mini-batch: its bottom block covers only its cold destinations; the splice index says
where among all bottom-layer destinations the cold rows and the reused hot rows go (``GNN.forward``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from neutronorch.nn.splice import SpliceIndex
from neutronorch.orchestration.batch import MiniBatch, each, per_type
from neutronorch.orchestration.neutronorch.planner import PlanStats


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
        index = each(self.index, lambda index: index.to(device, non_blocking))
        return Splice(self.super_batch_id, index, self.last, self.plan, self.probe)


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
