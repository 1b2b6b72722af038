"""Mode ``neutronorch``: hot vertices' bottom layer on the host, reused under a strictly bounded staleness
(``docs/neutronorch.md``; its threads, what each owns and what crosses between them: docs/architecture.md).

Hot embeddings of super-batch s are computed from the parameters at version ``snapshot_version(s)``
(version = optimizer steps taken), and every use is checked (``versions.py``). The pipeline runs across
epochs without draining. What differs per kind of graph is in one object (``HomogeneousKind``,
``TypedKind``), a typed graph's embedding-table rows included: its snapshots hold them too, their ids sent
ahead by the host on the ``needs`` channel.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable

import numpy as np
import torch

from neutronorch.config import NeutronOrchConfig, SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.nn.splice import HotRows, SpliceIndex
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.host_loader import HOST_SAMPLING_STAGES, HostLoader
from neutronorch.orchestration.mode import StepInputs
from neutronorch.orchestration.neutronorch.cold_sampler import EpochView, SplicedBatch, cold_batches, splice_index
from neutronorch.orchestration.neutronorch.controller import RatioController
from neutronorch.orchestration.neutronorch.device_planner import DevicePlanner
from neutronorch.orchestration.neutronorch.hot_rows import HotRowComputer
from neutronorch.orchestration.neutronorch.hot_grad import HotGradient
from neutronorch.orchestration.neutronorch.hot_table import HotTableReader
from neutronorch.orchestration.neutronorch.node import NodeHotSet, NodeLink
from neutronorch.orchestration.neutronorch.plan_loop import PlanLoop, one_ahead
from neutronorch.orchestration.neutronorch.planner import Plan, PlannedBatch, Planner
from neutronorch.orchestration.neutronorch.stats import HotStats
from neutronorch.orchestration.neutronorch.versions import Schedule, SnapshotPublisher, StalenessCheck
from neutronorch.orchestration.pipeline import Prefetcher, leaving, run_in
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.exclude import exclude_from_block, exclude_from_typed_block
from neutronorch.sampling.neighbor_sampler import NeighborSampler, layer_key, mix_key
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

STAGES = HOST_SAMPLING_STAGES.merge(StageTable(
    {"hot_select": "planner", "host_sample": "host", "host_gather": "host", "host_wait_weights": "host",
     "host_compute": "host", "host_aggregate": "host", "host_matmul": "host", "host_copy": "host",
     "host_share": "host", "wait_hot": "trainer", "hot_grad": "trainer", "publish": "trainer"},
    waits=frozenset({"wait_hot", "host_wait_weights", "host_share"})))


PROBE_KEY = 0x9E37  # mixed into the run's seed for the drift probe's fixed sample


class Kind:
    def plan_sampler(self):
        """The planner's sampler of the upper hops (made on its thread): the host's, unless a kind has its own."""
        return self.host_sampler()

    def leaving(self, lane: str):
        """What the thread of ``lane`` ("plan", "cold", "host") does as it leaves (``parts.PartKind``'s)."""
        return contextlib.nullcontext()


class HomogeneousKind(Kind):
    needs = type_sizes = None
    lead_adapts = True  # the snapshot lead may grow while the trainer waits for hot rows
    numbered = False  # its cold sampler's spans carry no batch index

    def __init__(self, graph: Graph, access: FeatureAccess, spans: Spans, sampling: SamplingConfig,
                 host_sampler: Callable[[], NeighborSampler]):
        self.graph, self.device, self.sampling, self.host_sampler = graph, access.device, sampling, host_sampler
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
        self.source = access.store  # what the host reads the hot rows' inputs from
        # Device sampling: the cold bottom hop is sampled and gathered on the device, else on the host.
        self.reader = DeviceReader(graph, access, spans, sampling) if access.placement.topology != "host" else None
        self.loader = HostLoader(access, spans) if self.reader is None else None
        self.plans_on_device = self.reader is not None

    def cold_sampler(self):
        """The cold sampler's (made on its thread): over the reader's topology with ``plans_on_device``."""
        return self.host_sampler() if self.reader is None else self.reader.new_sampler()

    def planner(self, sampler) -> Planner:
        """The planner beside ``sampler`` (the device's, with ``plans_on_device``)."""
        bottom = self.sampling.fanouts[-1]
        if not self.plans_on_device:
            return Planner(self.graph, bottom)
        return DevicePlanner(self.graph, bottom, self.reader.indptr)

    def bottom_hop(self, sampler, ids, key: int, exclude=None) -> tuple:
        """``sampler``'s bottom hop of ``ids`` as batch key ``key`` draws it, without ``exclude``'s edges (a
        link task's seed edges), and its source frontier."""
        fanouts = self.sampling.fanouts
        block, frontier = sampler.sample_hop(ids, fanouts[-1], layer_key(key, len(fanouts) - 1))
        if exclude is not None:
            block = exclude_from_block(block, frontier, exclude, self.graph.num_nodes)
        return block, frontier

    def cold_batch(self, sampler, plan: Plan, item: PlannedBatch) -> tuple[SampledSubgraph, SpliceIndex]:
        """A planned mini-batch's subgraph, its cold destinations' bottom hop drawn by ``sampler``, and where
        its bottom-layer rows go."""
        upper, dst = item.upper, item.upper.frontiers[0]
        if self.plans_on_device:  # positions are tensors there
            dst = dst.to(self.device)
            cold = dst.index_select(0, torch.as_tensor(item.cold_pos, device=dst.device))
        else:
            cold = dst.numpy()[item.cold_pos]
        block, frontier = self.bottom_hop(sampler, cold, item.key, item.exclude)
        return (SampledSubgraph(upper.seeds, [block, *upper.blocks], [frontier, *upper.frontiers]),
                splice_index(dst.shape[0], item.cold_pos, item.hot_pos, item.hot_rows))

    def inputs(self, batch, hot, index) -> StepInputs:
        """The step's model inputs: the batch's, and the super-batch's hot rows at ``index``."""
        return StepInputs(batch.blocks, batch.features, HotRows(hot.table, index, hot.grad_acc))

    def probe_inputs(self, ids: np.ndarray, sampling: SamplingConfig, model) -> tuple:
        """The drift probe's bottom block and float32 rows on the device, a fixed sample of its own key
        (float32: the probe runs outside autocast, and drift is a small difference)."""
        block, frontier = self.bottom_hop(self.host_sampler(), ids, mix_key(sampling.seed, PROBE_KEY))
        rows = self.store.as_dtype(torch.float32).gather(frontier)
        return block.to(self.device), rows.to(self.device)


class TypedKind(Kind):
    lead_adapts = False  # a typed run at a fixed ratio trains the same steps whatever the times measured
    numbered = True
    reader = store = placement = cache = None  # (a homogeneous graph's feature access)

    def __init__(self, graph: TypedGraph, access: FeatureAccess, fanouts: dict[RelationType, list[int]],
                 on_device: bool, spans: Spans, host_sampler: Callable[[], TypedNeighborSampler]):
        self.graph, self.source, self.fanouts, self.device = graph, access.inputs, fanouts, access.device
        self.host_sampler = host_sampler
        self.type_sizes = graph.num_nodes  # how a node numbers its ranks' hot sets as one (``node.py``)
        self.loader = HostLoader(access, spans)  # its ``TypedInputs``
        self.plans_on_device = on_device
        self.needs = Channel("needs")  # the ids of the table rows each super-batch's hot rows read

    def cold_sampler(self):
        """The cold sampler's (made on its thread): on the training device with ``plans_on_device``."""
        if self.plans_on_device:
            return TypedDeviceSampler(self.graph, self.device, self.fanouts)
        return self.host_sampler()

    def planner(self, sampler) -> Planner:
        bottom = {r: f[-1] for r, f in self.fanouts.items()}
        if not self.plans_on_device:
            return Planner(self.graph, bottom)
        indptrs = {r: indptr for r, (indptr, _) in sampler.relations.items()}
        return DevicePlanner(self.graph, bottom, indptrs)

    def bottom_hop(self, sampler, ids: dict, key: int, exclude=None) -> tuple:
        """``HomogeneousKind.bottom_hop`` per type (``exclude`` in the link's end types' stacked ids)."""
        block = sampler.sample_bottom(ids, key)
        if exclude is not None:
            block = exclude_from_typed_block(block, exclude, self.graph.links.ends)
        return block, block.src_ids

    def cold_batch(self, sampler, plan: Plan, item: PlannedBatch) -> tuple[SampledSubgraph, dict]:
        """``HomogeneousKind.cold_batch`` per type, the subgraph on the host (``HostLoader`` reads its rows
        whichever device drew it), a splice index per type hot in it."""
        upper, dst = item.upper, item.upper.frontiers[0]
        cold, _ = self.bottom_hop(sampler, {t: ids[item.cold_pos[t]] for t, ids in dst.items()}, item.key,
                                  item.exclude)
        subgraph = SampledSubgraph(upper.seeds.cpu(), [cold, *upper.blocks],
                                   [{t: v.cpu() for t, v in cold.src_ids.items()}, *upper.frontiers])
        index = {t: splice_index(int(dst[t].shape[0]), item.cold_pos[t], item.hot_pos[t], item.hot_rows[t])
                 for t in plan.hot if item.hot_pos[t].shape[0]}
        return subgraph, index

    def inputs(self, batch, hot, index: dict) -> StepInputs:
        return StepInputs(batch.blocks, batch.features,
                          {t: HotRows(hot.table[t], i, hot.grad_acc.get(t)) for t, i in index.items()}, batch.ids)

    def probe_inputs(self, ids: dict[str, np.ndarray], sampling: SamplingConfig, model):
        """A function giving the drift probe's bottom block and inputs (the table rows move with the
        weights)."""
        block, frontier = self.bottom_hop(self.host_sampler(), ids, mix_key(sampling.seed, PROBE_KEY))
        features, input_ids = self.source(frontier, self.device)
        block = block.to(self.device)
        return lambda: (block, model().input_rows(features, input_ids))

    def table_rows(self, model: torch.nn.Module, super_batch_id: int) -> tuple[dict, dict]:
        """The table rows super-batch ``super_batch_id``'s hot frontier reads, now, and their ids."""
        ids = self.needs.take(super_batch_id)
        with torch.no_grad():
            rows = {t: model.embeddings[t].weight.detach()[index.to(model.embeddings[t].weight.device)]
                    .to("cpu", copy=True) for t, index in ids.items()}
        return rows, ids


class NeutronOrchMode:
    name = "neutronorch"
    stages = STAGES
    # Anywhere: its state_dict holds the pending snapshots and the super-batch in progress.
    resumable = resumable_mid_epoch = True

    @property
    def warm_epochs(self) -> int:
        """With ``auto`` nothing is hot before the drift is measured: the hot rows' path compiles in the second
        epoch (the tuner's warm-up too); at a fixed ratio in the first."""
        return 2 if self.config.hot_ratio == "auto" else 1

    def __init__(self, kind: HomogeneousKind | TypedKind, seeds: NodeSeeds, sampling: SamplingConfig,
                 config: NeutronOrchConfig, epochs: int, spans: Spans, sampler_threads: int,
                 host_threads: int, node: NodeLink | None, shared=None):
        self.kind, self.graph, self.sampling, self.config = kind, kind.graph, sampling, config
        self.spans, self.device = spans, kind.device
        self.store, self.placement, self.cache = kind.store, kind.placement, kind.cache
        on_cuda = self.device.type == "cuda"
        self.threads = {"sampler": sampler_threads, "host": host_threads}
        self.seeds = seeds  # a link task's: LinkSeeds
        self.num_batches = self.seeds.num_batches
        self.schedule = Schedule(epochs, self.num_batches, config.super_batch, config.resolved_staleness)
        self.staleness = StalenessCheck(config.resolved_staleness)
        probe_inputs = lambda ids: kind.probe_inputs(ids, sampling, lambda: self.model)  # noqa: E731
        self.controller = RatioController(config, self.schedule, shared_cores=not on_cuda,
                                          probe_inputs=probe_inputs, lead_adapts=kind.lead_adapts)
        self.stats = HotStats()
        # Rows hot on several ranks computed once: by one of a node's, or by their owner (``parts.OwnerHotSet``).
        self.node = shared if shared is not None else (
            NodeHotSet(node, kind.type_sizes) if node is not None and node.local_size > 1 else None)
        self.hot_grad = HotGradient(self.seeds, self.node)
        self.version = 0  # optimizer steps taken
        self.model: torch.nn.Module | None = None
        self.snapshots = SnapshotPublisher(self.schedule, on_cuda, None if kind.needs is None else (
            lambda super_batch_id: kind.table_rows(self.model, super_batch_id)))
        self.hot_table = HotTableReader(spans, self.device)  # the host's hot embeddings -> the splice
        self._producer: HotRowComputer | None = None
        self._plans: Prefetcher | None = None
        self._host: threading.Thread | None = None
        self._stream: Prefetcher | None = None

    def start(self, model: torch.nn.Module) -> None:
        self.model, kind = model, self.kind
        self.bottom = model.bottom
        tables = tuple(getattr(model, "embeddings", ()))  # a typed model's embedding tables
        producer = HotRowComputer(kind, self.config, self.schedule, self.bottom,
                                  self.snapshots.channel, self.hot_table.channel, self.spans,
                                  self.threads["host"], self.node, tables)
        plans = PlanLoop(self.seeds, self.sampling, self.schedule, self.controller.published, producer.planned,
                         self.spans)
        self.snapshots.start()
        start, position = self.schedule.at(self.version)
        hot = None
        if position:  # resumed within a super-batch: plan it with the hot set its first steps used
            resumed = self.hot_table.resumed
            if resumed is None or resumed["gsid"] != start:
                raise RuntimeError(f"resumed at step {position} of super-batch {start} without its saved state")
            hot = resumed["vertices"]
        self._producer = producer
        if not kind.plans_on_device:  # planned on the host, in a thread of its own
            self._plans = Prefetcher(lambda: leaving(plans.run(kind.plan_sampler(), kind.planner(None), start, hot),
                                                     kind.leaving("plan")),
                                     depth=1, name="neutronorch-planner", threads=self.threads["host"])
            source = lambda _sampler: self._plans  # noqa: E731
        else:  # planned on the device, by the cold sampler's thread with its sampler
            source = lambda device_sampler: one_ahead(plans.run(  # noqa: E731
                device_sampler, kind.planner(device_sampler), start, hot, "sample"))
        self._host = threading.Thread(target=run_in, args=(kind.leaving("host"), producer.compute, start),
                                      name="neutronorch-host", daemon=True)
        self._host.start()
        cold = lambda: leaving(cold_batches(kind, self.spans, source, position), kind.leaving("cold"))  # noqa: E731
        self._stream = Prefetcher(cold, depth=self.sampling.prefetch, name="neutronorch-sampler",
                                  threads=self.threads["sampler"])
        # A typed graph's first snapshot waits for the host's table ids.
        self.snapshots.publish_due(self.bottom, self.version, self.controller.lead)

    def close(self) -> None:
        for stage in (self.snapshots, self.hot_table, self.kind.needs, self._producer, self._plans, self._stream):
            if stage is not None:
                stage.close()
        if self._host is not None:
            self._host.join()
        if self.kind.reader is not None:
            self.kind.reader.close()

    def batches(self, epoch: int, start: int = 0) -> "EpochView":
        if self._stream is None:
            raise RuntimeError("NeutronOrchMode.start(model) must be called before batches()")
        if epoch * self.num_batches + start != self.version:
            raise RuntimeError(f"NeutronOrch's pipeline is at parameter version {self.version}, not at step {start} "
                               f"of epoch {epoch}: epochs run in order, from where the run (or its resume) is")
        return EpochView(self._stream, epoch, self.num_batches - start)

    def step_inputs(self, batch: SplicedBatch) -> StepInputs:
        batch.wait()
        splice = batch.splice
        hot, new = self.hot_table.table(splice.super_batch_id)
        if new:
            exchange = hot.exchange
            self.stats.account(splice.plan, hot.host_edges,
                               hot.num_hot if exchange is None else exchange.computed.shape[0])
            self.controller.saw_plan(splice.probe)
        self.staleness.check(hot, self.version)
        self.hot_grad.weigh(hot, self.version)
        return self.kind.inputs(batch, hot, splice.index)

    def before_step(self, batch: SplicedBatch) -> None:
        """``hot_grad="cpu"``: at the super-batch's last step, the hot rows' W0 gradient (``hot_grad.py``)."""
        hot = self.hot_table.current
        self.hot_grad.unweigh(hot)
        if not batch.splice.last or self.config.hot_grad != "cpu":
            return
        if hot.output is None or (hot.num_hot == 0 and hot.exchange is None):  # nothing to add (zeros for the sum)
            return self.hot_grad.finish(hot, self.bottom)
        with self.spans.stage("hot_grad"):
            self.staleness.check(hot, self.version)
            self.hot_grad.finish(hot, self.bottom, getattr(self.model, "embeddings", None))

    def averaged_gradients(self) -> dict[torch.Tensor, torch.Tensor] | None:
        """Data parallel, at a super-batch's last step: the hot rows' W0 gradient (``hot_grad.py``)."""
        return self.hot_grad.averaged(self.bottom)

    def after_step(self, batch: SplicedBatch) -> None:
        with self.spans.stage("publish"):
            self.version += 1
            if batch.splice.last:
                self.hot_table.trained(batch.splice.super_batch_id)
                self.snapshots.trained(batch.splice.super_batch_id)
                # Before the snapshot wakes the host, whose next plan reads the measured error.
                self.controller.at_boundary(self.bottom, self.version)
            self.snapshots.publish_due(self.bottom, self.version, self.controller.lead)

    def state_dict(self) -> dict:
        """After any step: the parameter version, the snapshots published for super-batches not yet finished
        (they cannot be taken again), the super-batch in progress, and the summary's and controller's state."""
        return {"version": self.version, **self.snapshots.state_dict(), "in_progress": self.hot_table.state_dict(),
                "stats": self.stats.state_dict(), "staleness": self.staleness.state_dict(),
                "controller": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.version = state["version"]
        self.snapshots.load_state_dict(state)
        self.hot_table.load_state_dict(state.get("in_progress"))
        self.stats.load_state_dict(state["stats"])
        self.staleness.load_state_dict(state["staleness"])
        self.controller.load_state_dict(state["controller"], self.device)

    def end_epoch(self, record: dict) -> None:
        """Record this epoch's hot ratio and staleness controls and, with ``auto``, choose the next ones."""
        agree = None
        if self.node is not None:  # the node's ranks share rows: they must take snapshots at the same versions
            agree = lambda values: self.node.max_(torch.tensor(values, dtype=torch.float64)).tolist()  # noqa: E731
        ratio, served = self.stats.end_epoch(record["epoch"])
        apart = self.stats.planned_apart(record["epoch"], self.controller.setting.ratio)
        record.update(self.controller.end_epoch(record, ratio, self.stages, agree, apart))
        record.update(hot_served=None if served is None else round(served, 4), staleness=self.staleness.end_epoch())

    def summary(self) -> dict:
        return {
            **(self.kind.loader.summary() if self.kind.loader else {}),  # a typed graph's host caches
            "neutronorch": {"super_batch": self.schedule.super_batch, "hot_grad": self.config.hot_grad,
                            "hot_set": self.hot_set,
                            "hot_ratio_setting": self.config.hot_ratio,
                            "auto_history": self.controller.tuner.history if self.controller.tuner else None},
            "staleness": {"bound": self.schedule.staleness_bound, "max_observed": self.staleness.max_observed,
                          "mean_observed": self.staleness.mean_observed, "snapshot_lead": self.controller.lead},
            "hot": {**self.stats.summary(self.controller.auto), **self.controller.summary()},
        }

    def describe(self) -> str:
        return (f"sampler threads {self.threads['sampler']}, host threads {self.threads['host']}, super-batch "
                f"{self.config.super_batch}, hot ratio {self.config.hot_ratio}, staleness bound "
                f"{self.config.resolved_staleness}, hot grad {self.config.hot_grad}"
                + (f", hot set {self.hot_set}" if self.sampling.world > 1 else ""))

    @property
    def hot_set(self) -> str:
        """Who computes hot rows held by several ranks: "node" (one of a node's), "owner" (the rank owning the
        vertex, on a partitioned graph) or "rank" (each)."""
        return self.node.name if self.node is not None else "rank"
