"""Sampling on one part of a partitioned graph (docs/distributed.md, "Partitioned training"):
``PartitionedSampler`` gives exactly the blocks ``NeighborSampler`` gives on the whole graph for the same seeds
and key, while its rank holds only its part's in-edges.

Each hop groups the frontier by owner (``part_of``) and hands every owner the ids it owns (``Exchange``, every
rank taking part even with nothing to ask). The owner draws each asked vertex's neighbours from its part's CSC
(columns as global ids, every vertex's in-edges in the whole graph's order) keyed by (layer key, global id),
as ``kernels.sample_neighbors`` keys them, and sends back per vertex its count and the neighbours. The asker
puts them in frontier order and relabels them as the whole-graph sampler does, so draws do not depend on which
rank makes them. Three exchanges a hop: the ids (their sizes announced first), the counts, the neighbours."""

from __future__ import annotations

import numpy as np
import torch
from numba import njit, prange

from neutronorch.errors import ConfigError
from neutronorch.jit import read_only
from neutronorch.sampling import kernels
from neutronorch.sampling.block import Block
from neutronorch.sampling.exchange import Exchange
from neutronorch.sampling.frontier_map import FrontierMap
from neutronorch.sampling.neighbor_sampler import OneThread, Sampler


@njit(parallel=True, cache=True, nogil=True)
def sample_rows(indptr, indices, rows, ids, fanout, key):
    """``kernels.sample_neighbors`` of the vertices ``ids`` held at rows ``rows`` of a part's CSC: up to
    ``fanout`` (all when < 0) in-neighbours of ``ids[i]``, drawn from row ``rows[i]`` and keyed by ``ids[i]``
    (the whole graph's draws, the same in-edges in the same order). Returns (ptr, nbrs)."""
    n = rows.shape[0]
    ptr = kernels.drawn_ptr(indptr, rows, fanout, np.zeros(0, np.int64))
    nbrs = np.empty(ptr[n], indices.dtype)
    for i in prange(n):
        kernels.draw_keyed(indptr, indices, rows[i], ids[i], key, nbrs[ptr[i]:ptr[i + 1]])
    return ptr, nbrs


@njit(cache=True, nogil=True)
def in_frontier_order(order, grouped_ptr, grouped, ptr):
    """Segments received grouped by owner back in frontier order: position ``order[p]`` of the frontier gets
    ``grouped[grouped_ptr[p]:grouped_ptr[p + 1]]``; ``ptr`` is the frontier-order row pointer."""
    out = np.empty(ptr[-1], grouped.dtype)
    for p in range(order.shape[0]):
        i = order[p]
        out[ptr[i]:ptr[i + 1]] = grouped[grouped_ptr[p]:grouped_ptr[p + 1]]
    return out


def by_owner(ids: np.ndarray, part_of: np.ndarray, parts: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """``ids`` grouped by owner, keeping their order within each owner: (the grouping's order, positions in
    ``ids``; per part, its ids)."""
    owners = np.asarray(part_of[ids]) if ids.shape[0] else np.zeros(0, np.int32)
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(parts + 1))
    grouped = ids[order]
    return order, [grouped[bounds[k]:bounds[k + 1]] for k in range(parts)]


class PartitionedSampler(OneThread, Sampler):
    """``NeighborSampler``'s blocks for one rank holding ``part`` (``data.partition_files.Partition``), asking
    the other parts' ranks through ``exchange`` (rank ``part.part`` of ``part.parts``; None: it samples only its
    part's own vertices, as NeutronOrch's owner of hot rows does, and exchanges nothing). Every rank must sample
    the same number of hops at the same time, an empty batch included. ``degrees``: every vertex's in-degree in
    the whole graph (float32; ``global_in_degrees``), which the blocks then carry for their sources.

    Not thread-safe (one vertex -> position map, sized to its frontiers: ``FrontierMap``)."""

    def __init__(self, part, exchange: Exchange | None, fanouts: list[int], degrees: np.ndarray | None = None):
        if exchange is not None and (exchange.size != part.parts or exchange.rank != part.part):
            raise ConfigError(f"part {part.part} of {part.parts} sampled by rank {exchange.rank} of "
                              f"{exchange.size}: each rank samples the part of its number, one part per rank.")
        self.part, self.exchange, self.fanouts = part, exchange, list(fanouts)
        self.degrees, self._degree_of = degrees is not None, degrees
        self.indptr, self.indices = read_only(part.indptr), read_only(part.indices)
        self._map = FrontierMap()
        self.asked = 0  # vertices this rank asked other ranks to draw for
        self.served = 0  # vertices other ranks asked this one to draw for

    @staticmethod
    def _ids(ids) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        return ids if ids.flags.writeable else ids.copy()

    def _hops(self, start: np.ndarray, hops: list[tuple[int, int]]) -> tuple[list[Block], list[torch.Tensor]]:
        self._check_thread()
        self._map.start(start)
        frontier, blocks, frontiers = start, [], [torch.from_numpy(start)]
        try:
            for fanout, key in hops:
                num_dst = frontier.shape[0]
                ptr, nbrs = self.draw(frontier, fanout, key)
                (local,), frontier = self._map.relabel(frontier, [nbrs])
                frontiers.append(torch.from_numpy(frontier))
                blocks.append(Block(num_dst, frontier.shape[0], torch.from_numpy(ptr), torch.from_numpy(local),
                                    src_degree=self.src_degree(frontier), src_ids=frontiers[-1]))
        finally:
            self._map.clear()
        return blocks, frontiers

    def src_degree(self, sources: np.ndarray) -> torch.Tensor | None:
        return torch.from_numpy(self._degree_of[sources]) if self.degrees else None

    def draw(self, dst: np.ndarray, fanout: int, key: int) -> tuple[np.ndarray, np.ndarray]:
        """``kernels.sample_neighbors(indptr, indices, dst, fanout, key)`` of the whole graph: (ptr, nbrs),
        each vertex's neighbours drawn by its owner. A collective: every rank calls it at the same time. Without
        an exchange every vertex of ``dst`` must be this part's, and nothing is exchanged."""
        part, exchange = self.part, self.exchange
        if exchange is None:
            return self.serve(dst, fanout, key)
        order, asks = by_owner(dst, part.part_of, part.parts)
        self.asked += sum(a.shape[0] for k, a in enumerate(asks) if k != part.part)
        with exchange.unit():  # one unit of a ``Lane``: no rank stops within it
            asked = [a.reshape(-1) for a in exchange.all_to_all(asks)]
            drawn = [self.serve(ids, fanout, key) for ids in asked]
            counts = exchange.all_to_all([np.diff(p).astype(np.int32) for p, _ in drawn],
                                         [a.shape[0] for a in asks])
            nbrs = exchange.all_to_all([n for _, n in drawn], [int(c.sum()) for c in counts])
        self.served += sum(a.shape[0] for k, a in enumerate(asked) if k != part.part)
        grouped_counts = np.concatenate([c.reshape(-1) for c in counts]).astype(np.int64)
        grouped_ptr = np.zeros(dst.shape[0] + 1, np.int64)
        np.cumsum(grouped_counts, out=grouped_ptr[1:])
        ptr = np.zeros(dst.shape[0] + 1, np.int64)
        in_order = np.empty(dst.shape[0], np.int64)
        in_order[order] = grouped_counts
        np.cumsum(in_order, out=ptr[1:])
        grouped = np.concatenate([n.reshape(-1) for n in nbrs]) if nbrs else np.zeros(0, self.indices.dtype)
        return ptr, in_frontier_order(order, grouped_ptr, grouped.astype(self.indices.dtype, copy=False), ptr)

    def serve(self, ids: np.ndarray, fanout: int, key: int) -> tuple[np.ndarray, np.ndarray]:
        """The draws of ``ids`` (this part's vertices) as the whole graph's sampler makes them: (ptr, nbrs)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        rows = self.part.local(ids)
        return sample_rows(self.indptr, self.indices, rows, ids, fanout, np.uint64(key))


def global_in_degrees(part, gather, dtype=np.float32) -> np.ndarray:
    """Every vertex's in-degree in the whole graph (``dtype``, the whole graph's size), from each part's own, in
    its local order: ``gather(tensor)`` returns every rank's tensor (rank order; a collective) or, in one
    process, ``[tensor]``; vertex v's is row ``local_index[v]`` of part ``part_of[v]``'s. What symmetric GCN's
    blocks carry for their sources; 4 bytes a vertex, as ``part_of``."""
    own = torch.from_numpy(np.diff(np.asarray(part.indptr)).astype(dtype))
    parts = gather(own)
    starts = np.cumsum([0] + [p.shape[0] for p in parts[:-1]])
    return torch.cat(parts).numpy()[starts[np.asarray(part.part_of)] + np.asarray(part.local_index)]


def global_in_degree_ptr(part, gather) -> np.ndarray:
    """The whole graph's cumulative in-degrees (int64, a leading 0: vertex v's is ``ptr[v + 1] - ptr[v]``), from
    ``global_in_degrees``: what NeutronOrch's planner counts the edges a hot vertex spares by. 8 bytes a vertex."""
    counts = global_in_degrees(part, gather, np.int64)
    ptr = np.zeros(counts.shape[0] + 1, np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr
