"""The mini-batch a mode hands to the trainer: a sampled subgraph with its gathered inputs.

A batch moves itself: ``to(device)`` copies what is still on the host (asynchronously from pinned memory),
``transfer_bytes`` says how much that is, ``wait(stream)`` orders a consumer stream after the copy and
tells the caching allocator that the stream uses the tensors, and ``release`` hands the host buffer its
features were gathered into back to its pool. Modes that need more (NeutronOrch's spliced batches) extend
it in their own package; nothing here knows of them. A typed graph's modes hand over a ``TypedBatch``: its
rows by vertex type, already on the device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.sampling.block import Block, SampledSubgraph, TypedBlock


def _nothing() -> None:
    pass


@dataclass
class MiniBatch:
    epoch: int
    index: int
    subgraph: SampledSubgraph
    features: torch.Tensor  # rows of ``subgraph.input_nodes`` (or only the cache's misses until assembled)
    labels: torch.Tensor
    cache_hits: int = 0  # input rows served by the device feature cache
    device_bytes: int = 0  # bytes copied from the host to the device for this batch
    ready: object = None  # on CUDA: the event after which the batch's device tensors may be read
    _release: Callable[[], None] = field(default=_nothing, repr=False)

    @property
    def blocks(self) -> list[Block]:
        return self.subgraph.blocks

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a training step reads."""
        return [self.features, self.labels] + [t for b in self.blocks for t in b.tensors()]

    def counts(self) -> tuple[int, int, int, int, int]:
        """(sampled edges, input rows, their feature bytes, rows the device cache served, bytes copied to the
        device for it): what an epoch's record sums."""
        subgraph = self.subgraph
        return (subgraph.num_sampled_edges, subgraph.input_nodes.shape[0], self.features.nbytes, self.cache_hits,
                self.device_bytes)

    def transfer_bytes(self) -> int:
        """Bytes that ``to`` would copy from host memory to a device."""
        return sum(t.nbytes for t in self.tensors() if t.device.type == "cpu")

    def to(self, device: torch.device, non_blocking: bool = False) -> "MiniBatch":
        """Move features, labels and blocks to ``device`` (in place; returns the batch)."""
        self.features = self.features.to(device, non_blocking=non_blocking)
        self.labels = self.labels.to(device, non_blocking=non_blocking)
        self.subgraph.blocks = [b.to(device, non_blocking=non_blocking) for b in self.blocks]
        return self

    def mark_ready(self) -> None:
        """On CUDA: record the event that ends this batch's work on the current stream."""
        if self.features.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()

    def wait(self, stream=None) -> None:
        """Order ``stream`` (default: the current one) after the batch's copies; no-op off CUDA."""
        if self.ready is None:
            return
        stream = stream or torch.cuda.current_stream(self.features.device)
        stream.wait_event(self.ready)
        for tensor in self.tensors():
            tensor.record_stream(stream)

    def on_release(self, release: Callable[[], None]) -> None:
        self._release = release

    def release(self) -> None:
        """The step no longer needs the host buffer the features were gathered into."""
        release, self._release = self._release, _nothing
        release()


def target_labels(graph: TypedGraph, seeds: np.ndarray) -> torch.Tensor:
    """The labels of target ids, int64 (a memory-mapped array is read at those rows only)."""
    return torch.from_numpy(np.asarray(graph.labels[seeds], dtype=np.int64))


@dataclass
class TypedBatch:
    """A mini-batch as the trainer takes it: the blocks (bottom first, on the device), the bottom frontier's
    featured rows and every type's ids, the seeds' labels, and where it is in its epoch."""

    epoch: int
    index: int
    blocks: list[TypedBlock]
    features: dict[str, torch.Tensor]
    ids: dict[str, torch.Tensor]
    labels: torch.Tensor
    num_sampled_edges: int = 0
    num_inputs: int = 0
    stats: object = None  # NeutronOrch: the plan's stats, with a super-batch's first mini-batch

    def counts(self) -> tuple[int, int, int, int, int]:
        """(sampled edges, input rows, their feature bytes, rows a device cache served, bytes copied to the
        device for it): what an epoch's record sums (``MiniBatch.counts``); no typed mode caches rows."""
        return (self.num_sampled_edges, self.num_inputs, sum(x.nbytes for x in self.features.values()), 0, 0)

    def release(self) -> None:
        """Its tensors are its own: no buffer to give back."""
