"""Typed NeutronOrch mode's two producer threads, each with an object of its own that owns nothing the other
threads touch: the sampler's (``TypedColdSampler``: plans, and mini-batches with their cold bottom hop) and the
host's (``TypedHostRows``: each super-batch's hot rows), and what crosses between them and the trainer.

The sampler thread hands the host a ``HotPart`` (H_s's bottom block and its featured rows) and the trainer
the table ids H_s's frontier reads; the trainer hands the host a ``Snapshot`` (the bottom layer's parameters
and those table rows at one version, ``neutronorch/snapshots.py``); the host hands back the
``HotEmbeddings`` of ``neutronorch/versions.py``, one table per type, complete and frozen (the trainer
writes only into their ``grad_acc``), with the host's time on them, which the trainer records when it takes
them: the epoch that uses a super-batch's rows counts their ``host_compute``, wherever the host computed them
ahead. The mode that runs it is ``typed_neutronorch.py``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numba
import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.features.store import TypedInputs
from neutronorch.nn.splice import SpliceIndex
from neutronorch.observe import Spans
from neutronorch.orchestration.batch import TypedBatch, target_labels
from neutronorch.orchestration.channel import Channel, Closed
from neutronorch.orchestration.neutronorch.controller import PublishedSetting
from neutronorch.orchestration.neutronorch.cold_sampler import splice_index
from neutronorch.orchestration.neutronorch.device_planner import TypedDevicePlanner
from neutronorch.orchestration.neutronorch.hot_rows import layer_holding
from neutronorch.orchestration.neutronorch.plan_loop import one_ahead
from neutronorch.orchestration.neutronorch.planner import TypedPlan, TypedPlanner
from neutronorch.orchestration.neutronorch.versions import HotEmbeddings, Schedule, Snapshot
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_block import TypedBlock
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler, TypedTopology
from neutronorch.sampling.typed_sampler import TypedHops, TypedNeighborSampler


@dataclass(frozen=True)
class HotPart:
    """What the host computes super-batch s's hot rows from (made by the sampler): H_s's bottom block and
    its input frontier's featured rows (host memory), or no block when nothing is hot."""

    super_batch_id: int
    block: TypedBlock | None
    features: dict[str, torch.Tensor]
    hot: dict[str, np.ndarray]


@dataclass
class TypedOrchBatch(TypedBatch):
    """A mini-batch whose bottom block holds its cold destinations only, with each type's splice of its
    bottom-layer output (``blocks[1]``'s source frontier) and its place in its super-batch."""

    super_batch_id: int = 0
    position: int = 0  # in its super-batch
    last: bool = True  # the super-batch's last mini-batch
    splice: dict[str, SpliceIndex] = field(default_factory=dict)
    probe: dict[str, np.ndarray] | None = None  # its first: the plan's hottest per type (the drift probe's)


class TypedHostRows:
    """The host thread's side: every super-batch's hot tables, in order, each computed from its snapshot with
    a copy of the bottom layer (``template``) holding the snapshot's parameters. Owns nothing the other
    threads touch; reads ``parts`` and ``snapshots``, writes ``hot``."""

    def __init__(self, template: torch.nn.Module, track_grad: bool, device: torch.device, parts: Channel,
                 snapshots: Channel, hot: Channel, threads: int):
        self.template, self.track_grad, self.device = template, track_grad, device
        self.parts, self.snapshots, self.hot, self.threads = parts, snapshots, hot, threads

    def run(self, first: int, total: int) -> None:
        """The thread's body: super-batches ``first`` to ``total - 1``."""
        numba.set_num_threads(self.threads)
        try:
            for super_batch_id in range(first, total):
                part: HotPart = self.parts.take(super_batch_id)
                snapshot: Snapshot = self.snapshots.take(super_batch_id)
                if snapshot.ready is not None:
                    snapshot.ready.synchronize()
                self.hot.put(super_batch_id, self.embeddings(part, snapshot, time.perf_counter()))
        except Closed:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer through the hot channel
            self.hot.fail(exc)

    def embeddings(self, part: HotPart, snapshot: Snapshot, began: float) -> HotEmbeddings:
        """H_s's rows per type at the snapshot's version; with ``hot_grad="cpu"`` their graph back to the
        snapshot's parameters and table rows, and a zeroed accumulator per type."""
        if part.block is None:
            return HotEmbeddings(part.super_batch_id, snapshot.version, {}, 0, {}, grad_acc={}, output={})
        layer, params = layer_holding(self.template, snapshot.params, self.track_grad)
        rows = {t: r.detach().requires_grad_(self.track_grad) for t, r in snapshot.rows.items()}
        with torch.set_grad_enabled(self.track_grad):
            out = layer(part.block, {**part.features, **rows})
        outputs = {t: out[t] for t in part.hot}
        tables = {t: y.detach().to(self.device) for t, y in outputs.items()}
        grad_acc = ({t: torch.zeros(y.shape, dtype=torch.float32, device=self.device) for t, y in tables.items()}
                    if self.track_grad else {})
        track = self.track_grad
        num_hot = sum(int(y.shape[0]) for y in tables.values())
        return HotEmbeddings(part.super_batch_id, snapshot.version, tables, num_hot, part.hot, grad_acc=grad_acc,
                             output=outputs if track else {}, params=params if track else None,
                             rows=rows if track else {}, ids=snapshot.ids if track else {}, host_began=began,
                             host_seconds=time.perf_counter() - began)


class TypedColdSampler:
    """The sampler thread's side: plans each super-batch one ahead of the mini-batches it loads, hands the host
    its hot part (``parts``) and the trainer its table ids (``needs``), and loads each mini-batch with the
    bottom hop of its cold destinations only. Its samplers, planner and seeds (``NodeSeeds``, as a homogeneous
    run's: the target type's training vertices) are its own. With ``on_device`` (device sampling) the
    mini-batches' hops are drawn and planned on the training device (``TypedDeviceSampler``, the host
    sampler's draws; ``TypedDevicePlanner``, the host planner's plan); the hot part is drawn on the host."""

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 schedule: Schedule, published: PublishedSetting, device: torch.device, spans: Spans, threads: int,
                 tables: tuple[str, ...], first: tuple[int, int], parts: Channel, needs: Channel,
                 inputs: TypedInputs, on_device: bool = False):
        self.graph, self.fanouts, self.sampling, self.schedule = graph, fanouts, sampling, schedule
        self.published = published  # the ratio controller's setting (replaced whole by the trainer)
        self.inputs = inputs  # the featured types' stores
        self.device, self.spans, self.threads, self.tables = device, spans, threads, tables
        self.first, self.parts, self.needs, self.on_device = first, parts, needs, on_device
        self.seeds, self._batches = NodeSeeds(graph, sampling), {}  # the seeds of an epoch's mini-batches
        self.num_layers = len(next(iter(fanouts.values())))

    def run(self) -> Iterator[TypedOrchBatch]:
        """The sampler thread's body: every mini-batch of the run, in order. A failure here also fails the
        channels the host and the trainer wait on for its plans, so neither waits for one that never comes."""
        try:
            numba.set_num_threads(self.threads)
            host = TypedNeighborSampler(self.graph, self.fanouts)
            sampler = (TypedDeviceSampler(TypedTopology.of(self.graph, self.device), host.fanouts)
                       if self.on_device else host)
            bottom = {r: f[-1] for r, f in host.fanouts.items()}
            planner = (TypedDevicePlanner(self.graph, {r: ip for r, (ip, _) in sampler.topology.relations.items()},
                                          bottom) if self.on_device else TypedPlanner(self.graph, bottom))
            plans = (self._plan(s, sampler, host, planner) for s in range(self.first[0], self.schedule.total))
            for plan in one_ahead(plans):
                start = self.first[1] if plan.super_batch_id == self.first[0] else 0
                for position in range(start, len(plan.batches)):
                    yield self._load(plan, position, sampler)
        except Closed:
            raise
        except BaseException as exc:
            self.needs.fail(exc)
            self.parts.fail(exc)
            raise

    def _plan(self, super_batch_id: int, sampler: TypedHops, host: TypedNeighborSampler,
              planner: TypedPlanner) -> TypedPlan:
        """Plan super-batch ``super_batch_id`` and hand its hot part (drawn by ``host``) to the host and its
        table ids to the trainer."""
        epoch, first, end = self.schedule.locate(super_batch_id)
        if epoch not in self._batches:
            self._batches = {epoch: self.seeds.epoch(epoch)}
        with self.spans.stage("plan"):
            uppers = []
            for index in range(first, end):
                key = batch_key(self.sampling.seed, epoch, index)
                seeds = self._batches[epoch][index].seeds
                uppers.append((index, key, sampler.sample_hops(seeds if self.on_device else seeds.numpy(), key,
                                                                 self.num_layers - 1)))
            setting = self.published.read()[1]
            plan = planner.plan(super_batch_id, epoch, uppers, setting.ratio, setting.cap())
            block, features, needs = None, {}, {}
            if plan.hot:
                block = host.sample_bottom(plan.hot, uppers[0][1])  # the sampler copies the read-only hot set
                features, ids = self.inputs(block.src_ids, torch.device("cpu"))
                needs = {t: ids[t] for t in self.tables if t in ids}
        self.needs.put(super_batch_id, needs)
        self.parts.put(super_batch_id, HotPart(super_batch_id, block, features, plan.hot))
        return plan

    def _load(self, plan: TypedPlan, position: int, sampler: TypedHops) -> TypedOrchBatch:
        planned = plan.batches[position]
        upper = planned.upper
        with self.spans.stage("sample", planned.index):
            cold = sampler.sample_bottom({t: ids[planned.cold_pos[t]] for t, ids in upper.frontiers[0].items()},
                                         planned.key)
        with self.spans.stage("gather", planned.index):
            features, ids = self.inputs({t: v.cpu() for t, v in cold.src_ids.items()}, self.device)
            labels = target_labels(self.graph, upper.seeds.cpu().numpy()).to(self.device)
            splice = {t: splice_index(int(upper.frontiers[0][t].shape[0]), planned.cold_pos[t], planned.hot_pos[t],
                                      planned.hot_rows[t]).to(self.device)
                      for t in plan.hot if planned.hot_pos[t].shape[0]}
            blocks = [b.to(self.device) for b in [cold, *upper.blocks]]
        return TypedOrchBatch(plan.epoch, planned.index, blocks, features, ids, labels,
                              sum(b.num_edges for b in blocks), sum(int(v.shape[0]) for v in cold.src_ids.values()),
                              plan.stats if position == 0 else None, super_batch_id=plan.super_batch_id,
                              probe=plan.probe if position == 0 else None,
                              position=position, last=position == len(plan.batches) - 1, splice=splice)
