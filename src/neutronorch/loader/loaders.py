"""``NeighborLoader`` and ``LinkNeighborLoader`` (docs/loader.md). Each hands its mode a view of the graph
whose ``train_idx`` holds the seeds (modes read their seeds there and nowhere else, and the feature caches
rank rows by them). A link loader's are its edges' ends, the edges in ``links.train`` (where the modes'
``LinkSeeds`` read them) with ``task`` link, so each batch is what ``train()``'s link task samples
(``orchestration/link_seeds.py``). A typed graph gets its reverse relations as ``train()`` adds them."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from neutronorch.data.link_checks import check_graph_links
from neutronorch.data.links import LinkSplit, check_negatives_fit
from neutronorch.loader.arguments import (check_negatives, resolve_edges, resolve_link_temporal, resolve_seeds,
                                          resolve_temporal)
from neutronorch.loader.base import EpochLoader
from neutronorch.loader.batch import LinkLoaderBatch, LoaderBatch, TypedLoaderBatch
from neutronorch.orchestration.temporal import timed_relations


class NeighborLoader(EpochLoader):
    """Mini-batches of sampled neighbourhoods of seed vertices, one epoch per iteration: a ``LoaderBatch``
    (valid until the next is asked for, unless ``reuse_buffers=False``), or on a typed graph a
    ``TypedLoaderBatch`` (owning its tensors). Arguments, batch forms and resume: docs/loader.md.

    ``NeighborLoader(graph, fanouts, batch_size, *, seeds="train", shuffle=True, seed=0, device="cpu",
    mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2, reuse_buffers=True,
    model=None, time_attr=None, input_time=None, temporal_strategy="uniform", strict_time=False, **options)``;
    ``time_attr`` and what follows it: sampling by time (docs/temporal.md, "The loader")."""

    def __init__(self, graph, fanouts, batch_size: int, *, seeds="train", time_attr=None, input_time=None,
                 temporal_strategy: str = "uniform", strict_time: bool = False, **settings):
        self._seeds_given = seeds
        self._time_given = (time_attr, input_time, temporal_strategy, strict_time)
        self._labels: torch.Tensor | None = None
        super().__init__(graph, fanouts, batch_size, **settings)

    def _resolve(self):
        self.seeds = torch.from_numpy(resolve_seeds(self.graph, self._seeds_given))
        self.temporal = resolve_temporal(self.graph, self.seeds.numpy(), *self._time_given)
        self._edge_order = {}  # by vertex times, each re-sorted relation's old edge positions (``timed_relations``)
        if self.typed:
            self.graph = self.graph.with_reverse()
            if self.temporal is not None and self.temporal.by_vertices:  # sampled as the batches will report it
                self.graph, self._edge_order = timed_relations(self.graph, replace=True)
            if self.graph.labels is None:  # its batches' y: -1
                target = self.graph.num_nodes[self.graph.target]
                self.graph = dataclasses.replace(self.graph, labels=np.full(target, -1, dtype=np.int64))
        return {"train_idx": self.seeds.numpy()}, int(self.seeds.shape[0]), {}

    def _make_batch(self, minibatch, inputs, input_id) -> LoaderBatch | TypedLoaderBatch:
        if self.typed:
            return TypedLoaderBatch(minibatch, inputs, input_id, self.graph, self._edge_order)
        timed, graph = self.temporal, self.graph
        times = None if timed is None else graph.node_time if timed.by_vertices else graph.edge_time
        return LoaderBatch(minibatch, inputs, input_id, self._labels_of, self.reuse_buffers, times,
                           timed is not None and timed.by_vertices)

    def _labels_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Labels of global ids (PyG's ``y``, one per sampled vertex), on the ids' device."""
        if self._labels is None or self._labels.device != ids.device:
            self._labels = self.mode.store.labels.to(ids.device)
        return self._labels.index_select(0, ids)


TypedNeighborLoader = NeighborLoader  # the name it had for typed graphs, kept for code that imports it


class LinkNeighborLoader(EpochLoader):
    """Mini-batches of seed edges, their negatives and the sampled neighbourhoods of their ends
    (``LinkLoaderBatch``), one epoch per iteration, on a homogeneous graph (docs/loader.md).

    ``LinkNeighborLoader(graph, fanouts, batch_size, *, edges="train", negatives=1, layout=None,
    **settings)``: ``edges`` a set of ``graph.links`` (train, val, test) or (2, E) supervision edges of your
    own (``layout`` for a 2 x 2 array: ``data/pairs.py``); ``batch_size`` counts seed edges; ``negatives``:
    uniform negative destinations per positive; ``time_attr``, ``edge_label_time`` and ``temporal_strategy``:
    sampling by time (docs/temporal.md, "The loader"). ``settings``: ``NeighborLoader``'s."""

    items = "seed edges"
    task = "link"

    def __init__(self, graph, fanouts, batch_size: int, *, edges="train", negatives: int = 1,
                 layout: str | None = None, time_attr=None, edge_label_time=None, temporal_strategy: str = "uniform",
                 **settings):
        self._edges_given, self._layout = edges, layout
        self._time_given = (time_attr, edge_label_time, temporal_strategy)
        self.negatives = check_negatives(negatives)
        super().__init__(graph, fanouts, batch_size, **settings)

    def _resolve(self):
        check_graph_links(self.graph)  # a split given with the graph is checked as train() checks it
        edges = resolve_edges(self.graph, self._edges_given, self._layout)
        self.temporal = resolve_link_temporal(self.graph, edges.shape[1], *self._time_given)
        check_negatives_fit("negatives", self.negatives, self.graph.num_nodes)
        self.edges = torch.from_numpy(edges)
        links = self.graph.links
        none = np.empty((2, 0), dtype=np.int64)
        links = LinkSplit(edges, none, none) if links is None else dataclasses.replace(links, train=edges)
        task = {"task": "link", "negatives": self.negatives}
        return {"links": links, "train_idx": np.unique(edges)}, int(edges.shape[1]), task

    def _make_batch(self, minibatch, inputs, input_id) -> LinkLoaderBatch:
        return LinkLoaderBatch(minibatch, inputs, input_id, self.reuse_buffers,
                               None if self.temporal is None else self.graph.edge_time)

    def _describe(self) -> str:
        return f"edges={self._count:,}, negatives={self.negatives}"
