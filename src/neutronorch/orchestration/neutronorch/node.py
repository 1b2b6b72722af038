"""Hot rows computed once per node (data parallel, ``hot_set="node"``): a row hot on several ranks of a node
is computed by one of them and sent to the others; who computes what, the rows and their gradient:
``docs/distributed.md``, "NeutronOrch mode across ranks". Only where rows are computed changes, never the
training. A typed graph's hot sets are exchanged as one, each type numbered after the types before it. Each
collective runs on a group of its thread's own (``NodeLink``): host-thread collectives never interleave
with the trainer's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch


class NodeLink(Protocol):
    """The ranks of this node, as NeutronOrch mode needs them (made by the trainer from its process group)."""

    local_rank: int
    local_size: int

    def gather_ids(self, ids: torch.Tensor) -> list[torch.Tensor]:
        """Host thread: every rank's 1-D tensor (any length), in local rank order."""

    def gather_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """Host thread: every rank's rows (``counts[i]`` of them on local rank i) concatenated in order."""

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Trainer thread: ``tensor`` summed over the node's ranks, in place."""

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Trainer thread: the element-wise maximum over the node's ranks, in place."""


@dataclass
class Exchange:
    """Which of a rank's hot rows it computes, and where the node's shared rows go. The shared rows are
    listed rank by rank (``sizes[j]`` of them computed by rank j; ``mine``: this rank's range)."""

    computed: np.ndarray  # positions in this rank's hot set of the rows it computes (ascending)
    sent: np.ndarray  # positions in ``computed`` of the shared rows among them (this rank's part of the list)
    held: np.ndarray  # per shared row of the node: its position in this rank's hot set, or -1
    sizes: list[int]
    mine: tuple[int, int]

    @property
    def shared(self) -> int:
        return int(self.held.shape[0])


def plan_exchange(sets: list[np.ndarray], rank: int) -> Exchange:
    """From every rank's hot set (in rank order): what rank ``rank`` computes and receives. Pure."""
    sizes = [s.shape[0] for s in sets]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    ids = np.concatenate(sets).astype(np.int64, copy=False) if sets else np.empty(0, np.int64)
    order = np.argsort(ids, kind="stable")  # by vertex, its holders in rank order
    ordered = ids[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if ids.shape[0] else np.empty(0, np.int64)
    counts = np.diff(np.r_[starts, ids.shape[0]])
    owner_at = order[starts + ordered[starts] % counts]  # the entry of each vertex's owner
    group = np.repeat(np.arange(starts.shape[0]), counts)
    owns = np.zeros(ids.shape[0], bool)
    owns[owner_at] = True
    shared = np.empty(ids.shape[0], bool)
    shared[order] = (counts > 1)[group]
    lo, hi = offsets[rank], offsets[rank + 1]
    computed = np.flatnonzero(owns[lo:hi])
    sent = np.flatnonzero(shared[lo:hi][computed])
    # The node's shared rows, rank by rank, each rank's in its set's order; where each sits in this rank's set.
    listed = [np.flatnonzero(owns[offsets[j]:offsets[j + 1]] & shared[offsets[j]:offsets[j + 1]]) + offsets[j]
              for j in range(len(sets))]
    entries = np.concatenate(listed) if listed else np.empty(0, np.int64)
    mine_lo = int(sum(x.shape[0] for x in listed[:rank]))
    position = np.full(ids.shape[0], -1, np.int64)  # per entry: the position of its vertex in this rank's set
    position[order] = _group_position(group, order, lo, hi)
    return Exchange(computed, sent, position[entries], [x.shape[0] for x in listed],
                    (mine_lo, mine_lo + listed[rank].shape[0]))


def _group_position(group: np.ndarray, order: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """For the entries in vertex order (``order``, grouped by ``group``): the position in this rank's set
    (entries ``lo:hi``) of the same vertex, or -1."""
    found = np.full(group.max(initial=-1) + 1, -1, np.int64)
    here = (order >= lo) & (order < hi)
    found[group[here]] = order[here] - lo
    return found[group]


class NodeHotSet:
    """The exchange of one rank's hot rows with its node's other ranks (``num_nodes``: a typed graph's, per
    type)."""

    name = "node"

    def __init__(self, link: NodeLink, num_nodes: dict[str, int] | None = None):
        self.link = link
        self.offsets = None if num_nodes is None else dict(zip(num_nodes, np.cumsum([0, *num_nodes.values()])))

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Trainer thread: the element-wise maximum over the node's ranks, in place."""
        return self.link.max_(tensor)

    def sizes(self, hot: dict[str, np.ndarray]) -> list[int]:
        """A typed hot set's sizes, type by type in the node's order."""
        return [len(hot.get(t, ())) for t in self.offsets]

    def by_type(self, rows, sizes: list[int]) -> dict:
        """``rows`` of the concatenated types (``sizes`` of each) split by type, those with any."""
        ends = np.cumsum([0, *sizes])
        return {t: rows[lo:hi] for t, lo, hi in zip(self.offsets, ends[:-1], ends[1:]) if hi > lo}

    def computed(self, hot: np.ndarray | dict[str, np.ndarray], plan: Exchange) -> np.ndarray | dict:
        """The vertices of ``hot`` this rank computes (a typed graph's per type)."""
        if self.offsets is None:
            return hot[plan.computed]
        flat = np.concatenate([np.asarray(hot.get(t, np.empty(0, np.int64))) for t in self.offsets])
        ends = np.cumsum([0, *self.sizes(hot)])
        at = np.searchsorted(ends, plan.computed, side="right") - 1  # each computed row's type
        return {t: flat[plan.computed[at == k]] for k, t in enumerate(self.offsets) if (at == k).any()}

    def exchange(self, hot: np.ndarray | dict[str, np.ndarray]) -> Exchange:
        """A collective (host thread): every rank of the node calls it for each super-batch."""
        if self.offsets is not None:
            hot = np.concatenate([np.asarray(hot.get(t, np.empty(0, np.int64))) + o for t, o in self.offsets.items()])
        sets = [t.numpy() for t in self.link.gather_ids(torch.tensor(hot, dtype=torch.int64))]
        return plan_exchange(sets, self.link.local_rank)

    def assemble(self, rows: torch.Tensor, plan: Exchange, num_hot: int, version: int) -> torch.Tensor:
        """This rank's whole table from the rows it computed (``rows``, in ``plan.computed`` order) and the
        shared rows the others computed, after checking that every rank computed from ``version``."""
        versions = self.link.gather_rows(torch.tensor([[version]], dtype=torch.int64), [1] * self.link.local_size)
        if not bool((versions == version).all()):
            raise RuntimeError(f"the ranks of a node computed hot rows from parameter versions "
                               f"{versions.flatten().tolist()}: their snapshot schedules differ. This is a bug.")
        table = rows.new_empty((num_hot,) + tuple(rows.shape[1:]))
        table[torch.from_numpy(plan.computed)] = rows
        if plan.shared:
            received = self.link.gather_rows(rows[torch.from_numpy(plan.sent)], plan.sizes)
            wanted = np.flatnonzero(plan.held >= 0)
            table[torch.from_numpy(plan.held[wanted])] = received[torch.from_numpy(wanted)]
        return table

    def gradient_by_type(self, grad_acc: dict, plan: Exchange, computed: dict, width: int) -> dict:
        """``gradient`` of per-type accumulators (a homogeneous graph's keyed ``None``), split back by type
        (``computed``: rows this rank computed per type)."""
        if self.offsets is None:
            return {None: self.gradient(grad_acc[None].cpu(), plan)}
        flat = torch.cat([torch.zeros((0, width)), *(grad_acc[t].cpu() for t in self.offsets if t in grad_acc)])
        return self.by_type(self.gradient(flat, plan), [computed.get(t, 0) for t in self.offsets])

    def gradient(self, grad_acc: torch.Tensor, plan: Exchange) -> torch.Tensor:
        """A collective (trainer thread): dL/dY of the rows this rank computed, those of the shared ones
        summed over the node's ranks holding them."""
        computed = torch.from_numpy(plan.computed)
        grad = grad_acc[computed]
        if plan.shared:
            held = np.flatnonzero(plan.held >= 0)
            total = grad_acc.new_zeros((plan.shared,) + tuple(grad_acc.shape[1:]))
            total[torch.from_numpy(held)] = grad_acc[torch.from_numpy(plan.held[held])]
            self.link.sum_(total)
            grad[torch.from_numpy(plan.sent)] = total[plan.mine[0]:plan.mine[1]]
        return grad
