"""Mode ``neutronorch`` on a typed graph: each type's hot bottom-layer rows computed on the host once per
super-batch and reused under a strictly bounded staleness.

The homogeneous mode (``neutronorch/mode.py``) made typed: the same schedule of versions and the same
staleness check (``neutronorch/versions.py``), the same splice (``nn/splice.py``), a plan per destination
type (``typed_planner.py``). Three threads, each with its own objects; what crosses between them::

    sampler (typed-neutronorch-sampler)      host (typed-neutronorch-host)     trainer (caller)
      its TypedNeighborSampler, TypedPlanner    a copy of the bottom layer        the model, version,
                                                                                  StalenessCheck
      plans s + 1 before it loads s's batches
      hot part of s (Channel "parts") -------> |
      table ids of s (Channel "needs") ---------------------------------------> |
      TypedOrchBatch (Prefetcher) ---------------------------------------------> |
                                               | <---- snapshot of s (Channel "snapshots")
                                               | hot tables of s (Channel "hot") -------> |

**Sampler.** For super-batch s (P mini-batches, numbered across epochs: the pipeline never drains) it
samples each mini-batch's upper hops with the mini-batch's key (``sample_hops``), plans H_s per type, samples
H_s's bottom hop once with the key of the super-batch's first mini-batch (with P = 1, exactly the neighbours
that mini-batch draws) and gathers its inputs; then, per mini-batch, the bottom hop of its cold destinations
only (``sample_bottom``: each draws what exact mode draws for it) and their inputs. Hot destinations'
neighbours are never sampled or gathered for the mini-batches.

**Snapshots.** Super-batch s's hot rows are computed from the bottom layer's parameters (with the featured
types' input projections: ``TypedBottom``) at the version ``snapshot_version(s)``, ``lead`` steps (the
``snapshot_lead`` setting, default 2) before its first step, never older than the bound allows for its last
step and never before super-batch s - 1 begins (so the plan of s, made before s - 1's batches are loaded, is
there). A featureless type's inputs are rows of its embedding table, which the optimizer moves every step:
the snapshot holds those rows too, read by the trainer at that version (``needs``: the hot frontier's ids
the sampler sent ahead), so that every input of a hot row is of one version.

**Staleness.** Every use is checked against the bound (``StalenessCheck``): a violation is a bug and raises.
**Gradient** (``hot_grad``): ``stop`` treats hot rows as constants; ``cpu`` sums dL/dY of each hot row over
the super-batch's steps (the splice's accumulator) and, at its last step, takes it through the host's graph
of those rows into the bottom layer's weights and the tables' rows, added to that step's gradients. With
P = 1, staleness 0 and ``cpu`` a step is exact mode's (``tests/test_typed_neutronorch.py``). Evaluation is
exact mode's (``typed_logits``): no stale row ever reaches a score.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import numba
import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.nn.splice import HotRows, SpliceIndex
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.orchestration.channel import Channel, Closed
from neutronorch.orchestration.neutronorch.hot_rows import layer_holding
from neutronorch.orchestration.neutronorch.plan_loop import one_ahead
from neutronorch.orchestration.neutronorch.versions import Schedule, StalenessCheck
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.orchestration.typed_exact import Inputs, Labels, TypedBatch
from neutronorch.orchestration.typed_planner import TypedPlan, TypedPlanner, TypedPlanStats
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_block import TypedBlock
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

DEFAULT_LEAD = 2  # steps a snapshot precedes its super-batch by default: the host's time to compute it


@dataclass
class HotPart:
    """What the host computes super-batch s's hot rows from (made by the sampler): H_s's bottom block and
    its input frontier's featured rows (host memory), or no block when nothing is hot."""

    super_batch_id: int
    block: TypedBlock | None
    features: dict[str, torch.Tensor]
    hot: dict[str, np.ndarray]


@dataclass
class TypedSnapshot:
    """The bottom layer's parameters and the tables' rows the hot frontier reads, at one version."""

    version: int
    params: list[torch.Tensor]
    rows: dict[str, torch.Tensor]  # featureless type -> its table rows at the hot frontier's ids
    ids: dict[str, torch.Tensor]  # ... and those ids


@dataclass
class TypedHotTables:
    """Super-batch s's hot rows per type, as the trainer reads them: complete and frozen when they cross (the
    trainer writes only into ``grad_acc``)."""

    super_batch_id: int
    version: int
    tables: dict[str, torch.Tensor]  # type -> (|H_s[t]|, width) on the training device
    grad_acc: dict[str, torch.Tensor] = field(default_factory=dict)  # hot_grad="cpu": dL/dY summed
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)  # hot_grad="cpu": the host's rows, attached
    params: list[torch.Tensor] = field(default_factory=list)  # ... the snapshot's parameters they came from
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # ... and table rows (leaves)
    ids: dict[str, torch.Tensor] = field(default_factory=dict)  # ... and those rows' ids
    host_edges: int = 0
    host_seconds: float = 0.0
    host_began: float = 0.0

    @property
    def num_hot(self) -> int:
        return sum(int(t.shape[0]) for t in self.tables.values())


@dataclass
class TypedOrchBatch(TypedBatch):
    """A mini-batch whose bottom block holds its cold destinations only, with each type's splice of its
    bottom-layer output (``blocks[1]``'s source frontier) and its place in its super-batch."""

    super_batch_id: int = 0
    position: int = 0  # in its super-batch
    last: bool = True  # the super-batch's last mini-batch
    splice: dict[str, SpliceIndex] = field(default_factory=dict)


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
                snapshot: TypedSnapshot = self.snapshots.take(super_batch_id)
                self.hot.put(super_batch_id, self.tables(part, snapshot))
        except Closed:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer through the hot channel
            self.hot.fail(exc)

    def tables(self, part: HotPart, snapshot: TypedSnapshot) -> TypedHotTables:
        if part.block is None:
            return TypedHotTables(part.super_batch_id, snapshot.version, {})
        start = time.perf_counter()
        layer, params = layer_holding(self.template, snapshot.params, self.track_grad)
        rows = {t: r.requires_grad_(self.track_grad) for t, r in snapshot.rows.items()}
        with torch.set_grad_enabled(self.track_grad):
            out = layer(part.block, {**part.features, **rows})
        outputs = {t: out[t] for t in part.hot}
        tables = {t: y.detach().to(self.device) for t, y in outputs.items()}
        grad_acc = ({t: torch.zeros(y.shape, dtype=torch.float32, device=self.device) for t, y in tables.items()}
                    if self.track_grad else {})
        return TypedHotTables(part.super_batch_id, snapshot.version, tables, grad_acc,
                              outputs if self.track_grad else {}, params if self.track_grad else [],
                              rows if self.track_grad else {}, snapshot.ids if self.track_grad else {},
                              host_edges=part.block.num_edges, host_seconds=time.perf_counter() - start,
                              host_began=start)


class TypedNeutronOrch:
    """The typed NeutronOrch mode of one run; started at construction, ``close`` it (a context manager)."""

    name = "neutronorch"

    def __init__(self, graph: TypedGraph, model: TypedGNN, fanouts: dict[RelationType, list[int]],
                 schedule: Schedule, train_idx: torch.Tensor, batch_size: int, seed: int, ratio: float | None,
                 hot_grad: str, lead: int | None, device: torch.device, inputs: Inputs, labels: Labels,
                 prefetch: int = 2, sampler_threads: int = 1, host_threads: int = 1, start: int = 0,
                 resumed: dict | None = None):
        self.graph, self.model, self.fanouts, self.schedule = graph, model, fanouts, schedule
        self.train_idx, self.batch_size, self.seed, self.ratio = train_idx, batch_size, seed, ratio
        self.track_grad = hot_grad == "cpu"
        self.lead = DEFAULT_LEAD if lead is None else lead
        self.device, self.inputs, self.labels = device, inputs, labels
        self.num_layers = model.num_layers
        self.sampler_threads = sampler_threads
        self.live = model.bottom_layer()  # the trainer's: snapshots read it
        self.staleness = StalenessCheck(schedule.staleness_bound)
        self.parts = Channel("parts")
        self.needs = Channel("needs")
        self.snapshots = Channel("snapshots")
        self.hot = Channel("hot")
        self._orders: dict[int, tuple[torch.Tensor, ...]] = {}
        self._planned: list[TypedPlan] = []  # the sampler thread's plans not yet reported with a mini-batch
        # Where the run starts: global step ``start``, in super-batch ``first[0]`` at position ``first[1]``.
        steps = schedule.epochs * schedule.batches_per_epoch
        self.first = schedule.at(start) if start < steps else (schedule.total, 0)
        self._table: TypedHotTables | None = None
        self._kept: dict[int, TypedSnapshot] = {}  # published snapshots of super-batches not yet finished
        self._next_snapshot = self.first[0]
        self._resumed_grad = None
        if resumed is not None:
            self._restore(resumed)
        host = TypedHostRows(copy.deepcopy(self.live).cpu().train(), self.track_grad, device, self.parts,
                             self.snapshots, self.hot, host_threads)
        self._host = threading.Thread(target=host.run, args=(self.first[0], schedule.total),
                                      name="typed-neutronorch-host", daemon=True)
        self._host.start()
        self._batches = Prefetcher(self._produce, depth=prefetch, name="typed-neutronorch-sampler")

    def __enter__(self) -> "TypedNeutronOrch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for channel in (self.parts, self.needs, self.snapshots, self.hot):
            channel.close()
        self._batches.close()
        self._host.join(timeout=10)

    def snapshot_version(self, super_batch_id: int) -> int:
        """The version super-batch ``super_batch_id``'s hot rows are computed from (see the module docstring)."""
        version = self.schedule.snapshot_version(super_batch_id, self.lead)
        if super_batch_id > 0:
            version = max(version, self.schedule.first_step(super_batch_id - 1))
        return version

    # -- the trainer's side ------------------------------------------------------------------------------

    def epoch(self, epoch: int, count: int, first: int = 0) -> contextlib.nullcontext:
        """The next mini-batches of the run's stream: epoch ``epoch``'s from ``first`` to ``count`` (the stream
        runs on between epochs, so leaving one stops nothing)."""
        return contextlib.nullcontext(next(self._batches) for _ in range(first, count))

    def summary(self, hot: dict) -> dict:
        """The run summary's ``neutronorch`` part: the settings, what the plans did (``hot``, a
        ``HotRecord``'s) and the staleness observed."""
        return {"neutronorch": {"super_batch": self.schedule.super_batch,
                                "staleness_bound": self.schedule.staleness_bound,
                                "hot_ratio": "auto" if self.ratio is None else self.ratio,
                                "hot_grad": "cpu" if self.track_grad else "stop", "snapshot_lead": self.lead,
                                "staleness_max_observed": self.staleness.max_observed,
                                "staleness_mean_observed": round(self.staleness.mean_observed, 3), **hot}}

    def records(self) -> dict:
        """What the mode adds to an epoch's record: the staleness observed so far."""
        return {"staleness_max": self.staleness.max_observed,
                "staleness_mean": round(self.staleness.mean_observed, 3)}

    def hot_rows(self, batch: TypedOrchBatch, version: int) -> dict[str, HotRows]:
        """The hot rows ``batch`` splices in at parameter version ``version`` (optimizer steps so far):
        publishes every snapshot due by then, waits for its super-batch's tables at its first mini-batch and
        checks the staleness of every use."""
        while self._next_snapshot < self.schedule.total and self.snapshot_version(self._next_snapshot) <= version:
            self._publish(self._next_snapshot, version)
            self._next_snapshot += 1
        if batch.position == 0 or self._table is None or self._table.super_batch_id != batch.super_batch_id:
            self._table = self.hot.take(batch.super_batch_id)
            table = self._table  # the host's time on it, for the stage table and the timeline
            batch.seconds["host_compute"] = table.host_seconds
            batch.spans.append(("host_compute", table.host_began, table.host_began + table.host_seconds))
            if self._resumed_grad is not None and batch.super_batch_id == self.first[0]:
                for t, grad in self._resumed_grad.items():  # the steps of it taken before the resume
                    self._table.grad_acc[t].copy_(grad)
                self._resumed_grad = None
        table = self._table
        self.staleness.check(table, version)
        return {t: HotRows(table.tables[t], index, table.grad_acc.get(t)) for t, index in batch.splice.items()}

    def finish(self, batch: TypedOrchBatch) -> None:
        """After ``batch``'s backward pass, before its optimizer step: at a super-batch's last mini-batch with
        ``hot_grad="cpu"``, the summed dL/dY of its hot rows taken through the host's graph and added to the
        bottom layer's gradients and the tables' rows'."""
        table = self._table
        if not batch.last or table is None:
            return
        self._table = None
        self._kept.pop(batch.super_batch_id, None)
        self.needs.drop(batch.super_batch_id)
        if not (self.track_grad and table.outputs):
            return
        types = list(table.outputs)
        torch.autograd.backward([table.outputs[t] for t in types], [table.grad_acc[t].cpu() for t in types])
        with torch.no_grad():
            for param, host in zip(self.live.parameters(), table.params):
                if host.grad is None:
                    continue
                grad = host.grad.to(param.device)
                param.grad = grad if param.grad is None else param.grad + grad
            for t, rows in table.rows.items():
                if rows.grad is None:
                    continue
                weight = self.model.embeddings[t].weight
                ids = table.ids[t].to(weight.device)
                extra = torch.sparse_coo_tensor(ids.unsqueeze(0), rows.grad.to(weight.device), weight.shape,
                                                check_invariants=False)
                weight.grad = extra if weight.grad is None else weight.grad + extra

    def _publish(self, super_batch_id: int, version: int) -> None:
        """Snapshot super-batch ``super_batch_id``'s inputs at ``version``: the bottom layer's parameters and
        the table rows its hot frontier reads (the sampler sent their ids ahead)."""
        ids = self.needs.take(super_batch_id)
        with torch.no_grad():
            params = [p.detach().to("cpu", copy=True) for p in self.live.parameters()]
            rows = {t: self.model.embeddings[t].weight.detach()[index.to(self.model.embeddings[t].weight.device)]
                    .to("cpu", copy=True) for t, index in ids.items()}
        snapshot = TypedSnapshot(version, params, rows, ids)
        self._kept[super_batch_id] = snapshot
        self.snapshots.put(super_batch_id, snapshot)

    def state(self) -> dict:
        """What a checkpoint keeps of the mode for an exact resume: the snapshots published for super-batches
        not yet finished (their versions are past) and, mid super-batch, the hot rows' gradient summed so far.
        The plans are not kept: they depend on the seed, the epoch and the batches alone, and are made again."""
        grad = ({t: g.detach().to("cpu", copy=True) for t, g in self._table.grad_acc.items()}
                if self._table is not None else None)
        return {"snapshots": {s: {"version": k.version, "params": k.params, "rows": k.rows, "ids": k.ids}
                              for s, k in self._kept.items()},
                "grad_acc": grad, "staleness": self.staleness.state_dict()}

    def _restore(self, state: dict) -> None:
        """Continue from ``state`` (``state()`` of the run this one resumes): its snapshots published again,
        the current super-batch's summed gradient kept for when its table arrives."""
        for super_batch_id, saved in sorted(state["snapshots"].items()):
            snapshot = TypedSnapshot(saved["version"], list(saved["params"]), dict(saved["rows"]), dict(saved["ids"]))
            self._kept[super_batch_id] = snapshot
            self.snapshots.put(super_batch_id, snapshot)
            self._next_snapshot = max(self._next_snapshot, super_batch_id + 1)
        self._resumed_grad = state["grad_acc"]
        self.staleness.load_state_dict(state["staleness"])

    # -- the sampler -----------------------------------------------------------------------------------------

    def _produce(self) -> Iterator[TypedOrchBatch]:
        """The sampler thread's body: every mini-batch of the run, in order. A failure here also fails the
        channels the host and the trainer wait on for its plans, so neither waits for one that never comes."""
        try:
            numba.set_num_threads(self.sampler_threads)
            sampler = TypedNeighborSampler(self.graph, self.fanouts)
            planner = TypedPlanner(self.graph, {r: f[-1] for r, f in sampler.fanouts.items()})
            plans = (self._plan(s, sampler, planner) for s in range(self.first[0], self.schedule.total))
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

    def _seeds(self, epoch: int, index: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {epoch: torch.split(epoch_order(self.train_idx, self.seed, epoch), self.batch_size)}
        return self._orders[epoch][index].numpy()

    def _plan(self, super_batch_id: int, sampler: TypedNeighborSampler, planner: TypedPlanner) -> TypedPlan:
        """Plan super-batch ``super_batch_id`` and hand its hot part to the host and its table ids to the
        trainer."""
        epoch, first, end = self.schedule.locate(super_batch_id)
        clock = time.perf_counter()
        uppers = []
        for index in range(first, end):
            key = batch_key(self.seed, epoch, index)
            uppers.append((index, key, sampler.sample_hops(self._seeds(epoch, index), key, self.num_layers - 1)))
        plan = planner.plan(super_batch_id, epoch, uppers, self.ratio)
        block, features, needs = None, {}, {}
        if plan.hot:
            block = sampler.sample_bottom(plan.hot, uppers[0][1])
            features, ids = self.inputs(block.src_ids, torch.device("cpu"))
            needs = {t: ids[t] for t in self.model.embeddings if t in ids}
        self.needs.put(super_batch_id, needs)
        self.parts.put(super_batch_id, HotPart(super_batch_id, block, features, plan.hot))
        plan.began, plan.seconds = clock, time.perf_counter() - clock
        self._planned.append(plan)  # the sampler thread's: reported with the next mini-batch it loads
        return plan

    def _load(self, plan: TypedPlan, position: int, sampler: TypedNeighborSampler) -> TypedOrchBatch:
        planned = plan.batches[position]
        clock = time.perf_counter()
        upper = planned.upper
        cold = sampler.sample_bottom(planned.cold_destinations(), planned.key)
        sampled = time.perf_counter()
        features, ids = self.inputs(cold.src_ids, self.device)
        labels = self.labels(upper.seeds.numpy()).to(self.device)
        splice = {t: SpliceIndex.build(int(upper.frontiers[0][t].shape[0]), planned.cold_pos[t], planned.hot_pos[t],
                                       planned.hot_rows[t]).to(self.device)
                  for t in plan.hot if planned.hot_pos[t].shape[0]}
        blocks, done = [cold, *upper.blocks], time.perf_counter()
        seconds = {"sample": sampled - clock, "gather": done - sampled}
        spans = [("sample", clock, sampled), ("gather", sampled, done)]
        if self._planned:  # the plans made since the last mini-batch (one super-batch ahead of it)
            seconds["plan"] = sum(p.seconds for p in self._planned)
            spans[:0] = [("plan", p.began, p.began + p.seconds) for p in self._planned]
            self._planned.clear()
        return TypedOrchBatch([b.to(self.device) for b in blocks], features, ids, labels, seconds,
                              sum(b.num_edges for b in blocks), sum(int(v.shape[0]) for v in cold.src_ids.values()),
                              plan.stats if position == 0 else None, spans=spans, super_batch_id=plan.super_batch_id,
                              position=position, last=position == len(plan.batches) - 1, splice=splice)
