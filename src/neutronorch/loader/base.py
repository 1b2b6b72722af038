"""What every loader shares: arguments, the mode, epochs, iteration, resume and the lifetime of batches.

A loader builds a mode exactly as ``train()`` does (``build_mode`` from a ``TrainConfig``, threads from
``thread_budget``; a ``TypedGraph`` gets its typed mode, with fanouts per relation), so its batches come from
the same pipeline: the multi-threaded numba sampler in a background producer, gathers into pooled (on CUDA
pinned) buffers, copies to the device on a side stream, the device feature cache and, for memory-mapped
features, the host cache and file-ordered reads. Each iteration is one epoch, ``mode.batches(epoch, start)``
under a ``with``, so its producer thread stops when the epoch ends, on ``break`` and on an exception. What
runs on which kind of graph is ``capabilities.py``'s table (``refusal``).

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

from neutronorch.capabilities import TYPED_DOCS, check_run, refusal
from neutronorch.config import TrainConfig
from neutronorch.data import Graph, TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.loader.arguments import check_device, check_mode, resolve_graph
from neutronorch.loader.batch import SampledBatch
from neutronorch.loader.epochs import EpochIterator, EpochSource
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.mode import Mode, StepInputs
from neutronorch.sampling.typed_sampler import typed_fanouts
from neutronorch.train.resources import check_threading_layer, thread_budget

__all__ = ["EpochLoader", "EpochIterator", "LOADER_OPTIONS"]

# TrainConfig settings a loader passes on (the rest are the trainer's: model, optimizer, evaluation, outputs).
LOADER_OPTIONS = ("hidden", "heads", "gcn_norm", "precision", "gpu_memory_gb", "gpu_cache_gb", "cache_policy",
                  "read_order", "host_cache_gb", "host_cache_dir")
TYPED_OPTIONS = ("gpu_memory_gb",)  # a typed graph's modes size nothing else by the model's settings


class EpochLoader(EpochSource):
    """Mini-batches of sampled neighbourhoods of a ``Graph`` or a ``TypedGraph``, one epoch per iteration
    (``NeighborLoader`` and ``LinkNeighborLoader`` document the arguments)."""

    task = "node"  # capabilities.py's task of the loader's batches

    def __init__(self, graph, fanouts, batch_size: int, *, shuffle: bool = True, seed: int = 0, device="cpu",
                 mode: str = "exact", epoch: int = 0, start: int = 0, drop_last: bool = False,
                 sampler_threads: int = 0, prefetch: int = 2, reuse_buffers: bool = True, model=None, **options):
        self.graph = resolve_graph(graph)
        self.typed = isinstance(self.graph, TypedGraph)
        self.mode_name = check_mode(mode)
        refused = refusal("typed" if self.typed else "homogeneous", self.mode_name, self.task)
        if refused is not None:
            raise ConfigError(refused + (TYPED_DOCS if self.typed else ""))
        if self.typed and model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"`model`: on a typed graph, your torch.nn.Module (device mode counts its parameters "
                              f"in the device's budget), not a {type(model).__name__}.")
        view, count, task = self._resolve()
        self._epochs(count, batch_size, seed, epoch, shuffle, drop_last)
        self.device = check_device(device)
        self.reuse_buffers = bool(reuse_buffers)
        self.config = self._config(fanouts, model, prefetch, sampler_threads, options, task)
        self._start = self._check_start(start)
        check_threading_layer(self.device)
        self.threads = thread_budget(self.config)
        self.mode: Mode | None = build_mode(self.config, view, self.device, self.threads,
                                            fanouts=self.fanouts if self.typed else None)
        self._finalizer = weakref.finalize(self, self.mode.close)
        self.mode.start(model if self.typed and model is not None else torch.nn.Module())  # typed device mode: placed

    def _resolve(self) -> tuple[Graph | TypedGraph, int, dict]:
        """The graph the mode samples from, the items of an epoch and the ``TrainConfig`` settings of the
        task (a subclass's)."""
        raise NotImplementedError

    def _make_batch(self, minibatch, inputs: StepInputs, input_id: torch.Tensor):
        raise NotImplementedError

    def _config(self, fanouts, model, prefetch, sampler_threads, options, task) -> TrainConfig:
        """The run's settings as ``train()`` would take them; a typed graph's ``fanouts`` per relation
        (``typed_fanouts``), checked against the layers of ``model`` where it says how many it has."""
        taken = TYPED_OPTIONS if self.typed else LOADER_OPTIONS
        unknown = sorted(set(options) - set(taken))
        if unknown:
            raise ConfigError(f"{type(self).__name__} got unexpected option(s) {', '.join(unknown)}; on a "
                              f"{'typed' if self.typed else 'homogeneous'} graph it takes {', '.join(taken)} "
                              f"besides its named arguments.")
        if self.typed:
            self.fanouts = typed_fanouts(self.graph, fanouts)
            layers = {len(hops) for hops in self.fanouts.values()}
            if getattr(model, "num_layers", None) is not None and layers != {model.num_layers}:
                raise ConfigError(f"`fanouts` give {'/'.join(map(str, sorted(layers)))} layer(s) and `model` has "
                                  f"{model.num_layers}: its batches would not fit the model. Give one fanout per "
                                  f"layer.")
        else:
            if options.get("precision", "fp32") not in ("fp32", "bf16"):
                raise ConfigError(f"`precision` {options['precision']!r}: the loader's rows are fp32 or bf16.")
            if isinstance(fanouts, bool) or isinstance(fanouts, (int, float, dict, set)):
                raise ConfigError(f"`fanouts` {fanouts!r}: expected a list of neighbours per hop, seed hop first, "
                                  f"such as [15, 10, 5] or '15,10,5' (-1: every neighbour).")
            task = dict(task, fanouts=fanouts, model="sage" if model is None else model)
        config = TrainConfig(dataset=self.graph.name, batch_size=self.batch_size, seed=self.seed,
                             mode=self.mode_name, device=self.device.type, prefetch=prefetch,
                             sampler_threads=sampler_threads, epochs=1, **task, **options).validate()
        check_run(config, "typed" if self.typed else "homogeneous")  # a setting this kind of graph cannot honour
        config.sampling = dataclasses.replace(config.sampling, shuffle=self.shuffle)  # the trainer always shuffles
        if not self.typed:
            self.fanouts = list(config.fanouts)
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

    def _batch(self, minibatch, order: torch.Tensor):
        inputs = self.mode.step_inputs(minibatch)  # on CUDA: the current stream waits for the batch's copies
        k = minibatch.index * self.batch_size
        return self._make_batch(minibatch, inputs, order[k:k + self.batch_size].to(self.device, non_blocking=True))

    def _close_mode(self) -> None:
        self._finalizer()
