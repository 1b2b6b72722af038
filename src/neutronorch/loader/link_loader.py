"""``LinkNeighborLoader``: the training pipeline's link-prediction mini-batches for a loop of your own.

The loader's edges reach the mode as ``links.train`` of a view of the graph (the modes' ``LinkSeeds`` read
the seed edges there and nowhere else) with ``task`` link, so each batch is what ``train()``'s link task
samples (``orchestration/link_seeds.py``). The view's ``train_idx`` is the edges' ends, so the feature caches
rank rows by the vertices the batches start from.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from neutronorch.data.link_checks import check_graph_links
from neutronorch.data.links import LinkSplit, check_negatives_fit
from neutronorch.loader.arguments import check_negatives, resolve_edges
from neutronorch.loader.base import EpochLoader
from neutronorch.loader.link_batch import LinkLoaderBatch

__all__ = ["LinkNeighborLoader"]


class LinkNeighborLoader(EpochLoader):
    """Mini-batches of seed edges, their negatives and the sampled neighbourhoods of their ends
    (``LinkLoaderBatch``), one epoch per iteration, on a homogeneous graph (docs/loader.md).

    ``LinkNeighborLoader(graph, fanouts, batch_size, *, edges="train", negatives=1, layout=None,
    **settings)``: ``edges`` a set of ``graph.links`` (train, val, test) or (2, E) supervision edges of your
    own (``layout`` for a 2 x 2 array: ``data/pairs.py``); ``batch_size`` counts seed edges; ``negatives``:
    uniform negative destinations per positive. ``settings``: ``NeighborLoader``'s."""

    items = "seed edges"
    task = "link"

    def __init__(self, graph, fanouts, batch_size: int, *, edges="train", negatives: int = 1,
                 layout: str | None = None, **settings):
        self._edges_given, self._layout = edges, layout
        self.negatives = check_negatives(negatives)
        super().__init__(graph, fanouts, batch_size, **settings)

    def _resolve(self):
        check_graph_links(self.graph)  # a split given with the graph is checked as train() checks it
        edges = resolve_edges(self.graph, self._edges_given, self._layout)
        check_negatives_fit("negatives", self.negatives, self.graph.num_nodes)
        self.edges = torch.from_numpy(edges)
        links = self.graph.links
        none = np.empty((2, 0), dtype=np.int64)
        links = LinkSplit(edges, none, none) if links is None else dataclasses.replace(links, train=edges)
        view = dataclasses.replace(self.graph, links=links, train_idx=np.unique(edges),
                                   notes=list(self.graph.notes))
        return view, int(edges.shape[1]), {"task": "link", "negatives": self.negatives}

    def _make_batch(self, minibatch, inputs, input_id) -> LinkLoaderBatch:
        return LinkLoaderBatch(minibatch, inputs, input_id, self.reuse_buffers)

    def _describe(self) -> str:
        return f"edges={self._count:,}, negatives={self.negatives}"
