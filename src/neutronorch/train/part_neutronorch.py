"""``train --partitions DIR --mode neutronorch``: NeutronOrch mode on the parts (docs/distributed.md, "NeutronOrch
across the parts"; ``orchestration/neutronorch/parts.py``). Each rank plans and trains its share of every
global batch as the full-copy data-parallel run dealt by the same parts (``--deal-by``) does, and the row of
a hot vertex is computed by its owner for every rank holding it hot. What does not apply to parts is refused."""

from __future__ import annotations

import contextlib
from typing import Callable

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.errors import ConfigError
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.orchestration.neutronorch.parts import OwnerHotSet, PartKind, RemoteStore
from neutronorch.orchestration.remote_rows import PartitionedLoader, RemoteRows
from neutronorch.sampling.exchange import Lane, ThreadExchange
from neutronorch.sampling.partitioned import PartitionedSampler, global_in_degree_ptr
from neutronorch.train.distributed import World
from neutronorch.train.part_exchange import GlooExchange, TrafficRecord

WHY = "(docs/distributed.md, \"NeutronOrch across the parts\")"


def check_request(config: TrainConfig) -> None:
    """Refuse, before any output is made, what does not apply to NeutronOrch mode on the parts, with the reason."""
    settings = config.neutronorch
    if config.settings_given(["hot_set"]):
        raise ConfigError(f"`hot_set` {settings.hot_set} with `partitions`: on a partitioned graph the rank owning a "
                          f"hot vertex computes its row for every rank holding it hot {WHY}. Leave `hot_set` out.")


class PartNeutronOrchMode(NeutronOrchMode):
    """``NeutronOrchMode`` over ``PartKind``, whose epoch records and summary also hold the bytes each lane
    exchanged (``TrafficRecord``: the planner's, the cold sampler's, the host's and the trainer's)."""

    def __init__(self, *args, traffic: TrafficRecord, **kwargs):
        super().__init__(*args, **kwargs)
        self.traffic = traffic

    def end_epoch(self, record: dict) -> None:
        super().end_epoch(record)
        self.traffic.end_epoch(record)

    def summary(self) -> dict:
        owner = self.node
        return {**super().summary(), **self.traffic.summary(),
                "hot_rows_exchanged": {"sent": owner.sent_rows, "received": owner.received_rows}}


def exchanges(world: World, cold, stack: contextlib.ExitStack) -> tuple[dict[str, Lane], object, Callable]:
    """NeutronOrch's exchanges on the parts: each thread's lane (the planner's and the host's made here, closed
    by ``stack`` after the mode; the cold sampler's over ``cold``), whose ranks stop together (a stop agreed by
    the trainers leaves them anywhere); the trainer's exchange of the hot rows' gradient; and ``agree(tensor)``,
    the element-wise maximum over the ranks."""
    if world.distributed:
        plan = GlooExchange.new(world, "the partitioned planner's exchange")
        host = GlooExchange.new(world, "NeutronOrch's exchange of hot rows")
        for exchange in (plan, host):
            stack.callback(exchange.close)
        gradients = GlooExchange(world, what="the exchange of the hot rows' gradient")
        agree = lambda t: world.all_reduce_(t, "agreeing on the snapshot lead", world.host_group,  # noqa: E731
                                            torch.distributed.ReduceOp.MAX)
    else:
        plan, host, gradients = (ThreadExchange.group(1)[0] for _ in range(3))
        agree = lambda t: t  # noqa: E731
    lanes = {"plan": Lane(plan, "the planner's exchange"), "cold": Lane(cold, "the cold sampler's exchange"),
             "host": Lane(host, "the exchange of hot rows")}
    return lanes, gradients, agree


def build_mode(config: TrainConfig, part, graph, world: World, access, loader, sampling, spans, threads,
               degrees: np.ndarray | None, seeds, cold: object, evaluation_exchange,
               stack: contextlib.ExitStack) -> PartNeutronOrchMode:
    """The mode of rank ``world.rank`` on ``part``: ``loader`` (a ``PartitionedLoader`` over the exchange
    ``cold``) loads the cold mini-batches; the planner and the host get exchanges of their own, closed by
    ``stack`` after the mode."""
    lanes, gradients, agree = exchanges(world, cold, stack)
    loader = PartitionedLoader(loader.access, RemoteRows(part, lanes["cold"]), loader.spans, loader.dtype)

    def samplers(lane: str) -> PartitionedSampler:  # "own": the host's, of its part's vertices, exchanging nothing
        return PartitionedSampler(part, lanes.get(lane), sampling.fanouts, degrees)

    # The planner counts the bottom-hop edges a hot vertex spares by its in-degree in the whole graph.
    degree_ptr = global_in_degree_ptr(part, world.rows_gatherer("gathering the in-degrees"))
    kind = PartKind(graph, access, spans, sampling, samplers, loader,
                    RemoteStore(RemoteRows(part, lanes["host"]), loader.dtype), degree_ptr, lanes)
    if config.neutronorch.hot_ratio == "auto":  # the drift probe's rows, fetched now (trainer thread, every rank)
        kind.prepare_probe(part, lambda ids: RemoteRows(part, evaluation_exchange).fetch(ids)[0])
    shared = OwnerHotSet(part, lanes["host"], gradients, agree)
    traffic = TrafficRecord(world, {**lanes, "gradient": gradients}, evaluation_exchange)
    mode = PartNeutronOrchMode(kind, seeds, sampling, config.neutronorch, config.epochs, spans, threads.sampler,
                               threads.host, None, shared=shared, traffic=traffic)
    stack.callback(mode.close)
    return mode
