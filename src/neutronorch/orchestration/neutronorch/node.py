"""One hot set per node (data parallel, ``hot_set="node"``): planned from the node's counts, computed a
slice per rank, gathered.

The ranks of a node train the parts of the same global mini-batches, so their bottom layers reach many of
the same vertices. Planned per rank, a vertex hot on two ranks is sampled, gathered and computed twice on
the node's one CPU. Here, for each super-batch:

1. **plan** (planner thread): each rank counts its own parts' bottom-layer destinations, as it would
   alone; the node gathers every rank's (vertex, count) pairs and each rank ranks the merged counts the
   same way (count, then first appearance over the ranks' lists in rank order), with the ratio and staleness-error setting of the node's first rank,
   so that every rank of the node holds the same hot set H_s;
2. **compute** (host thread): rank ``i`` of the node samples, gathers and computes rows
   ``slice_bounds(|H_s|, L)[i]`` of H_s, and the node gathers the slices into the whole table. Sampling
   and dropout are keyed by vertex, so a row is what any rank would have computed;
3. **gradient** (trainer thread, ``hot_grad="cpu"``): every rank accumulates dL/dY for all of H_s from its
   own mini-batches; the node sums them and each rank back-propagates its own slice. Summed over the
   node's ranks, that is the gradient each rank adds when it computes all of its own hot set.

Each step is a collective within the node, on a group of its thread's own (``NodeLink``), so host-thread
collectives never interleave with the trainer's. ``merge_counts`` and ``slice_bounds`` are pure.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch

from neutronorch.orchestration.neutronorch.controller import RatioSetting, error_cap
from neutronorch.orchestration.neutronorch.planner import PROBE_ROWS, index_appearances, rank_by_count


class NodeLink(Protocol):
    """The ranks of this node, as NeutronOrch mode needs them (made by the trainer from its process group)."""

    local_rank: int
    local_size: int

    def gather_plans(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Planner thread: every rank's 1-D tensor (any length), in local rank order."""

    def gather_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Host thread: every rank's rows (``counts[i]`` of them on local rank i) concatenated in order."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Trainer thread: ``tensor`` summed over the node's ranks, in place."""

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Trainer thread: the element-wise maximum over the node's ranks, in place."""


def slice_bounds(num_rows: int, parts: int) -> list[tuple[int, int]]:
    """Contiguous ranges of ``num_rows`` rows, one per part, sizes differing by at most one (first ones larger)."""
    base, extra = divmod(num_rows, parts)
    bounds, lo = [], 0
    for i in range(parts):
        hi = lo + base + (1 if i < extra else 0)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]],
                 slot: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The node's distinct vertices, in order of first appearance over the ranks' lists taken in rank order
    (the same order on every rank), and their summed counts, from each rank's (vertices, counts). One
    linear pass; ``slot`` (one int32 per vertex, all -1, left so) is scratch."""
    if not parts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    ids = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
    counts = np.concatenate([p[1] for p in parts]).astype(np.int64, copy=False)
    if slot is None:
        slot = np.full(int(ids.max(initial=-1)) + 1, -1, np.int32)
    distinct, _, index = index_appearances(ids, slot)
    return distinct, np.bincount(index, weights=counts, minlength=distinct.shape[0]).astype(np.int64)


def _encode(distinct: np.ndarray, counts: np.ndarray, setting: RatioSetting) -> torch.Tensor:
    """One int64 message: [ratio, error (NaN: not measured), auto] as float64 bits, then vertices, counts."""
    error = setting.stale_error
    error = error.value() if hasattr(error, "value") else error
    error = math.nan if error is None else float(error)
    header = np.array([setting.ratio, error, float(setting.auto)], np.float64).view(np.int64)
    return torch.from_numpy(np.concatenate([header, distinct.astype(np.int64), counts.astype(np.int64)]))


def _decode(message: torch.Tensor) -> tuple[np.ndarray, np.ndarray, tuple[float, float | None, bool]]:
    values = message.numpy()
    ratio, error, auto = values[:3].view(np.float64)
    n = (values.shape[0] - 3) // 2
    return values[3:3 + n], values[3 + n:], (float(ratio), None if math.isnan(error) else float(error), bool(auto))


class NodeHotSet:
    """Plans one hot set for the node's ranks (``choose``, planner thread) and says which slice of it this
    rank computes (``bounds``)."""

    def __init__(self, link: NodeLink):
        self.link = link

    def choose(self, distinct: np.ndarray, counts: np.ndarray, setting: RatioSetting,
               slot: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, bool, int]:
        """From this rank's distinct bottom-layer destinations and their counts: the node's hot set (hottest
        first), its hottest ``PROBE_ROWS`` vertices, whether the error cap lowered it, and how many vertices
        the node's super-batch reaches. A collective: every rank of the node calls it for each super-batch.
        ``slot``: ``merge_counts``' scratch."""
        messages = self.link.gather_plans(_encode(distinct, counts, setting))
        decoded = [_decode(m) for m in messages]
        ratio, error, auto = decoded[0][2]  # the node's first rank decides: every rank then plans the same
        node, total = merge_counts([(ids, c) for ids, c, _ in decoded], slot)
        ranked = rank_by_count(total)  # ties in merged order: the same on every rank
        num_hot = min(node.shape[0], int(round(ratio * node.shape[0])))
        capped = False
        if auto:
            limit, capped = error_cap(total[ranked], RatioSetting(ratio, auto, error, setting.error_budget))
            num_hot = min(num_hot, limit)
        return node[ranked[:num_hot]], node[ranked[:PROBE_ROWS]], capped, int(node.shape[0])

    def bounds(self, num_hot: int) -> tuple[int, int]:
        """The rows of a hot set of ``num_hot`` this rank computes."""
        return slice_bounds(num_hot, self.link.local_size)[self.link.local_rank]

    def counts(self, num_hot: int) -> list[int]:
        return [hi - lo for lo, hi in slice_bounds(num_hot, self.link.local_size)]

    def gather(self, rows: torch.Tensor, num_hot: int, version: int) -> torch.Tensor:
        """The whole table of a hot set of ``num_hot`` from every rank's slice (``rows``: this rank's),
        after checking that every slice was computed from the same parameter version."""
        if num_hot == 0:  # the same on every rank: nothing to gather
            return rows
        versions = self.link.gather_rows(torch.tensor([[version]], dtype=torch.int64), [1] * self.link.local_size)
        if not bool((versions == version).all()):
            raise RuntimeError(f"the ranks of a node computed slices of one hot set from parameter versions "
                               f"{versions.flatten().tolist()}: their snapshot schedules differ. This is a bug.")
        return self.link.gather_rows(rows.contiguous(), self.counts(num_hot))
