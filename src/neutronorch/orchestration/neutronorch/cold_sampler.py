"""The cold sampler: per mini-batch, the bottom hop of the cold destinations only, then gather and ship.

Runs on its own thread (``neutronorch-sampler``), consuming the planning loop's plans in order, and owns
its sampler. Hot destinations are never sampled, gathered or moved. Without device sampling the bottom
hop is drawn on the host with the numba sampler (with the mini-batch's own key, so together with the
planner's upper hops it draws exactly what exact mode draws) and loaded like exact mode's batches; with
it (``device_sampling``, on by default with CUDA), it is drawn on the device with the torch sampler and
its rows come from the device feature cache, as in device mode.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable, Iterable, Iterator

import numba
import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.data.graph import Graph
from neutronorch.nn.splice import SpliceIndex
from neutronorch.observe import Spans
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.host_loader import HostLoader
from neutronorch.orchestration.neutronorch.batch import Splice, SplicedBatch, spliced
from neutronorch.orchestration.neutronorch.planner import Plan
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.device_sampler import make_device_sampler
from neutronorch.sampling.exclude import exclude_from_block
from neutronorch.sampling.neighbor_sampler import NeighborSampler, layer_key


class ColdSampler:
    def __init__(self, graph: Graph, sampling: SamplingConfig, spans: Spans, threads: int, loader: HostLoader | None,
                 reader: DeviceReader | None):
        self.graph, self.fanouts, self.degrees = graph, sampling.fanouts, sampling.degrees
        self.file_order = sampling.file_order
        self.spans, self.threads = spans, threads
        self.loader, self.reader = loader, reader
        on_cuda = reader is not None and reader.device.type == "cuda"
        self.stream = torch.cuda.Stream(reader.device) if on_cuda else None

    def run(self, plans: Callable[[object], Iterable[Plan]], skip: int = 0) -> Iterator[SplicedBatch]:
        """The sampler's loop (the body of its thread): one batch per planned mini-batch of ``plans(sampler)``
        (given this thread's sampler, which plans on the device sample with), in order, but for the first
        ``skip`` mini-batches of the first plan (a resumed super-batch's, trained already)."""
        numba.set_num_threads(self.threads)
        on_device = self.reader is not None
        if on_device:
            sampler = make_device_sampler(self.reader.indptr, self.reader.indices, self.fanouts, self.degrees)
        else:
            sampler = NeighborSampler(self.graph.indptr, self.graph.indices, self.fanouts, self.degrees,
                                      self.file_order)
        bottom_hop, fanout = len(self.fanouts) - 1, self.fanouts[-1]
        with torch.cuda.stream(self.stream) if self.stream is not None else nullcontext():
            for plan in plans(sampler):
                for position, item in enumerate(plan.batches):
                    if position < skip:
                        continue
                    with self.spans.stage("sample"):
                        dst = item.upper.frontiers[0]
                        key = layer_key(item.key, bottom_hop)
                        if on_device:  # planned on the device: positions are tensors there
                            dst = dst.to(self.reader.device)
                            cold = dst.index_select(0, torch.as_tensor(item.cold_pos, device=dst.device))
                            block, frontier = sampler.sample_hop(cold, fanout, key)
                        else:
                            block, frontier = sampler.sample_hop(dst.numpy()[item.cold_pos], fanout, key)
                            frontier = torch.from_numpy(frontier)
                        if item.exclude is not None:
                            block = exclude_from_block(block, frontier, item.exclude, self.graph.num_nodes)
                        subgraph = SampledSubgraph(item.upper.seeds, [block] + item.upper.blocks,
                                                   [frontier] + item.upper.frontiers)
                        splice = Splice(plan.super_batch_id,
                                        splice_index(dst.shape[0], item.cold_pos, item.hot_pos, item.hot_rows),
                                        position == len(plan.batches) - 1,
                                        plan.stats, plan.probe)
                    source = self.reader if on_device else self.loader
                    yield source.load(plan.epoch, item.index, subgraph, make=spliced(splice), targets=item.targets)
                skip = 0


def splice_index(num_rows: int, cold_pos, hot_pos, hot_rows) -> SpliceIndex:
    """The splice index of a planned mini-batch's destinations (of one type): from numpy positions (planned on
    the host) or from tensors (planned on the device, where it is built without leaving it)."""
    if isinstance(cold_pos, np.ndarray):
        return SpliceIndex.build(num_rows, cold_pos, hot_pos, hot_rows)
    origin = torch.empty(num_rows, dtype=torch.int64, device=cold_pos.device)
    origin.index_copy_(0, cold_pos, torch.arange(cold_pos.shape[0], device=cold_pos.device))
    origin.index_copy_(0, hot_pos, -1 - hot_rows)
    return SpliceIndex(num_rows, cold_pos, hot_pos, hot_rows, origin)
