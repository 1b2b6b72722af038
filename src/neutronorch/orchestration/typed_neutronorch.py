"""Mode ``neutronorch`` on a typed graph: each type's hot bottom-layer rows computed on the host once per
super-batch and reused under a strictly bounded staleness.

The homogeneous mode (``neutronorch/mode.py``) made typed: the same schedule of versions and the same
staleness check (``neutronorch/versions.py``), the same splice (``nn/splice.py``), a plan per destination
type (``typed_planner.py``). Three threads, each with its own objects (the producers' in
``typed_producers.py``: ``TypedColdSampler``, ``TypedHostRows``); what crosses between them::

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

**Protocol.** The ``Mode`` of ``mode.py``: the threads start with ``start(model)``, at the parameter version
(optimizer steps taken, counted by ``after_step``) a resumed run's ``load_state_dict`` gave; ``step_inputs``
publishes the snapshots due and hands the model its hot rows, ``before_step`` adds their gradient.

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

import torch

from neutronorch.config import NeutronOrchConfig, SamplingConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.features.store import TypedInputs
from neutronorch.nn.splice import HotRows
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.mode import StepInputs
from neutronorch.orchestration.neutronorch.versions import Schedule, StalenessCheck
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.typed_exact import train_seeds
from neutronorch.orchestration.typed_planner import HotRecord
from neutronorch.orchestration.typed_producers import (TypedColdSampler, TypedHostRows, TypedHotTables, TypedOrchBatch,
                                                      TypedSnapshot)

DEFAULT_LEAD = 2  # steps a snapshot precedes its super-batch by default: the host's time to compute it


class TypedNeutronOrch:
    """The typed NeutronOrch mode of one run; its threads run from ``start`` to ``close``."""

    name = "neutronorch"
    stages = StageTable({"plan": "planner", "host_compute": "host", "sample": "sampler", "gather": "sampler"})
    resumable = resumable_mid_epoch = True  # ``state_dict`` after any step
    store = placement = cache = None  # it reads a typed graph's rows through ``inputs``' stores, no device cache

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 config: NeutronOrchConfig, epochs: int, device: torch.device, spans: Spans,
                 sampler_threads: int = 1, host_threads: int = 1, inputs: TypedInputs | None = None):
        self.graph, self.fanouts, self.sampling, self.device, self.spans = graph, fanouts, sampling, device, spans
        self.inputs = inputs if inputs is not None else TypedInputs(graph)  # the featured types' stores
        self.train_idx = train_seeds(graph)
        self.num_batches = -(-self.train_idx.shape[0] // sampling.batch_size)
        self.schedule = Schedule(epochs, self.num_batches, config.super_batch, config.resolved_staleness)
        self.ratio = None if config.hot_ratio == "auto" else float(config.hot_ratio)
        self.track_grad = config.hot_grad == "cpu"
        self.lead = DEFAULT_LEAD if config.snapshot_lead is None else config.snapshot_lead
        self.sampler_threads, self.host_threads = sampler_threads, host_threads
        self.threads = {"sampler": sampler_threads, "host": host_threads}
        self.staleness = StalenessCheck(self.schedule.staleness_bound)
        self.version = 0  # optimizer steps taken: the parameter version
        self.hot_epoch, self.hot_run = HotRecord(), HotRecord()  # what the plans did, this epoch and in the run
        self.parts = Channel("parts")
        self.needs = Channel("needs")
        self.snapshots = Channel("snapshots")
        self.hot = Channel("hot")
        self._table: TypedHotTables | None = None
        self._kept: dict[int, TypedSnapshot] = {}  # published snapshots of super-batches not yet finished
        self._resumed: dict | None = None
        self._resumed_grad = None
        self._host = self._batches = None

    def start(self, model: TypedGNN) -> None:
        """Start the sampler and host threads at the run's parameter version (a resumed run's snapshots
        published again)."""
        self.model, self.live, self.num_layers = model, model.bottom_layer(), model.num_layers  # snapshots read it
        steps = self.schedule.epochs * self.schedule.batches_per_epoch
        # Where the run starts: in super-batch ``first[0]`` at position ``first[1]``.
        self.first = self.schedule.at(self.version) if self.version < steps else (self.schedule.total, 0)
        self._next_snapshot = self.first[0]
        if self._resumed is not None:
            self._restore(self._resumed)
        host = TypedHostRows(copy.deepcopy(self.live).cpu().train(), self.track_grad, self.device, self.parts,
                             self.snapshots, self.hot, self.host_threads)
        self._host = threading.Thread(target=host.run, args=(self.first[0], self.schedule.total),
                                      name="typed-neutronorch-host", daemon=True)
        self._host.start()
        sampler = TypedColdSampler(self.graph, self.fanouts, self.sampling, self.schedule, self.ratio, self.device,
                                   self.spans, self.sampler_threads, tuple(model.embeddings), self.first,
                                   self.parts, self.needs, self.inputs)
        self._batches = Prefetcher(sampler.run, depth=self.sampling.prefetch, name="typed-neutronorch-sampler")

    def close(self) -> None:
        for channel in (self.parts, self.needs, self.snapshots, self.hot):
            channel.close()
        if self._batches is not None:
            self._batches.close()
            self._host.join(timeout=10)

    def snapshot_version(self, super_batch_id: int) -> int:
        """The version super-batch ``super_batch_id``'s hot rows are computed from (see the module docstring)."""
        version = self.schedule.snapshot_version(super_batch_id, self.lead)
        if super_batch_id > 0:
            version = max(version, self.schedule.first_step(super_batch_id - 1))
        return version

    # -- the trainer's side ------------------------------------------------------------------------------

    def batches(self, epoch: int, start: int = 0) -> contextlib.nullcontext:
        """The next mini-batches of the run's stream: epoch ``epoch``'s from ``start`` on (the stream runs on
        between epochs, so leaving one stops nothing)."""
        if epoch * self.num_batches + start != self.version:
            raise RuntimeError(f"NeutronOrch's pipeline is at parameter version {self.version}, not at step {start} "
                               f"of epoch {epoch}: epochs run in order, from where the run (or its resume) is")
        return contextlib.nullcontext(next(self._batches) for _ in range(start, self.num_batches))

    def describe(self) -> str:
        return (f"super-batch {self.schedule.super_batch}, staleness bound {self.schedule.staleness_bound}, "
                f"sampler threads {self.sampler_threads}, host threads {self.host_threads}")

    def summary(self) -> dict:
        """The run summary's ``neutronorch`` part: the settings, what the plans did and the staleness observed."""
        return {**self.inputs.summary(), "neutronorch": {"super_batch": self.schedule.super_batch,
                                "staleness_bound": self.schedule.staleness_bound,
                                "hot_ratio": "auto" if self.ratio is None else self.ratio,
                                "hot_grad": "cpu" if self.track_grad else "stop", "snapshot_lead": self.lead,
                                "staleness_max_observed": self.staleness.max_observed,
                                "staleness_mean_observed": round(self.staleness.mean_observed, 3),
                                **self.hot_run.record()}}

    def end_epoch(self, record: dict) -> None:
        """What the plans did in the epoch, and the staleness observed so far."""
        record.update(self.hot_epoch.record(), staleness_max=self.staleness.max_observed,
                      staleness_mean=round(self.staleness.mean_observed, 3))
        self.hot_run.merge(self.hot_epoch)
        self.hot_epoch = HotRecord()

    def averaged_gradients(self) -> None:
        return None  # one process: typed NeutronOrch mode does not train data parallel

    def step_inputs(self, batch: TypedOrchBatch) -> StepInputs:
        """The model's inputs with the hot rows ``batch`` splices in at the current parameter version:
        publishes every snapshot due by then, waits for its super-batch's tables at its first mini-batch and
        checks the staleness of every use."""
        version = self.version
        self.hot_epoch.add(batch.stats)
        while self._next_snapshot < self.schedule.total and self.snapshot_version(self._next_snapshot) <= version:
            self._publish(self._next_snapshot, version)
            self._next_snapshot += 1
        if batch.position == 0 or self._table is None or self._table.super_batch_id != batch.super_batch_id:
            self._table = table = self.hot.take(batch.super_batch_id)
            self.spans.add("host_compute", table.host_began, table.host_began + table.host_seconds)
            if self._resumed_grad is not None and batch.super_batch_id == self.first[0]:
                for t, grad in self._resumed_grad.items():  # the steps of it taken before the resume
                    self._table.grad_acc[t].copy_(grad)
                self._resumed_grad = None
        table = self._table
        self.staleness.check(table, version)
        hot = {t: HotRows(table.tables[t], index, table.grad_acc.get(t)) for t, index in batch.splice.items()}
        return StepInputs(batch.blocks, batch.features, hot, batch.ids)

    def after_step(self, batch: TypedOrchBatch) -> None:
        self.version += 1

    def before_step(self, batch: TypedOrchBatch) -> None:
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

    def state_dict(self) -> dict:
        """What a checkpoint keeps of the mode for an exact resume: the parameter version, the snapshots
        published for super-batches not yet finished (their versions are past) and, mid super-batch, the hot
        rows' gradient summed so far. The plans are not kept: they depend on the seed, the epoch and the batches
        alone, and are made again."""
        grad = ({t: g.detach().to("cpu", copy=True) for t, g in self._table.grad_acc.items()}
                if self._table is not None else None)
        return {"version": self.version,
                "snapshots": {s: {"version": k.version, "params": k.params, "rows": k.rows, "ids": k.ids}
                              for s, k in self._kept.items()},
                "grad_acc": grad, "staleness": self.staleness.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Before ``start``: continue from ``state`` (``state_dict()`` of the run this one resumes)."""
        self.version, self._resumed = state["version"], state

    def _restore(self, state: dict) -> None:
        """Its snapshots published again, the current super-batch's summed gradient kept for when its table
        arrives."""
        for super_batch_id, saved in sorted(state["snapshots"].items()):
            snapshot = TypedSnapshot(saved["version"], list(saved["params"]), dict(saved["rows"]), dict(saved["ids"]))
            self._kept[super_batch_id] = snapshot
            self.snapshots.put(super_batch_id, snapshot)
            self._next_snapshot = max(self._next_snapshot, super_batch_id + 1)
        self._resumed_grad = state["grad_acc"]
        self.staleness.load_state_dict(state["staleness"])
