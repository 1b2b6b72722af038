"""Loading a host-sampled mini-batch: gather its rows on the host (into a pooled buffer, pinned on CUDA; with
a device cache only its misses; a typed graph's through ``TypedInputs``) and ship them (CUDA: copied on a
side stream, the cache assembling the rows on the device, the buffer back to the pool after the copy's
event, never blocking this thread).
"""

from __future__ import annotations

from typing import Callable

import torch

from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch, target_labels
from neutronorch.sampling.block import SampledSubgraph

HOST_SAMPLING_STAGES = StageTable({"sample": "sampler", "gather": "sampler", "copy": "copy"})


class HostLoader:
    def __init__(self, access: FeatureAccess, spans: Spans):
        self.access, self.spans = access, spans
        self.copy_stream = torch.cuda.Stream(access.device) if access.on_cuda else None

    def load(self, epoch: int, index: int, subgraph: SampledSubgraph,
             make: Callable[..., MiniBatch] = MiniBatch, targets: torch.Tensor | None = None) -> MiniBatch:
        """The batch of ``subgraph``, built by ``make``, its rows gathered and on CUDA its copy started.
        ``targets``: what the loss reads instead of the seeds' labels (``SeedBatch.targets``)."""
        access = self.access
        store, pool, cache = access.store, access.pool, access.cache
        with self.spans.stage("gather", index):
            rows, buffer, parts, hits = subgraph.input_nodes, None, None, 0
            if access.inputs is not None:
                features = access.inputs.rows(rows)
            elif cache is None:
                buffer = pool.acquire(rows.shape[0])
                features = store.gather_into(rows, buffer)
            else:
                slots, miss_pos, missed = cache.split(rows)
                buffer = pool.acquire(missed.shape[0])
                features = store.gather_into(torch.from_numpy(missed), buffer)
                parts = [torch.from_numpy(slots), torch.from_numpy(miss_pos)]
                hits = rows.shape[0] - missed.shape[0]
            labels = targets
            if labels is None:  # the seeds' own
                labels = (store.labels[subgraph.seeds] if store is not None
                          else target_labels(access.graph, subgraph.seeds.numpy()))
            batch = make(epoch, index, subgraph, features, labels, cache_hits=hits)
        if access.on_cuda:
            with self.spans.stage("copy", index):
                self._ship(batch, buffer, parts)
        elif parts is not None:
            batch.features = cache.assemble(*parts, features)  # a copy: the buffer is free
            pool.release(buffer)
        elif buffer is not None:
            batch.releaser = lambda: pool.release(buffer)
        return batch

    def _ship(self, batch: MiniBatch, buffer: torch.Tensor | None, parts: list | None) -> None:
        """Start the batch's copy; ``parts``: the cache slots and misses' positions the rows assemble from."""
        device = self.access.device
        batch.device_bytes = batch.transfer_bytes() + (sum(t.nbytes for t in parts) if parts else 0)
        with torch.cuda.stream(self.copy_stream):
            batch.to(device, non_blocking=True)
            if parts is not None:
                slots, miss_pos = (t.pin_memory().to(device, non_blocking=True) for t in parts)
                batch.features = self.access.cache.assemble(slots, miss_pos, batch.features)
            batch.mark_ready()
        if buffer is not None:  # the pinned buffer is refilled only after the copy out of it has finished
            self.access.pool.release_after(buffer, batch.ready)

    def start(self, model: torch.nn.Module) -> None:
        pass  # nothing waits for the model

    def close(self) -> None:
        pass

    def summary(self) -> dict:
        """A typed graph's: ``TypedInputs.summary``."""
        return {} if self.access.inputs is None else self.access.inputs.summary()
