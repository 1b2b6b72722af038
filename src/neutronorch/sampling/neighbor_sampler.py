"""Uniform neighbour sampling: seeds in, one block per layer out.

``NeighborSampler`` (numba kernels on host arrays) and ``TorchNeighborSampler`` (torch ops on tensors of any
device) share one contract: uniform without replacement, all neighbours when the degree is at most the
fanout, destination-first source frontiers, first-appearance order for new vertices.

Randomness derives from ``batch_key(seed, epoch, batch_index)``: the same key always yields the same sample,
and each vertex's neighbours in a hop depend only on (``layer_key``, vertex), in both samplers, whichever
batch, thread or data-parallel rank samples it. The two samplers draw the same neighbours for a given key: the
same counter stream, the same steps of Floyd's algorithm and the same multiply-shift from 32 random bits to an
offset, so a hop sampled on the device equals that hop sampled on the host.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numba
import numpy as np
import torch

from neutronorch.jit import read_only
from neutronorch.sampling import hop_pipeline, kernels, relabel_kernels
from neutronorch.sampling.block import Block, SampledSubgraph
from neutronorch.sampling.hop_pipeline import segments_for
from neutronorch.sampling.relabel_kernels import RelabelScratch


_MASK = (1 << 64) - 1
# A step started on the device: a size it waits for (a device scalar), and what finishes it given that size.
Started = tuple[torch.Tensor, Callable[[int], tuple]]


def mix_key(a: int, b: int) -> int:
    """Combine two integers into a 64-bit key (a Python int): ``kernels.splitmix_key``, the kernels' own
    function, of ``a`` and ``b`` taken modulo 2**64 (so negative ones, such as epoch -1, wrap)."""
    return int(kernels.splitmix_key(np.uint64(a & _MASK), np.uint64(b & _MASK)))


def batch_key(seed: int, epoch: int, batch_index: int) -> int:
    """The 64-bit key of one mini-batch's randomness."""
    return mix_key(mix_key(seed, epoch), batch_index)


def layer_key(key: int, hop: int) -> int:
    return mix_key(key, hop + 1)


class OneThread:
    """A sampler owning position maps: ``_check_thread`` raises when a second thread calls it."""

    _owner: int | None = None

    def _check_thread(self) -> None:
        me = threading.get_ident()
        if self._owner is None:
            self._owner = me
        elif self._owner != me:
            raise RuntimeError(f"{type(self).__name__} used from two threads; create one sampler per thread")


class Sampler:
    """What the homogeneous samplers share: ``sample``, ``sample_many`` and ``sample_hop`` over their
    ``_hops(start, hops)``, the blocks and frontiers (seed hop first, ``frontiers[0]`` is ``start``) of
    ``hops``, each a (fanout, layer key), from the destinations ``start`` (made by ``_ids``)."""

    fanouts: list[int]

    def sample(self, seeds, key: int, fanouts: list[int] | None = None) -> SampledSubgraph:
        """Sample the computation graph of ``seeds`` (unique global ids) with fanouts seed hop first."""
        return self.sample_many([seeds], [key], fanouts)[0]

    def sample_many(self, seeds: list, keys: list[int], fanouts: list[int] | None = None
                    ) -> list[SampledSubgraph]:
        """``sample`` of several mini-batches (``seeds[i]`` with ``keys[i]``)."""
        fanouts = self.fanouts if fanouts is None else fanouts
        runs = self._run([(self._ids(s), [(f, layer_key(key, hop)) for hop, f in enumerate(fanouts)])
                          for s, key in zip(seeds, keys)])
        return [SampledSubgraph(frontiers[0], blocks[::-1], frontiers[::-1]) for blocks, frontiers in runs]

    def sample_hop(self, dst, fanout: int, key: int) -> tuple[Block, torch.Tensor]:
        """One hop on its own: sample ``fanout`` in-neighbours of every vertex of ``dst`` (unique global ids)
        with the per-vertex randomness of ``key`` (a ``layer_key``). Returns the block and its source
        frontier (global ids, ``dst`` first). With the same key, each vertex gets exactly the neighbours
        ``sample`` draws for it in that hop."""
        blocks, frontiers = self._run([(self._ids(dst), [(fanout, key)])])[0]
        return blocks[0], frontiers[1]

    def _run(self, calls: list[tuple]) -> list[tuple[list[Block], list]]:
        return [self._hops(start, hops) for start, hops in calls]


class NeighborSampler(OneThread, Sampler):
    """Host sampler over a CSC graph (``indptr``, ``indices`` as numpy arrays or memory maps). With
    ``degrees``, every block carries its source rows' in-degrees in the graph (``Block.src_degree``). With
    ``file_order``, each hop visits its vertices region by region of the topology (``kernels.region_order``:
    memory maps read front to back); the blocks are the same either way.

    Not thread-safe: one instance per sampling thread (it owns a vertex -> position map).
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, fanouts: list[int], degrees: bool = False,
                 file_order: bool = False):
        self.file_order = file_order
        # Vertices per region: about REGION_BYTES of their adjacency at the graph's mean degree.
        mean_degree = max(1.0, indices.shape[0] / max(1, indptr.shape[0] - 1))
        self.vertices_per_region = max(1, int(kernels.REGION_BYTES / (mean_degree * indices.itemsize)))
        self.indptr = read_only(indptr)
        self.indices = read_only(indices)
        self.fanouts = list(fanouts)
        self.degrees = degrees
        self._node_map = np.full(indptr.shape[0] - 1, -1, dtype=np.int64)
        self._scratch = RelabelScratch(indptr.shape[0] - 1)

    @staticmethod
    def _ids(ids) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        return ids if ids.flags.writeable else ids.copy()  # a plan's read-only hot set: frontiers get a copy

    def _hops(self, start: np.ndarray, hops: list[tuple[int, int]]) -> tuple[list[Block], list[torch.Tensor]]:
        self._check_thread()
        node_map = self._node_map
        kernels.map_nodes(start, node_map)
        frontier, blocks, frontiers = start, [], [torch.from_numpy(start)]
        threads = numba.get_num_threads()
        # Draws and relabel at once where the relabel would otherwise run on one thread while the rest wait
        # (docs/performance.md, "The host sampler on more threads"); in file order, one after the other.
        pipelined = not self.file_order and 2 <= threads < relabel_kernels.PARALLEL_FROM_THREADS
        try:
            for fanout, key in hops:
                num_dst = frontier.shape[0]
                if pipelined:
                    ptr, local, frontier = self._pipelined_hop(frontier, fanout, key, threads)
                else:
                    order = (kernels.region_order(frontier, self.vertices_per_region, self.indptr.shape[0] - 1)
                             if self.file_order else kernels.NO_ORDER)
                    ptr, nbrs = kernels.sample_neighbors(self.indptr, self.indices, frontier, fanout,
                                                         np.uint64(key), order)
                    (local,), frontier = relabel_into(frontier, [nbrs], node_map, self._scratch)
                frontiers.append(torch.from_numpy(frontier))
                blocks.append(Block(num_dst, frontier.shape[0], torch.from_numpy(ptr), torch.from_numpy(local),
                                    src_degree=self._degrees(frontier), src_ids=frontiers[-1]))
        finally:
            kernels.reset_map(frontier, node_map)
        return blocks, frontiers

    def _pipelined_hop(self, frontier: np.ndarray, fanout: int, key: int, threads: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``hop_pipeline.draw_and_relabel``: the row pointer, local ids and new frontier of one hop."""
        num_dst = frontier.shape[0]
        ptr = kernels.drawn_ptr(self.indptr, frontier, fanout, kernels.NO_ORDER)
        grown = np.empty(num_dst + ptr[-1], np.int64)
        grown[:num_dst] = frontier
        local, size = hop_pipeline.draw_and_relabel(self.indptr, self.indices, grown, num_dst, np.uint64(key), ptr,
                                                    self._node_map, segments_for(num_dst, ptr[-1], threads), threads)
        return ptr, local, grown[:size]

    def _degrees(self, sources: np.ndarray) -> torch.Tensor | None:
        return torch.from_numpy(kernels.in_degrees(self.indptr, sources)) if self.degrees else None


def relabel_into(frontier: np.ndarray, parts: list[np.ndarray], node_map: np.ndarray,
                 scratch: RelabelScratch | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """The host's relabel: each of ``parts`` (sampled global ids) as local ids in the frontier [``frontier``,
    new vertices in first-appearance order over the parts in order], and that frontier (int64). ``node_map``
    holds ``frontier``'s positions (-1 elsewhere) and is left holding the new frontier's. With ``scratch``, a
    large relabel on enough threads runs on all of them (``relabel_parallel``: the same result)."""
    size = frontier.shape[0]
    total = sum(part.shape[0] for part in parts)
    grown = np.empty(size + total, np.int64)
    grown[:size] = frontier
    if (scratch is not None and total >= relabel_kernels.PARALLEL_FROM_IDS
            and numba.get_num_threads() >= relabel_kernels.PARALLEL_FROM_THREADS):
        ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
        positions, size = relabel_kernels.relabel_parallel(grown, size, ids, node_map, scratch.shift,
                                                           scratch.take(3 * total))
        local = np.split(positions, np.cumsum([part.shape[0] for part in parts[:-1]]))
        return local, grown[:size]
    local = []
    for part in parts:
        positions, size = kernels.relabel(grown, size, part, node_map)
        local.append(positions)
    return local, grown[:size]


class TorchNeighborSampler(Sampler):
    """The same sampling contract in vectorised torch ops, on the device holding ``indptr``/``indices``."""

    reads_grouped = True  # device mode samples mini-batches in groups with it (Triton: one read a group)

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int], degrees: bool = False):
        self.indptr = indptr.long()
        self.indices = indices
        self.fanouts = list(fanouts)
        self.degrees = degrees
        self.device = indptr.device
        self._node_map: torch.Tensor | None = None  # scratch of the relabel; so one sampler per thread

    def _ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.to(self.device, torch.int64)

    def _hops(self, start: torch.Tensor, hops: list[tuple[int, int]]) -> tuple[list[Block], list]:
        if self._node_map is None:
            self._node_map = torch.empty(self.indptr.shape[0] - 1, dtype=torch.int64, device=self.device)
        blocks, frontiers = [], [start]
        for fanout, key in hops:
            dst = frontiers[-1]
            ptr, nbrs = together([self.start_draw(dst, fanout, key)])[0]
            local, frontier = together([start_relabel(self._node_map, dst, nbrs)])[0]
            blocks.append(Block(dst.shape[0], frontier.shape[0], ptr, local,
                                src_degree=self._degrees(frontier), src_ids=frontier))
            frontiers.append(frontier)
        return blocks, frontiers

    def _degrees(self, sources: torch.Tensor) -> torch.Tensor | None:
        if not self.degrees:
            return None
        return (self.indptr.index_select(0, sources + 1) - self.indptr.index_select(0, sources)).float()

    def start_draw(self, dst: torch.Tensor, fanout: int, key: int, edges: bool = False) -> Started:
        """The draws of one hop up to their read of the device: the edge count (on the device), and what
        finishes them given it (``together``): ``(ptr, nbrs)`` as ``kernels.sample_neighbors`` gives them
        (global ids, not relabelled), with ``edges`` ``(ptr, nbrs, positions)``. No vertex map is touched, so
        the neighbours may be of another vertex set than ``dst`` (a typed relation's source type)."""
        # index_select, not advanced indexing: the same result, several times faster on the CPU.
        start = self.indptr.index_select(0, dst)
        deg = self.indptr.index_select(0, dst + 1) - start
        take = deg if fanout < 0 else deg.clamp(max=fanout)
        ptr = torch.zeros(dst.shape[0] + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(take, 0, out=ptr[1:])

        def finish(total: int) -> tuple[torch.Tensor, ...]:
            row, slot = drawn_slots(ptr, take, total)
            if fanout > 0:
                # Rows with degree <= fanout take every neighbour in order; the others take Floyd's subset.
                picks = self._floyd(deg, fanout, dst, key).view(-1).index_select(0, row * fanout + slot)
                offset = torch.where(deg.index_select(0, row) > fanout, picks, slot)
            else:
                offset = slot
            positions = start.index_select(0, row) + offset
            nbrs = self.indices.index_select(0, positions).long()
            return (ptr, nbrs, positions) if edges else (ptr, nbrs)

        return ptr[-1], finish

    def _floyd(self, deg: torch.Tensor, k: int, dst: torch.Tensor, key: int) -> torch.Tensor:
        """A uniform k-subset of offsets [0, deg) for every row at once (Floyd's algorithm, vectorised over
        rows): step i draws t uniformly from [0, j] with j = deg - k + i and keeps t, or j if t was already
        kept; no sort, no host synchronisation. Rows with degree below k are meaningless (unused). Row r's
        draws are the counter stream of ``splitmix_key(key, dst[r])`` turned into offsets as the numba
        kernel's ``_below`` does, so both samplers draw the same neighbours."""
        stream = kernels.torch_splitmix_key(key, dst)
        steps = torch.arange(1, k + 1, dtype=torch.int64, device=self.device) * kernels.T_GOLDEN
        r = kernels.torch_shr(kernels.torch_mix(stream[:, None] + steps[None, :]), 32)  # 32 random bits
        # Every step's range and draw at once ([rows, k]); only the duplicate check is sequential. j values
        # are distinct and exceed every earlier pick, so the fallback j never collides.
        j = (deg.unsqueeze(1) + torch.arange(-k, 0, device=self.device)).clamp_(min=0)
        picks = (r * (j + 1)) >> 32  # uniform in [0, j]; below 2**63 for degrees below 2**31
        for i in range(1, k):
            taken = (picks[:, :i] == picks[:, i:i + 1]).any(1)
            picks[:, i] = torch.where(taken, j[:, i], picks[:, i])
        return picks


def start_relabel(node_map: torch.Tensor, dst: torch.Tensor, nbrs: torch.Tensor) -> Started:
    """The relabel in torch up to its read of the device (the frontier's size), and what finishes it given
    that size (``together``): local ids of ``nbrs`` in the frontier [dst, new vertices in first-appearance
    order], and that frontier, through ``node_map`` (int64, one entry per vertex; no sort). Each vertex's
    first position among [dst, nbrs] is a scatter-min, first appearances are where that minimum sits, and
    their running count is their local id. Only the entries touched are written, left as scratch, so one map
    serves any number of calls on one thread."""
    everything = torch.cat([dst, nbrs])
    m = everything.shape[0]
    positions = torch.arange(m, device=node_map.device)
    node_map.index_fill_(0, everything, m)
    node_map.scatter_reduce_(0, everything, positions, reduce="amin")
    first = node_map.index_select(0, everything) == positions

    def finish(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        frontier = everything.index_select(0, torch.nonzero_static(first, size=size).squeeze(1))
        node_map.index_copy_(0, frontier, torch.arange(size, device=node_map.device))
        return node_map.index_select(0, nbrs), frontier

    return first.sum(), finish


def drawn_slots(ptr: torch.Tensor, take: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of ``total`` drawn edges in compact order (row ``i``'s ``take[i]`` edges from ``ptr[i]``), its
    row and its slot within the row."""
    row = torch.repeat_interleave(torch.arange(take.shape[0], device=ptr.device), take, output_size=total)
    return row, torch.arange(total, device=ptr.device) - ptr.index_select(0, row)


def together(started: list[Started]) -> list:
    """Finish steps started on the device (``start_draw``, ``start_relabel``), each waiting for a size, after
    one read of the device for all their sizes (a typed hop's relations' draws, its types' relabels)."""
    if not started:
        return []
    sizes = [int(started[0][0])] if len(started) == 1 else torch.stack([size for size, _ in started]).tolist()
    return [finish(size) for (_, finish), size in zip(started, sizes)]
