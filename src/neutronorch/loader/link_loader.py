"""``LinkNeighborLoader``: the training pipeline's link-prediction mini-batches for a loop of your own.

The loader's edges reach the mode as the training set of a view of the graph (``links.train`` replaced:
the modes' ``LinkSeeds`` read the seed edges there and nowhere else), with ``task`` link in its
``TrainConfig``, so each batch is what ``train()``'s link task samples: P seed edges in the epoch's order,
K uniform negative destinations per positive keyed by (seed, epoch, batch), the neighbourhoods of the
pairs' distinct ends, and those seed edges taken out of the sampled graph at every hop in both directions
(``sampling/exclude.py``). The view's ``train_idx`` is the edges' ends, so the feature caches rank rows by
the vertices the loader's batches start from. Epochs, resume and the batches' lifetime are
``EpochLoader``'s (base.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from neutronorch.data.link_checks import check_graph_links
from neutronorch.data.links import LinkSplit, check_negatives_fit
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.loader.arguments import check_negatives, resolve_edges
from neutronorch.loader.base import EpochLoader
from neutronorch.loader.link_batch import LinkLoaderBatch

__all__ = ["LinkNeighborLoader"]


class LinkNeighborLoader(EpochLoader):
    """Mini-batches of seed edges, their negatives and the sampled neighbourhoods of their ends, one epoch
    per iteration.

    ``LinkNeighborLoader(graph, fanouts, batch_size, *, edges="train", negatives=1, layout=None, shuffle=True,
    seed=0, device="cpu", mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2,
    reuse_buffers=True, model=None, **options)``, on a homogeneous graph (``docs/loader.md``).

    ``edges``: ``"train"`` (default), ``"val"`` or ``"test"``, a set of ``graph.links`` (a link graph:
    ``neutronorch.train.link_task.link_graph`` or an OGB link dataset), or a (2, E) tensor, array or list of
    supervision edges of your own (the graph then needs no link split); an (E, 2) one is read as an edge per
    row, a 2 x 2 one needs ``layout`` ``"columns"`` or ``"rows"`` (``data/pairs.py``). ``batch_size`` counts
    seed edges; ``negatives``: uniform negative destinations per positive (at least 1, at most the vertex
    count). Every other argument is ``NeighborLoader``'s: the order of epoch ``e``, its negatives and every
    draw derive from (``seed``, ``e``, batch number) alone; ``start``, ``iter_from``, ``set_epoch`` resume.

    Each batch (``LinkLoaderBatch``) holds ``blocks``, ``x``, ``seeds`` (the pairs' distinct ends, sorted),
    ``pairs`` (P, 2 + K), ``edge_label_index``, ``edge_label``, ``input_id`` (the positives' positions in
    ``loader.edges``); ``to_pyg()`` gives PyG's link batch, ``to_dgl_blocks()`` and ``pair_ids()`` (or
    ``to_dgl_pair_graphs()``) DGL's."""

    items = "seed edges"
    task = "link"

    def __init__(self, graph, fanouts, batch_size: int, *, edges="train", negatives: int = 1,
                 layout: str | None = None, **settings):
        if isinstance(graph, TypedGraph):
            raise ConfigError("LinkNeighborLoader takes a homogeneous graph for now; a typed graph's link task "
                              "(one relation's edges) trains through train() (docs/heterogeneous.md).")
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
