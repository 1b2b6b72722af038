"""Mode ``device``: sample and gather on the training device, like DGL-UVA and GNNLab.

The topology (CSC) and the features are placed on the training device once; a background thread samples
with the vectorised torch sampler and gathers rows with ``index_select`` there, on its own CUDA stream, so
nothing but seed ids crosses the host-device boundary during training. With ``--device cpu`` the same
orchestration runs on host tensors (the stages then share the CPU with training, as every mode does on a
CPU-only machine).

This is the placement NeutronOrch is compared with: fast while the graph and the features fit in device
memory, and the whole bottom layer is still computed on the device for every mini-batch.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Iterator

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.orchestration.exact import ExactMode, epoch_order
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.sampling.block import MiniBatch
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key


def place(array: np.ndarray, device: torch.device, what: str) -> torch.Tensor:
    """A host array as a tensor on ``device`` (zero-copy on the CPU for writable arrays); a clear error when
    the device has no room."""
    tensor = torch.from_numpy(np.ascontiguousarray(array)) if array.flags.writeable else torch.from_numpy(
        np.array(array))
    if device.type == "cpu":
        return tensor
    try:
        return tensor.to(device)
    except torch.cuda.OutOfMemoryError:
        raise ConfigError(f"--mode device: the {what} ({tensor.nbytes / 2**30:.1f} GiB) do not fit in the "
                          f"memory of {device}. Use --mode neutronorch or --mode exact, which keep them in "
                          f"host memory.") from None


class DeviceMode(ExactMode):
    name = "device"

    def __init__(self, graph: Graph, config: TrainConfig, device: torch.device, sampler_threads: int):
        super().__init__(graph, config, device, sampler_threads)
        self.indptr = place(graph.indptr, device, "topology")
        self.indices = place(graph.indices, device, "topology")
        features = graph.features
        if features.dtype != np.float32:
            features = features.astype(np.float32)
        self.features = place(features, device, "features")
        self.labels = self.store.labels.to(device)
        self.sample_stream = torch.cuda.Stream(device) if self.on_cuda else None

    def batches(self, epoch: int) -> Prefetcher:
        """This epoch's mini-batches, sampled and gathered on the device in a background thread."""
        return Prefetcher(lambda: self._produce(epoch), depth=self.config.prefetch, name=f"{self.name}-producer")

    def _produce(self, epoch: int) -> Iterator[MiniBatch]:
        sampler = TorchNeighborSampler(self.indptr, self.indices, self.config.fanouts)
        order = epoch_order(self.train_idx, self.config.seed, epoch)
        stream_context = torch.cuda.stream(self.sample_stream) if self.on_cuda else nullcontext()
        with stream_context:
            for index, seeds in enumerate(torch.split(order, self.config.batch_size)):
                t0 = time.perf_counter()
                seeds = seeds.to(self.device, non_blocking=True)
                subgraph = sampler.sample(seeds, batch_key(self.config.seed, epoch, index))
                t1 = time.perf_counter()
                self.spans.add("sample", t0, t1)
                rows = subgraph.input_nodes
                features = self.features.index_select(0, rows)
                labels = self.labels.index_select(0, subgraph.seeds)
                batch = MiniBatch(epoch, index, subgraph, features, labels)
                if self.on_cuda:
                    batch.ready = torch.cuda.Event()
                    batch.ready.record(self.sample_stream)
                t2 = time.perf_counter()
                self.spans.add("gather", t1, t2)
                yield batch

