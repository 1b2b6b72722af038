"""NeutronOrch's plan on a typed graph: per vertex type, which of a super-batch's bottom-layer destinations
are hot, and where each mini-batch finds them.

Pure, as the homogeneous ``neutronorch/planner.py`` is, and built from its kernels: the upper hops of the
super-batch's P mini-batches go in (``TypedNeighborSampler.sample_hops``, already drawn), a ``TypedPlan``
comes out. A relational model's bottom layer writes one output per destination type, so the plan is one
homogeneous plan per type over that type's destinations (``upper.frontiers[0][t]``): the vertices reached,
how often each appears among the super-batch's mini-batches, ranked most frequent first (ties in order of
first appearance), the top of them hot.

How many are hot, per type: the ratio setting's share of the type's distinct destinations (at most those a
hot row can serve), with ``hot_ratio="auto"`` capped by the staleness-error cap, as in the homogeneous plan
(``controller.py``: the ratio controller tunes the ratio and measures the error for both kinds of graph).

A mini-batch's own seeds (the target type's first ``len(seeds)`` destinations: every hop keeps its
destinations first) are never served hot in it, and their appearances there do not count towards their
rank, as in the homogeneous plan (``planner.py`` says why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.orchestration.neutronorch.controller import RatioSetting, error_cap
from neutronorch.orchestration.neutronorch.planner import (PROBE_ROWS, fresh_entries, index_appearances, rank_by_count,
                                                           split_hot_cold)
from neutronorch.sampling.typed_block import TypedSubgraph

EMPTY = np.empty(0, np.int64)


@dataclass
class TypedPlannedBatch:
    """One mini-batch of a plan: its upper hops and, per destination type of its bottom layer, the
    positions (among ``upper.frontiers[0][t]``) of its cold destinations (ascending) and of its hot ones,
    with the hot ones' rows of the type's hot table."""

    index: int  # mini-batch number in its epoch
    key: int  # its ``batch_key``
    upper: TypedSubgraph
    cold_pos: dict[str, np.ndarray]
    hot_pos: dict[str, np.ndarray]
    hot_rows: dict[str, np.ndarray]
    saved_edges: int  # bottom-hop edges not sampled for it because their destination is hot

    def cold_destinations(self) -> dict[str, np.ndarray]:
        """Per type, the cold destinations' vertex ids, in the order of their positions."""
        return {t: ids.numpy()[self.cold_pos[t]] for t, ids in self.upper.frontiers[0].items()}


@dataclass
class TypedPlanStats:
    """What one plan did, for the epoch records and the summary."""

    epoch: int
    hot: dict[str, int] = field(default_factory=dict)  # |H_s| per type
    reached: int = 0  # distinct bottom-layer destinations, all types
    appearances: int = 0  # bottom-layer destination rows over its mini-batches
    hot_appearances: int = 0  # of which served by hot rows
    saved_edges: int = 0
    error_capped: bool = False  # the staleness-error cap lowered some type's |H_s| below the ratio's

    @property
    def hot_share(self) -> float:
        return sum(self.hot.values()) / max(1, self.reached)


@dataclass
class TypedPlan:
    super_batch_id: int
    epoch: int
    batches: list[TypedPlannedBatch]
    hot: dict[str, np.ndarray]  # H_s per type (only the types with hot vertices), hottest first
    stats: TypedPlanStats
    probe: dict[str, np.ndarray] = field(default_factory=dict)  # per type its hottest (the drift probe's)

    @property
    def num_hot(self) -> int:
        return sum(int(ids.shape[0]) for ids in self.hot.values())


class TypedPlanner:
    """Plans super-batches over one typed graph; owns scratch arrays of one entry per vertex (one planner
    per thread). ``bottom_fanouts``: each relation's fanout in the bottom hop (what a hot destination spares
    the device)."""

    def __init__(self, graph: TypedGraph, bottom_fanouts: dict[RelationType, int]):
        self.target = graph.target
        self._slot = {t: np.full(n, -1, np.int32) for t, n in graph.num_nodes.items()}
        self._into = {t: [(graph.relations[r].indptr, bottom_fanouts[r]) for r in graph.relations if r[2] == t]
                      for t in graph.num_nodes}

    def plan(self, super_batch_id: int, epoch: int, uppers: list[tuple[int, int, TypedSubgraph]],
             setting: RatioSetting) -> TypedPlan:
        """``uppers``: (mini-batch index, key, upper hops) of each mini-batch of the super-batch; ``setting``:
        the ratio controller's (the share of each type's reached destinations made hot, and the error cap)."""
        types = [t for t in self._slot if any(t in upper.frontiers[0] for _, _, upper in uppers)]
        stats = TypedPlanStats(epoch)
        per_type = {t: self._plan_type(t, uppers, setting, stats) for t in types}
        batches = []
        for b, (index, key, upper) in enumerate(uppers):
            cold, hot_pos, hot_rows, saved = {}, {}, {}, 0
            for t in upper.frontiers[0]:
                cold[t], hot_pos[t], hot_rows[t], edges = per_type[t][1][b]
                saved += edges
            batches.append(TypedPlannedBatch(index, key, upper, cold, hot_pos, hot_rows, saved))
        hot = {t: plan[0] for t, plan in per_type.items() if plan[0].shape[0]}
        stats.hot = {t: int(ids.shape[0]) for t, ids in hot.items()}
        probe = {t: plan[2] for t, plan in per_type.items() if plan[2].shape[0]}
        return TypedPlan(super_batch_id, epoch, batches, hot, stats, probe)

    def _plan_type(self, t: str, uppers, setting: RatioSetting, stats: TypedPlanStats):
        """H_s of type ``t`` and, per mini-batch, (cold positions, hot positions, hot rows, spared edges)."""
        slot = self._slot[t]
        bottoms = [upper.frontiers[0][t].numpy() if t in upper.frontiers[0] else EMPTY for _, _, upper in uppers]
        offsets = np.zeros(len(bottoms) + 1, np.int64)
        np.cumsum([b.shape[0] for b in bottoms], out=offsets[1:])
        dst = np.concatenate(bottoms) if bottoms else EMPTY
        own = np.array([upper.seeds.shape[0] if t == self.target else 0 for _, _, upper in uppers], np.int64)
        cold = fresh_entries(dst, offsets, own, EMPTY, np.zeros(len(uppers) + 1, np.int64), slot)
        distinct, appear, index = index_appearances(dst, slot)
        # Only the appearances a hot row can serve count: not those as their own mini-batch's seeds.
        appear -= np.bincount(index[cold], minlength=distinct.shape[0]).astype(np.int32)
        ranked = rank_by_count(appear)
        num_hot = min(int(np.count_nonzero(appear)), int(round(setting.ratio * distinct.shape[0])))
        if setting.auto:
            limit, capped = error_cap(appear[ranked], setting)
            num_hot = min(num_hot, limit)
            stats.error_capped |= capped
        hot = distinct[ranked[:num_hot]]
        row_of = np.full(distinct.shape[0], -1, np.int32)
        row_of[ranked[:num_hot]] = np.arange(num_hot, dtype=np.int32)
        saved_of = np.zeros(distinct.shape[0], np.int64)
        for indptr, fanout in self._into[t]:
            degree = indptr[hot + 1] - indptr[hot]
            saved_of[ranked[:num_hot]] += degree if fanout < 0 else np.minimum(degree, fanout)
        positions, rows, hot_counts, saved = split_hot_cold(index, offsets, row_of, saved_of, cold)
        stats.reached += int(distinct.shape[0])
        stats.appearances += int(dst.shape[0])
        stats.hot_appearances += int(hot_counts.sum())
        stats.saved_edges += int(saved.sum())
        per_batch = []
        for b in range(len(uppers)):
            lo, mid, hi = offsets[b], offsets[b] + hot_counts[b], offsets[b + 1]
            per_batch.append((positions[mid:hi], positions[lo:mid], rows[lo:mid], int(saved[b])))
        return hot, per_batch, distinct[ranked[:PROBE_ROWS]]


class HotRecord:
    """What the plans of an epoch (or a run) did, summed from their ``TypedPlanStats``; empty in exact mode."""

    def __init__(self):
        self.plans = 0
        self.hot: dict[str, int] = {}
        self.reached = self.appearances = self.hot_appearances = self.saved_edges = 0

    def add(self, stats: TypedPlanStats | None) -> None:
        if stats is not None:
            self._sum(1, stats.hot, stats.reached, stats.appearances, stats.hot_appearances, stats.saved_edges)

    def merge(self, other: "HotRecord") -> None:
        self._sum(other.plans, other.hot, other.reached, other.appearances, other.hot_appearances, other.saved_edges)

    def _sum(self, plans: int, hot: dict[str, int], reached: int, appearances: int, hot_appearances: int,
             saved_edges: int) -> None:
        self.plans += plans
        for t, count in hot.items():
            self.hot[t] = self.hot.get(t, 0) + count
        self.reached += reached
        self.appearances += appearances
        self.hot_appearances += hot_appearances
        self.saved_edges += saved_edges

    @property
    def hot_ratio(self) -> float | None:
        """The share of the reached destinations made hot (None without plans): what the tuner measured."""
        return sum(self.hot.values()) / max(1, self.reached) if self.plans else None

    def record(self) -> dict:
        """``hot_share``: the bottom-layer destination rows served by hot rows; ``hot_per_super_batch``: the
        mean |H_s| per type; ``saved_edges``: bottom-hop edges not sampled for the mini-batches."""
        if not self.plans:
            return {}
        return {"hot_share": round(self.hot_appearances / max(1, self.appearances), 4),
                "hot_per_super_batch": {t: round(n / self.plans, 1) for t, n in self.hot.items()},
                "saved_edges": self.saved_edges}
