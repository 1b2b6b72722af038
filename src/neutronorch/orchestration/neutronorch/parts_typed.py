"""NeutronOrch mode on a typed graph's parts (``train --partitions DIR --mode neutronorch`` of a typed partition;
docs/distributed.md, "NeutronOrch across the parts"): ``parts.py``'s design, per vertex type. A rank's hot sets of
all its types are exchanged as one, each type numbered after the types before it (as ``node.NodeHotSet`` numbers
them); the owner of a hot vertex computes its bottom-layer row for every rank holding it hot, from its own
in-edges of every relation into its type, and the rows of the sources from their owners.

Featureless types read embedding tables split by owner (``train/part_tables.py``): a snapshot holds the table rows
its hot rows read, fetched from their owners when it is taken (``TypedPartKind.table_rows``, the trainer's thread,
every rank at the same step), and the hot rows' gradient of them goes to their owners with the step's
(``PartTables.reduce``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.orchestration.neutronorch.mode import PROBE_KEY, TypedKind
from neutronorch.orchestration.neutronorch.node import NodeHotSet
from neutronorch.orchestration.neutronorch.parts import OwnerHotSet, OwnerPlan, PartLanes
from neutronorch.orchestration.neutronorch.planner import PROBE_ROWS, Planner
from neutronorch.sampling.exchange import Exchange, Lane
from neutronorch.sampling.neighbor_sampler import mix_key


class StackedOwners:
    """The owner part of each id of a typed part's types stacked as one (type t's vertex v is ``start[t] + v``):
    ``part_of`` as ``OwnerHotSet`` reads it."""

    def __init__(self, part_of: dict[str, np.ndarray], offsets: dict[str, int]):
        self.part_of, self.types = part_of, list(offsets)
        self.starts = np.array(list(offsets.values()), np.int64)

    def type_of(self, ids: np.ndarray) -> np.ndarray:
        """Each stacked id's type, as its index in the types' order."""
        return np.searchsorted(self.starts, ids, side="right") - 1

    def __getitem__(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        at = self.type_of(ids)
        owners = np.empty(ids.shape[0], np.int32)
        for k, t in enumerate(self.types):
            mine = at == k
            if mine.any():
                owners[mine] = np.asarray(self.part_of[t][ids[mine] - self.starts[k]])
        return owners


class TypedOwnerHotSet(OwnerHotSet):
    """``OwnerHotSet`` over a typed part's stacked types, with ``node.NodeHotSet``'s typed interface (``offsets``,
    ``sizes``, ``by_type``, ``computed`` per type, ``gradient_by_type`` per type)."""

    sizes = NodeHotSet.sizes
    by_type = NodeHotSet.by_type

    def __init__(self, part, rows: Exchange, gradients: Exchange, agree: Callable[[torch.Tensor], torch.Tensor]):
        counts = dict(part.num_nodes)
        self.offsets = dict(zip(counts, (int(o) for o in np.cumsum([0, *counts.values()])[:-1])))
        self.owners = StackedOwners({t: part.part_of[t] for t in counts}, self.offsets)
        super().__init__(SimpleNamespace(part=part.part, parts=part.parts, part_of=self.owners), rows, gradients,
                         agree)

    def _stack(self, hot: dict) -> np.ndarray:
        return np.concatenate([np.zeros(0, np.int64)] + [np.asarray(hot[t], dtype=np.int64) + o
                                                         for t, o in self.offsets.items() if t in hot])

    def exchange(self, hot: dict) -> OwnerPlan:
        return super().exchange(self._stack(hot))

    def group(self, ids: np.ndarray) -> np.ndarray:
        """The type of each stacked id (its index in ``offsets``): the rows a rank computes go type by type."""
        return self.owners.type_of(ids)

    def computed(self, hot: dict, plan: OwnerPlan) -> dict:
        """The vertices this rank computes, per type (its part's, in the order first asked), the types in
        ``hot``'s order, then any other (the order the host's rows, and their gradient's terms, are summed in)."""
        at, starts = self.group(plan.computed), self.owners.starts
        mine = {t: plan.computed[at == k] - starts[k] for k, t in enumerate(self.offsets) if (at == k).any()}
        return {t: mine[t] for t in [*hot, *mine] if t in mine}

    def gradient_by_type(self, grad_acc: dict, plan: OwnerPlan, computed: dict, width: int) -> dict:
        flat = torch.cat([torch.zeros((0, width)), *(grad_acc[t].cpu() for t in self.offsets if t in grad_acc)])
        total = super().gradient_by_type({None: flat}, plan, computed, width)[None]
        return self.by_type(total, [computed.get(t, 0) for t in self.offsets])


class TypedPartKind(PartLanes, TypedKind):
    """``TypedKind`` for a rank holding one part of a typed graph, on the CPU: ``samplers`` makes each thread's
    sampler (``"plan"``, ``"cold"``: across the parts, each over its thread's exchange; ``"own"``: of its part's
    own vertices, the host's), ``loader`` loads the cold mini-batches, ``source(frontier, device)`` gives the hot
    rows' inputs (every featured type's rows from their owners, over the host's exchange) and ``indptrs`` each
    relation's cumulative in-degrees in the whole graph (what the planner counts spared edges by)."""

    def __init__(self, graph: TypedGraph, access, fanouts: dict[RelationType, list[int]], spans,
                 samplers: Callable[[str], object], loader, source, indptrs: dict[RelationType, np.ndarray],
                 lanes: dict[str, Lane]):
        super().__init__(graph, access, fanouts, False, spans, lambda: samplers("own"))
        self.samplers, self.loader, self.source, self.indptrs, self.lanes = samplers, loader, source, indptrs, lanes
        self.tables = None  # the part's embedding tables (``part_tables.PartTables``), where it has any

    def table_rows(self, model: torch.nn.Module, super_batch_id: int) -> tuple[dict, dict]:
        """The table rows super-batch ``super_batch_id``'s hot frontier reads, now, from their owners (a collective
        of the trainer's thread, at the same step on every rank: a snapshot's), and their ids."""
        ids = self.needs.take(super_batch_id)
        return ({} if self.tables is None else self.tables.rows_of(ids)), ids

    def planner(self, sampler) -> Planner:
        return Planner(self.graph, {r: f[-1] for r, f in self.fanouts.items()}, self.indptrs)

    def prepare_probe(self, part, seed: int, rows: Callable[[dict], dict]) -> None:
        """``hot_ratio`` auto: the drift probe's inputs, fixed at the start on every rank (``rows(frontier)``: every
        featured type's rows, a collective), as ``parts.PartKind.prepare_probe``: the part's ``PROBE_ROWS`` target
        vertices of the most in-edges."""
        target, owned = self.graph.target, np.asarray(part.ids[self.graph.target])
        degree = np.zeros(owned.shape[0], np.int64)
        for relation, csc in part.relations.items():
            if relation[2] == target:
                degree += np.diff(np.asarray(csc.indptr))
        ids = np.sort(owned[np.argsort(-degree, kind="stable")[:PROBE_ROWS]])
        block, frontier = self.bottom_hop(self.host_sampler(), {target: ids}, mix_key(seed, PROBE_KEY))
        self.probe = block, rows(frontier), frontier

    def probe_inputs(self, ids, sampling, model):
        """The drift probe's block and inputs (``prepare_probe``'s, whatever ``ids``). Where the part has embedding
        tables, the probe's table rows are fetched from their owners each time it measures (a collective of the
        trainer's thread: every rank measures at every super-batch boundary, ``probe_ids``)."""
        block, features, frontier = self.probe
        block, device = block.to(self.device), self.device
        features = {t: f.to(device) for t, f in features.items()}
        frontier = {t: v.to(device) for t, v in frontier.items()}

        def inputs():
            if self.tables is not None:  # as they are now: the tables move with the weights
                self.tables.fetch({t: v for t, v in frontier.items() if t in self.tables.tables}, grad=False)
            return block, model().input_rows(features, frontier)
        return inputs

    @property
    def probe_ids(self) -> dict[str, np.ndarray]:
        """The probe's vertices (``prepare_probe``'s), given to the controller at the start on every rank, so that
        every rank measures the drift at every boundary from the first (``probe_inputs``' fetch is a collective)."""
        return {self.graph.target: self.probe[2][self.graph.target].numpy()}
