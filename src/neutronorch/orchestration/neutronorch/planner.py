"""The planner: which vertices of a super-batch are hot, and where each mini-batch finds them.

Pure (no threads, parameters or device): the upper hops of the super-batch's P mini-batches in, a ``Plan``
out, by the rule of ``docs/neutronorch.md``, "Hot sets" (on a typed graph per vertex type). A mini-batch's
own seeds, its first ``upper.seeds`` destinations, are never served hot in it; data parallel neither are
the global batch's other seeds (``fresh``), so ranks serve hot exactly the rows one process would.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
from numba import njit, prange

from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.kernels import relabel, reset_map

PROBE_ROWS = 256  # vertices whose bottom-layer output measures the per-step drift (the hottest of a plan)


@dataclass(frozen=True)
class PlannedBatch:
    """One mini-batch of a plan: positions among ``upper.frontiers[0]`` of its cold destinations (ascending)
    and hot ones, with the hot ones' table rows; per type on a typed graph; on the device if planned there."""

    index: int  # mini-batch number in its epoch
    key: int  # its ``batch_key``
    upper: SampledSubgraph
    cold_pos: np.ndarray | dict[str, np.ndarray]
    hot_pos: np.ndarray | dict[str, np.ndarray]
    hot_rows: np.ndarray | dict[str, np.ndarray]
    saved_edges: int  # bottom-hop edges the device does not sample because their destination is hot
    targets: object = None  # what the loss reads instead of the seeds' labels (``SeedBatch.targets``)
    exclude: object = None  # edges its sampled graph must not hold (``SeedBatch.exclude``), bottom hop included


@dataclass(frozen=True)
class PlanStats:
    """What one plan did, for the summary; on a typed graph summed over the types."""

    epoch: int
    hot: int  # |H_s|
    reached: int  # distinct bottom-layer destinations of the super-batch
    appearances: int  # bottom-layer destination rows over its mini-batches
    hot_appearances: int  # of which served by hot embeddings
    saved_edges: int
    error_capped: bool = False  # the staleness-error cap lowered |H_s| below the ratio's
    setting: int = 0  # the number of the ratio setting's publication the plan followed
    ratio: float | None = None  # ... and its ratio


@dataclass(frozen=True)
class Plan:
    """A super-batch's plan. Frozen, its hot set read-only: it crosses to the host's and the cold sampler's
    threads. On a typed graph ``hot`` and ``probe`` are read-only mappings of the types that have any."""

    super_batch_id: int
    epoch: int
    batches: tuple[PlannedBatch, ...]
    hot: np.ndarray | Mapping[str, np.ndarray]  # H_s, hottest first
    probe: np.ndarray | Mapping[str, np.ndarray]  # the hottest PROBE_ROWS vertices (the drift probe's candidates)
    stats: PlanStats
    exclude: object = None  # every mini-batch's ``exclude`` together: edges the hot rows' bottom hop must not hold


def read_only(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


@njit(cache=True, nogil=True)
def rank_by_count(counts):
    """``np.argsort(-counts, kind="stable")`` by a counting sort: counts are small integers (appearances
    among a super-batch's mini-batches), so this is linear."""
    n = counts.shape[0]
    order = np.empty(n, np.int64)
    if n == 0:
        return order
    top = counts.max()
    start = np.zeros(top + 2, np.int64)  # bucket b holds count top - b
    for i in range(n):
        start[top - counts[i] + 1] += 1
    for b in range(1, top + 2):
        start[b] += start[b - 1]
    for i in range(n):
        b = top - counts[i]
        order[start[b]] = i
        start[b] += 1
    return order


def index_appearances(nodes: np.ndarray, slot: np.ndarray):
    """The distinct vertices of ``nodes`` by first appearance, each one's count, and each entry's distinct
    number. ``slot``: scratch of one int32 per vertex, all -1 (left so); the only pass over O(vertices)."""
    distinct = np.empty(nodes.shape[0], np.int64)
    index, n = relabel(distinct, 0, nodes, slot)
    reset_map(distinct[:n], slot)
    return distinct[:n], np.bincount(index, minlength=n), index


@njit(parallel=True, cache=True, nogil=True)
def split_hot_cold(index, offsets, row_of, saved_of, fresh):
    """Per mini-batch ``b`` (entries ``offsets[b]:offsets[b + 1]`` of ``index``, distinct-vertex numbers):
    in ``positions`` its hot destinations' positions then its cold ones', in ``rows`` the hot ones' table
    rows, how many are hot, and the bottom-hop edges they spare. ``row_of``/``saved_of``: per distinct
    vertex, its hot row (-1: cold) and those edges; ``fresh``: per entry, cold whatever its vertex."""
    batches = offsets.shape[0] - 1
    positions = np.empty(index.shape[0], np.int64)
    rows = np.empty(index.shape[0], np.int64)
    hot = np.zeros(batches, np.int64)
    saved = np.zeros(batches, np.int64)
    for b in prange(batches):
        lo, hi = offsets[b], offsets[b + 1]
        h, edges = lo, 0
        for i in range(lo, hi):
            row = row_of[index[i]]
            if row >= 0 and not fresh[i]:
                positions[h] = i - lo
                rows[h] = row
                h += 1
                edges += saved_of[index[i]]
        hot[b], saved[b] = h - lo, edges
        for i in range(lo, hi):
            if row_of[index[i]] < 0 or fresh[i]:
                positions[h] = i - lo
                h += 1
    return positions, rows, hot, saved


@njit(cache=True, nogil=True)
def fresh_entries(dst, offsets, own, extra, extra_offsets, slot):
    """Per entry of ``dst`` (mini-batch ``b`` at ``offsets[b]:offsets[b + 1]``): whether it is computed fresh,
    being one of the first ``own[b]`` (its seeds) or in ``extra[extra_offsets[b]:extra_offsets[b + 1]]``
    (data parallel: the global batch's seeds). ``slot``: scratch as ``index_appearances``'s."""
    fresh = np.zeros(dst.shape[0], np.bool_)
    for b in range(offsets.shape[0] - 1):
        lo, hi = offsets[b], offsets[b + 1]
        for i in range(lo, min(hi, lo + own[b])):
            fresh[i] = True
        first, last = extra_offsets[b], extra_offsets[b + 1]
        if last > first:
            for k in range(first, last):
                slot[extra[k]] = 0
            for i in range(lo, hi):
                if slot[dst[i]] == 0:
                    fresh[i] = True
            for k in range(first, last):
                slot[extra[k]] = -1
    return fresh


def concatenated(parts: list) -> tuple[np.ndarray, np.ndarray]:
    arrays = [np.empty(0, np.int64) if p is None else np.asarray(p, dtype=np.int64) for p in parts]
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([a.shape[0] for a in arrays], out=offsets[1:])
    return (np.concatenate(arrays) if arrays else np.empty(0, np.int64)), offsets


@dataclass
class Choice:
    """``choose``'s result for one kind of destination (a typed graph's vertex type)."""

    hot: np.ndarray  # hottest first
    probe: np.ndarray  # the hottest PROBE_ROWS reached (the drift probe's candidates)
    cold_pos: list[np.ndarray]  # per mini-batch, ascending
    hot_pos: list[np.ndarray]
    hot_rows: list[np.ndarray]
    saved: np.ndarray  # per mini-batch: bottom-hop edges not sampled on the device
    reached: int
    appearances: int
    hot_appearances: int
    capped: bool


def all_cold(sizes: list[int], positions=np.asarray) -> Choice:
    """Ratio 0: every destination cold, in order, nothing counted or ranked (``positions``: how the planner
    holds positions)."""
    empty = lambda: positions(np.empty(0, np.int64))  # noqa: E731 - each its own (the hot set becomes read-only)
    return Choice(np.empty(0, np.int64), np.empty(0, np.int64), [positions(np.arange(n, dtype=np.int64)) for n in sizes],
                  [empty() for _ in sizes], [empty() for _ in sizes], np.zeros(len(sizes), np.int64), 0, sum(sizes), 0,
                  False)


def choose(slot: np.ndarray, into: list[tuple[np.ndarray, int]], bottoms: list[np.ndarray], own: np.ndarray,
           ratio: float, cap: Callable[[np.ndarray], tuple[int, bool]] | None = None, hot: np.ndarray | None = None,
           fresh: list | None = None) -> Choice:
    """The choice among ``bottoms`` (each mini-batch's bottom-layer destinations, the first ``own[b]`` its
    seeds); ``into``: the (indptr, bottom fanout) of each relation into them; ``slot``: scratch as
    ``index_appearances``'s. ``ratio``, ``cap``, ``hot`` and ``fresh`` as ``Planner.plan`` takes them."""
    dst, offsets = concatenated(bottoms)
    extra, extra_offsets = concatenated(fresh if fresh is not None else [None] * len(bottoms))
    cold = fresh_entries(dst, offsets, own, extra, extra_offsets, slot)
    distinct, appear, index = index_appearances(dst, slot)
    # Only the appearances a hot row can serve count: not those as their own mini-batch's seeds.
    appear -= np.bincount(index[cold], minlength=distinct.shape[0])
    ranked = rank_by_count(appear)
    capped = False
    row_of = np.full(distinct.shape[0], -1, np.int32)  # per distinct vertex: its hot row, or -1
    if hot is None:
        servable = int(np.count_nonzero(appear))
        num_hot = min(servable, int(round(ratio * distinct.shape[0])))
        if cap is not None:
            limit, capped = cap(appear[ranked])
            num_hot = min(num_hot, limit)
        hot = distinct[ranked[:num_hot]]
        row_of[ranked[:num_hot]] = np.arange(num_hot, dtype=np.int32)
    else:  # a resumed super-batch's hot set: find its vertices among the distinct ones
        slot[hot] = np.arange(hot.shape[0], dtype=np.int32)
        row_of[:] = slot[distinct]
        slot[hot] = -1
    # The bottom-hop edges each hot vertex spares the device (all its neighbours with fanout -1).
    hot_distinct = np.flatnonzero(row_of >= 0)
    vertices = distinct[hot_distinct]
    saved_of = np.zeros(distinct.shape[0], np.int64)
    for indptr, fanout in into:
        degree = indptr[vertices + 1] - indptr[vertices]
        saved_of[hot_distinct] += degree if fanout < 0 else np.minimum(degree, fanout)
    positions, rows, hot_counts, saved = split_hot_cold(index, offsets, row_of, saved_of, cold)
    mids = offsets[:-1] + hot_counts
    return Choice(hot, distinct[ranked[:PROBE_ROWS]],
                  [positions[mid:hi] for mid, hi in zip(mids, offsets[1:])],
                  [positions[lo:mid] for lo, mid in zip(offsets[:-1], mids)],
                  [rows[lo:mid] for lo, mid in zip(offsets[:-1], mids)], saved,
                  int(distinct.shape[0]), int(dst.shape[0]), int(hot_counts.sum()), capped)


class Planner:
    """Plans over a graph's kinds of destination: a homogeneous graph's one (key ``None``; its plans hold
    plain arrays) or a typed graph's vertex types (``choose`` per type). ``bottom_fanouts`` and ``indptrs``
    (default the graph's): per relation on a typed graph. Owns per-vertex scratch: one planner per thread."""

    on_device = False  # the uppers it takes, and the positions it gives, are tensors on the training device

    def __init__(self, graph: Graph | TypedGraph, bottom_fanouts: int | dict[RelationType, int], indptrs=None):
        if isinstance(graph, TypedGraph):
            indptrs = indptrs or {r: relation.indptr for r, relation in graph.relations.items()}
            self.target, num_nodes = graph.target, graph.num_nodes
            self._into = {t: [(indptrs[r], bottom_fanouts[r]) for r in graph.relations if r[2] == t]
                          for t in num_nodes}
        else:
            self.target, num_nodes = None, {None: graph.num_nodes}
            self._into = {None: [(graph.indptr if indptrs is None else indptrs, bottom_fanouts)]}
        self._slot = {t: self._scratch(n) for t, n in num_nodes.items()}  # choose's scratch, left as it was

    def _scratch(self, n: int):
        return np.full(n, -1, np.int32)

    def _positions(self, array: np.ndarray):
        return array

    def plan(self, super_batch_id: int, epoch: int, uppers: list[tuple[int, int, SampledSubgraph]], ratio: float,
             cap: Callable[[np.ndarray], tuple[int, bool]] | None = None, hot=None, fresh: list | None = None) -> Plan:
        """``uppers``: (mini-batch index, key, upper-hop sample) per mini-batch. ``hot``: a resumed
        super-batch's hot set, instead of ranking by ``ratio`` (ratio 0 without it: all cold, ``reached``
        0 and no probe). ``fresh``: per mini-batch, vertices never hot in it besides its seeds
        (``SeedBatch.batch_seeds``, per type on a typed graph as ``hot``; None: none)."""
        bottoms = [upper.frontiers[0] if self.target else {None: upper.frontiers[0]} for _, _, upper in uppers]
        choices, none = {}, self._positions(np.empty(0, np.int64))  # once, not once per mini-batch
        for t in self._slot:
            if not any(t in b for b in bottoms):
                continue
            mine = [b.get(t, none) for b in bottoms]
            if ratio == 0 and hot is None:
                choices[t] = all_cold([int(d.shape[0]) for d in mine], self._positions)
                continue
            # A mini-batch's seeds of this type lead its frontier: a typed one's are its top frontier's.
            own = [len(upper.frontiers[-1].get(t, ())) if self.target else upper.seeds.shape[0]
                   for _, _, upper in uppers]
            chosen = hot if hot is None or not self.target else hot.get(t, np.empty(0, np.int64))
            extra = fresh if fresh is None or not self.target else [f.get(t) for f in fresh]
            choices[t] = self._choose(t, mine, own, ratio, cap, chosen, extra, super_batch_id)
        planned = tuple(PlannedBatch(index, key, upper, *(self._as_plan({t: getattr(choices[t], part)[b] for t in
                                                                         bottoms[b]}, True)
                                                          for part in ("cold_pos", "hot_pos", "hot_rows")),
                                     sum(int(choices[t].saved[b]) for t in bottoms[b]))
                        for b, (index, key, upper) in enumerate(uppers))
        total = lambda part: sum(getattr(c, part) for c in choices.values())  # noqa: E731
        stats = PlanStats(epoch, sum(int(c.hot.shape[0]) for c in choices.values()), total("reached"),
                          total("appearances"), total("hot_appearances"),
                          sum(int(c.saved.sum()) for c in choices.values()), any(c.capped for c in choices.values()))
        hot = self._as_plan({t: read_only(c.hot) for t, c in choices.items()})
        return Plan(super_batch_id, epoch, planned, hot if not self.target else MappingProxyType(hot),
                    self._as_plan({t: c.probe for t, c in choices.items()}), stats)

    def _as_plan(self, per_kind: dict, keep_empty: bool = False):
        """A homogeneous graph's one array, or a typed graph's mapping (of the types with any, unless
        ``keep_empty``)."""
        if not self.target:
            return per_kind[None]
        return {t: a for t, a in per_kind.items() if keep_empty or a.shape[0]}

    def _choose(self, t, bottoms: list, own: list[int], ratio: float, cap, hot, fresh, super_batch_id: int) -> Choice:
        return choose(self._slot[t], self._into[t], bottoms, np.array(own, np.int64), ratio, cap, hot, fresh)
