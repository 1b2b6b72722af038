"""Node classification on typed graphs, in exact, device or NeutronOrch mode: ``train_typed(config, graph)``.

``neutronorch.train(config, graph=typed_graph)`` (or ``config.dataset`` naming a typed folder, the native typed
layout or OGB's ogbn-mag layout: ``is_typed_run``) runs this, through ``train_typed_run``. One epoch: the target type's training vertices in the order ``epoch_order(seed, epoch)`` gives them
(the homogeneous loaders' order), in batches of ``batch_size``; each batch sampled by a
``TypedNeighborSampler`` with the key ``batch_key(seed, epoch, batch)``; every input type's rows gathered for
the bottom frontier (``gather_rows`` from the possibly memory-mapped features, as float32); a
``TypedGNN`` forward, the task's loss on the seeds' labels (``train/task.py``: cross-entropy, or binary
cross-entropy for multi-label targets), and one step of two optimizers: Adam (``lr``, ``weight_decay``) for
the dense weights, ``RowAdam`` (``train/row_adam.py``: ``torch.optim.SparseAdam``'s update, ``lr``, no
weight decay) for the featureless types' embedding tables, which moves only the rows the batch looked up.
The same seed gives the same losses: the seed order, the samples and the dropout masks are keyed by it.

The batches come from the run's mode (``orchestration/factory.py``'s ``build_mode``, given the typed graph),
and the epochs run through the homogeneous runs' loop (``train/loop.py``'s ``train_epoch``, each step
``train/step.py``'s ``train_step`` with both optimizers and the forward pass in ``step_masks``): exact mode
samples and gathers each batch whole on a producer thread (``orchestration/exact.py``), device mode on
the training device (``orchestration/device.py``), NeutronOrch mode reuses hot rows computed on a host thread
(``orchestration/neutronorch/``: the mode protocol's ``step_inputs`` hands them to the model, ``before_step`` adds
their gradient). The producers run numba at ``sampler_threads`` (``thread_budget``: half the cores by
default); the trainer runs torch and numba at ``threads`` (default all cores) each. A batch depends on its key
only, so the losses are those of sampling inline. An epoch's record is a homogeneous one's (its
``stage_seconds`` hold the producer's ``sample`` and ``gather`` time, overlapped with training, NeutronOrch's
planning and host stages, and the trainer's ``wait`` for a batch besides ``forward``, ``backward`` and
``step``), with NeutronOrch's ``hot_ratio`` and ``snapshot_lead``.

The graph's relations are made two-way first (``TypedGraph.with_reverse``: a reverse for every relation
without one, built in memory): papers then hear from their authors and authors from their papers, as PyG's
``ToUndirected`` does in its ogbn-mag examples, and every type a model reads has a relation into it.

Fanouts: ``config.fanouts`` for every relation, or ``fanouts`` given here as ``typed_fanouts`` reads them
(per relation, with a ``"default"``); relations are named after the reverses are added (``rev_writes``).

Evaluation (``eval_every``, as in homogeneous runs) scores the validation and test vertices in batches of
``eval_batch_size``, the model in eval mode, from sampled neighbourhoods with the training fanouts (or
``eval_fanouts``, one list for every relation; -1 takes all) and one fixed key, ``inference_key(seed)``, as
predictions sample: every evaluation sees the same sample, whatever the batches, so epochs' scores compare
and ``predict`` of the test vertices gives the test score, and the model sees
neighbourhoods of the size it trained on. Full neighbourhoods are not the default because through a hub
relation (a popular field of study, linked to most papers) two hops from a batch reach nearly the whole
graph; ``eval_fanouts -1`` asks for them where the graph is small enough.

What typed graphs cannot do yet (each refused with a ``ConfigError`` that says so, ``capabilities.check_run``):
link tasks, your own module in NeutronOrch mode or with checkpoints, graph blocks, residual connections and
normalisation layers, NeutronOrch mode on several ranks, and a ``split`` (the typed graph carries its own).
Data parallel (``torchrun``, a process group), exact and device mode train as one process with the global batch
would: ``train/typed_distributed.py``, called through small hooks (``rank_settings`` to ``shared_logits``).
Summary and metric logs (``summary_json``, ``log_jsonl``, ``log_csv``, ``tensorboard``), ``patience``,
``eval_max_nodes``, ``metric`` and checkpoints (``checkpoint_dir``, ``checkpoint_every``, ``resume``: exact
to the bit, ``train/typed_checkpoint.py``) work as in homogeneous runs: the same driver (``train/run.py``'s
``run_epochs`` and ``summarised``) runs both, asking the run for what differs (``_TypedRun``'s ``train_epoch``,
``evaluate``, ``checkpoint`` and ``summary``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from pathlib import Path
import numpy as np
import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data import Graph, TypedGraph, is_typed_dataset, load_typed_dataset
from neutronorch.data.typed_native import is_typed_dir, read_typed
from neutronorch.errors import ConfigError
from neutronorch.nn.precision import resolve_precision
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.orchestration.factory import Threads, build_mode
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.evaluate import eval_subset, scored
from neutronorch.train.feasible import check_learnable
from neutronorch.train.health import Health
from neutronorch.observe import Spans, Utilisation
from neutronorch.train.loop import EpochControl, Progress, TimelineWindow, step_sync, train_epoch
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.optim import Adam
from neutronorch.train.outputs import check_checkpoint_space, check_outputs
from neutronorch.train.resume import write_checkpoint
from neutronorch.train.run import RunState, run_epochs, summarised
from neutronorch.train.summary import typed_summary
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.resources import (check_threading_layer, numba_threads, resolve_device, thread_budget,
                                         torch_threads)
from neutronorch.train.row_adam import RowAdam
from neutronorch.train.task import Task
from neutronorch.train.distributed import join_ranks, launched_rank, rank_device, ranks_here, world_size
from neutronorch.train.typed_checkpoint import resume_typed, save_typed_checkpoint, typed_fingerprint
from neutronorch.train.typed_distributed import data_parallel, rank_settings, shared_logits, step_masks
from neutronorch.train.typed_inputs import typed_files, typed_logits
from neutronorch.train.typed_own import check_own_model_config, own_typed_model
from neutronorch.train.typed_tables import TypedTables, plan_tables

logger = logging.getLogger("neutronorch")


def is_typed_run(config: TrainConfig, graph: Graph | TypedGraph | None) -> bool:
    """Whether ``train`` trains a typed graph."""
    return isinstance(graph, TypedGraph) or (graph is None and is_typed_dataset(config.dataset))


def train_typed_run(config: TrainConfig, graph: TypedGraph | None, progress, stop: threading.Event | None,
                    model: torch.nn.Module | None) -> dict:
    """``train`` for a typed run: the graph loaded when only named (OGB's layout takes parsing, so the settings
    and outputs are checked first), then ``train_typed``, with ``model`` (your own module: ``train/typed_own.py``)
    when given."""
    if model is not None:
        check_own_model_config(config)  # before the graph is read
    if graph is not None:
        graph.check_given()  # one built or changed by hand is checked as a loaded one is
    if graph is None and not is_typed_dir(Path(config.dataset).expanduser()):
        check_run(config, "typed", world_size())
        check_outputs(config)
        graph = load_typed_dataset(config.dataset)
    return train_typed(config, graph, progress, stop, model=model)


def train_typed(config: TrainConfig, graph: TypedGraph | None = None, progress: Progress | None = None,
                stop: threading.Event | None = None, fanouts=None, num_bases: int | None = None,
                embed_dim: int | None = None, model: torch.nn.Module | None = None) -> dict:
    """Train ``config.model`` (sage, rgcn or rgat) on ``graph`` (default: the typed folder ``config.dataset``)
    in the mode ``config.mode`` names and return the run summary (also written to ``summary_json``).
    ``fanouts``: per-relation fanouts (``typed_fanouts``) instead of ``config.fanouts``; ``num_bases``: R-GCN's
    basis decomposition;
    ``embed_dim``: the featureless types' table width for sage and rgat (default ``hidden``); ``model``: your
    own module instead (``train/typed_own.py``: ``forward(blocks, features, ids)``, exact and device mode).
    ``progress(epoch, done, total)`` after every step (and its ``loss``/``evaluating`` methods, when it has
    them, as ``train`` calls them); setting ``stop`` ends the run after the current step, writes the summary
    marked interrupted and raises ``Interrupted``."""
    started = time.perf_counter()
    config = dataclasses.replace(config).validate()
    check_run(config, "typed", world_size())
    config = rank_settings(config)  # data parallel: only rank 0 writes the summary and logs
    data_seconds = 0.0
    if graph is None:
        graph = read_typed(Path(config.dataset).expanduser())
        data_seconds = time.perf_counter() - started
        logger.info(f"loaded {graph.name} in {data_seconds:.1f}s")
    check_outputs(config, {"graph": typed_files(graph)})
    if graph.labels is None:
        raise ConfigError(f"{graph.name}: its target type {graph.target!r} has no labels to train on.")
    for note in graph.notes if launched_rank() == 0 else []:  # the same on every rank
        logger.warning(f"note: {note}")
    warnings = check_learnable(graph)
    graph = graph.with_reverse()
    logger.info(graph.describe())
    device = rank_device(resolve_device(config.device))  # data parallel on CUDA: this rank's GPU
    precision = resolve_precision(config.precision, device)
    config.precision = precision.name
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(len(graph.train_idx))
    sampler = TypedNeighborSampler(graph, fanouts if fanouts is not None else config.fanouts)
    eval_sampler = (TypedNeighborSampler(graph, config.eval_fanouts) if config.eval_fanouts is not None
                    else TypedNeighborSampler(graph, sampler.fanouts))
    if eval_sampler.num_layers != sampler.num_layers:
        raise ConfigError(f"`eval_fanouts` has {eval_sampler.num_layers} entries but the fanouts give "
                          f"{sampler.num_layers} layers; give one per layer.")
    check_threading_layer(device)  # the producer and the trainer run numba kernels at once
    own, config = own_typed_model(model, config, graph, sampler.num_layers, device)  # your own module, or None
    budget = thread_budget(config, ranks_here())
    threads = budget.train  # torch's and, in this thread, numba's: the two pools take turns
    task = Task.of(graph, config.metric)
    tables = plan_tables(config, graph, sampler.num_layers, embed_dim, device)  # where the tables live, checked
    with contextlib.ExitStack() as stack:
        # Data parallel: the ranks; rank 0 holds checkpoint_dir and sets aside what `overwrite` replaces.
        world, replacing = join_ranks(stack, config, device)
        stack.enter_context(tables)  # memory-mapped tables: their files, open while the run lasts
        stack.enter_context(torch_threads(threads))
        stack.enter_context(numba_threads(threads))
        stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda" else []))
        torch.manual_seed(config.seed)
        try:
            model = own or TypedGNN(config.model, TypedSpec.of(graph), config.hidden, graph.num_classes,
                             sampler.num_layers, dropout=config.dropout, heads=config.heads, num_bases=num_bases,
                             embed_dim=embed_dim, tables=tables.maker).to(device)
        except ValueError as exc:
            raise ConfigError(f"{graph.name}: {exc}.") from None
        metrics = stack.enter_context(contextlib.closing(MetricLog(config.logging, task.key, append=config.resume)))
        run = _TypedRun(config, graph, model, task, sampler, eval_sampler, device, metrics, progress, stop, budget,
                        None if own else tables)  # your own module's tables are its own
        run.precision, run.replacing, run.started, run.data_seconds = precision, replacing, started, data_seconds
        run.health.warnings[:0] = warnings  # the settings' (train/feasible.py), before any collapse
        stack.enter_context(contextlib.closing(run.util))
        data_parallel(run, world)  # several ranks: global batches, the weights broadcast, run.sync and run.stop
        if config.checkpoint_dir:
            check_checkpoint_space(config, run.model.parameters())
            run.fingerprint = typed_fingerprint(graph)  # the graph does not change while the run lasts
            if config.resume:
                resume_typed(run)  # every rank, from last.pt
        stack.enter_context(contextlib.closing(run.open_mode()))  # where the run starts, its threads started
        logger.info(f"mode {run.mode.name}, model {config.model} (typed: {', '.join(graph.node_types)}), fanouts "
                    f"{config.fanouts if fanouts is None else fanouts}, device {device}, batch size "
                    f"{config.batch_size}, train threads {threads}, {run.mode.describe()}, {run.num_batches} batches "
                    f"per epoch, "
                    f"parameters {run.parameters['dense']:,} dense + {run.parameters['embedding']:,} in "
                    f"embedding tables")
        summary = summarised(run)  # written before the earlier outputs `overwrite` set aside are deleted
    return run.metrics.checked(summary)


def _table_optimizer(tables: list[torch.nn.Parameter], lr: float, storage: TypedTables | None = None):
    """``RowAdam`` for float32 CPU tables; ``torch.optim.SparseAdam`` (the same update, as sparse-tensor ops)
    for tables elsewhere. SparseAdam is a ``torch.optim.Optimizer``, whose import of torch._dynamo takes
    seconds (train/optim.py): made only when needed. ``storage``: memory-mapped tables' moments."""
    if all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tables):
        return RowAdam(tables, lr=lr, moments=storage.moments if storage is not None else None)
    return torch.optim.SparseAdam(tables, lr=lr)


class _TypedRun(RunState):
    """One typed run: its model, optimizers, samplers, history and best evaluation; ``run_epochs`` trains it."""

    stop_at_last_step = True  # a stop after an epoch's last step saves it unrecorded (typed_checkpoint.py resumes it)
    label = " (typed)"  # after the model's name in the timeline's title

    def __init__(self, config: TrainConfig, graph: TypedGraph, model: TypedGNN, task: Task,
                 sampler: TypedNeighborSampler, eval_sampler: TypedNeighborSampler, device: torch.device,
                 metrics: MetricLog, progress: Progress | None, stop: threading.Event | None,
                 threads: Threads = Threads(1, 1, 1), storage: TypedTables | None = None):
        super().__init__(stop=stop, progress=progress)  # precision: ``train_typed`` resolves it
        self.config, self.graph, self.model, self.task = config, graph, model, task
        self.sampler, self.eval_sampler, self.device = sampler, eval_sampler, device
        self.metrics, self.threads = metrics, threads
        dense = model.dense_parameters()  # none where your own module keeps every weight in sparse tables
        self.adam = Adam(dense, lr=config.lr, weight_decay=config.weight_decay) if dense else None
        tables = model.embedding_parameters()
        self.tables = storage  # where the tables live (train/typed_tables.py), memory-mapped ones' moments too
        self.sparse = _table_optimizer(tables, config.lr, storage) if tables else None
        self.optimizer = [o for o in (self.adam, self.sparse) if o is not None]
        self.train_idx = torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))
        self.num_batches = -(-self.train_idx.shape[0] // config.batch_size)
        self.mode = None  # the typed mode (open_mode), once the run knows where it starts
        self.stages = TRAINER_STAGES  # with the mode's (open_mode)
        self.resumed_mode = None  # the mode's state a resumed checkpoint kept (typed_checkpoint.py)
        self.parameters = {"dense": sum(p.numel() for p in model.dense_parameters()),
                           "embedding": sum(p.numel() for p in tables)}
        self.health = Health(task.constant_losses(np.asarray(graph.labels[np.asarray(graph.train_idx)])))
        self.fingerprint = None  # the graph's, which checkpoints hold (with checkpoint_dir)
        self.spans = Spans()  # every stage's spans; kept raw in the timeline's window
        self.util = Utilisation(device)  # CPU (and GPU) busy, sampled on a thread (train_typed closes it)

    def open_mode(self):
        """Build the run's mode (exact, device or NeutronOrch), with the mode state a resumed checkpoint kept
        (``run_epochs`` starts it); the caller closes it."""
        self.mode = build_mode(self.config, self.graph, self.device, self.threads, self.spans,
                               (self.world.rank, self.world.size), fanouts=self.sampler.fanouts)
        self.stages = TRAINER_STAGES.merge(self.mode.stages)
        if self.resumed_mode:
            self.mode.load_state_dict(self.resumed_mode)
        return self.mode

    def epochs(self) -> dict | None:
        return run_epochs(self, self.progress)

    def train_epoch(self, epoch: int, control: EpochControl, window: TimelineWindow, progress: Progress | None,
                    loss_progress) -> dict:
        masks = lambda batch: step_masks(self.config.seed, batch.epoch, batch.index)  # noqa: E731
        return train_epoch(self.model, self.optimizer, self.mode, epoch, self.spans, self.stages, self.util,
                           self.metrics, window, progress, control, self.task.loss, self.precision, step_sync(self),
                           loss_progress, masks)

    def evaluate(self, epoch: int, progress=None) -> dict[str, float]:
        """The metric on the validation and test sets (``eval_max_nodes``: a fixed sample of each);
        ``progress(0, done, total)`` after each set."""
        config, scores, done, check = self.config, {}, 0, self.health.evaluation(epoch)
        sets = {"val": eval_subset(self.graph.val_idx, config.eval_max_nodes, config.seed),
                "test": eval_subset(self.graph.test_idx, config.eval_max_nodes, config.seed + 1)}
        total = sum(len(nodes) for nodes in sets.values())
        for name, nodes in sets.items():
            logits = shared_logits(self.world, lambda part: typed_logits(
                self.model, self.graph, self.eval_sampler, part, self.device, config.eval_batch_size, config.seed),
                torch.from_numpy(nodes))  # data parallel: a share on each rank, gathered
            labels = torch.from_numpy(np.asarray(self.graph.labels[nodes]))
            scores.update(scored(self.task, {name: (logits, labels)}, check))  # finite, collapse noted
            done += len(nodes)
            if progress is not None:
                progress(0, done, total)
        return scores

    def checkpoint(self, name: str, epoch: int, position: tuple[int, float] | None = None) -> None:
        """Save the run (the rank that writes, with ``checkpoint_dir``); ``position`` (steps done, their loss
        sum) when mid-epoch, else the epoch is complete."""
        if self.world.main:
            step, loss_sum = position if position is not None else (self.num_batches, 0.0)
            write_checkpoint(self, name, lambda path: save_typed_checkpoint(
                path, self, epoch, {"step": step, "loss_sum": loss_sum}, self.fingerprint))

    def summary(self, status: str, timeline: dict | None = None) -> dict:
        """The run summary (``typed_summary``), with the keys of the homogeneous one where they mean the same."""
        return typed_summary(self, status, timeline)
