"""``NeighborLoader``: the training pipeline's mini-batches of seed vertices for a training loop of your own.

Seeds other than the training split reach the mode as the training split of a view of the graph (the same
arrays, ``train_idx`` replaced): modes read their seeds from ``graph.train_idx`` and nowhere else, and the
feature caches then rank rows by the loader's seeds. ``shuffle=False`` keeps their given order every epoch
(``SamplingConfig.shuffle``). Epochs, resume and the batches' lifetime are ``EpochLoader``'s (base.py).
"""

from __future__ import annotations

import dataclasses

import torch

from neutronorch.loader.arguments import resolve_seeds
from neutronorch.loader.base import EpochLoader
from neutronorch.loader.batch import LoaderBatch

__all__ = ["NeighborLoader"]


class NeighborLoader(EpochLoader):
    """Mini-batches of sampled neighbourhoods of seed vertices, one epoch per iteration.

    ``NeighborLoader(graph, fanouts, batch_size, *, seeds="train", shuffle=True, seed=0, device="cpu",
    mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2, reuse_buffers=True,
    model="sage", **options)``

    ``graph``: a ``Graph`` or a dataset spec (``load_dataset``). ``fanouts``: neighbours per hop, seed hop
    first (``[15, 10, 5]`` or ``"15,10,5"``; -1: all). ``seeds``: ``"train"`` (default), ``"val"``,
    ``"test"``, ``"all"``, vertex ids or a boolean mask. The seed order of epoch ``e`` and every draw derive
    from (``seed``, ``e``, batch number) alone: the same arguments give the same batches, whatever the
    threads. Each ``iter(loader)`` runs epoch ``loader.epoch`` (``epoch`` at first) and moves it on by one;
    ``set_epoch(e)`` chooses the next. ``start=k`` begins the first iteration at batch ``k`` (resume);
    ``iter_from(k)`` does so for any epoch. ``mode``: ``exact`` (host sampling and gathering in a background
    thread) or ``device`` (on ``device``). ``model`` (sage, gcn, gat) and ``options`` (``hidden``,
    ``gcn_norm``, ``precision``, the placement and read-order settings of ``TrainConfig``) size the buffers and
    caches as ``train()`` would; ``model="gcn"`` makes the blocks carry the sources' degrees.

    A batch's tensors stay valid until the next batch is asked for (``reuse_buffers=False``: for good, at the
    cost of a copy). A new iteration closes the one before
    it (another thread's is refused: one loader per thread); ``close()`` (or ``with``) ends everything."""

    def __init__(self, graph, fanouts, batch_size: int, *, seeds="train", **settings):
        self._seeds_given = seeds
        self._labels: torch.Tensor | None = None
        super().__init__(graph, fanouts, batch_size, **settings)

    def _resolve(self):
        self.seeds = torch.from_numpy(resolve_seeds(self.graph, self._seeds_given))
        view = dataclasses.replace(self.graph, train_idx=self.seeds.numpy(), notes=list(self.graph.notes))
        return view, int(self.seeds.shape[0]), {}

    def _make_batch(self, minibatch, blocks, x, input_id, reused) -> LoaderBatch:
        return LoaderBatch(minibatch, blocks, x, input_id, self._labels_of, reused)

    def _labels_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Labels of global ids (PyG's ``y``, one per sampled vertex), on the ids' device."""
        if self._labels is None or self._labels.device != ids.device:
            self._labels = self.mode.store.labels.to(ids.device)
        return self._labels.index_select(0, ids)
