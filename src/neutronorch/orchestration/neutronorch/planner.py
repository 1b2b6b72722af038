"""The planner: which vertices of a super-batch are hot, and where each mini-batch finds them.

Pure: the upper hops of the super-batch's P mini-batches go in (already sampled), a ``Plan`` comes out.
No threads, no parameters, no device: tested on its own. The planning loop calls it once per super-batch.

The hot set H_s is the top ``ratio`` of the vertices reached among the super-batch's bottom-layer
destinations, ranked by how often they appear there (most frequent first, ties in order of first
appearance), optionally capped by ``cap(ranked counts)`` (the staleness-error cap of ``controller.py``).
On a typed graph the same choice (``choose``) is made once per vertex type, among that type's bottom-layer
destinations.

A mini-batch's own seeds are never served hot in it: their bottom-layer rows are computed fresh on the
device, and only their appearances in other mini-batches count towards their rank. A seed's bottom row
feeds its own output (the self term of every layer above), where the loss is read, so a stale one moves
the loss most; in a link task the seeds are the ends of the scored pairs, drawn in proportion to their
degree (the hottest vertices are seeds of most mini-batches), and serving them stale rows made training
diverge (Amazon Photo, ``docs/link-prediction.md``). The seeds lead each mini-batch's bottom-layer
destinations (every hop keeps its destinations first), so they are its first ``upper.seeds`` positions.
Data parallel, a rank's part of a global batch also keeps the other ranks' seeds of it cold (``fresh``), so
that ranks serve hot exactly the rows one process would.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Mapping

import numpy as np
import torch
from numba import njit, prange

from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.sampling.block import SampledSubgraph

PROBE_ROWS = 256  # vertices whose bottom-layer output measures the per-step drift (the hottest of a plan)


@dataclass(frozen=True)
class PlannedBatch:
    """One mini-batch of a plan: its upper hops and the positions (among ``upper.frontiers[0]``, the bottom-layer
    destinations) of its cold destinations (ascending) and of its hot ones, with the hot ones' rows of the hot
    table; on a typed graph one of each per destination type. Tensors on the device where it planned there."""

    index: int  # mini-batch number in its epoch
    key: int  # its ``batch_key``
    upper: SampledSubgraph  # the upper hops; ``upper.frontiers[0]`` are the bottom-layer destinations
    cold_pos: np.ndarray | dict[str, np.ndarray]
    hot_pos: np.ndarray | dict[str, np.ndarray]
    hot_rows: np.ndarray | dict[str, np.ndarray]
    saved_edges: int  # bottom-hop edges the device does not sample because their destination is hot
    targets: object = None  # what the loss reads instead of the seeds' labels (``SeedBatch.targets``)
    exclude: object = None  # edges its sampled graph must not hold (``SeedBatch.exclude``), bottom hop included


@dataclass(frozen=True)
class PlanStats:
    """What one plan did, for the summary (accounted by the trainer when it reaches the super-batch); on a
    typed graph summed over the types."""

    epoch: int
    hot: int  # |H_s|
    reached: int  # distinct bottom-layer destinations of the super-batch
    appearances: int  # bottom-layer destination rows over its mini-batches
    hot_appearances: int  # of which served by hot embeddings
    saved_edges: int
    error_capped: bool = False  # the staleness-error cap lowered |H_s| below the ratio's
    setting: int = 0  # the number of the ratio setting's publication the plan followed


@dataclass(frozen=True)
class Plan:
    """A super-batch's plan. Frozen, with its hot set read-only: it crosses from the planning thread to the
    host's and the cold sampler's (``read_only``). On a typed graph ``hot`` and ``probe`` are read-only
    mappings of the types that have any."""

    super_batch_id: int
    epoch: int
    batches: tuple[PlannedBatch, ...]
    hot: np.ndarray | Mapping[str, np.ndarray]  # H_s, hottest first
    probe: np.ndarray | Mapping[str, np.ndarray]  # the hottest PROBE_ROWS vertices (the drift probe's candidates)
    stats: PlanStats
    exclude: object = None  # every mini-batch's ``exclude`` together: edges the hot rows' bottom hop must not hold


def read_only(array: np.ndarray) -> np.ndarray:
    """``array``, no longer writeable: a hot set, which the plan hands to other threads."""
    array.flags.writeable = False
    return array


@njit(cache=True, nogil=True)
def rank_by_count(counts):
    """Positions of ``counts`` from the largest count to the smallest, ties in their order (what
    ``np.argsort(-counts, kind="stable")`` returns), by a counting sort: counts are appearances among a
    super-batch's mini-batches, small integers, so this is linear where a comparison sort is not."""
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


@njit(cache=True, nogil=True)
def index_appearances(nodes, slot):
    """The distinct vertices of ``nodes`` in order of first appearance, how often each appears, and for each
    entry of ``nodes`` its distinct vertex's number. ``slot`` (one int32 per vertex of the graph, all -1)
    is scratch, left -1 again. The one pass with random access to O(vertices) memory: what follows reads
    only arrays of the distinct vertices."""
    distinct = np.empty(nodes.shape[0], np.int64)
    counts = np.zeros(nodes.shape[0], np.int32)
    index = np.empty(nodes.shape[0], np.int32)
    n = 0
    for i in range(nodes.shape[0]):
        v = nodes[i]
        k = slot[v]
        if k < 0:
            k = n
            slot[v] = n
            distinct[n] = v
            n += 1
        counts[k] += 1
        index[i] = k
    for k in range(n):
        slot[distinct[k]] = -1
    return distinct[:n], counts[:n], index


@njit(parallel=True, cache=True, nogil=True)
def split_hot_cold(index, offsets, row_of, saved_of, fresh):
    """For each mini-batch ``b`` (entries ``offsets[b]:offsets[b + 1]`` of ``index``, the distinct-vertex
    numbers of its bottom-layer destinations): the positions of its hot destinations, ascending, then those
    of its cold ones (in ``positions``, over the same range), the hot ones' rows of the hot table (``rows``,
    at the front of the range), how many are hot, and the bottom-hop edges not sampled on the device
    because they are. ``row_of``/``saved_of``: per distinct vertex, its hot row (-1: cold) and those edges;
    ``fresh``: per entry, True where it is cold whatever its vertex (``fresh_entries``)."""
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
    """Per entry of the concatenated bottom-layer destinations ``dst`` (mini-batch ``b`` at
    ``offsets[b]:offsets[b + 1]``): whether it must be computed fresh: one of the mini-batch's first ``own[b]``
    (its own seeds, which lead its destinations), or a vertex of ``extra[extra_offsets[b]:extra_offsets[b + 1]]``
    (data parallel: the global batch's seeds). ``slot`` (one int32 per vertex, all -1) is scratch, left -1."""
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
    """``parts`` (arrays or tensors, or None for none) as one int64 array and the offsets of each."""
    arrays = [np.empty(0, np.int64) if p is None else np.asarray(p, dtype=np.int64) for p in parts]
    offsets = np.zeros(len(arrays) + 1, np.int64)
    np.cumsum([a.shape[0] for a in arrays], out=offsets[1:])
    return (np.concatenate(arrays) if arrays else np.empty(0, np.int64)), offsets


@dataclass
class Choice:
    """The hot set of one kind of destination (a typed graph's vertex type) in a super-batch and, per
    mini-batch, where its hot and cold destinations are: what ``choose`` gives."""

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
    """The choice with nothing hot (ratio 0): every destination cold, in order, nothing counted or ranked
    (``positions``: how the planner holds them)."""
    empty = lambda: positions(np.empty(0, np.int64))  # noqa: E731 - each its own (the hot set becomes read-only)
    return Choice(np.empty(0, np.int64), np.empty(0, np.int64), [positions(np.arange(n, dtype=np.int64)) for n in sizes],
                  [empty() for _ in sizes], [empty() for _ in sizes], np.zeros(len(sizes), np.int64), 0, sum(sizes), 0,
                  False)


def choose(slot: np.ndarray, into: list[tuple[np.ndarray, int]], bottoms: list[np.ndarray], own: np.ndarray,
           ratio: float, cap: Callable[[np.ndarray], tuple[int, bool]] | None = None, hot: np.ndarray | None = None,
           fresh: list | None = None) -> Choice:
    """The plan of one kind of destination: ``bottoms``, each mini-batch's bottom-layer destinations, whose
    first ``own[b]`` are its seeds; ``into``: the (indptr, bottom fanout) of each relation into them (what a
    hot destination spares the device); ``slot``: scratch of one int32 per vertex, all -1 (left so).
    ``ratio``, ``cap``, ``hot`` and ``fresh`` as ``Planner.plan`` takes them."""
    offsets = np.zeros(len(bottoms) + 1, np.int64)
    np.cumsum([b.shape[0] for b in bottoms], out=offsets[1:])
    dst = np.concatenate(bottoms) if bottoms else np.empty(0, np.int64)
    extra, extra_offsets = concatenated(fresh if fresh is not None else [None] * len(bottoms))
    cold = fresh_entries(dst, offsets, own, extra, extra_offsets, slot)
    distinct, appear, index = index_appearances(dst, slot)
    # Only the appearances a hot row can serve count: not those as their own mini-batch's seeds.
    appear -= np.bincount(index[cold], minlength=distinct.shape[0]).astype(np.int32)
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
    """Plans super-batches over a graph's kinds of destination: a homogeneous graph's one (``None``: its
    vertices; its plans hold plain arrays), or a typed graph's vertex types (a relational model's bottom layer
    writes one output per destination type, so a plan is ``choose`` once per type, the target type's first
    ``len(seeds)`` being each mini-batch's own seeds). ``bottom_fanouts``: the bottom hop's fanout (a typed
    graph's: per relation); ``indptrs``: the topology it reads (default the graph's; a typed graph's per
    relation). Owns scratch arrays of one entry per vertex (one planner per thread)."""

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

    def _empty(self, t) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64)

    def _positions(self, array: np.ndarray):
        return array

    def plan(self, super_batch_id: int, epoch: int, uppers: list[tuple[int, int, SampledSubgraph]], ratio: float,
             cap: Callable[[np.ndarray], tuple[int, bool]] | None = None, hot=None, fresh: list | None = None) -> Plan:
        """``uppers``: (mini-batch index, key, upper-hop sample) of each mini-batch of the super-batch.
        ``hot``: the hot set (a typed graph's: per type), already chosen (a resumed super-batch's), instead of
        ranking by ``ratio``; ratio 0 and no ``hot``: every destination cold, in order, without counting or
        ranking them (``reached`` and the probe are then unknown: 0 and none). ``fresh``: per mini-batch,
        vertices never served hot in it besides its own seeds (data parallel: the global batch's seeds,
        ``SeedBatch.batch_seeds``; None: none)."""
        bottoms = [upper.frontiers[0] if self.target else {None: upper.frontiers[0]} for _, _, upper in uppers]
        choices = {}
        for t in self._slot:
            if not any(t in b for b in bottoms):
                continue
            mine = [b.get(t, self._empty(t)) for b in bottoms]
            if ratio == 0 and hot is None:
                choices[t] = all_cold([int(d.shape[0]) for d in mine], self._positions)
                continue
            own = [upper.seeds.shape[0] if t == self.target else 0 for _, _, upper in uppers]
            chosen = hot if hot is None or not self.target else hot.get(t, np.empty(0, np.int64))
            choices[t] = self._choose(t, mine, own, ratio, cap, chosen, fresh if t == self.target else None,
                                      super_batch_id)
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
        """``per_kind`` as a plan holds it: a homogeneous graph's one array; a typed graph's mapping (of the
        types with any, unless ``keep_empty``)."""
        if not self.target:
            return per_kind[None]
        return {t: a for t, a in per_kind.items() if keep_empty or a.shape[0]}

    def _choose(self, t, bottoms: list, own: list[int], ratio: float, cap, hot, fresh, super_batch_id: int) -> Choice:
        """The choice among the bottom-layer destinations of kind ``t``, ``bottoms`` (each mini-batch's; its
        first ``own[b]`` its seeds)."""
        return choose(self._slot[t], self._into[t], [b.numpy() for b in bottoms], np.array(own, np.int64), ratio,
                      cap, hot, fresh)
