"""``train --partitions DIR --mode neutronorch`` of a typed graph's partition (docs/distributed.md, "NeutronOrch
across the parts"; ``orchestration/neutronorch/parts_typed.py``): each rank plans and trains its share of every
global batch as the full-copy typed run dealt by the same parts does, and the row of a hot vertex of any type is
computed by its owner for every rank holding it hot. Featureless types' embedding tables are split by owner as in
exact mode (``part_tables.py``): a snapshot's table rows come from their owners, and the hot rows' gradient of them
goes back to the owners with the step's (``TablesMode``)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import torch

from neutronorch.config import TrainConfig
from neutronorch.orchestration.neutronorch.parts_typed import TypedOwnerHotSet, TypedPartKind
from neutronorch.sampling.partitioned import global_in_degree_ptr
from neutronorch.sampling.partitioned_typed import PartitionedTypedSampler
from neutronorch.train.distributed import World
from neutronorch.train.part_exchange import TrafficRecord
from neutronorch.train.part_neutronorch import PartNeutronOrchMode, exchanges
from neutronorch.train.part_tables import TableSteps
from neutronorch.train.part_typed import TypedPartLoader, TypedRemoteRows


class TablesMode(TableSteps, PartNeutronOrchMode):
    """``PartNeutronOrchMode`` of a typed part whose embedding tables are split by owner (``TableSteps``: the hot
    rows' table gradient is added after the looked-up rows', or handed to ``PartTables.reduce`` with them)."""

    def __init__(self, tables, world: World, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tables, self.alone = tables, not world.distributed


def global_indptrs(part, world: World) -> dict:
    """Each relation's cumulative in-degrees of its destination type in the whole graph (int64), from every
    part's own (a collective): what the planner counts spared edges by."""
    gather = world.rows_gatherer("gathering the in-degrees")
    return {relation: global_in_degree_ptr(SimpleNamespace(indptr=csc.indptr, part_of=part.part_of[relation[2]],
                                                           local_index=part.local_index[relation[2]]), gather)
            for relation, csc in part.relations.items()}


def build_typed_mode(config: TrainConfig, part, graph, world: World, setup, access, seeds, sampling, spans, threads,
                     stack: contextlib.ExitStack, loader=TypedPartLoader) -> PartNeutronOrchMode:
    """The NeutronOrch mode of rank ``world.rank`` on a typed ``part`` (``setup``: ``part_typed.typed_setup``'s):
    the cold sampler samples over the setup's sampling exchange; the planner and the host get exchanges of their
    own, closed by ``stack`` after the mode."""
    lanes, gradients, agree = exchanges(world, setup.sampling, stack)
    fanouts = setup.fanouts
    samplers = lambda lane: PartitionedTypedSampler(part, lanes.get(lane), fanouts)  # noqa: E731
    hot_rows = TypedRemoteRows(part, lanes["host"])

    def source(frontier: dict, device: torch.device) -> tuple[dict, dict]:  # the host's inputs (host thread)
        return ({t: rows.to(device) for t, rows in hot_rows.rows(frontier).items()},
                {t: ids.to(device) for t, ids in frontier.items()})

    kind = TypedPartKind(graph, access, fanouts, spans, samplers, loader(
        access, TypedRemoteRows(part, lanes["cold"]), spans), source, global_indptrs(part, world), lanes)
    if config.neutronorch.hot_ratio == "auto":  # the drift probe's rows, fetched now (trainer thread, every rank)
        kind.prepare_probe(part, config.seed, TypedRemoteRows(part, setup.evaluation).rows)
    shared = TypedOwnerHotSet(part, lanes["host"], gradients, agree)
    arguments = (kind, seeds, sampling, config.neutronorch, config.epochs, spans, threads.sampler, threads.host, None)
    traffic = {**lanes, "gradient": gradients}
    if not setup.tables.tables:
        mode = PartNeutronOrchMode(*arguments, shared=shared, traffic=TrafficRecord(world, traffic, setup.evaluation))
    else:  # the snapshots' rows from their owners, over the tables' exchange (trainer's thread)
        kind.tables, traffic["tables"] = setup.tables, setup.tables_exchange
        mode = TablesMode(setup.tables, world, *arguments, shared=shared,
                          traffic=TrafficRecord(world, traffic, setup.evaluation))
        if config.neutronorch.hot_ratio == "auto":  # the probe's table rows fetched at every boundary, every rank
            mode.controller.saw_plan(kind.probe_ids)
    stack.callback(mode.close)
    return mode
