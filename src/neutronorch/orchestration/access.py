"""How a run reads feature rows: the host store, the device feature cache, and the pool of gather buffers.
Built once per run from the placement and shared by the mode's loader or reader; a typed graph's holds its
``TypedInputs`` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
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


def build_feature_access(graph: Graph, placement: Placement, device: torch.device, sampling: SamplingConfig,
                         ranked: Callable[[], np.ndarray], dtype: torch.dtype = torch.float32,
                         file_order: bool | None = None) -> FeatureAccess:
    """Rows read as ``dtype`` wherever they come from, a memory map in file order or not (``file_order``;
    None: ``FeatureStore``'s choice); a partial device cache holds the first of ``ranked()``."""
    store = FeatureStore(graph.features, graph.labels, dtype, file_order)
    pool = BufferPool(sampling.prefetch + 2, store.width, dtype, pin=device.type == "cuda")
    # Where the device samples, its reads go through the cache even when it holds no row.
    needs_cache = placement.features != "host" or placement.topology != "host"
    device_rows = placement.cache_rows if needs_cache else 0
    order = ranked() if 0 < device_rows < graph.num_nodes else np.empty(0, np.int64)
    try:
        cache = (FeatureCache(store, order, device_rows, device, device_lookup=placement.topology != "host")
                 if needs_cache else None)
    except torch.cuda.OutOfMemoryError:
        raise ConfigError(f"the device feature cache ({placement.cache_bytes / 2**30:.2f} GiB) does not fit in "
                          f"the memory of {device}. Lower `gpu_cache_gb` or `gpu_memory_gb` (rows not cached "
                          f"are read from host memory).") from None
    return FeatureAccess(device, store, placement, cache, pool)
