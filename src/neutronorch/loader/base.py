"""What every loader shares: arguments, the mode, epochs, iteration, resume and the lifetime of batches.

A loader builds a mode exactly as ``train()`` does (``build_mode`` from a ``TrainConfig``, threads from
``thread_budget``), so its batches come from the same pipeline: the multi-threaded numba sampler in a
background producer, gathers into pooled (on CUDA pinned) buffers, copies to the device on a side stream,
the device feature cache and, for memory-mapped features, the host cache and file-ordered reads. Each
iteration is one epoch, ``mode.batches(epoch, start)`` under a ``with``, so its producer thread stops when
the epoch ends, on ``break`` and on an exception.

Epochs, resume and the iteration's lifetime are ``EpochSource``'s (epochs.py). A subclass says what an
epoch is made of (``_resolve``: the vertices or edges it takes, in batches of
``batch_size``, and the view of the graph its mode reads them from) and what a batch looks like
(``_make_batch``); the order of epoch ``e`` is the mode's own permutation of those items
(``epoch_order(seed, e)``), so ``input_order`` names each batch's items without asking the mode.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Iterator

import torch

from neutronorch.config import TrainConfig
from neutronorch.data import Graph
from neutronorch.errors import ConfigError
from neutronorch.loader.arguments import check_device, check_mode, resolve_graph
from neutronorch.loader.batch import SampledBatch
from neutronorch.loader.epochs import EpochIterator, EpochSource
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.mode import Mode
from neutronorch.train.resources import check_threading_layer, thread_budget

__all__ = ["EpochLoader", "EpochIterator", "LOADER_OPTIONS"]

# TrainConfig settings a loader passes on (the rest are the trainer's: model, optimizer, evaluation, outputs).
LOADER_OPTIONS = ("hidden", "heads", "gcn_norm", "precision", "gpu_memory_gb", "gpu_cache_gb", "cache_policy",
                  "read_order", "host_cache_gb", "host_cache_dir")


class EpochLoader(EpochSource):
    """Mini-batches of sampled neighbourhoods, one epoch per iteration (``NeighborLoader`` and
    ``LinkNeighborLoader`` document the arguments)."""

    def __init__(self, graph, fanouts, batch_size: int, *, shuffle: bool = True, seed: int = 0, device="cpu",
                 mode: str = "exact", epoch: int = 0, start: int = 0, drop_last: bool = False,
                 sampler_threads: int = 0, prefetch: int = 2, reuse_buffers: bool = True, model: str = "sage",
                 **options):
        self.graph = resolve_graph(graph)
        self.mode_name = check_mode(mode)
        view, count, task = self._resolve()
        self._epochs(count, batch_size, seed, epoch, shuffle, drop_last)
        self.device = check_device(device)
        self.reuse_buffers = bool(reuse_buffers)
        self.config = self._config(fanouts, model, prefetch, sampler_threads, options, task)
        self.fanouts = list(self.config.fanouts)
        self._start = self._check_start(start)
        check_threading_layer(self.device)
        self.threads = thread_budget(self.config)
        self.mode: Mode | None = build_mode(self.config, view, self.device, self.threads)
        self._finalizer = weakref.finalize(self, self.mode.close)

    def _resolve(self) -> tuple[Graph, int, dict]:
        """The graph the mode samples from, the items of an epoch and the ``TrainConfig`` settings of the
        task (a subclass's)."""
        raise NotImplementedError

    def _make_batch(self, minibatch, blocks, x: torch.Tensor, input_id: torch.Tensor, reused: bool) -> SampledBatch:
        raise NotImplementedError

    def _config(self, fanouts, model, prefetch, sampler_threads, options, task) -> TrainConfig:
        unknown = sorted(set(options) - set(LOADER_OPTIONS))
        if unknown:
            raise ConfigError(f"{type(self).__name__} got unexpected option(s) {', '.join(unknown)}; it takes "
                              f"{', '.join(LOADER_OPTIONS)} besides its named arguments.")
        if options.get("precision", "fp32") not in ("fp32", "bf16"):
            raise ConfigError(f"`precision` {options['precision']!r}: the loader's rows are fp32 or bf16.")
        if isinstance(fanouts, bool) or isinstance(fanouts, (int, float, dict, set)):
            raise ConfigError(f"`fanouts` {fanouts!r}: expected a list of neighbours per hop, seed hop first, "
                              f"such as [15, 10, 5] or '15,10,5' (-1: every neighbour).")
        config = TrainConfig(dataset=self.graph.name, fanouts=fanouts, batch_size=self.batch_size,
                             seed=self.seed, mode=self.mode_name, device=self.device.type, model=model,
                             prefetch=prefetch, sampler_threads=sampler_threads, epochs=1, **task,
                             **options).validate()
        config.sampling = dataclasses.replace(config.sampling, shuffle=self.shuffle)  # the trainer always shuffles
        return config

    def _produce(self, epoch: int, start: int) -> Iterator[SampledBatch]:
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

    def _batch(self, minibatch, order: torch.Tensor) -> SampledBatch:
        inputs = self.mode.step_inputs(minibatch)  # on CUDA: the current stream waits for the batch's copies
        k = minibatch.index * self.batch_size
        input_id = order[k:k + self.batch_size].to(self.device, non_blocking=True)
        x, reused = inputs.features, self.reuse_buffers
        if not reused:
            if x.device.type == "cpu":
                x = x.clone()
            minibatch.release()
        return self._make_batch(minibatch, inputs.blocks, x, input_id, reused)

    def _close_mode(self) -> None:
        self._finalizer()
