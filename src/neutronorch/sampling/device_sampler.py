"""The sampler of the training device: Triton kernels where Triton runs, torch ops elsewhere.

``TritonNeighborSampler`` keeps the contract of ``TorchNeighborSampler`` (and of the host sampler) bit for
bit, in a few launches per hop (``triton_kernels``) and one read of the device per mini-batch.

``make_device_sampler`` picks it (``backend``: ``auto``, the default, takes Triton for CUDA tensors where it
can be imported; ``torch`` and ``triton`` force one; docs/gpu.md).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os

import torch

from neutronorch.errors import ConfigError
from neutronorch.sampling.block import Block
from neutronorch.sampling.neighbor_sampler import Started, TorchNeighborSampler, drawn_slots

BACKENDS = ("auto", "torch", "triton")
ENV = "NEUTRONORCH_DEVICE_SAMPLER"


def triton_available(device: torch.device) -> bool:
    """Whether the Triton sampler can run on ``device``: Triton importable, and a CUDA device or Triton's
    interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or (device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") == "1")


def check_device_sampler(device: torch.device, backend: str | None = None) -> str:
    """The device sampler asked for (``backend``, else ``$NEUTRONORCH_DEVICE_SAMPLER``, else auto), checked
    to run on ``device``: a ``ConfigError`` naming where it was asked for and why it cannot run."""
    where = "the argument `backend`" if backend else ENV
    backend = backend or os.environ.get(ENV) or "auto"
    if backend not in BACKENDS:
        raise ConfigError(f"{where}={backend!r} is not one of {', '.join(BACKENDS)}; set it to one of them"
                          + ("." if where != ENV else ", or unset it (auto)."))
    if backend == "triton" and not triton_available(device):
        why = ("Triton is not installed (pip install triton; CUDA builds of PyTorch ship it)"
               if importlib.util.find_spec("triton") is None else
               f"Triton kernels need a CUDA device (this run's is {device}); on the CPU they run only through "
               f"Triton's interpreter, TRITON_INTERPRET=1")
        raise ConfigError(f"{where}=triton: the Triton device sampler cannot run: {why}. "
                          + ("Set it to torch or auto, or unset it." if where == ENV else "Give torch or auto."))
    return backend


def make_device_sampler(indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int], degrees: bool = False,
                        backend: str | None = None):
    """The sampler for topology on ``indptr``'s device (see the module docstring for ``backend``)."""
    device = indptr.device
    backend = check_device_sampler(device, backend)
    if backend == "triton" or (backend == "auto" and device.type == "cuda" and triton_available(device)):
        return TritonNeighborSampler(indptr, indices, fanouts, degrees)
    return TorchNeighborSampler(indptr, indices, fanouts, degrees)


class TritonNeighborSampler(TorchNeighborSampler):
    """``TorchNeighborSampler``'s contract in Triton kernels: ``sample_many`` reads the device once per call.
    Not thread-safe (it owns a vertex -> code map): one per sampling thread. Fanouts below 0 (every
    neighbour) have no fixed bound per row; such a call runs in the torch sampler."""

    def __init__(self, indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int], degrees: bool = False):
        from neutronorch.sampling import triton_kernels  # Triton is imported only when this sampler is used
        super().__init__(indptr, indices, fanouts, degrees)
        self._k = triton_kernels
        self.num_nodes = self.indptr.shape[0] - 1
        self._code_map: torch.Tensor | None = None
        self._generation = 0

    def start_draw(self, dst: torch.Tensor, fanout: int, key: int, edges: bool = False) -> Started:
        """``TorchNeighborSampler.start_draw`` in one kernel (fanouts of 0 and below, and no destinations:
        the torch sampler's)."""
        bound = dst.shape[0]
        if fanout <= 0 or bound == 0:
            return super().start_draw(dst, fanout, key, edges)
        k = self._k
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            sizes = torch.full((1,), bound, dtype=torch.int64, device=self.device)
            nbrs = torch.empty(bound * fanout, dtype=torch.int64, device=self.device)
            positions = torch.empty(bound * fanout if edges else 0, dtype=torch.int64, device=self.device)
            take = torch.empty(bound, dtype=torch.int64, device=self.device)
            k.sample_kernel[(triton_cdiv(bound, k.ROWS),)](
                self.indptr, self.indices, dst, sizes, 0, key, 0, nbrs, nbrs, take, bound,
                positions if edges else nbrs, FANOUT=fanout, FANOUT_PAD=1 << max(0, (fanout - 1).bit_length()),
                ROWS=k.ROWS, RELABEL=False, EDGES=edges)
        ptr = torch.zeros(bound + 1, dtype=torch.int64, device=self.device)
        torch.cumsum(take, 0, out=ptr[1:])

        def finish(total: int) -> tuple[torch.Tensor, ...]:
            row, slot = drawn_slots(ptr, take, total)
            kept = row * fanout + slot  # the used slots, in compact order
            drawn = (ptr, nbrs.index_select(0, kept))
            return (*drawn, positions.index_select(0, kept)) if edges else drawn

        return ptr[-1], finish

    def _codes(self, hops: int) -> int:
        """The map (allocated on first use) and the first of ``hops`` fresh generations' high bits."""
        if self._code_map is None or self._generation + hops >= self._k.GEN_TOP:
            self._code_map = torch.full((self.num_nodes,), torch.iinfo(torch.int64).max, dtype=torch.int64,
                                        device=self.device)
            self._generation = 0
        first = self._k.GEN_TOP - self._generation
        self._generation += hops
        return first

    def _run(self, calls: list[tuple[torch.Tensor, list[tuple[int, int]]]]):
        """Every call's (blocks, frontiers) (seed hop first), after one read of the device: the kernels of
        several mini-batches queue back to back, and the host waits once, for every hop's sizes."""
        if any(fanout < 0 for _, hops in calls for fanout, _ in hops):
            return super()._run(calls)
        # Triton launches on the calling thread's current device, which a sampling thread does not inherit.
        with torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext():
            hops = len(calls[0][1])
            # Row i, call i's sizes: [2h] hop h's destinations, [2h + 1] its edges, [2h + 2] its source frontier.
            sizes = torch.empty((len(calls), 2 * hops + 1), dtype=torch.int64, device=self.device)
            pending = [self._launch(seeds, call_hops, sizes[i]) for i, (seeds, call_hops) in enumerate(calls)]
            counts = sizes.tolist()  # the one read of the device
        return [self._build(seeds, row, parts) for (seeds, _), row, parts in zip(calls, counts, pending)]

    def _launch(self, seeds: torch.Tensor, hops: list[tuple[int, int]], sizes: torch.Tensor) -> list[tuple]:
        """Queue the kernels of every hop of ``seeds``; their sizes go to ``sizes`` (on the device)."""
        k, device = self._k, self.device
        high = self._codes(len(hops))
        sizes.fill_(seeds.shape[0])
        dst, bound = seeds, seeds.shape[0]
        pending = []
        for hop, (fanout, key) in enumerate(hops):
            code = high - hop
            at = 2 * hop
            slots = bound * fanout
            if slots == 0:  # no destinations, or a zero fanout: no edges, the frontier unchanged
                sizes[at + 1] = 0
                sizes[at + 2] = sizes[at]
                pending.append((torch.zeros(bound + 1, dtype=torch.int64, device=device),
                                torch.empty(0, dtype=torch.int64, device=device), dst))
                continue
            nbrs = torch.empty(slots, dtype=torch.int64, device=device)
            take = torch.empty(bound, dtype=torch.int64, device=device)
            pad = 1 << max(0, (fanout - 1).bit_length())
            k.sample_kernel[(triton_cdiv(bound, k.ROWS),)](
                self.indptr, self.indices, dst, sizes, at, key, code, self._code_map, nbrs, take, bound, nbrs,
                FANOUT=fanout, FANOUT_PAD=pad, ROWS=k.ROWS, RELABEL=True, EDGES=False)
            grid = (triton_cdiv(slots, k.SLOTS),)
            flags = torch.empty(slots, dtype=torch.int32, device=device)
            k.first_kernel[grid](nbrs, take, self._code_map, code, flags, bound, FANOUT=fanout, SLOTS=k.SLOTS)
            ranks = torch.cumsum(flags, 0)
            new_bound = min(self.num_nodes, bound + slots)
            frontier = torch.empty(new_bound, dtype=torch.int64, device=device)  # bound <= new_bound
            k.rank_kernel[grid](dst, nbrs, flags, ranks, self._code_map, code, frontier, sizes, at, bound,
                                FANOUT=fanout, SLOTS=k.SLOTS)
            ptr = torch.zeros(bound + 1, dtype=torch.int64, device=device)
            torch.cumsum(take, 0, out=ptr[1:])
            local = torch.empty(slots, dtype=torch.int64, device=device)
            k.local_kernel[grid](nbrs, take, ptr, self._code_map, local, sizes, at, bound, FANOUT=fanout,
                                 SLOTS=k.SLOTS)
            pending.append((ptr, local, frontier))
            dst, bound = frontier, new_bound
        return pending

    def _build(self, seeds: torch.Tensor, counts: list[int], pending: list[tuple]):
        """The blocks and frontiers (seed hop first) of launched hops, cut to the sizes read back."""
        blocks, frontiers = [], [seeds]
        for hop, (ptr, local, frontier) in enumerate(pending):
            num_dst, num_edges, num_src = counts[2 * hop:2 * hop + 3]
            frontier = frontier[:num_src]
            blocks.append(Block(num_dst, num_src, ptr[:num_dst + 1], local[:num_edges],
                                src_degree=self._degrees(frontier), src_ids=frontier))
            frontiers.append(frontier)
        return blocks, frontiers


def triton_cdiv(a: int, b: int) -> int:
    return max(1, -(-a // b))
