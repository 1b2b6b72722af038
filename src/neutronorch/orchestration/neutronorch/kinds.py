"""What NeutronOrch mode does differently on each kind of graph, in one small object per kind, so that
``mode.py`` reads one way: where a mini-batch's rows are read and its hops drawn, the drift probe's inputs,
the hot rows a step reads, and (a typed graph's) the embedding-table rows a snapshot holds.

A homogeneous graph's rows come from its ``FeatureAccess`` (on the device with device sampling, which then
also plans there); a typed graph's featured rows are read on the host through its ``TypedInputs``, whichever
device draws its mini-batches (``on_device``: ``cold_sampler.draws_on_device``), and its featureless types'
inputs are embedding-table rows, which its snapshots also hold (ids sent ahead on the ``needs`` channel).
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.features.store import TypedInputs
from neutronorch.nn.splice import HotRows
from neutronorch.observe import Spans
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.channel import Channel
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.host_loader import HostLoader, TypedHostLoader
from neutronorch.orchestration.mode import StepInputs
from neutronorch.sampling.neighbor_sampler import NeighborSampler, layer_key, mix_key
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler, TypedTopology
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

PROBE_KEY = 0x9E37  # mixed into the run's seed for the drift probe's fixed sample


class HomogeneousKind:
    fanouts = None  # the sampling configuration's
    needs = type_sizes = None
    lead_adapts = True  # the snapshot lead may grow while the trainer waits for hot rows

    def __init__(self, graph: Graph, access: FeatureAccess, spans: Spans):
        self.graph, self.device = graph, access.device
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
        self.source = access.store  # what the host reads the hot rows' inputs from
        # Device sampling: the cold bottom hop is sampled and gathered on the device (its topology placed
        # there, or read from pinned host memory); otherwise on the host like exact mode.
        self.reader = DeviceReader(graph, access, spans) if access.placement.topology != "host" else None
        self.loader = HostLoader(access, spans) if self.reader is None else None
        self.plans_on_device = self.reader is not None
        self.cold_sampler = None  # the cold sampler makes its own

    def inputs(self, batch, hot, index) -> StepInputs:
        """The step's model inputs: the batch's, and the super-batch's hot rows at ``index``."""
        return StepInputs(batch.blocks, batch.features, HotRows(hot.table, index, hot.grad_acc))

    def probe_inputs(self, ids: np.ndarray, sampling: SamplingConfig, model) -> tuple:
        """The drift probe's bottom block and float32 rows (the probe runs outside autocast, and drift is a
        small difference), a fixed sample of its own key, on the device."""
        sampler = NeighborSampler(self.graph.indptr, self.graph.indices, sampling.fanouts, sampling.degrees)
        key = layer_key(mix_key(sampling.seed, PROBE_KEY), len(sampling.fanouts) - 1)
        block, frontier = sampler.sample_hop(ids, sampling.fanouts[-1], key)
        rows = self.store.as_dtype(torch.float32).gather(torch.from_numpy(frontier))
        return block.to(self.device), rows.to(self.device)


class TypedKind:
    lead_adapts = False  # a typed run at a fixed ratio trains the same steps whatever the times measured
    reader = store = placement = cache = None  # (a homogeneous graph's feature access)

    def __init__(self, graph: TypedGraph, inputs: TypedInputs, fanouts: dict[RelationType, list[int]],
                 device: torch.device, on_device: bool, spans: Spans):
        self.graph, self.source, self.fanouts, self.device = graph, inputs, fanouts, device
        self.type_sizes = graph.num_nodes  # how a node numbers its ranks' hot sets as one (``node.py``)
        self.loader = TypedHostLoader(graph, inputs, device, spans)
        self.plans_on_device = on_device
        self.needs = Channel("needs")  # the ids of the table rows each super-batch's hot rows read

    def cold_sampler(self):
        """The cold sampler's (made on its thread): on the training device with ``plans_on_device``."""
        if self.plans_on_device:
            return TypedDeviceSampler(TypedTopology.of(self.graph, self.device), self.fanouts)
        return TypedNeighborSampler(self.graph, self.fanouts)

    def inputs(self, batch, hot, index: dict) -> StepInputs:
        return StepInputs(batch.blocks, batch.features,
                          {t: HotRows(hot.table[t], i, hot.grad_acc.get(t)) for t, i in index.items()}, batch.ids)

    def probe_inputs(self, ids: dict[str, np.ndarray], sampling: SamplingConfig, model):
        """A function giving the drift probe's bottom block and inputs at each measurement (the table rows
        move with the weights)."""
        block = TypedNeighborSampler(self.graph, self.fanouts).sample_bottom(ids, mix_key(sampling.seed, PROBE_KEY))
        features, input_ids = self.source(block.src_ids, self.device)
        block = block.to(self.device)
        return lambda: (block, model().input_rows(features, input_ids))

    def table_rows(self, model: torch.nn.Module, super_batch_id: int) -> tuple[dict, dict]:
        """The embedding-table rows super-batch ``super_batch_id``'s hot frontier reads, now, for its snapshot
        (the host sent their ids ahead)."""
        ids = self.needs.take(super_batch_id)
        with torch.no_grad():
            rows = {t: model.embeddings[t].weight.detach()[index.to(model.embeddings[t].weight.device)]
                    .to("cpu", copy=True) for t, index in ids.items()}
        return rows, ids
