"""Mode ``neutronorch`` on a typed graph: each type's hot bottom-layer rows computed on the host once per
super-batch and reused under a strictly bounded staleness.

The homogeneous mode (``neutronorch/mode.py``) with a plan per destination type (``neutronorch/planner.py``'s
``TypedPlanner``) and the splice of ``nn/splice.py``. Three threads, each with its own objects (the producers' in
``typed_producers.py``: ``TypedColdSampler``, ``TypedHostRows``); what crosses between them::

    sampler (typed-neutronorch-sampler)      host (typed-neutronorch-host)     trainer (caller)
      its samplers, its planner                 a copy of the bottom layer        the model, version,
                                                                                  StalenessCheck,
                                                                                  SnapshotPublisher,
                                                                                  HotTableReader
      plans s + 1 before it loads s's batches
      hot part of s (Channel "parts") -------> |
      table ids of s (Channel "needs") ---------------------------------------> |
      TypedOrchBatch (Prefetcher) ---------------------------------------------> |
                                               | <---- Snapshot of s (Channel "snapshots")
                                               | HotEmbeddings of s (Channel "hot") ----> |

**Sampler.** For super-batch s (P mini-batches, numbered across epochs: the pipeline never drains) it
samples each mini-batch's upper hops with the mini-batch's key (``sample_hops``), plans H_s per type, samples
H_s's bottom hop once with the key of the super-batch's first mini-batch (with P = 1, exactly the neighbours
that mini-batch draws) and gathers its inputs; then, per mini-batch, the bottom hop of its cold destinations
only (``sample_bottom``: each draws what exact mode draws for it) and their inputs. Hot destinations'
neighbours are never sampled or gathered for the mini-batches. With device sampling the mini-batches' hops
and the plans are made on the training device (``TypedDeviceSampler``, ``TypedDevicePlanner``), with the
same draws and plans.

**The rest is the homogeneous mode's** (``neutronorch/``): the snapshots (``SnapshotPublisher``, which also
takes the table rows a featureless type's hot inputs are, at the snapshot's version, from the ids the
sampler sent ahead on ``needs``), the hot table (``HotTableReader``), the staleness check at every use, the
ratio controller (``auto``: tuner, drift probe, error cap) and the ``Mode`` protocol (``mode.py``).
**Gradient** (``hot_grad``): ``stop`` treats hot rows as constants; ``cpu`` sums dL/dY of each hot row over
the super-batch's steps and, at its last step, takes it through the host's graph of those rows into the
bottom layer's weights and the tables' rows. With P = 1, staleness 0 and ``cpu`` a step is exact mode's
(``tests/test_typed_neutronorch.py``). Evaluation is exact mode's: no stale row ever reaches a score.
"""

from __future__ import annotations

import copy
import logging
import threading

import numpy as np
import torch

from neutronorch.config import NeutronOrchConfig, SamplingConfig
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.features.placement import GiB
from neutronorch.features.store import TypedInputs
from neutronorch.nn.splice import HotRows
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.mode import StepInputs
from neutronorch.orchestration.neutronorch.controller import RatioController
from neutronorch.orchestration.neutronorch.hot_grad import HotGradient
from neutronorch.orchestration.neutronorch.hot_table import HotTableReader
from neutronorch.orchestration.neutronorch.snapshots import SnapshotPublisher
from neutronorch.orchestration.neutronorch.stats import HotStats
from neutronorch.orchestration.neutronorch.versions import Schedule, StalenessCheck
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.neutronorch.mode import NeutronOrchMode
from neutronorch.orchestration.seeds import batches_per_epoch
from neutronorch.orchestration.typed_producers import TypedColdSampler, TypedHostRows, TypedOrchBatch
from neutronorch.sampling.neighbor_sampler import mix_key
from neutronorch.sampling.typed_device_sampler import edge_feature_bytes, topology_bytes
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

logger = logging.getLogger("neutronorch")

def draws_on_device(setting: str, graph: TypedGraph, device: torch.device, free: int | None = None) -> bool:
    """Whether the mini-batches are drawn on ``device`` (``device_sampling`` ``setting``): ``on``, or ``auto``
    with CUDA where the topology and edge features, placed there whole, take at most half its free memory
    (``free`` bytes, default what CUDA says); ``on`` beyond that is refused."""
    on = setting == "on" or (setting == "auto" and device.type == "cuda")
    if not on or device.type != "cuda":
        return on
    free = torch.cuda.mem_get_info(device)[0] if free is None else free
    need = topology_bytes(graph) + edge_feature_bytes(graph)
    if need <= free // 2:
        return True
    if setting == "on":
        raise ConfigError(f"`device_sampling` on: typed NeutronOrch places the graph's topology and edge features "
                          f"on {device} whole ({need / GiB:.2f} GiB), more than half its free {free / GiB:.2f} GiB; "
                          f"set `device_sampling` off to sample on the host")
    logger.info(f"device sampling off: the topology ({need / GiB:.2f} GiB) takes more than half of {device}'s free "
                f"memory")
    return False


class TypedNeutronOrch:
    """The typed NeutronOrch mode of one run; its threads run from ``start`` to ``close``."""

    name = "neutronorch"
    stages = StageTable({"plan": "planner", "host_compute": "host", "sample": "sampler", "gather": "sampler",
                         "wait_hot": "trainer"}, waits=frozenset({"wait_hot"}))
    resumable = resumable_mid_epoch = True  # ``state_dict`` after any step
    store = placement = cache = None  # it reads a typed graph's rows through ``inputs``' stores, no device cache

    def __init__(self, graph: TypedGraph, fanouts: dict[RelationType, list[int]], sampling: SamplingConfig,
                 config: NeutronOrchConfig, epochs: int, device: torch.device, spans: Spans,
                 sampler_threads: int = 1, host_threads: int = 1, inputs: TypedInputs | None = None,
                 device_sampling: str = "off"):
        self.graph, self.fanouts, self.sampling, self.device, self.spans = graph, fanouts, sampling, device, spans
        self.inputs = inputs if inputs is not None else TypedInputs(graph)  # the featured types' stores
        self.num_batches = batches_per_epoch(graph, sampling)
        self.schedule = Schedule(epochs, self.num_batches, config.super_batch, config.resolved_staleness)
        self.hot_ratio = config.hot_ratio
        self.track_grad = config.hot_grad == "cpu"
        self.hot_grad = HotGradient(None, sampling, self.num_batches, None)
        self.controller = RatioController(config, self.schedule, shared_cores=device.type != "cuda",
                                          probe_inputs=self._probe_inputs, lead_adapts=False)
        self.sampler_threads, self.host_threads = sampler_threads, host_threads
        self.device_sampling = draws_on_device(device_sampling, graph, device)  # the mini-batches' hops there
        self.threads = {"sampler": sampler_threads, "host": host_threads}
        self.staleness = StalenessCheck(self.schedule.staleness_bound)
        self.version = 0  # optimizer steps taken: the parameter version
        self.hot_epoch, self.stats = HotStats(), HotStats()  # what the plans did, this epoch and in the run
        self.parts = Channel("parts")
        self.needs = Channel("needs")
        self.snapshots = SnapshotPublisher(self.schedule, device.type == "cuda", self._table_rows)
        self.hot_table = HotTableReader(spans, device)
        self._host = self._stream = None

    def start(self, model: TypedGNN) -> None:
        """Start the sampler and host threads at the run's parameter version (a resumed run's snapshots
        published again)."""
        self.model, self.live, self.num_layers = model, model.bottom_layer(), model.num_layers  # snapshots read it
        steps = self.schedule.epochs * self.schedule.batches_per_epoch
        # Where the run starts: in super-batch ``first[0]`` at position ``first[1]``.
        self.first = self.schedule.at(self.version) if self.version < steps else (self.schedule.total, 0)
        self.snapshots.start()
        host = TypedHostRows(copy.deepcopy(self.live).cpu().train(), self.track_grad, self.device, self.parts,
                             self.snapshots.channel, self.hot_table.channel, self.host_threads)
        self._host = threading.Thread(target=host.run, args=(self.first[0], self.schedule.total),
                                      name="typed-neutronorch-host", daemon=True)
        self._host.start()
        sampler = TypedColdSampler(self.graph, self.fanouts, self.sampling, self.schedule, self.controller.published,
                                   self.device, self.spans, self.sampler_threads, tuple(model.embeddings),
                                   self.first, self.parts, self.needs, self.inputs, self.device_sampling)
        self._stream = Prefetcher(sampler.run, depth=self.sampling.prefetch, name="typed-neutronorch-sampler")

    def close(self) -> None:
        for channel in (self.parts, self.needs):
            channel.close()
        self.snapshots.close()
        self.hot_table.close()
        if self._stream is not None:
            self._stream.close()
            self._host.join(timeout=10)

    # -- the trainer's side ------------------------------------------------------------------------------

    batches = NeutronOrchMode.batches  # epoch ``epoch``'s from ``start`` on, out of the run's one stream

    def describe(self) -> str:
        return (f"super-batch {self.schedule.super_batch}, staleness bound {self.schedule.staleness_bound}, "
                f"sampler threads {self.sampler_threads}, host threads {self.host_threads}"
                + (", device sampling" if self.device_sampling else ""))

    def summary(self) -> dict:
        """The run summary's ``neutronorch`` part: the settings, what the plans did and the staleness observed."""
        return {**self.inputs.summary(), "neutronorch": {"super_batch": self.schedule.super_batch,
                                "staleness_bound": self.schedule.staleness_bound,
                                "hot_ratio": self.hot_ratio,
                                "hot_grad": "cpu" if self.track_grad else "stop",
                                "snapshot_lead": self.controller.lead, **self.controller.summary(),
                                "staleness_max_observed": self.staleness.max_observed,
                                "staleness_mean_observed": round(self.staleness.mean_observed, 3),
                                **self.stats.record()}}

    def end_epoch(self, record: dict) -> None:
        """What the plans did in the epoch, and the staleness observed so far."""
        record.update(self.hot_epoch.record(), staleness_max=self.staleness.max_observed,
                      staleness_mean=round(self.staleness.mean_observed, 3))
        record.update(self.controller.end_epoch(record, self.hot_epoch.hot_ratio, self.stages))
        self.hot_epoch = HotStats()

    def averaged_gradients(self) -> None:
        return None  # one process: typed NeutronOrch mode does not train data parallel

    def step_inputs(self, batch: TypedOrchBatch) -> StepInputs:
        """The model's inputs with the hot rows ``batch`` splices in at the current parameter version:
        publishes every snapshot due by then, waits for its super-batch's tables at its first mini-batch and
        checks the staleness of every use."""
        if batch.stats is not None:
            self.hot_epoch.account(batch.stats)
            self.stats.account(batch.stats)
        self.snapshots.publish_due(self.live, self.version, self.controller.lead)
        previous = self.hot_table.current
        hot, _ = self.hot_table.table(batch.super_batch_id)
        if hot is not previous:
            self.spans.add("host_compute", hot.host_began, hot.host_began + hot.host_seconds)
        if batch.probe is not None:
            self.controller.saw_plan(batch.probe)
        self.staleness.check(hot, self.version)
        rows = {t: HotRows(hot.table[t], index, hot.grad_acc.get(t)) for t, index in batch.splice.items()}
        return StepInputs(batch.blocks, batch.features, rows, batch.ids)

    def after_step(self, batch: TypedOrchBatch) -> None:
        self.version += 1
        if batch.last:
            self.controller.at_boundary(self.live, self.version)  # before the next snapshots: the error plans read
            self.hot_table.trained(batch.super_batch_id)
            self.snapshots.trained(batch.super_batch_id)
            self.needs.drop(batch.super_batch_id)

    def before_step(self, batch: TypedOrchBatch) -> None:
        """After ``batch``'s backward pass, before its optimizer step: at a super-batch's last mini-batch with
        ``hot_grad="cpu"``, the summed dL/dY of its hot rows taken through the host's graph and added to the
        bottom layer's gradients and the tables' rows'."""
        if batch.last and self.track_grad:
            self.hot_grad.finish(self.hot_table.current, self.live, False, self.model.embeddings)

    def _table_rows(self, super_batch_id: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The table rows super-batch ``super_batch_id``'s hot frontier reads, now (the sampler sent their
        ids ahead), for its snapshot."""
        ids = self.needs.take(super_batch_id)
        with torch.no_grad():
            rows = {t: self.model.embeddings[t].weight.detach()[index.to(self.model.embeddings[t].weight.device)]
                    .to("cpu", copy=True) for t, index in ids.items()}
        return rows, ids

    # After any step, what a checkpoint keeps for an exact resume is the homogeneous mode's. The plans are not
    # kept: they depend on the seed, the epoch and the batches alone, and are made again.
    state_dict, load_state_dict = NeutronOrchMode.state_dict, NeutronOrchMode.load_state_dict

    def _probe_inputs(self, ids: dict[str, np.ndarray]):
        """The drift probe's bottom block (a fixed sample of its own key) and, at each measurement, its rows:
        the featured types' and the embedding tables' current ones (they move with the weights)."""
        block = TypedNeighborSampler(self.graph, self.fanouts).sample_bottom(ids, mix_key(self.sampling.seed, 0x9E37))
        features, input_ids = self.inputs(block.src_ids, self.device)
        block = block.to(self.device)
        return lambda: (block, self.model.input_rows(features, input_ids))
