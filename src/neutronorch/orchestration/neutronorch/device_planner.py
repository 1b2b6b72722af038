"""The planner on the training device: ``planner.py``'s plan, entry for entry, from upper hops sampled there
(first appearances by a scatter-min, counts by a bincount, one stable sort). It must never read back per
destination: a few small reads per super-batch (sizes, the hot set).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.orchestration.neutronorch.planner import PROBE_ROWS, Choice, Planner, read_only
from neutronorch.sampling.neighbor_sampler import start_relabel, together


class DevicePlanner(Planner):
    """``Planner`` on the device holding ``indptrs``: uppers and positions are tensors there."""

    on_device = True

    def __init__(self, graph: Graph | TypedGraph, bottom_fanouts: int | dict[RelationType, int], indptrs):
        self.device = (indptrs if isinstance(indptrs, torch.Tensor) else next(iter(indptrs.values()))).device
        super().__init__(graph, bottom_fanouts, indptrs)

    def _scratch(self, n: int) -> torch.Tensor:
        return torch.empty(n, dtype=torch.int64, device=self.device)

    def _positions(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def _choose(self, t, bottoms: list[torch.Tensor], own: list[int], ratio: float, cap, hot, fresh,
                super_batch_id: int) -> Choice:
        return choose(self._slot[t], self._into[t], bottoms, own, ratio, cap, hot, fresh, super_batch_id)


def choose(slot: torch.Tensor, into: list[tuple[torch.Tensor, int]], bottoms: list[torch.Tensor], own: list[int],
           ratio: float, cap: Callable[[np.ndarray], tuple[int, bool]] | None, hot: np.ndarray | None = None,
           fresh: list | None = None, super_batch_id: int = 0) -> Choice:
    """``planner.choose`` on the device (``slot``: scratch of one entry per vertex)."""
    device = slot.device
    sizes = [b.shape[0] for b in bottoms]
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    dst = torch.cat([b.long() for b in bottoms]) if bottoms else torch.empty(0, dtype=torch.int64, device=device)
    n = dst.shape[0]
    positions = torch.arange(n, device=device)
    # Each entry's distinct vertex, and those in order of first appearance (one read back: how many).
    index, distinct = together([start_relabel(slot, dst[:0], dst)])[0]
    num_distinct = distinct.shape[0]
    # Each mini-batch's own seeds stay cold and do not count (``planner.py``).
    batch_of = torch.bucketize(positions, torch.from_numpy(offsets[1:]).to(device), right=True)
    starts = torch.from_numpy(offsets[:-1]).to(device)
    own = torch.tensor(own, dtype=torch.int64, device=device)
    is_seed = (positions - starts.index_select(0, batch_of)) < own.index_select(0, batch_of)
    for b, extra in enumerate(fresh or []):  # data parallel: the global batch's seeds too
        if extra is not None and extra.shape[0]:
            lo, hi = int(offsets[b]), int(offsets[b + 1])
            is_seed[lo:hi] |= torch.isin(dst[lo:hi], torch.as_tensor(extra, device=device))
    appear = torch.bincount(index[~is_seed], minlength=num_distinct)
    ranked = torch.sort(appear, descending=True, stable=True).indices
    capped = False
    if hot is None:
        servable = int(torch.count_nonzero(appear))
        num_hot = min(servable, int(round(ratio * num_distinct)))
        if cap is not None:
            limit, capped = cap(appear.index_select(0, ranked).cpu().numpy())
            num_hot = min(num_hot, limit)
        hot_distinct = ranked[:num_hot]
        hot_ids = distinct.index_select(0, hot_distinct)
    else:  # a resumed super-batch's hot set (reached again: the same draws), found among the distinct ones
        hot_ids = torch.tensor(hot, dtype=torch.int64).to(device)
        num_hot = hot_ids.shape[0]
        hot_distinct = slot.index_select(0, hot_ids)
        if num_hot and not torch.equal(distinct.index_select(0, hot_distinct.clamp(0, max(0, num_distinct - 1))),
                                       hot_ids):
            raise RuntimeError(f"super-batch {super_batch_id} was resumed with a hot set its mini-batches "
                               "do not reach")
    row_of = torch.full((num_distinct,), -1, dtype=torch.int64, device=device)
    row_of.index_copy_(0, hot_distinct, torch.arange(num_hot, device=device))
    # The bottom-hop edges each hot vertex spares the device (all its neighbours with fanout -1).
    saved_of = torch.zeros(num_hot, dtype=torch.int64, device=device)
    for indptr, fanout in into:
        degree = (indptr.index_select(0, hot_ids + 1) - indptr.index_select(0, hot_ids)).long()
        saved_of += degree if fanout < 0 else degree.clamp(max=fanout)
    entry_row = row_of.index_select(0, index).masked_fill_(is_seed, -1)
    is_hot = entry_row >= 0
    hot_entries = torch.nonzero(is_hot).squeeze(1)
    cold_entries = torch.nonzero(~is_hot).squeeze(1)
    hot_batch = batch_of.index_select(0, hot_entries)
    per_batch = torch.zeros(len(sizes), dtype=torch.int64, device=device)
    saved = torch.zeros(len(sizes), dtype=torch.int64, device=device)
    per_batch.index_add_(0, hot_batch, torch.ones_like(hot_batch))
    saved.index_add_(0, hot_batch, saved_of.index_select(0, entry_row.index_select(0, hot_entries)))
    hot_counts, saved = torch.stack([per_batch, saved]).tolist()  # one read back for both
    hot_splits = torch.split(hot_entries, hot_counts)
    cold_splits = torch.split(cold_entries, [s - h for s, h in zip(sizes, hot_counts)])
    lows = [int(lo) for lo in offsets[:-1]]
    probe = distinct.index_select(0, ranked[:PROBE_ROWS])
    return Choice(read_only(hot_ids.cpu().numpy()), probe.cpu().numpy(),
                  [c - lo for c, lo in zip(cold_splits, lows)], [h - lo for h, lo in zip(hot_splits, lows)],
                  [entry_row.index_select(0, h) for h in hot_splits], np.asarray(saved, np.int64), num_distinct, n,
                  int(sum(hot_counts)), capped)
