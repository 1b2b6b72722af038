"""How a run reads feature rows: the host store, the device feature cache, and the pool of gather buffers.
Built once per run from the placement and shared by the mode's loader or reader; a typed graph's holds its
``TypedInputs`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.features.cache import FeatureCache
from neutronorch.features.placement import Placement
from neutronorch.features.store import BufferPool, FeatureStore, TypedInputs


@dataclass
class FeatureAccess:
    device: torch.device
    store: FeatureStore | None  # None: a typed graph's (``inputs``)
    placement: Placement | None
    cache: FeatureCache | None  # None: every row is gathered on the host
    pool: BufferPool | None  # gather buffers (pinned on CUDA): the queue, one being filled, one being trained on
    inputs: TypedInputs | None = None  # a typed graph's rows: a ``FeatureStore`` per featured type
    graph: TypedGraph | None = None  # ... and the graph whose target's labels its batches read

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"
