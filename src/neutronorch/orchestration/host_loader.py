"""Loading a host-sampled mini-batch: gather its rows on the host, ship them to the device. A loader also
says which stages it records and what a step reads of its batches (``stages``, ``step_inputs``).

Gather: the batch's input rows go into a pooled buffer (pinned on CUDA); with a device feature cache only
the rows it misses. Ship (CUDA): the batch copies itself on a side stream, the device assembles the rows
from the cache and the copied misses, and the buffer returns to the pool once the copy's event has
completed, without blocking this thread. On the CPU nothing is copied. A typed graph's batch
(``TypedHostLoader``): every featured type's rows read through ``TypedInputs`` and copied, with the blocks
and the seeds' labels, to the device as part of the gather stage.
"""

from __future__ import annotations

from typing import Callable

import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.features.store import TypedInputs
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch, TypedBatch, target_labels
from neutronorch.orchestration.mode import StepInputs
from neutronorch.sampling.block import SampledSubgraph

HOST_SAMPLING_STAGES = StageTable({"sample": "sampler", "gather": "sampler", "copy": "copy"})
TYPED_SAMPLING_STAGES = StageTable({"sample": "sampler", "gather": "sampler"})


class HostLoader:
    stages = HOST_SAMPLING_STAGES
    producer = "exact-producer"  # the name of exact mode's producer thread over it

    def __init__(self, access: FeatureAccess, spans: Spans):
        self.access = access
        self.store, self.placement, self.cache = access.store, access.placement, access.cache
        self.spans = spans
        self.copy_stream = torch.cuda.Stream(access.device) if access.on_cuda else None

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph,
             make: Callable[..., MiniBatch] = MiniBatch, targets: torch.Tensor | None = None) -> MiniBatch:
        """The batch of ``subgraph``, built by ``make`` (a ``MiniBatch`` type), its rows gathered and, on
        CUDA, its copy to the device started (not waited for). ``targets``: what the loss reads instead of
        the seeds' labels (``SeedBatch.targets``)."""
        store, pool, cache = self.access.store, self.access.pool, self.access.cache
        with self.spans.stage("gather"):
            rows = subgraph.input_nodes
            parts = None
            if cache is None:
                buffer = pool.acquire(rows.shape[0])
                features = store.gather_into(rows, buffer)
                hits = 0
            else:
                slots, miss_pos, missed = cache.split(rows)
                buffer = pool.acquire(missed.shape[0])
                features = store.gather_into(torch.from_numpy(missed), buffer)
                parts = [torch.from_numpy(slots), torch.from_numpy(miss_pos)]
                hits = rows.shape[0] - missed.shape[0]
            labels = store.labels[subgraph.seeds] if targets is None else targets
            batch = make(epoch, index, subgraph, features, labels, cache_hits=hits)
        if self.access.on_cuda:
            with self.spans.stage("copy"):
                self._ship(batch, buffer, parts)
        elif parts is not None:
            batch.features = cache.assemble(*parts, features)  # a copy: the buffer is free
            pool.release(buffer)
        else:
            batch.on_release(lambda: pool.release(buffer))
        return batch

    def _ship(self, batch: MiniBatch, buffer: torch.Tensor, parts: list | None) -> None:
        """Start the batch's copy on the copy stream. With ``parts`` (every row's cache slot, the misses'
        positions), ``batch.features`` holds only the missed rows until the device assembles them."""
        device = self.access.device
        batch.device_bytes = batch.transfer_bytes() + (sum(t.nbytes for t in parts) if parts else 0)
        with torch.cuda.stream(self.copy_stream):
            batch.to(device, non_blocking=True)
            if parts is not None:
                slots, miss_pos = (t.pin_memory().to(device, non_blocking=True) for t in parts)
                batch.features = self.access.cache.assemble(slots, miss_pos, batch.features)
            batch.mark_ready()
        # The pinned buffer is refilled only after the copy out of it has finished.
        self.access.pool.release_after(buffer, batch.ready)

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        batch.wait()
        return StepInputs(batch.blocks, batch.features)

    def summary(self) -> dict:
        return {}


class TypedHostLoader:
    """A typed graph's batches (node tasks only): no feature store of one row type, no device cache."""

    stages = TYPED_SAMPLING_STAGES
    producer = "typed-producer"
    store = placement = cache = None

    def __init__(self, graph: TypedGraph, inputs: TypedInputs, device: torch.device, spans: Spans):
        self.graph, self.inputs, self.device, self.spans = graph, inputs, device, spans

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph, make: Callable[..., TypedBatch] = TypedBatch,
             targets: torch.Tensor | None = None) -> TypedBatch:
        """The batch of ``subgraph``, built by ``make`` (a ``TypedBatch`` type), on the device, labelled with its
        seeds' labels (or ``targets``, ``SeedBatch.targets``)."""
        with self.spans.stage("gather", index):
            features, ids = self.inputs(subgraph.input_nodes, self.device)
            labels = (target_labels(self.graph, subgraph.seeds.numpy()) if targets is None else targets).to(self.device)
            blocks = [b.to(self.device) for b in subgraph.blocks]
        return make(epoch, index, blocks, features, ids, labels, subgraph.num_sampled_edges,
                    sum(int(v.shape[0]) for v in subgraph.input_nodes.values()))

    def step_inputs(self, batch: TypedBatch) -> StepInputs:
        return StepInputs(batch.blocks, batch.features, None, batch.ids)

    def summary(self) -> dict:
        """The host caches of its featured types and how their rows were read (``TypedInputs.summary``)."""
        return self.inputs.summary()
