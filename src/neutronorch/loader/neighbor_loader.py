"""``NeighborLoader``: the training pipeline's mini-batches of seed vertices, of a ``Graph`` or a
``TypedGraph``, for a training loop of your own (docs/loader.md).

The seeds reach the mode as the ``train_idx`` of a view of the graph (modes read their seeds there and nowhere
else, and the feature caches then rank rows by them); a typed graph gets its reverse relations as ``train()``
adds them (``with_reverse``).
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
    """Mini-batches of sampled neighbourhoods of seed vertices, one epoch per iteration: a ``LoaderBatch``
    (valid until the next is asked for, unless ``reuse_buffers=False``), or on a typed graph a
    ``TypedLoaderBatch`` (owning its tensors). Arguments, batch forms and resume: docs/loader.md.

    ``NeighborLoader(graph, fanouts, batch_size, *, seeds="train", shuffle=True, seed=0, device="cpu",
    mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2, reuse_buffers=True,
    model=None, **options)``"""

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
