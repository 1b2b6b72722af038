"""The planner: which vertices of a super-batch are hot, and where each mini-batch finds them.

Pure: the upper hops of the super-batch's P mini-batches go in (already sampled), a ``Plan`` comes out.
No threads, no parameters, no device: tested on its own. The host producer calls it once per super-batch.

The hot set H_s is the top ``ratio`` of the vertices reached among the super-batch's bottom-layer
destinations, ranked by how often they appear there (most frequent first), optionally capped by
``cap(ranked counts)`` (the staleness-error cap of ``controller.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from neutronorch.sampling import kernels
from neutronorch.sampling.block import SampledSubgraph

PROBE_ROWS = 256  # vertices whose bottom-layer output measures the per-step drift (the hottest of a plan)


@dataclass
class PlannedBatch:
    index: int  # mini-batch number in its epoch
    key: int  # its ``batch_key``
    upper: SampledSubgraph  # the upper hops; ``upper.frontiers[0]`` are the bottom-layer destinations
    cold_pos: np.ndarray  # positions of the cold destinations among them
    hot_pos: np.ndarray  # positions of the hot ones
    hot_rows: np.ndarray  # their rows of the hot table
    saved_edges: int  # bottom-hop edges the device does not sample because their destination is hot


@dataclass
class PlanStats:
    """What one plan did, for the summary (accounted by the trainer when it reaches the super-batch)."""

    epoch: int
    hot: int  # |H_s|
    reached: int  # distinct bottom-layer destinations of the super-batch
    appearances: int  # bottom-layer destination rows over its mini-batches
    hot_appearances: int  # of which served by hot embeddings
    saved_edges: int
    error_capped: bool = False  # the staleness-error cap lowered |H_s| below the ratio's

    @property
    def hot_share(self) -> float:
        return self.hot / max(1, self.reached)


@dataclass
class Plan:
    gsid: int
    epoch: int
    batches: list[PlannedBatch]
    hot: np.ndarray  # H_s, hottest first
    probe: np.ndarray  # the hottest PROBE_ROWS vertices (the drift probe's candidates)
    stats: PlanStats


class Planner:
    """Plans super-batches over one graph; owns scratch arrays of one entry per vertex (one per thread)."""

    def __init__(self, indptr: np.ndarray, bottom_fanout: int):
        num_nodes = indptr.shape[0] - 1
        self.indptr = indptr
        self.bottom_fanout = bottom_fanout
        self._counts = np.zeros(num_nodes, np.int32)  # count_appearances' scratch, left zero
        self._hot_map = np.full(num_nodes, -1, np.int64)  # vertex -> hot row during one plan, left -1

    def plan(self, gsid: int, epoch: int, uppers: list[tuple[int, int, SampledSubgraph]], ratio: float,
             cap: Callable[[np.ndarray], tuple[int, bool]] | None = None, hot: np.ndarray | None = None) -> Plan:
        """``uppers``: (mini-batch index, key, upper-hop sample) of each mini-batch of the super-batch.
        ``hot``: the hot set, already chosen (a resumed super-batch's), instead of ranking by ``ratio``."""
        bottoms = [upper.frontiers[0].numpy() for _, _, upper in uppers]
        distinct, appear = kernels.count_appearances(np.concatenate(bottoms), self._counts)
        ranked = np.argsort(-appear, kind="stable")
        capped = False
        if hot is None:
            num_hot = min(distinct.shape[0], int(round(ratio * distinct.shape[0])))
            if cap is not None:
                limit, capped = cap(appear[ranked])
                num_hot = min(num_hot, limit)
            hot = distinct[ranked[:num_hot]]
        num_hot = hot.shape[0]
        hot_map = self._hot_map
        hot_map[hot] = np.arange(num_hot)
        planned, hot_appearances = [], 0
        try:
            for (index, key, upper), dst in zip(uppers, bottoms):
                rows = hot_map[dst]
                is_hot = rows >= 0
                hot_pos = np.flatnonzero(is_hot)
                planned.append(PlannedBatch(index, key, upper, np.flatnonzero(~is_hot), hot_pos, rows[hot_pos],
                                            self._saved_edges(dst[hot_pos])))
                hot_appearances += hot_pos.shape[0]
        finally:
            hot_map[hot] = -1
        stats = PlanStats(epoch, num_hot, int(distinct.shape[0]), int(appear.sum()), hot_appearances,
                          sum(b.saved_edges for b in planned), error_capped=capped)
        return Plan(gsid, epoch, planned, hot, distinct[ranked[:PROBE_ROWS]], stats)

    def _saved_edges(self, hot_dst: np.ndarray) -> int:
        """Bottom-hop edges the device would have sampled for these destinations."""
        degree = self.indptr[hot_dst + 1] - self.indptr[hot_dst]
        return int(degree.sum() if self.bottom_fanout < 0 else np.minimum(degree, self.bottom_fanout).sum())
