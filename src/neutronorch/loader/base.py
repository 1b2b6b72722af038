"""What every loader shares: arguments, the mode, epochs, iteration, resume and the lifetime of batches.

A loader builds a mode exactly as ``train()`` does (``build_mode`` from a ``TrainConfig``, threads from
``thread_budget``), so its batches come from the same pipeline; what runs on which kind of graph is
``capabilities.py``'s table. Each ``iter(loader)`` runs epoch ``loader.epoch`` (``mode.batches(epoch,
start)`` in an ``EpochIterator``, whose producer thread stops with it) and moves it on by one, as a PyG loop
that iterates the loader once per epoch expects. A subclass says what an epoch is made of (``_resolve``) and
what a batch looks like (``_make_batch``); epoch ``e`` takes its items in the mode's order
``epoch_order(seed, e)``."""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Iterator

import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig
from neutronorch.data import Graph, TypedGraph
from neutronorch.data.feature_norm import normalized
from neutronorch.errors import ConfigError
from neutronorch.limits import check_seed, check_switch
from neutronorch.loader.arguments import check_count, check_mode, resolve_graph
from neutronorch.loader.batch import SampledBatch
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.mode import Mode, StepInputs
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.sampling.typed_sampler import typed_fanouts
from neutronorch.train.resources import check_threading_layer, resolve_device, thread_budget

# TrainConfig settings a loader passes on (the rest are the trainer's: model, optimizer, evaluation, outputs).
LOADER_OPTIONS = ("hidden", "heads", "gcn_norm", "precision", "gpu_memory_gb", "gpu_cache_gb", "cache_policy",
                  "read_order", "host_cache_gb", "host_cache_dir", "normalize_features")
# A typed graph's modes size nothing else by the model's settings; its featured types' rows are normalised too.
TYPED_OPTIONS = ("gpu_memory_gb", "normalize_features")


class EpochLoader:
    """Mini-batches of ``batch_size`` of an epoch's ``_count`` items (seeds or seed edges), one epoch per
    iteration (arguments: ``NeighborLoader``, ``LinkNeighborLoader``)."""

    task = "node"  # capabilities.py's task of the loader's batches
    items = "seeds"  # what an epoch is made of, in messages
    mode = None  # None once closed
    temporal = None  # a TemporalRequest: the seeds are sampled at their times (docs/temporal.md)

    def __init__(self, graph, fanouts, batch_size: int, *, shuffle: bool = True, seed: int = 0, device="cpu",
                 mode: str = "exact", epoch: int = 0, start: int = 0, drop_last: bool = False,
                 sampler_threads: int = 0, prefetch: int = 2, reuse_buffers: bool = True, model=None, **options):
        # The rows its batches carry, as train() reads them with the same setting (docs/loader.md).
        self.graph = normalized(resolve_graph(graph), options.get("normalize_features", "none"))
        self.typed = isinstance(self.graph, TypedGraph)
        self.kind = "typed" if self.typed else "homogeneous"  # capabilities.py's name for it
        self.mode_name = check_mode(mode, self.kind, self.task)
        if self.typed and model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"`model`: on a typed graph, your torch.nn.Module (device mode counts its parameters "
                              f"in the device's budget), not a {type(model).__name__}.")
        fields, self._count, task = self._resolve()
        view = dataclasses.replace(self.graph, notes=list(self.graph.notes), **fields)
        self.batch_size = check_count("batch_size", batch_size, 1)
        self.seed = check_seed(check_count("seed", seed, 0))
        self.epoch = check_count("epoch", epoch, 0)
        self.shuffle = check_switch(shuffle, "`shuffle`")
        self.drop_last = check_switch(drop_last, "`drop_last`")
        if self.drop_last and self._count < self.batch_size:
            raise ConfigError(f"`drop_last` with `batch_size` {self.batch_size}: the {self._count:,} "
                              f"{self.items} fill no whole batch, so every epoch would be empty. Give a "
                              f"batch_size of at most {self._count:,}, or drop_last=False.")
        self._active: weakref.ref | None = None
        self._iterating = threading.Lock()  # one thread at a time opens or closes an iteration
        self.device = resolve_device(device)
        self.reuse_buffers = bool(reuse_buffers)
        self.config = self._config(fanouts, model, prefetch, sampler_threads, options, task)
        self._start = self._check_start(start)
        check_threading_layer(self.device)
        self.threads = thread_budget(self.config)
        self.mode: Mode | None = build_mode(self.config, view, self.device, self.threads,
                                            fanouts=self.fanouts if self.typed else None, temporal=self.temporal)
        self._finalizer = weakref.finalize(self, self.mode.close)
        self.mode.start(model if self.typed and model is not None else torch.nn.Module())  # typed device mode: placed

    def _resolve(self) -> tuple[Graph | TypedGraph, int, dict]:
        """What the mode's view of the graph changes (its fields), the items of an epoch and the
        ``TrainConfig`` settings of the task (a subclass's)."""
        raise NotImplementedError

    def _make_batch(self, minibatch, inputs: StepInputs, input_id: torch.Tensor):
        raise NotImplementedError

    def _config(self, fanouts, model, prefetch, sampler_threads, options, task) -> TrainConfig:
        """The run's settings as ``train()`` would take them; a typed graph's ``fanouts`` per relation
        (``typed_fanouts``), checked against the layers of ``model`` where it says how many it has."""
        taken = TYPED_OPTIONS if self.typed else LOADER_OPTIONS
        unknown = sorted(set(options) - set(taken))
        if unknown:
            raise ConfigError(f"{type(self).__name__} got unexpected option(s) {', '.join(unknown)}; on a {self.kind} "
                              f"graph it takes {', '.join(taken)} besides its named arguments.")
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
        check_run(config, self.kind)  # a setting this kind of graph cannot honour
        config.sampling = dataclasses.replace(config.sampling, shuffle=self.shuffle)  # the trainer always shuffles
        if not self.typed:
            self.fanouts = list(config.fanouts)
        return config

    def _produce(self, epoch: int, start: int) -> Iterator[SampledBatch]:
        stop = len(self)
        if start >= stop:
            return
        order = torch.arange(self._count)  # positions among the loader's items, in the epoch's order
        order = epoch_order(order, self.seed, epoch) if self.shuffle else order
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
                    inputs = self.mode.step_inputs(minibatch)  # CUDA: the stream waits for its copies
                    k = minibatch.index * self.batch_size
                    input_id = order[k:k + self.batch_size].to(self.device, non_blocking=True)
                    held = self._make_batch(minibatch, inputs, input_id)
                    yield held
            finally:
                if held is not None:  # the last batch handed out stays valid, its buffer back in the pool
                    held._keep()

    def _check_start(self, start) -> int:
        start = check_count("start", start, 0)
        if start > len(self):
            raise ConfigError(f"`start` {start}: an epoch has {len(self)} batches of the {self._count:,} "
                              f"{self.items} (batch size {self.batch_size}); start at 0..{len(self)}.")
        return start

    def __len__(self) -> int:
        """Batches in an epoch."""
        return self._count // self.batch_size if self.drop_last else -(-self._count // self.batch_size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (its order and draws)."""
        self.epoch = check_count("epoch", epoch, 0)

    def __iter__(self) -> "EpochIterator":
        start, self._start = self._start, 0
        return self.iter_from(start)

    def iter_from(self, start: int = 0, epoch: int | None = None) -> "EpochIterator":
        """Epoch ``epoch`` (default: the next, ``loader.epoch``) from batch ``start`` on: exactly the batches
        ``start``, ``start + 1``, ... that a whole iteration of that epoch yields. Closes an iteration still
        open; the epoch after this one comes next."""
        if self.mode is None:
            raise ConfigError(f"this {type(self).__name__} is closed (close(), or its `with` block ended); make a "
                              f"new one to iterate again.")
        epoch = self.epoch if epoch is None else check_count("epoch", epoch, 0)
        start = self._check_start(start)
        with self._iterating:
            self._close_active()
            self.epoch = epoch + 1
            iterator = EpochIterator(self._produce(epoch, start), epoch, start, len(self) - start,
                                     type(self).__name__)
            self._active = weakref.ref(iterator)
        return iterator

    def _close_active(self) -> None:
        """Close the open iteration, which must be this thread's: a new iteration (or ``close``) from another
        thread while one runs would end it under its loop, a short epoch or batches of two epochs mixed."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active._check_thread("a new iteration cannot start" if self.mode is not None else "the loader cannot close")
            active.close()

    def close(self) -> None:
        """Stop the iteration in progress (its thread joined) and release what the mode holds."""
        with self._iterating:
            self._close_active()
            if self.mode is not None:
                self._finalizer()
                self.mode = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _describe(self) -> str:
        return f"{self.items}={self._count:,}" + (f" of {self.graph.target}" if self.typed else "")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.graph.name}, fanouts={self.fanouts}, batch_size={self.batch_size}, "
                f"{self._describe()}, mode={self.mode_name}, device={self.device}, epoch={self.epoch}, "
                f"batches={len(self)})")


class EpochIterator:
    """One epoch's batches: an iterator (with ``len``) and a context manager. Its producer thread stops when
    the epoch is done, when it is closed, or when it is dropped (``break``, an exception).

    An iteration belongs to the thread that last took a batch from it (at first, the one that made it): a
    second thread taking batches at the same time, or opening a new iteration of the loader while this one
    is unfinished, is refused with a ``ConfigError`` (the loader has one iteration at a time; each thread
    needs a loader of its own)."""

    def __init__(self, batches: Iterator, epoch: int, start: int, length: int, loader: str = "loader"):
        self._batches = batches
        self.epoch, self.start, self._length = epoch, start, length
        self._loader, self._taken, self._done = loader, 0, False
        self._owner = threading.current_thread()
        self._next_lock = threading.Lock()

    def __iter__(self) -> "EpochIterator":
        return self

    def __next__(self):
        if not self._next_lock.acquire(blocking=False):
            self._refuse("a batch cannot be taken while another is")
        try:
            self._owner = threading.current_thread()
            batch = next(self._batches)
            self._taken += 1
            return batch
        except BaseException:  # the epoch's end, or an error that ended its generator
            self._done = True
            raise
        finally:
            self._next_lock.release()

    def __len__(self) -> int:
        return self._length

    def _check_thread(self, what: str) -> None:
        """Refuse ``what`` from this thread while another thread iterates this unfinished epoch."""
        owner = self._owner
        if not self._done and owner is not threading.current_thread() and owner.is_alive():
            self._refuse(what)

    def _refuse(self, what: str) -> None:
        raise ConfigError(
            f"{self._loader}: {what} in thread {threading.current_thread().name!r}: thread "
            f"{self._owner.name!r} is iterating it (epoch {self.epoch}, {self._taken} of {self._length} batches "
            f"taken), and a loader runs one iteration at a time. Give each thread a loader of its own, or "
            f"iterate in one thread (set_epoch(e) or iter_from(start, epoch) choose the epoch).")

    def close(self) -> None:
        if not self._next_lock.acquire(blocking=False):
            self._refuse("the iteration cannot close while it takes a batch")
        try:
            self._done = True
            self._batches.close()
        finally:
            self._next_lock.release()

    def __enter__(self) -> "EpochIterator":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
