"""NeutronOrch mode on a partitioned graph (``train --partitions DIR --mode neutronorch``; docs/distributed.md,
"NeutronOrch across the parts"): each rank plans its hot sets from its own share of every global batch, as a
full-copy data-parallel rank does, but the bottom-layer row of a hot vertex is computed by the rank owning it,
once per super-batch for every rank that holds it hot, and sent to them. The owner holds the vertex's
in-edges, so its bottom hop is drawn where it lives (keyed as the whole graph's sampler keys it); only its
neighbours' feature rows may come from other parts. A rank that holds a remote vertex hot thus neither
samples its neighbourhood nor fetches their rows in any of the super-batch's mini-batches: one row of the
hidden width replaces them.

The collectives of each thread go through an exchange of that thread's own: the planner's upper hops, the
cold sampler's bottom hops and rows, the host's hot sets, hot rows and their inputs, and the trainer's
gradient rows. Every rank takes part in each, the same number of times, nothing to send included.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.errors import TrainingError
from neutronorch.orchestration.neutronorch.mode import PROBE_KEY, HomogeneousKind
from neutronorch.orchestration.neutronorch.planner import PROBE_ROWS, Planner
from neutronorch.orchestration.remote_rows import RemoteRows
from neutronorch.sampling.exchange import Exchange, Lane
from neutronorch.sampling.neighbor_sampler import mix_key
from neutronorch.sampling.partitioned import by_owner


@dataclass
class OwnerPlan:
    """Who computes which hot rows of a super-batch: this rank those of its part's vertices any rank holds
    hot (``computed``, ascending ids), and where every rank's rows come from."""

    computed: np.ndarray  # the vertices this rank computes: every rank's asks of it, once each (``first_asked``)
    order: np.ndarray  # this rank's hot set grouped by owner: positions in it (``by_owner``)
    asked: list[int]  # per owner, how many of this rank's hot rows it computes
    wanted: list[np.ndarray]  # per rank, the positions in ``computed`` of the rows it asked for, in its order


class OwnerHotSet:
    """The hot rows of a partitioned run's ranks, each computed by its vertex's owner (``part``: this rank's
    ``data.partition_files.Partition``). ``rows``: the host thread's exchange, ``gradients``: the trainer's;
    ``agree(tensor)``: the element-wise maximum over the ranks (trainer thread), so that every rank takes its
    snapshots at the same versions. The interface of ``node.NodeHotSet``, for ``NeutronOrchMode``."""

    name = "owner"

    def __init__(self, part, rows: Exchange, gradients: Exchange, agree: Callable[[torch.Tensor], torch.Tensor]):
        self.part, self.rows, self.gradients, self.agree = part, rows, gradients, agree
        self.sent_rows = 0  # hot rows this rank computed for other ranks
        self.received_rows = 0  # hot rows other ranks computed for this one

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.agree(tensor)

    def exchange(self, hot: np.ndarray) -> OwnerPlan:
        """A collective (host thread): every rank's hot set to the owners of its vertices."""
        part = self.part
        order, asks = by_owner(np.asarray(hot, dtype=np.int64), part.part_of, part.parts)
        with self.rows.unit():
            asked = [a.reshape(-1) for a in self.rows.all_to_all(asks)]
        self.received_rows += sum(a.shape[0] for k, a in enumerate(asks) if k != part.part)
        self.sent_rows += sum(a.shape[0] for k, a in enumerate(asked) if k != part.part)
        computed, wanted = self.first_asked(asked)
        return OwnerPlan(computed, order, [a.shape[0] for a in asks], wanted)

    def first_asked(self, asked: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """The vertices every rank asked this one for, once each, in the order first asked (this rank's own asks
        first: with one part, its hot set's order, which the whole graph's run computes its rows in), grouped
        by ``group``; and per rank, the positions of its asks among them."""
        me = self.part.part
        listed = np.concatenate([np.zeros(0, np.int64), asked[me], *(a for k, a in enumerate(asked) if k != me)])
        distinct, first = np.unique(listed, return_index=True)
        order = np.lexsort((first, self.group(distinct)))
        position = np.empty(order.shape[0], np.int64)
        position[order] = np.arange(order.shape[0])
        return distinct[order], [position[np.searchsorted(distinct, a)] for a in asked]

    def group(self, ids: np.ndarray) -> np.ndarray:
        """What the rows a rank computes are grouped by, before the order asked: nothing here (a typed graph's:
        the vertices' types, ``parts_typed.py``)."""
        return np.zeros(ids.shape[0], np.int64)

    def computed(self, hot: np.ndarray, plan: OwnerPlan) -> np.ndarray:
        """The vertices this rank computes (owned by its part; not all of them need be in ``hot``)."""
        return plan.computed

    def assemble(self, rows: torch.Tensor, plan: OwnerPlan, num_hot: int, version: int) -> torch.Tensor:
        """A collective (host thread): this rank's table of its ``num_hot`` hot rows, from the rows every owner
        computed (``rows``: this rank's, in ``plan.computed`` order), after checking that every rank computed
        them from parameter ``version``."""
        parts = self.part.parts
        with self.rows.unit():
            seen = [int(v[0]) for v in self.rows.all_to_all([np.array([version], np.int64)] * parts, [1] * parts)]
            width, dtype = tuple(rows.shape[1:]), rows.dtype
            got = self.rows.all_to_all([as_numpy(rows[torch.from_numpy(w)]) for w in plan.wanted], plan.asked)
        if any(v != version for v in seen):
            raise RuntimeError(f"the ranks computed hot rows from parameter versions {seen}: their snapshot "
                               f"schedules differ. This is a bug.")
        table = rows.new_empty((num_hot, *width))
        if num_hot:
            table[torch.from_numpy(plan.order)] = from_numpy(np.concatenate([g.reshape(-1, *width) for g in got]),
                                                             dtype)
        return table

    def gradient_by_type(self, grad_acc: dict, plan: OwnerPlan, computed: dict, width: int) -> dict:
        """A collective (trainer thread): dL/dY of the rows this rank computed, each the sum of what every
        rank holding it hot accumulated (rank by rank)."""
        grad = grad_acc[None].cpu()
        grouped = grad[torch.from_numpy(plan.order)].numpy() if grad.shape[0] else np.zeros((0, width), np.float32)
        sends = np.split(grouped, np.cumsum(plan.asked)[:-1])
        got = self.gradients.all_to_all(sends, [w.shape[0] for w in plan.wanted])
        total = torch.zeros((plan.computed.shape[0], width), dtype=torch.float32)
        for rows, at in zip(got, plan.wanted):
            total.index_add_(0, torch.from_numpy(at), torch.from_numpy(rows.reshape(-1, width)))
        return {None: total}


def as_numpy(rows: torch.Tensor) -> np.ndarray:
    """``rows`` as an array that an exchange can send (bfloat16's bits as int16)."""
    return rows.view(torch.int16).numpy() if rows.dtype == torch.bfloat16 else rows.numpy()


def from_numpy(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor


class RemoteStore:
    """What the host computes hot rows from: the feature rows of any vertex (``RemoteRows.fetch``, a
    collective of the host thread), as a ``FeatureStore`` of ``dtype`` gives them."""

    def __init__(self, fetcher: RemoteRows, dtype: torch.dtype):
        self.fetcher, self.dtype = fetcher, dtype

    def as_dtype(self, dtype: torch.dtype) -> "RemoteStore":
        return RemoteStore(self.fetcher, dtype)

    def gather(self, ids) -> torch.Tensor:
        rows, _ = self.fetcher.fetch(np.asarray(ids, dtype=np.int64))
        return tensor_from_numpy(rows).to(self.dtype)


class PartLanes:
    """What the kinds of a rank holding one part share (``PartKind``, ``parts_typed.TypedPartKind``): each
    thread's sampler from ``samplers`` (``"plan"``, ``"cold"``: across the parts, each over its thread's exchange
    in ``lanes``), and each thread's leaving told to the other ranks'."""

    samplers: Callable[[str], object]
    lanes: dict[str, Lane]

    @contextlib.contextmanager
    def leaving(self, lane: str):
        """As the thread of ``lane`` leaves, done or stopped early, it tells the other ranks' (``Lane``). Where
        that fails, another rank is gone, and the trainer's collectives say so: the thread leaves quietly."""
        try:
            yield
        finally:
            with contextlib.suppress(TrainingError, threading.BrokenBarrierError):
                self.lanes[lane].finish()

    def plan_sampler(self):
        return self.samplers("plan")

    def cold_sampler(self):
        return self.samplers("cold")


class PartKind(PartLanes, HomogeneousKind):
    """``HomogeneousKind`` for a rank holding one part, on the CPU: ``samplers`` makes each thread's sampler
    (``"plan"``, ``"cold"``: across the parts, each over its thread's exchange; ``"own"``: of this part's own
    vertices, the host's), ``loader`` loads the cold mini-batches (``PartitionedLoader``), ``source`` gives the
    hot rows' inputs (``RemoteStore``) and ``degree_ptr`` is the cumulative in-degree of the whole graph's
    vertices (what the planner counts spared edges by). It draws and splices as ``HomogeneousKind`` does."""

    def __init__(self, graph, access, spans, sampling, samplers: Callable[[str], object], loader,
                 source: RemoteStore, degree_ptr: np.ndarray, lanes: dict[str, Lane]):
        super().__init__(graph, access, spans, sampling, lambda: samplers("own"))
        self.samplers, self.loader, self.source, self.degree_ptr = samplers, loader, source, degree_ptr
        self.lanes = lanes  # each thread's exchange: "plan", "cold" and "host"

    def planner(self, sampler) -> Planner:
        return Planner(self.graph, self.sampling.fanouts[-1], self.degree_ptr)

    def prepare_probe(self, part, fetch) -> None:
        """``hot_ratio`` auto: the drift probe's inputs, fixed at the start on every rank (``fetch(ids)``: the
        rows of any vertices, a collective). A rank probes its part's ``PROBE_ROWS`` vertices of the most
        in-edges (a part's hubs, what plans make hottest), not a plan's hottest: those are known at a super-batch
        boundary, which the ranks reach at different times, and their neighbours' rows may be other parts'."""
        degree = np.diff(np.asarray(part.indptr))
        ids = np.sort(np.asarray(part.ids)[np.argsort(-degree, kind="stable")[:PROBE_ROWS]])
        block, frontier = self.bottom_hop(self.host_sampler(), ids, mix_key(self.sampling.seed, PROBE_KEY))
        self.probe = block, tensor_from_numpy(fetch(frontier.numpy())).float()

    def probe_inputs(self, ids, sampling, model):
        """The drift probe's block and float32 rows on the device (``prepare_probe``'s, whatever ``ids``)."""
        block, rows = self.probe
        return block.to(self.device), rows.to(self.device)
