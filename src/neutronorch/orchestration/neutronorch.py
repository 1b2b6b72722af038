"""Mode ``neutronorch``: hot vertices' bottom layer on the host, reused under a strictly bounded staleness.

Three threads cooperate; none waits on another except through the bounded hand-offs below.

- **Host producer** (one thread, its own sampler). For each super-batch s (P consecutive mini-batches of
  the epoch's shuffled seed order) it *plans*: samples the upper hops of the P mini-batches (the same
  per-vertex randomness as exact mode), counts how often each vertex appears among the bottom-layer
  destinations, and takes the top ``hot_ratio`` of the vertices reached as the hot set H_s (sorted by
  count). The plan goes to the device sampler. Then it samples the bottom hop of H_s once and gathers the
  raw features, waits for the W0 snapshot the schedule assigns to s, and computes H_s's bottom-layer output
  with exactly the device layer's code: the *hot embeddings* of s. It plans s+1 before it waits, so the
  device sampler never starves on a plan.
- **Device sampler** (the exact mode's producer, reused): per mini-batch, samples the bottom hop of the
  *cold* destinations only (hot ones are never sampled, gathered or transferred), gathers and copies.
  With device sampling (``--device-sampling``, on by default with CUDA) that bottom hop is sampled on the
  device with the torch sampler and its rows come from the device feature cache (misses read from pinned
  host memory), as in device mode.
- **Trainer**: per mini-batch, splices the hot rows into the bottom layer's pre-activation output.

Staleness is bounded by construction: the hot embeddings of s are computed from the parameters at version
``last_step(s) - S`` exactly (version = optimizer steps taken), a snapshot the trainer publishes when it
reaches that version. Every buffer carries its super-batch id and parameter version, and every use checks
``version_now - version_snapshot <= S``; a violation raises (it would be a bug). With ``hot_grad="cpu"``
the hot rows' gradient is accumulated over the super-batch and turned into W0's gradient by the host at
the super-batch's last step (version difference again at most S).
"""

from __future__ import annotations

import copy
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import numba
import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.orchestration.device import DeviceReader
from neutronorch.orchestration.exact import ExactMode, epoch_order
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.sampling import kernels
from neutronorch.sampling.block import MiniBatch, SampledSubgraph
from neutronorch.sampling.neighbor_sampler import (NeighborSampler, TorchNeighborSampler, batch_key, layer_key,
                                                   mix_key)
from neutronorch.nn.splice import SpliceIndex, splice, splice_relu_dropout
from neutronorch.train.telemetry import lane_seconds

# The hot ratio ``auto`` starts here and is re-tuned between epochs (see ``HotRatioTuner``).
AUTO_START_RATIO = 0.2


class Schedule:
    """Global numbering of super-batches and optimizer steps across epochs (the pipeline never drains).

    Super-batch ``g`` is number ``g % per_epoch`` of epoch ``g // per_epoch``; the last one of an epoch
    may hold fewer than P mini-batches. Step ``t`` is the t-th optimizer step of the whole run."""

    def __init__(self, epochs: int, batches_per_epoch: int, super_batch: int, staleness_bound: int):
        self.epochs = epochs
        self.batches_per_epoch = batches_per_epoch
        self.super_batch = super_batch
        self.staleness_bound = staleness_bound
        self.per_epoch = -(-batches_per_epoch // super_batch)
        self.total = epochs * self.per_epoch

    def locate(self, gsid: int) -> tuple[int, int, int]:
        """(epoch, first mini-batch, end mini-batch) of super-batch ``gsid``."""
        epoch, index = divmod(gsid, self.per_epoch)
        first = index * self.super_batch
        return epoch, first, min(first + self.super_batch, self.batches_per_epoch)

    def first_step(self, gsid: int) -> int:
        epoch, first, _ = self.locate(gsid)
        return epoch * self.batches_per_epoch + first

    def last_step(self, gsid: int) -> int:
        epoch, _, end = self.locate(gsid)
        return epoch * self.batches_per_epoch + end - 1

    @property
    def max_lead(self) -> int:
        """The most steps a snapshot may precede its super-batch's first step within the bound."""
        return max(0, self.staleness_bound - self.super_batch + 1)

    def snapshot_version(self, gsid: int, lead: int | None = None) -> int:
        """The parameter version the hot embeddings of ``gsid`` are computed from: ``lead`` steps before the
        super-batch's first step (the host's time to compute them), and never older than the bound allows
        for its last step. ``lead=None`` takes the oldest version the bound allows."""
        oldest = self.last_step(gsid) - self.staleness_bound
        version = oldest if lead is None else max(oldest, self.first_step(gsid) - lead)
        return max(0, version)

    def gsid_of(self, epoch: int, batch: int) -> int:
        return epoch * self.per_epoch + batch // self.super_batch


class _Closed(Exception):
    """Raised in a pipeline thread waiting on a board that was closed (the run is shutting down)."""


class _Board:
    """Items keyed by super-batch id, handed from one thread to another; waiting wakes on close or failure."""

    def __init__(self):
        self._items: dict[int, object] = {}
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._closed = False

    def put(self, key: int, value) -> None:
        with self._cond:
            self._items[key] = value
            self._cond.notify_all()

    def take(self, key: int, remove: bool):
        """The item under ``key``, waiting for it."""
        with self._cond:
            while key not in self._items:
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise _Closed()
                self._cond.wait(0.5)
            return self._items.pop(key) if remove else self._items[key]

    def drop(self, key: int) -> None:
        with self._cond:
            self._items.pop(key, None)

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._items.clear()
            self._cond.notify_all()


@dataclass
class Snapshot:
    """A copy of the bottom layer's parameters at one parameter version (host memory)."""

    version: int
    params: list[torch.Tensor]
    ready: object = None  # on CUDA: the event after which the pinned copies are complete


@dataclass
class HotEmbeddings:
    """The bottom-layer output of one super-batch's hot set, as the device reads it."""

    gsid: int
    version: int
    table: torch.Tensor  # (|H_s|, width) on the training device
    num_hot: int
    grad_acc: torch.Tensor | None = None  # hot_grad="cpu": dL/dY summed over the super-batch's steps
    output: torch.Tensor | None = None  # hot_grad="cpu": the host output, still attached to its graph
    params: list[torch.Tensor] | None = None  # hot_grad="cpu": the snapshot parameters it was computed from
    ready: object = None  # on CUDA: the event after which ``table`` holds the data
    keep: list = field(default_factory=list)  # host buffers that must outlive an asynchronous copy


@dataclass
class _PlannedBatch:
    index: int
    key: int
    upper: SampledSubgraph  # the upper hops; ``upper.frontiers[0]`` are the bottom-layer destinations
    cold_pos: np.ndarray
    hot_pos: np.ndarray
    hot_rows: np.ndarray
    saved_edges: int  # bottom-hop edges the device does not sample because their destination is hot


@dataclass
class _Plan:
    gsid: int
    epoch: int
    batches: list[_PlannedBatch]
    hot: np.ndarray  # H_s, hottest first
    reached: int  # distinct bottom-layer destinations of the super-batch
    appearances: int  # bottom-layer destination rows over its mini-batches
    hot_appearances: int  # of which served by hot embeddings


@dataclass
class Splice:
    """A mini-batch's place in its super-batch and how its bottom-layer output is assembled."""

    gsid: int
    index: SpliceIndex
    last: bool  # the last mini-batch of its super-batch

    def to(self, device: torch.device, non_blocking: bool = False) -> "Splice":
        return Splice(self.gsid, self.index.to(device, non_blocking), self.last)


class HotRatioTuner:
    """``hot_ratio="auto"``: re-tune r between epochs from measured times.

    - **Host and device are different processors** (CUDA): balance them. The host producer's busy time per
      super-batch grows with r, the device's shrinks; r is scaled by (device time / host time), at most 2x
      either way per epoch, so that neither side waits for the other for long.
    - **They share the cores** (device = CPU): the host's work is taken from the device's cores, so the
      balance point says nothing; what counts is the epoch time. r walks in log steps (x2, then x sqrt 2 once
      a step made things worse) in the direction that lowered the measured epoch time.

    The first epoch (JIT compilation, cold caches) is not used for decisions.
    """

    LOW, HIGH = 0.01, 0.8
    MIN_STEP = 0.25  # log2 units: the walk stops refining below a factor of 2 ** 0.25

    def __init__(self, start: float, shared_cores: bool):
        self.ratio = start
        self.shared_cores = shared_cores
        self.history: list[dict] = []
        self._direction, self._step = 1.0, 1.0  # walk in log2(r)
        self._best: tuple[float, float] | None = None  # (epoch seconds, ratio)

    def update(self, epoch_seconds: float, host_seconds: float, device_seconds: float) -> float:
        """Record one epoch at the current ratio; return the ratio for the next epoch."""
        self.history.append({"ratio": round(self.ratio, 4), "epoch_s": round(epoch_seconds, 3),
                             "host_s_per_super_batch": round(host_seconds, 4),
                             "device_s_per_super_batch": round(device_seconds, 4)})
        if len(self.history) == 1:
            return self.ratio  # the warm-up epoch decides nothing
        if not self.shared_cores:
            factor = min(2.0, max(0.5, device_seconds / max(host_seconds, 1e-9)))
            return self._set(self.ratio * factor)
        if self._best is None or epoch_seconds < self._best[0]:
            self._best = (epoch_seconds, self.ratio)
            base = self.ratio
        else:
            # Worse: back to the best ratio, turn round, and take smaller steps.
            self._direction, self._step = -self._direction, self._step / 2
            base = self._best[1]
        if self._step < self.MIN_STEP:
            return self._set(self._best[1])
        return self._set(base * 2 ** (self._direction * self._step))

    def _set(self, ratio: float) -> float:
        self.ratio = float(min(self.HIGH, max(self.LOW, ratio)))
        return self.ratio


class NeutronOrchMode(ExactMode):
    name = "neutronorch"
    PROBE_ROWS = 256  # vertices whose bottom-layer output measures the per-step drift

    def __init__(self, graph: Graph, config: TrainConfig, device: torch.device, sampler_threads: int,
                 host_threads: int = 1):
        super().__init__(graph, config, device, sampler_threads)
        self.host_threads = host_threads
        self.policy = config.hot_grad
        self.schedule = Schedule(config.epochs, self.num_batches, config.super_batch, config.resolved_staleness)
        self.auto = config.hot_ratio == "auto"
        self.ratio = AUTO_START_RATIO if self.auto else float(config.hot_ratio)
        self.tuner = HotRatioTuner(self.ratio, shared_cores=not self.on_cuda) if self.auto else None
        self.version = 0
        self.max_staleness = 0
        self._staleness_sum = self._staleness_uses = 0
        self.auto_lead = config.snapshot_lead is None
        self.lead = min(self.schedule.max_lead, 2 if self.auto_lead else config.snapshot_lead)
        self.hot_stream = torch.cuda.Stream(device) if self.on_cuda else None
        # Device sampling: the cold bottom hop is sampled and gathered on the device (its topology placed
        # there, or read from pinned host memory); otherwise on the host like exact mode.
        self.reader = DeviceReader(self) if self.placement.topology != "host" else None
        self.sample_stream = torch.cuda.Stream(device) if self.on_cuda and self.reader is not None else None
        self._snapshots = _Board()
        self._hot = _Board()
        self._next_snapshot = 0
        self._current: HotEmbeddings | None = None
        self._totals = {"super_batches": 0, "hot": 0, "reached": 0, "appearances": 0, "hot_appearances": 0,
                        "saved_edges": 0, "host_edges": 0, "error_capped": 0}
        self._epoch_ratios: dict[int, list[float]] = {}
        self._drift: torch.Tensor | None = None
        self._probe_ids: np.ndarray | None = None
        self._probe = None
        self._probe_history: list[tuple[torch.Tensor, int]] = []
        self._stale_error: torch.Tensor | None = None  # relative error of a row at the mean staleness
        self._plans: Prefetcher | None = None
        self._stream: Prefetcher | None = None
        self.model: torch.nn.Module | None = None

    # ----- lifecycle -------------------------------------------------------------------------------------

    def start(self, model) -> None:
        self.model = model
        self._host_template = copy.deepcopy(model.bottom).cpu().eval()
        self._publish_due()
        self._plans = Prefetcher(self._host_run, depth=1, name="neutronorch-host")
        self._stream = Prefetcher(self._device_run, depth=self.config.prefetch, name="neutronorch-sampler",
                                  on_start=lambda: numba.set_num_threads(self.sampler_threads))

    def close(self) -> None:
        self._snapshots.close()
        self._hot.close()
        for prefetcher in (self._plans, self._stream):
            if prefetcher is not None:
                prefetcher.close()
        if self.reader is not None:
            self.reader.close()

    def batches(self, epoch: int) -> "_EpochView":
        if self._stream is None:
            raise RuntimeError("NeutronOrchMode.start(model) must be called before batches()")
        return _EpochView(self._stream, epoch, self.num_batches)

    # ----- host producer ---------------------------------------------------------------------------------

    def _host_run(self):
        numba.set_num_threads(self.host_threads)
        sampler = NeighborSampler(self.graph.indptr, self.graph.indices, self.config.fanouts)
        counts = np.zeros(self.graph.num_nodes, np.int32)
        hot_map = np.full(self.graph.num_nodes, -1, np.int64)
        orders: dict[int, torch.Tensor] = {}
        try:
            if self.schedule.total == 0:
                return
            plan = self._plan(0, sampler, counts, hot_map, orders)
            yield plan
            for gsid in range(self.schedule.total):
                prepared = self._gather_hot(plan, sampler)
                next_plan = None
                if gsid + 1 < self.schedule.total:
                    next_plan = self._plan(gsid + 1, sampler, counts, hot_map, orders)
                    yield next_plan
                self._finish_hot(plan, prepared)
                plan = next_plan
        except _Closed:
            return
        except BaseException as exc:
            self._hot.fail(exc)  # wakes a trainer waiting for hot embeddings
            raise

    def _plan(self, gsid, sampler, counts, hot_map, orders) -> _Plan:
        t0 = time.perf_counter()
        epoch, first, end = self.schedule.locate(gsid)
        if epoch not in orders:
            orders.clear()
            orders[epoch] = epoch_order(self.train_idx, self.config.seed, epoch)
        order = orders[epoch]
        size = self.config.batch_size
        upper_fanouts = self.config.fanouts[:-1]
        bottom_fanout = self.config.fanouts[-1]
        uppers = []
        for index in range(first, end):
            key = batch_key(self.config.seed, epoch, index)
            seeds = order[index * size:(index + 1) * size].numpy()
            uppers.append((index, key, sampler.sample(seeds, key, upper_fanouts)))
        bottoms = [u.frontiers[0].numpy() for _, _, u in uppers]
        distinct, appear = kernels.count_appearances(np.concatenate(bottoms), counts)
        ranked = np.argsort(-appear, kind="stable")
        num_hot = min(distinct.shape[0], int(round(self.ratio * distinct.shape[0])))
        if self.auto:
            num_hot = min(num_hot, self._error_cap(appear[ranked], len(uppers)))
        hot = distinct[ranked[:num_hot]]
        if self._probe_ids is None:
            self._probe_ids = distinct[ranked[:self.PROBE_ROWS]]
        hot_map[hot] = np.arange(num_hot)
        degrees = self.graph.indptr
        planned = []
        hot_appearances = 0
        try:
            for (index, key, upper), dst in zip(uppers, bottoms):
                rows = hot_map[dst]
                is_hot = rows >= 0
                hot_pos = np.flatnonzero(is_hot)
                hot_dst = dst[hot_pos]
                deg = degrees[hot_dst + 1] - degrees[hot_dst]
                saved = int(deg.sum() if bottom_fanout < 0 else np.minimum(deg, bottom_fanout).sum())
                planned.append(_PlannedBatch(index, key, upper, np.flatnonzero(~is_hot), hot_pos, rows[hot_pos],
                                             saved))
                hot_appearances += hot_pos.shape[0]
        finally:
            hot_map[hot] = -1
        plan = _Plan(gsid, epoch, planned, hot, int(distinct.shape[0]), int(appear.sum()), hot_appearances)
        ratios = self._epoch_ratios.setdefault(epoch, [])
        ratios.append(num_hot / max(1, distinct.shape[0]))
        totals = self._totals
        totals["super_batches"] += 1
        totals["hot"] += num_hot
        totals["reached"] += plan.reached
        totals["appearances"] += plan.appearances
        totals["hot_appearances"] += hot_appearances
        totals["saved_edges"] += sum(b.saved_edges for b in planned)
        self.spans.add("hot_select", t0, time.perf_counter())
        return plan

    def _error_cap(self, ranked_counts: np.ndarray, num_batches: int) -> int:
        """The most hot vertices (hottest first) whose reuse keeps the expected staleness error within
        ``hot_error_budget``: (share of bottom-layer rows served hot) x (relative error of a row at the
        mean staleness) <= budget. The error comes from the probe rows (``_measure_drift``); until it has
        been measured, nothing is hot (the weights move fastest at the start)."""
        stale_error = self._stale_error
        if stale_error is None:
            self._totals["error_capped"] += 1
            return 0
        error = float(stale_error)
        if error <= 0:
            return ranked_counts.shape[0]
        coverage = np.cumsum(ranked_counts) / max(1, ranked_counts.sum())
        cap = int(np.searchsorted(coverage, self.config.hot_error_budget / error, side="right"))
        if cap < int(round(self.ratio * ranked_counts.shape[0])):
            self._totals["error_capped"] += 1
        return cap

    def _gather_hot(self, plan: _Plan, sampler: NeighborSampler):
        """The weight-independent part of the hot embeddings: the bottom hop of H_s and its raw features.
        The bottom hop uses the key of the super-batch's first mini-batch, so with P = 1 the host draws
        exactly the neighbours the device would have drawn."""
        t0 = time.perf_counter()
        bottom_hop = len(self.config.fanouts) - 1
        key = layer_key(plan.batches[0].key, bottom_hop)
        block, frontier = sampler.sample_hop(plan.hot, self.config.fanouts[-1], key)
        self._totals["host_edges"] += block.num_edges
        t1 = time.perf_counter()
        x = self.store.gather(torch.from_numpy(frontier))
        t2 = time.perf_counter()
        self.spans.add("host_sample", t0, t1)
        self.spans.add("host_gather", t1, t2)
        return block, x

    def _finish_hot(self, plan: _Plan, prepared) -> None:
        block, x = prepared
        t_wait = time.perf_counter()
        snapshot = self._snapshots.take(plan.gsid, remove=True)
        t0 = time.perf_counter()
        self.spans.add("host_wait_weights", t_wait, t0)
        if snapshot.ready is not None:
            snapshot.ready.synchronize()
        layer = copy.deepcopy(self._host_template)
        params = list(layer.parameters())
        track = self.policy == "cpu"
        with torch.no_grad():
            for p, value in zip(params, snapshot.params):
                p.copy_(value)
        for p in params:
            p.requires_grad_(track)
        with torch.set_grad_enabled(track):
            if hasattr(layer, "aggregate"):
                # Separable layers (SAGE, GCN): the same two calls that define the device layer, timed apart.
                aggregated = layer.aggregate(block, x)
                t_mid = time.perf_counter()
                self.spans.add("host_aggregate", t0, t_mid)
                output, stage = layer.transform(block.dst_rows(x), aggregated), "host_matmul"
            else:
                t_mid = t0
                output, stage = layer(block, x), "host_compute"
        table = output.detach()
        hot = HotEmbeddings(plan.gsid, snapshot.version, table, plan.hot.shape[0])
        if track:
            hot.output, hot.params = output, params
        t1 = time.perf_counter()
        self.spans.add(stage, t_mid, t1)
        if self.on_cuda:
            pinned = torch.empty(table.shape, dtype=table.dtype, pin_memory=True)
            pinned.copy_(table)
            with torch.cuda.stream(self.hot_stream):
                hot.table = pinned.to(self.device, non_blocking=True)
                if track:
                    hot.grad_acc = torch.zeros_like(hot.table)
                hot.ready = torch.cuda.Event()
                hot.ready.record(self.hot_stream)
            hot.keep.append(pinned)
            self.spans.count("device_bytes", table.nbytes)
            t2 = time.perf_counter()
            self.spans.add("host_copy", t1, t2)
        elif track:
            hot.grad_acc = torch.zeros_like(table)
        self._hot.put(plan.gsid, hot)

    # ----- device sampler --------------------------------------------------------------------------------

    def _device_run(self):
        on_device = self.reader is not None
        if on_device:
            sampler = TorchNeighborSampler(self.reader.indptr, self.reader.indices, self.config.fanouts)
        else:
            sampler = NeighborSampler(self.graph.indptr, self.graph.indices, self.config.fanouts)
        bottom_hop = len(self.config.fanouts) - 1
        fanout = self.config.fanouts[-1]
        stream_context = torch.cuda.stream(self.sample_stream) if self.sample_stream is not None else nullcontext()
        with stream_context:
            for plan in self._plans:
                for position, item in enumerate(plan.batches):
                    t0 = time.perf_counter()
                    dst = item.upper.frontiers[0].numpy()
                    cold = dst[item.cold_pos]
                    key = layer_key(item.key, bottom_hop)
                    if on_device:
                        block, frontier = sampler.sample_hop(torch.from_numpy(cold).to(self.device), fanout, key)
                    else:
                        block, frontier = sampler.sample_hop(cold, fanout, key)
                        frontier = torch.from_numpy(frontier)
                    subgraph = SampledSubgraph(item.upper.seeds, [block] + item.upper.blocks,
                                               [frontier] + item.upper.frontiers)
                    index = SpliceIndex.build(dst.shape[0], item.cold_pos, item.hot_pos, item.hot_rows)
                    splice_info = Splice(plan.gsid, index, last=position == len(plan.batches) - 1)
                    self.spans.add("sample", t0, time.perf_counter())
                    if on_device:
                        yield self.reader.ship(plan.epoch, item.index, subgraph, splice_info)
                    else:
                        yield self._gather_and_ship(plan.epoch, item.index, subgraph, splice_info)

    # ----- trainer side ----------------------------------------------------------------------------------

    def _publish_due(self) -> None:
        """Publish the W0 snapshot to every super-batch whose assigned version is now reached."""
        snapshot = None
        while (self._next_snapshot < self.schedule.total
               and self.schedule.snapshot_version(self._next_snapshot, self.lead) <= self.version):
            if snapshot is None:
                snapshot = self._take_snapshot()
            self._snapshots.put(self._next_snapshot, snapshot)
            self._next_snapshot += 1

    def _take_snapshot(self) -> Snapshot:
        params = [p.detach() for p in self.model.bottom.parameters()]
        if not self.on_cuda:
            return Snapshot(self.version, [p.clone() for p in params])
        host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=True) for p in params]
        for h, p in zip(host, params):
            h.copy_(p, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return Snapshot(self.version, host, ready)

    def prepare(self, batch: MiniBatch) -> None:
        super().prepare(batch)
        gsid = batch.splice.gsid
        if self._current is None or self._current.gsid != gsid:
            t0 = time.perf_counter()
            self._current = self._hot.take(gsid, remove=False)
            self.spans.add("wait_hot", t0, time.perf_counter())
            if self._current.ready is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(self._current.ready)
                self._current.table.record_stream(stream)
                if self._current.grad_acc is not None:
                    self._current.grad_acc.record_stream(stream)
        if self.on_cuda:
            for t in batch.splice.index.tensors():
                t.record_stream(torch.cuda.current_stream(self.device))
        self._check_staleness(self._current)

    def _check_staleness(self, hot: HotEmbeddings) -> None:
        staleness = self.version - hot.version
        if staleness > self.schedule.staleness_bound or staleness < 0:
            raise RuntimeError(f"staleness bound violated: hot embeddings of super-batch {hot.gsid} were "
                               f"computed at parameter version {hot.version} and are used at version "
                               f"{self.version} (bound {self.schedule.staleness_bound}). This is a bug.")
        if hot.num_hot:
            self.max_staleness = max(self.max_staleness, staleness)
            self._staleness_sum += staleness
            self._staleness_uses += 1

    def forward(self, model, batch: MiniBatch) -> torch.Tensor:
        hot = self._current
        y_cold = model.layers[0](batch.blocks[0], batch.features)
        if model.num_layers == 1:
            return splice(y_cold, hot.table, batch.splice.index, hot.grad_acc)
        h = splice_relu_dropout(y_cold, hot.table, batch.splice.index, model.dropout, model.training, hot.grad_acc)
        return model.forward_from(1, batch.blocks, h)

    def before_step(self, batch: MiniBatch) -> None:
        """``hot_grad="cpu"``: at the super-batch's last step, add the hot rows' W0 gradient (computed on the
        host from the accumulated dL/dY) to the bottom layer's gradient."""
        hot = self._current
        if not batch.splice.last or hot.output is None or hot.num_hot == 0:
            return
        t0 = time.perf_counter()
        self._check_staleness(hot)
        grad_y = hot.grad_acc.cpu() if self.on_cuda else hot.grad_acc
        grads = torch.autograd.grad(hot.output, hot.params, grad_y)
        for p, g in zip(self.model.bottom.parameters(), grads):
            g = g.to(p.device, non_blocking=True)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)
        self.spans.add("hot_grad", t0, time.perf_counter())

    def after_step(self, batch: MiniBatch) -> None:
        t0 = time.perf_counter()
        self.version += 1
        if batch.splice.last:
            self._hot.drop(batch.splice.gsid)
            self._current = None
            if self.auto:
                self._measure_drift()  # before the snapshot wakes the host, whose next plan reads it
        self._publish_due()
        self.spans.add("publish", t0, time.perf_counter())

    def _measure_drift(self) -> None:
        """At each super-batch boundary: the relative change per optimizer step of the bottom-layer output
        of a fixed set of probe vertices (the hottest of the first super-batch) since the last boundary.
        Kept as a device tensor; the planner reads it (on CUDA that read waits in the host thread only)."""
        if self._probe is None:
            if self._probe_ids is None or self._probe_ids.shape[0] == 0:
                return
            sampler = NeighborSampler(self.graph.indptr, self.graph.indices, self.config.fanouts)
            key = layer_key(mix_key(self.config.seed, 0x9E37), len(self.config.fanouts) - 1)
            block, frontier = sampler.sample_hop(self._probe_ids, self.config.fanouts[-1], key)
            x = self.store.gather(torch.from_numpy(frontier))
            self._probe = (block.to(self.device), x.to(self.device))
        bottom = self.model.bottom
        training = bottom.training
        bottom.eval()
        with torch.no_grad():
            y = bottom(*self._probe)
        bottom.train(training)
        # Compare with the boundary whose distance in steps is closest to the mean staleness of a reused
        # row (lead + (P-1)/2): the error measured over about that many steps, scaled to it. (Per-step drift
        # times the staleness would overstate it: Adam's steps partly cancel over a few steps.)
        history = [h for h in self._probe_history if h[1] < self.version]
        if history:
            target = max(1.0, self.lead + (self.schedule.super_batch - 1) / 2)
            past, version = min(history, key=lambda h: abs((self.version - h[1]) - target))
            distance = self.version - version
            change = (y - past).norm() / y.norm().clamp(min=1e-12)
            self._drift = change / distance
            self._stale_error = change * (target / distance)
        self._probe_history = (self._probe_history + [(y, self.version)])[-4:]

    @property
    def drift_per_step(self) -> float | None:
        """The latest measured relative drift of a bottom-layer row per optimizer step."""
        drift = self._drift
        return None if drift is None else float(drift)

    # ----- reporting -------------------------------------------------------------------------------------

    def end_epoch(self, record: dict) -> None:
        """Record this epoch's hot ratio and, with ``auto``, choose the next one."""
        record["snapshot_lead"] = self.lead
        if self.auto_lead and record["stage_seconds"].get("wait_hot", 0.0) > 0.02 * record["seconds"]:
            # The trainer waited for hot rows: give the host more steps (the bound still caps the lead).
            self.lead = min(self.schedule.max_lead, self.lead + max(1, self.lead // 2))
        ratios = self._epoch_ratios.pop(record["epoch"], [])
        record["hot_ratio"] = round(sum(ratios) / len(ratios), 4) if ratios else round(self.ratio, 4)
        if self.drift_per_step is not None:
            record["drift_per_step"] = round(self.drift_per_step, 6)
            record["stale_error"] = round(float(self._stale_error), 5)
        if self.tuner is None:
            return
        busy = lane_seconds(record["stage_seconds"])
        per = max(1, self.schedule.per_epoch)
        self.ratio = self.tuner.update(record["seconds"], busy.get("host", 0.0) / per, busy.get("trainer", 0.0) / per)

    def summary(self) -> dict:
        t = self._totals
        n = max(1, t["super_batches"])
        return {
            "neutronorch": {"super_batch": self.schedule.super_batch, "hot_grad": self.policy,
                            "hot_ratio_setting": self.config.hot_ratio,
                            "auto_history": self.tuner.history if self.tuner else None},
            "staleness": {"bound": self.schedule.staleness_bound, "max_observed": self.max_staleness,
                          "mean_observed": self._staleness_sum / max(1, self._staleness_uses),
                          "snapshot_lead": self.lead},
            "hot": {
                "ratio": round(self.ratio, 4),
                "mean_hot_per_super_batch": t["hot"] / n,
                "mean_reached_per_super_batch": t["reached"] / n,
                # Share of bottom-layer destination rows served from hot embeddings instead of computed.
                "reuse_rate": t["hot_appearances"] / max(1, t["appearances"]),
                "uses_per_hot_embedding": t["hot_appearances"] / max(1, t["hot"]),
                "bottom_edges_saved": t["saved_edges"],
                "host_bottom_edges": t["host_edges"],
                "super_batches": t["super_batches"],
                "error_budget": self.config.hot_error_budget if self.auto else None,
                "error_capped_super_batches": t["error_capped"] if self.auto else None,
                "drift_per_step": self.drift_per_step,
                "stale_error": None if self._stale_error is None else float(self._stale_error),
            },
        }


class _EpochView:
    """One epoch's mini-batches out of the mode's persistent stream (closing it does not stop the stream)."""

    def __init__(self, stream: Prefetcher, epoch: int, count: int):
        self._stream, self._epoch, self._left = stream, epoch, count

    def __iter__(self):
        return self

    def __next__(self) -> MiniBatch:
        if self._left == 0:
            raise StopIteration
        batch = next(self._stream)
        if batch.epoch != self._epoch:
            raise RuntimeError(f"pipeline out of step: got a batch of epoch {batch.epoch} in epoch {self._epoch}")
        self._left -= 1
        return batch

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
