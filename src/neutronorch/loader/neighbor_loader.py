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
from neutronorch.loader.batch import LoaderBatch, TypedLoaderBatch

__all__ = ["NeighborLoader", "TypedNeighborLoader"]


class NeighborLoader(EpochLoader):
    """Mini-batches of sampled neighbourhoods of seed vertices, one epoch per iteration (``docs/loader.md``).

    ``NeighborLoader(graph, fanouts, batch_size, *, seeds="train", shuffle=True, seed=0, device="cpu",
    mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2, reuse_buffers=True,
    model=None, **options)``

    ``graph``: a ``Graph``, a ``TypedGraph`` (``loader.graph`` then has its reverse relations) or a dataset
    spec. ``fanouts``: neighbours per hop, seed hop first (-1: all); on a typed graph for every relation or a
    dict per relation (``typed_fanouts``). ``seeds``: a split's name, vertex ids (of a typed graph's target
    type) or a boolean mask. Epoch ``e``'s order and draws derive from (``seed``, ``e``, batch number) alone,
    as ``train()``'s do. Each ``iter(loader)`` runs epoch ``loader.epoch`` and moves it on; ``set_epoch``,
    ``start`` and ``iter_from`` resume. ``mode``: exact or device. ``model`` and ``options`` size buffers and
    caches as ``train()`` would (homogeneous: a model name, ``hidden``, ``precision``, ...; typed: your
    module and ``gpu_memory_gb``, device mode's budget).

    A homogeneous batch (``LoaderBatch``: ``blocks``, ``x``, ``y``) is valid until the next is asked for
    (``reuse_buffers=False``: for good); a typed one (``TypedLoaderBatch``: ``blocks``, ``features``, ``ids``,
    ``y``) owns its tensors. ``to_pyg()`` gives PyG's ``Data`` or ``HeteroData``, ``to_dgl_blocks()`` DGL's
    blocks. One iteration at a time, in one thread; ``close()`` (or ``with``) ends everything."""

    def __init__(self, graph, fanouts, batch_size: int, *, seeds="train", **settings):
        self._seeds_given = seeds
        self._labels: torch.Tensor | None = None
        super().__init__(graph, fanouts, batch_size, **settings)

    def _resolve(self):
        self.seeds = torch.from_numpy(resolve_seeds(self.graph, self._seeds_given))
        if self.typed:
            self.graph = self.graph.with_reverse()
            if self.graph.labels is None:  # its batches' y: -1
                target = self.graph.num_nodes[self.graph.target]
                self.graph = dataclasses.replace(self.graph, labels=np.full(target, -1, dtype=np.int64))
            return dataclasses.replace(self.graph, train_idx=self.seeds.numpy()), int(self.seeds.shape[0]), {}
        view = dataclasses.replace(self.graph, train_idx=self.seeds.numpy(), notes=list(self.graph.notes))
        return view, int(self.seeds.shape[0]), {}

    def _make_batch(self, minibatch, inputs, input_id) -> LoaderBatch | TypedLoaderBatch:
        if self.typed:
            return TypedLoaderBatch(minibatch, inputs, input_id, self.graph)
        return LoaderBatch(minibatch, inputs, input_id, self._labels_of, self.reuse_buffers)

    def _labels_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Labels of global ids (PyG's ``y``, one per sampled vertex), on the ids' device."""
        if self._labels is None or self._labels.device != ids.device:
            self._labels = self.mode.store.labels.to(ids.device)
        return self._labels.index_select(0, ids)


TypedNeighborLoader = NeighborLoader  # the name it had for typed graphs, kept for code that imports it
