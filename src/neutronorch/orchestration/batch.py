"""The mini-batch a mode hands to the trainer, of either kind of graph: a sampled subgraph with its gathered
inputs (a typed graph's by vertex type, its blocks ``TypedBlock``s). A batch moves itself (``to``,
``wait``, ``release``); nothing here knows of NeutronOrch's spliced batches, which extend it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.sampling.block import Block, SampledSubgraph, TypedBlock


def per_type(value) -> Mapping:
    """``value`` per vertex type: a typed graph's mapping as it is, a homogeneous graph's value as its one
    entry (keyed ""), None as none."""
    return value if isinstance(value, Mapping) else {} if value is None else {"": value}


def each(value, change):
    """``change`` of ``value``, or of each of its values (a typed graph's, per type); None stays None."""
    if value is None:
        return None
    return {t: change(v) for t, v in value.items()} if isinstance(value, Mapping) else change(value)


@dataclass
class MiniBatch:
    epoch: int
    index: int
    subgraph: SampledSubgraph
    # Rows of ``subgraph.input_nodes`` (or only the cache's misses until assembled); a typed graph's by featured type.
    features: torch.Tensor | dict[str, torch.Tensor]
    labels: torch.Tensor
    cache_hits: int = 0  # input rows served by the device feature cache
    device_bytes: int = 0  # bytes copied from the host to the device for this batch
    ready: object = None  # on CUDA: the event after which the batch's device tensors may be read
    releaser: Callable[[], None] | None = field(default=None, repr=False)  # gives the host buffer back

    @property
    def blocks(self) -> list[Block] | list[TypedBlock]:
        return self.subgraph.blocks

    @property
    def ids(self) -> dict[str, torch.Tensor] | None:
        """A typed graph's: every type's input vertices (moved with the batch); None on a homogeneous graph."""
        frontier = self.subgraph.input_nodes
        return frontier if isinstance(frontier, dict) else None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor a training step reads."""
        return [*per_type(self.features).values(), self.labels, *per_type(self.ids).values(),
                *(t for b in self.blocks for t in b.tensors())]

    def counts(self) -> tuple[int, int, int, int, int]:
        """(sampled edges, input rows, their feature bytes, rows the device cache served, bytes copied to the
        device for it): what an epoch's record sums."""
        subgraph = self.subgraph
        inputs = per_type(subgraph.input_nodes).values()
        return (subgraph.num_sampled_edges, sum(int(ids.shape[0]) for ids in inputs),
                sum(x.nbytes for x in per_type(self.features).values()), self.cache_hits, self.device_bytes)

    def transfer_bytes(self) -> int:
        """Bytes that ``to`` would copy from host memory to a device."""
        return sum(t.nbytes for t in self.tensors() if t.device.type == "cpu")

    def to(self, device: torch.device, non_blocking: bool = False) -> "MiniBatch":
        """Move what a step reads to ``device``, in place."""
        def move(tensors):
            return each(tensors, lambda x: x.to(device, non_blocking=non_blocking))

        self.features, self.labels = move(self.features), move(self.labels)
        subgraph = self.subgraph
        subgraph.blocks = [b.to(device, non_blocking=non_blocking) for b in subgraph.blocks]
        if self.ids is not None:
            subgraph.frontiers = [move(self.ids), *subgraph.frontiers[1:]]
        return self

    def mark_ready(self) -> None:
        """On CUDA: record the event ending this batch's work on the current stream."""
        if self.labels.is_cuda:
            self.ready = torch.cuda.Event()
            self.ready.record()

    def wait(self, stream=None) -> None:
        """Order ``stream`` (default: the current one) after the batch's copies; no-op off CUDA."""
        if self.ready is None:
            return
        stream = stream or torch.cuda.current_stream(self.labels.device)
        stream.wait_event(self.ready)
        for tensor in self.tensors():
            tensor.record_stream(stream)

    def release(self) -> None:
        """The step no longer needs the host buffer the features were gathered into."""
        release, self.releaser = self.releaser, None
        if release is not None:
            release()


def target_labels(graph: TypedGraph, seeds: np.ndarray) -> torch.Tensor:
    """The labels of target ids, int64 (a memory-mapped array is read at those rows only)."""
    return torch.from_numpy(np.asarray(graph.labels[seeds], dtype=np.int64))
