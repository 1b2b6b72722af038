"""``NeighborLoader``: the training pipeline's mini-batches of seed vertices for a training loop of your own,
from a homogeneous ``Graph`` or a ``TypedGraph`` alike.

Seeds other than the training split reach the mode as the training split of a view of the graph (the same
arrays, ``train_idx`` replaced): modes read their seeds from ``graph.train_idx`` and nowhere else, and the
feature caches then rank rows by the loader's seeds. ``shuffle=False`` keeps their given order every epoch
(``SamplingConfig.shuffle``). A typed graph's seeds are vertices of its target type, and the graph gets its
reverse relations as ``train()`` adds them (``with_reverse``). Epochs, resume and the batches' lifetime are
``EpochLoader``'s (base.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from neutronorch.loader.arguments import resolve_seeds
from neutronorch.loader.base import EpochLoader
from neutronorch.loader.batch import LoaderBatch
from neutronorch.loader.typed_batch import TypedLayout, TypedLoaderBatch
from neutronorch.orchestration.typed_exact import target_labels

__all__ = ["NeighborLoader", "TypedNeighborLoader"]


class NeighborLoader(EpochLoader):
    """Mini-batches of sampled neighbourhoods of seed vertices, one epoch per iteration.

    ``NeighborLoader(graph, fanouts, batch_size, *, seeds="train", shuffle=True, seed=0, device="cpu",
    mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2, reuse_buffers=True,
    model=None, **options)``

    ``graph``: a ``Graph``, a ``TypedGraph`` (its reverse relations added as ``train()`` adds them:
    ``loader.graph`` is that graph) or a dataset spec (``load_dataset``; a typed dataset's path:
    ``load_typed_dataset``). ``fanouts``: neighbours per hop, seed hop first (``[15, 10, 5]`` or
    ``"15,10,5"``; -1: all); on a typed graph the same for every relation (0: none) or a dict per relation
    with a ``"default"`` (``typed_fanouts``). ``seeds``: ``"train"`` (default), ``"val"``, ``"test"``,
    ``"all"``, vertex ids (of a typed graph's target type) or a boolean mask. The seed order of epoch ``e``
    and every draw derive from (``seed``, ``e``, batch number) alone: the same arguments give the same
    batches, whatever the threads, and ``train()`` with the same seed, batch size and fanouts samples them in
    its epoch ``e``. Each ``iter(loader)`` runs epoch ``loader.epoch`` (``epoch`` at first) and moves it on
    by one; ``set_epoch(e)`` chooses the next. ``start=k`` begins the first iteration at batch ``k``
    (resume); ``iter_from(k)`` does so for any epoch. ``mode``: ``exact`` (host sampling and gathering in a
    background thread) or ``device`` (on ``device``). On a homogeneous graph ``model`` (sage, the default;
    gcn, gat) and ``options`` (``hidden``, ``gcn_norm``, ``precision``, the placement and read-order settings
    of ``TrainConfig``) size the buffers and caches as ``train()`` would, and ``model="gcn"`` makes the blocks
    carry the sources' degrees; on a typed graph ``model`` is your module and ``gpu_memory_gb`` the memory
    allowed, device mode's budget.

    A homogeneous batch (``LoaderBatch``) holds ``blocks``, ``x``, ``y``; its tensors stay valid until the
    next batch is asked for (``reuse_buffers=False``: for good, at the cost of a copy). A typed batch
    (``TypedLoaderBatch``) holds ``blocks``, ``features``, ``ids``, ``y``, its own tensors. ``to_pyg()``
    gives PyG's ``Data`` or ``HeteroData``, ``to_dgl_blocks()`` DGL's blocks. A new iteration closes the one
    before it (another thread's is refused: one loader per thread); ``close()`` (or ``with``) ends
    everything."""

    def __init__(self, graph, fanouts, batch_size: int, *, seeds="train", **settings):
        self._seeds_given = seeds
        self._labels: torch.Tensor | None = None
        super().__init__(graph, fanouts, batch_size, **settings)

    def _resolve(self):
        self.seeds = torch.from_numpy(resolve_seeds(self.graph, self._seeds_given))
        if self.typed:
            self.graph = graph = _labelled(self.graph.with_reverse())
            self.layout = TypedLayout({t: graph.feature_dim(t) for t in graph.num_nodes},
                                      {r: rel.edge_feature_dim for r, rel in graph.relations.items()}, graph.target,
                                      lambda ids: target_labels(graph, ids.cpu().numpy()).to(ids.device))
            return dataclasses.replace(graph, train_idx=self.seeds.numpy()), int(self.seeds.shape[0]), {}
        view = dataclasses.replace(self.graph, train_idx=self.seeds.numpy(), notes=list(self.graph.notes))
        return view, int(self.seeds.shape[0]), {}

    def _make_batch(self, minibatch, inputs, input_id) -> LoaderBatch | TypedLoaderBatch:
        if self.typed:
            return TypedLoaderBatch(minibatch, input_id, self.layout)
        return LoaderBatch(minibatch, inputs, input_id, self._labels_of, self.reuse_buffers)

    def _labels_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Labels of global ids (PyG's ``y``, one per sampled vertex), on the ids' device."""
        if self._labels is None or self._labels.device != ids.device:
            self._labels = self.mode.store.labels.to(ids.device)
        return self._labels.index_select(0, ids)

    def _describe(self) -> str:
        return f"seeds={self._count:,}" + (f" of {self.graph.target}" if self.typed else "")


TypedNeighborLoader = NeighborLoader  # the name it had for typed graphs, kept for code that imports it


def _labelled(graph):
    """``graph``, given labels of -1 on its target where it has none (its batches' ``y``)."""
    if graph.labels is not None:
        return graph
    return dataclasses.replace(graph, labels=np.full(graph.num_nodes[graph.target], -1, dtype=np.int64))
