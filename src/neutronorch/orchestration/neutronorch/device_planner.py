"""The planner on the training device: the plan of ``planner.py``, from upper hops sampled there.

With device sampling the cold sampler samples every hop of every mini-batch on the device, as device mode
does, and plans each super-batch there too: the host neither samples upper hops nor counts destinations,
and receives only H_s, whose rows it computes. The plan is the host planner's, entry for entry: the
distinct bottom-layer destinations in order of first appearance (a scatter-min of positions over a
per-vertex scratch array), their counts where a hot row can serve them (a bincount of the entries that
are not their mini-batch's own seeds), ranked by count with ties in first-appearance order (one stable
sort), the top ``ratio`` (capped as the host caps it) made hot. A handful of small reads back per
super-batch (sizes and the hot set), none per destination.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from neutronorch.orchestration.neutronorch.planner import PROBE_ROWS, Plan, PlannedBatch, PlanStats, read_only
from neutronorch.sampling.block import SampledSubgraph


class DevicePlanner:
    """Plans super-batches over one graph on the device holding ``indptr``; owns one scratch entry per
    vertex (one planner per thread)."""

    def __init__(self, indptr: torch.Tensor, bottom_fanout: int):
        self.indptr = indptr
        self.device = indptr.device
        self.bottom_fanout = bottom_fanout
        self._slot = torch.empty(indptr.shape[0] - 1, dtype=torch.int64, device=self.device)  # scratch

    def plan(self, super_batch_id: int, epoch: int, uppers: list[tuple[int, int, SampledSubgraph]], ratio: float,
             cap: Callable[[np.ndarray], tuple[int, bool]] | None = None, hot: np.ndarray | None = None,
             fresh: list | None = None) -> Plan:
        """As ``Planner.plan``; the uppers' tensors on this planner's device, the plan's positions too."""
        device, slot = self.device, self._slot
        sizes = [upper.frontiers[0].shape[0] for _, _, upper in uppers]
        offsets = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        dst = (torch.cat([upper.frontiers[0].long() for _, _, upper in uppers]) if uppers
               else torch.empty(0, dtype=torch.int64, device=device))
        n = dst.shape[0]
        positions = torch.arange(n, device=device)
        slot.index_fill_(0, dst, n)
        slot.scatter_reduce_(0, dst, positions, reduce="amin")
        first = slot.index_select(0, dst) == positions
        distinct = dst[first]  # in order of first appearance (one read back: how many)
        num_distinct = distinct.shape[0]
        slot.index_copy_(0, distinct, torch.arange(num_distinct, device=device))
        index = slot.index_select(0, dst)  # each entry's distinct vertex
        # Each mini-batch's own seeds (its first destinations) stay cold and their appearances there do not
        # count (``planner.py``).
        batch_of = torch.bucketize(positions, torch.from_numpy(offsets[1:]).to(device), right=True)
        starts = torch.from_numpy(offsets[:-1]).to(device)
        own = torch.tensor([upper.seeds.shape[0] for _, _, upper in uppers], dtype=torch.int64, device=device)
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
        degree = (self.indptr.index_select(0, hot_ids + 1) - self.indptr.index_select(0, hot_ids)).long()
        saved_of = degree if self.bottom_fanout < 0 else degree.clamp(max=self.bottom_fanout)
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
        planned = []
        for b, (batch, key, upper) in enumerate(uppers):
            lo = int(offsets[b])
            hot_pos, cold_pos = hot_splits[b] - lo, cold_splits[b] - lo
            planned.append(PlannedBatch(batch, key, upper, cold_pos, hot_pos,
                                        entry_row.index_select(0, hot_splits[b]), int(saved[b])))
        stats = PlanStats(epoch, num_hot, num_distinct, n, int(sum(hot_counts)), int(sum(saved)),
                          error_capped=capped)
        probe = distinct.index_select(0, ranked[:PROBE_ROWS])
        hot = read_only(hot_ids.cpu().numpy())
        return Plan(super_batch_id, epoch, tuple(planned), hot, probe.cpu().numpy(), stats)
