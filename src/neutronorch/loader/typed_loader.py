"""``TypedNeighborLoader``: the typed training pipeline's mini-batches for a training loop of your own.

The loader builds its mode as ``train()`` builds a typed run's (``build_typed_mode``, over the graph with
its reverse relations added, fanouts per relation resolved by ``typed_fanouts``, the rows gathered by
``TypedInputs``, threads from ``thread_budget``), so its batches come from the same producer thread,
the same prefetching and the same device placement. Its seeds reach the mode as the mode's seeds (the
target type's training vertices in ``train()``); ``shuffle=False`` keeps their given order every epoch.
Epochs, resume and the iteration's lifetime are ``EpochSource``'s (epochs.py).

NeutronOrch mode is not offered: its batches hold bottom-layer rows the host computes from snapshots of
the model's weights and embedding rows taken between optimizer steps, checked for staleness against the
steps taken, and its last step of a super-batch adds the hot rows' gradient: the mode needs the model and
every step, which ``train()`` owns and a loop of one's own does not hand over.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Iterator

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.errors import ConfigError
from neutronorch.loader.arguments import check_device, check_mode, resolve_seeds, resolve_typed_graph
from neutronorch.loader.epochs import EpochSource
from neutronorch.loader.typed_batch import TypedLayout, TypedLoaderBatch
from neutronorch.orchestration.factory import build_typed_mode
from neutronorch.sampling.typed_sampler import typed_fanouts
from neutronorch.train.resources import check_threading_layer, thread_budget
from neutronorch.train.typed_inputs import TypedInputs

__all__ = ["TypedNeighborLoader"]


class TypedNeighborLoader(EpochSource):
    """Mini-batches of sampled typed neighbourhoods of target vertices, one epoch per iteration.

    ``TypedNeighborLoader(graph, fanouts, batch_size, *, seeds="train", shuffle=True, seed=0, device="cpu",
    mode="exact", epoch=0, start=0, drop_last=False, sampler_threads=0, prefetch=2, model=None,
    gpu_memory_gb=None)``

    ``graph``: a ``TypedGraph`` or the path of a typed dataset (``load_typed_dataset``); its reverse
    relations are added (``with_reverse``), as ``train()`` adds them: ``loader.graph`` is that graph.
    ``fanouts``: one list for every relation, seed hop first (``[10, 5]`` or ``"10,5"``; -1: all, 0: none),
    or a dict per relation with a ``"default"`` (``typed_fanouts``). ``seeds``: ``"train"`` (default),
    ``"val"``, ``"test"``, ``"all"``, ids of the target type or a boolean mask over it. The seed order of
    epoch ``e`` and every draw derive from (``seed``, ``e``, batch number) alone: ``train()`` with the same
    seed, batch size and fanouts samples the same batches in its epoch ``e``. Each ``iter(loader)`` runs
    epoch ``loader.epoch`` (``epoch`` at first) and moves it on by one; ``set_epoch(e)`` chooses the next;
    ``start=k`` begins the first iteration at batch ``k``, ``iter_from(k)`` any epoch's. ``mode``: ``exact``
    (sampling and gathering on the host, in a background thread) or ``device`` (topology, rows and labels
    placed on ``device`` once, each batch sampled there; ``model``, your module, and ``gpu_memory_gb`` size
    that placement's budget). ``neutronorch`` is refused: it needs ``train()``.

    Each batch (``TypedLoaderBatch``) holds ``blocks``, ``features``, ``ids``, ``seeds``, ``y``,
    ``batch_size``, ``input_id``; ``to_pyg()`` gives PyG's ``HeteroData``, ``to_dgl()`` DGL's blocks. A new
    iteration closes the one before it (another thread's is refused:
    one loader per thread); ``close()`` (or ``with``) ends everything."""

    def __init__(self, graph, fanouts, batch_size: int, *, seeds="train", shuffle: bool = True, seed: int = 0,
                 device="cpu", mode: str = "exact", epoch: int = 0, start: int = 0, drop_last: bool = False,
                 sampler_threads: int = 0, prefetch: int = 2, model: torch.nn.Module | None = None,
                 gpu_memory_gb: float | None = None):
        graph = resolve_typed_graph(graph)
        self.mode_name = check_mode(mode)
        self.seeds = torch.from_numpy(resolve_seeds(graph, seeds))
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"`model`: expected your torch.nn.Module (device mode counts its parameters in the "
                              f"device's budget), not a {type(model).__name__}.")
        self._epochs(int(self.seeds.shape[0]), batch_size, seed, epoch, shuffle, drop_last)
        self.device = check_device(device)
        self.graph = graph = _labelled(graph.with_reverse())
        self.fanouts = typed_fanouts(graph, fanouts)
        layers = {len(hops) for hops in self.fanouts.values()}
        if getattr(model, "num_layers", None) is not None and layers != {model.num_layers}:
            raise ConfigError(f"`fanouts` give {'/'.join(map(str, sorted(layers)))} layer(s) and `model` has "
                              f"{model.num_layers}: its batches would not fit the model. Give one fanout per layer.")
        self.config = TrainConfig(dataset=graph.name, batch_size=self.batch_size, seed=self.seed, mode=self.mode_name,
                                  device=self.device.type, prefetch=prefetch, sampler_threads=sampler_threads,
                                  gpu_memory_gb=gpu_memory_gb, epochs=1).validate()
        self._start = self._check_start(start)
        self.layout = TypedLayout({t: graph.feature_dim(t) for t in graph.num_nodes},
                                  {r: rel.edge_feature_dim for r, rel in graph.relations.items()}, graph.target,
                                  lambda ids: _labels(graph, ids.cpu().numpy()).to(ids.device))
        check_threading_layer(self.device)
        self.threads = thread_budget(self.config)
        self._batches = -(-self._count // self.batch_size)  # the mode's, the partial one included
        self.mode = build_typed_mode(
            self.config, graph, model if model is not None else torch.nn.Module(), self.fanouts, self.seeds,
            self._batches, self.device, TypedInputs(graph),
            lambda ids: _labels(graph, ids), self.threads)
        self.mode.shuffle = self.shuffle  # False: the seeds in their given order (train() always shuffles)
        self._finalizer = weakref.finalize(self, self.mode.close)

    def _produce(self, epoch: int, start: int) -> Iterator[TypedLoaderBatch]:
        stop = len(self)
        if start >= stop:
            return
        order = self.input_order(epoch)
        with self.mode.epoch(epoch, self._batches, start) as produced:  # its thread stops when this is closed
            for index, batch in enumerate(produced, start=start):
                if index >= stop:  # drop_last: the partial batch
                    break
                # What the trainer calls first on a batch: device mode's stream waits for the batch there (the
                # loader's modes reuse no rows).
                self.mode.hot_rows(batch, 0)
                k = index * self.batch_size
                yield TypedLoaderBatch(batch, epoch, index, order[k:k + self.batch_size].to(self.device),
                                       self.layout)

    def _close_mode(self) -> None:
        self._finalizer()

    def _describe(self) -> str:
        return f"seeds={self._count:,} of {self.graph.target}"


def _labelled(graph):
    """``graph``, given labels of -1 on its target where it has none (its batches' ``y``)."""
    if graph.labels is not None:
        return graph
    return dataclasses.replace(graph, labels=np.full(graph.num_nodes[graph.target], -1, dtype=np.int64))


def _labels(graph, ids: np.ndarray) -> torch.Tensor:
    """The labels of target ids, int64 (a memory-mapped array is read at those rows only)."""
    return torch.from_numpy(np.asarray(graph.labels[ids], dtype=np.int64))
