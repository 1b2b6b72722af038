"""``NeighborLoader``: the training pipeline's mini-batches for a training loop of your own.

The loader builds a mode exactly as ``train()`` does (``build_mode`` from a ``TrainConfig``, threads from
``thread_budget``), so its batches come from the same pipeline: the multi-threaded numba sampler in a
background producer, gathers into pooled (on CUDA pinned) buffers, copies to the device on a side stream,
the device feature cache and, for memory-mapped features, the host cache and file-ordered reads. Each
iteration is one epoch, ``mode.batches(epoch, start)`` under a ``with``, so its producer thread stops when
the epoch ends, on ``break`` and on an exception.

Seeds other than the training split reach the mode as the training split of a view of the graph (the same
arrays, ``train_idx`` replaced): modes read their seeds from ``graph.train_idx`` and nowhere else, and the
feature caches then rank rows by the loader's seeds. ``shuffle=False`` keeps their given order every epoch
(``SamplingConfig.shuffle``).
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Iterator

import torch

from neutronorch.config import TrainConfig
from neutronorch.errors import ConfigError
from neutronorch.loader.arguments import (check_count, check_device, check_mode, resolve_graph, resolve_seeds)
from neutronorch.loader.batch import LoaderBatch
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.mode import Mode
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.train.resources import check_threading_layer, thread_budget

__all__ = ["NeighborLoader", "EpochIterator"]

# TrainConfig settings a loader passes on (the rest are the trainer's: model, optimizer, evaluation, outputs).
LOADER_OPTIONS = ("hidden", "heads", "gcn_norm", "precision", "gpu_memory_gb", "gpu_cache_gb", "cache_policy",
                  "read_order", "host_cache_gb", "host_cache_dir")


class NeighborLoader:
    """Mini-batches of sampled neighbourhoods, one epoch per iteration.

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
    cost of a copy). A new iteration closes the one before it; ``close()`` (or ``with``) ends everything."""

    def __init__(self, graph, fanouts, batch_size: int, *, seeds="train", shuffle: bool = True, seed: int = 0,
                 device="cpu", mode: str = "exact", epoch: int = 0, start: int = 0, drop_last: bool = False,
                 sampler_threads: int = 0, prefetch: int = 2, reuse_buffers: bool = True, model: str = "sage",
                 **options):
        self.graph = resolve_graph(graph)
        self.mode_name = check_mode(mode)
        self.seeds = torch.from_numpy(resolve_seeds(self.graph, seeds))
        self.batch_size = check_count("batch_size", batch_size, 1)
        self.seed = check_count("seed", seed, 0)
        self.epoch = check_count("epoch", epoch, 0)
        self.device = check_device(device)
        self.shuffle, self.drop_last, self.reuse_buffers = bool(shuffle), bool(drop_last), bool(reuse_buffers)
        self.config = self._config(fanouts, model, prefetch, sampler_threads, options)
        self.fanouts = list(self.config.fanouts)
        self._start = self._check_start(start)
        self._active: weakref.ref | None = None
        self._labels: torch.Tensor | None = None
        check_threading_layer()
        self.threads = thread_budget(self.config)
        view = dataclasses.replace(self.graph, train_idx=self.seeds.numpy(), notes=list(self.graph.notes))
        self.mode: Mode | None = build_mode(self.config, view, self.device, self.threads)
        self._finalizer = weakref.finalize(self, self.mode.close)

    def _config(self, fanouts, model, prefetch, sampler_threads, options) -> TrainConfig:
        unknown = sorted(set(options) - set(LOADER_OPTIONS))
        if unknown:
            raise ConfigError(f"NeighborLoader got unexpected option(s) {', '.join(unknown)}; it takes "
                              f"{', '.join(LOADER_OPTIONS)} besides its named arguments.")
        if options.get("precision", "fp32") not in ("fp32", "bf16"):
            raise ConfigError(f"`precision` {options['precision']!r}: the loader's rows are fp32 or bf16.")
        if isinstance(fanouts, bool) or isinstance(fanouts, (int, float, dict, set)):
            raise ConfigError(f"`fanouts` {fanouts!r}: expected a list of neighbours per hop, seed hop first, "
                              f"such as [15, 10, 5] or '15,10,5' (-1: every neighbour).")
        config = TrainConfig(dataset=self.graph.name, fanouts=fanouts, batch_size=self.batch_size,
                             seed=self.seed, mode=self.mode_name, device=self.device.type, model=model,
                             prefetch=prefetch, sampler_threads=sampler_threads, epochs=1, **options).validate()
        config.sampling = dataclasses.replace(config.sampling, shuffle=self.shuffle)  # the trainer always shuffles
        return config

    def _check_start(self, start) -> int:
        start = check_count("start", start, 0)
        if start > len(self):
            raise ConfigError(f"`start` {start}: an epoch has {len(self)} batches of the {len(self.seeds):,} seeds "
                              f"(batch size {self.batch_size}); start at 0..{len(self)}.")
        return start

    # -- epochs ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches in an epoch."""
        n = int(self.seeds.shape[0])
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (its seed order and draws)."""
        self.epoch = check_count("epoch", epoch, 0)

    def __iter__(self) -> "EpochIterator":
        start, self._start = self._start, 0
        return self.iter_from(start)

    def iter_from(self, start: int = 0, epoch: int | None = None) -> "EpochIterator":
        """Epoch ``epoch`` (default: the next, ``loader.epoch``) from batch ``start`` on: exactly the batches
        ``start``, ``start + 1``, ... that a whole iteration of that epoch yields. Closes an iteration still
        open; the epoch after this one comes next."""
        if self.mode is None:
            raise RuntimeError("this NeighborLoader is closed; make a new one")
        epoch = self.epoch if epoch is None else check_count("epoch", epoch, 0)
        start = self._check_start(start)
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self.epoch = epoch + 1
        iterator = EpochIterator(self._produce(epoch, start), epoch, start, len(self) - start)
        self._active = weakref.ref(iterator)
        return iterator

    def input_order(self, epoch: int) -> torch.Tensor:
        """Positions in ``seeds`` in the order epoch ``epoch`` takes them (the mode's own permutation)."""
        positions = torch.arange(self.seeds.shape[0])
        return epoch_order(positions, self.seed, epoch) if self.shuffle else positions

    def _produce(self, epoch: int, start: int) -> Iterator[LoaderBatch]:
        stop = len(self)
        if start >= stop:
            return
        order = self.input_order(epoch)
        held = None
        with self.mode.batches(epoch, start) as batches:  # its thread stops when this generator is closed
            try:
                for minibatch in batches:
                    if held is not None:
                        held._release()
                        held = None
                    if minibatch.index >= stop:  # drop_last: the partial batch
                        minibatch.release()
                        break
                    held = self._batch(minibatch, order)
                    yield held
            finally:
                if held is not None:  # the last batch handed out stays valid, its buffer back in the pool
                    held._keep()

    def _batch(self, minibatch, order: torch.Tensor) -> LoaderBatch:
        inputs = self.mode.step_inputs(minibatch)  # on CUDA: the current stream waits for the batch's copies
        k = minibatch.index * self.batch_size
        input_id = order[k:k + self.batch_size].to(self.device, non_blocking=True)
        x, reused = inputs.features, self.reuse_buffers
        if not reused:
            if x.device.type == "cpu":
                x = x.clone()
            minibatch.release()
        return LoaderBatch(minibatch, inputs.blocks, x, input_id, self._labels_of, reused)

    def _labels_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Labels of global ids (PyG's ``y``, one per sampled vertex), on the ids' device."""
        if self._labels is None or self._labels.device != ids.device:
            self._labels = self.mode.store.labels.to(ids.device)
        return self._labels.index_select(0, ids)

    # -- lifetime -------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the iteration in progress (its thread joined) and release what the mode holds."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        if self.mode is not None:
            self._finalizer()
            self.mode = None

    def __enter__(self) -> "NeighborLoader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"NeighborLoader({self.graph.name}, fanouts={self.fanouts}, batch_size={self.batch_size}, "
                f"seeds={self.seeds.shape[0]:,}, mode={self.mode_name}, device={self.device}, epoch={self.epoch}, "
                f"batches={len(self)})")


class EpochIterator:
    """One epoch's batches: an iterator (with ``len``) and a context manager. Its producer thread stops when
    the epoch is done, when it is closed, or when it is dropped (``break``, an exception)."""

    def __init__(self, batches: Iterator[LoaderBatch], epoch: int, start: int, length: int):
        self._batches = batches
        self.epoch, self.start, self._length = epoch, start, length

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self) -> LoaderBatch:
        return next(self._batches)

    def __len__(self) -> int:
        return self._length

    def close(self) -> None:
        self._batches.close()

    def __enter__(self) -> "EpochIterator":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
