"""Node classification on typed graphs, in exact, device or NeutronOrch mode: ``train_typed(config, graph)``.

``neutronorch.train(config, graph=typed_graph)`` (or ``config.dataset`` naming a typed native folder) runs
this. One epoch: the target type's training vertices in the order ``epoch_order(seed, epoch)`` gives them
(the homogeneous loaders' order), in batches of ``batch_size``; each batch sampled by a
``TypedNeighborSampler`` with the key ``batch_key(seed, epoch, batch)``; every input type's rows gathered for
the bottom frontier (``gather_rows`` from the possibly memory-mapped features, as float32); a
``TypedGNN`` forward, the task's loss on the seeds' labels (``train/task.py``: cross-entropy, or binary
cross-entropy for multi-label targets), and one step of two optimizers: Adam (``lr``, ``weight_decay``) for
the dense weights, ``RowAdam`` (``train/row_adam.py``: ``torch.optim.SparseAdam``'s update, ``lr``, no
weight decay) for the featureless types' embedding tables, which moves only the rows the batch looked up.
The same seed gives the same losses: the seed order, the samples and the dropout masks are keyed by it.

The batches come from the run's mode (``orchestration/factory.py``'s ``build_typed_mode``): exact mode samples
and gathers each batch whole on a producer thread (``orchestration/typed_exact.py``), device mode on the
training device (``typed_device.py``), NeutronOrch mode reuses hot rows computed on a host thread
(``typed_neutronorch.py``: ``hot_rows`` before the forward pass, ``finish`` after the backward pass). The
producers run numba at ``sampler_threads`` (``thread_budget``: half the cores by default); the trainer runs
torch and numba at ``threads`` (default all cores) each. A batch depends on its key only, so the losses are
those of sampling inline. An epoch's ``stage_seconds`` hold the producer's ``sample`` and ``gather`` time
(overlapped with training; NeutronOrch adds ``plan`` and ``host_compute``) and the trainer's ``wait`` for a
batch besides ``forward``, ``backward`` and ``step``.

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
to the bit, ``train/typed_checkpoint.py``, called through ``run.checkpoints``) work as in homogeneous runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import threading
import time
from pathlib import Path
import numpy as np
import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data.typed import TypedGraph
from neutronorch.data.typed_native import read_typed
from neutronorch.errors import ConfigError, Interrupted, OutputError, TrainingError
from neutronorch.nn.precision import Precision, resolve_precision
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.orchestration.factory import Threads, build_typed_mode, gathers_on_host
from neutronorch.orchestration.typed_planner import HotRecord
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.evaluate import eval_subset, scored
from neutronorch.train.feasible import check_learnable
from neutronorch.train.health import Health
from neutronorch.observe import Spans, Utilisation, epoch_table
from neutronorch.train.loop import DIVERGENCE_CHECK_STEPS, Progress, TimelineWindow, epoch_line
from neutronorch.train.memory import peak_rss_mb
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.optim import Adam
from neutronorch.train.outputs import check_outputs, write_summary
from neutronorch.train.summary import TYPED_STAGES, named_scores, typed_summary, write_typed_timeline
from neutronorch.train.resources import (check_threading_layer, numba_threads, resolve_device, thread_budget,
                                         torch_threads)
from neutronorch.train.replacing import Replacement
from neutronorch.train.row_adam import RowAdam
from neutronorch.train.task import Task
from neutronorch.train.distributed import World, rank_device
from neutronorch.train.typed_distributed import (data_parallel, join_ranks, launched_rank, rank_checkpoints,
                                                 rank_settings, ranks_here, shared_logits, step_masks, world_size)
from neutronorch.features.reading import typed_stores
from neutronorch.train.typed_inputs import TypedInputs, typed_files, typed_logits
from neutronorch.train.typed_own import own_typed_model
from neutronorch.train.typed_tables import TypedTables, plan_tables

logger = logging.getLogger("neutronorch")

STAGES = ("wait", "sample", "gather", "forward", "backward", "step")
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
        run.precision, run.replacing = precision, replacing
        run.health.warnings[:0] = warnings  # the settings' (train/feasible.py), before any collapse
        run.util = stack.enter_context(contextlib.closing(Utilisation(device)))
        data_parallel(run, world)  # several ranks: global batches, the weights broadcast, run.sync and run.stop
        run.checkpoints = rank_checkpoints(run, world)  # with `resume`, the run restored from last.pt
        stack.enter_context(contextlib.closing(run.open_mode()))  # where the run starts, its threads started
        logger.info(f"mode {run.mode.name}, model {config.model} (typed: {', '.join(graph.node_types)}), fanouts "
                    f"{config.fanouts if fanouts is None else fanouts}, device {device}, batch size "
                    f"{config.batch_size}, train threads {threads}, sampler threads {budget.sampler}, "
                    f"{run.num_batches} batches per epoch, "
                    f"parameters {run.parameters['dense']:,} dense + {run.parameters['embedding']:,} in "
                    f"embedding tables")
        try:
            run.epochs()
        except (Interrupted, TrainingError, OutputError) as exc:
            # Nothing lost: what was trained is summarised (a checkpoint that could not be written too).
            summary = run.summary("interrupted" if isinstance(exc, Interrupted) else "failed", started,
                                  data_seconds, budget)
            summary["error"] = None if isinstance(exc, Interrupted) else str(exc)
            try:
                write_summary(config, summary)
            except OutputError as lost:  # the first error is the one to raise; say this one too
                logger.error(str(lost))
            raise
        summary = run.summary("stopped_early" if run.stopped_early else "completed", started, data_seconds,
                              budget)
        summary["timeline"] = write_typed_timeline(run)
        run.metrics.close()  # the logs' last lines: a full disk shows now, and in the summary
        if run.metrics.lost:  # a log or the timeline could not be written
            summary["error"] = run.metrics.lost
        write_summary(config, summary)  # before the earlier outputs `overwrite` set aside are deleted
    return run.metrics.checked(summary)


def _table_optimizer(tables: list[torch.nn.Parameter], lr: float, storage: TypedTables | None = None):
    """``RowAdam`` for float32 CPU tables; ``torch.optim.SparseAdam`` (the same update, as sparse-tensor ops)
    for tables elsewhere. SparseAdam is a ``torch.optim.Optimizer``, whose import of torch._dynamo takes
    seconds (train/optim.py): made only when needed. ``storage``: memory-mapped tables' moments."""
    if all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tables):
        return RowAdam(tables, lr=lr, moments=storage.moments if storage is not None else None)
    return torch.optim.SparseAdam(tables, lr=lr)


class _TypedRun:
    """One typed run: its model, optimizers, samplers, history and best evaluation."""

    def __init__(self, config: TrainConfig, graph: TypedGraph, model: TypedGNN, task: Task,
                 sampler: TypedNeighborSampler, eval_sampler: TypedNeighborSampler, device: torch.device,
                 metrics: MetricLog, progress: Progress | None, stop: threading.Event | None,
                 threads: Threads = Threads(1, 1, 1), storage: TypedTables | None = None):
        self.config, self.graph, self.model, self.task = config, graph, model, task
        self.sampler, self.eval_sampler, self.device = sampler, eval_sampler, device
        self.metrics, self.progress, self.stop = metrics, progress, stop
        self.threads = threads
        self.precision = Precision()  # bf16: the forward pass under autocast (``train_typed`` resolves it)
        self.version = 0  # optimizer steps taken: the parameter version
        self.hot = HotRecord()
        dense = model.dense_parameters()  # none where your own module keeps every weight in sparse tables
        self.adam = Adam(dense, lr=config.lr, weight_decay=config.weight_decay) if dense else None
        tables = model.embedding_parameters()
        self.tables = storage  # where the tables live (train/typed_tables.py), memory-mapped ones' moments too
        self.sparse = _table_optimizer(tables, config.lr, storage) if tables else None
        self.train_idx = torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))
        self.num_batches = -(-self.train_idx.shape[0] // config.batch_size)
        self.mode = None  # the typed mode (open_mode), once the run knows where it starts
        self.inputs = None  # its featured types' rows (TypedInputs), made with the mode
        self.resumed_mode = None  # the mode's state a resumed checkpoint kept (typed_checkpoint.py)
        self.parameters = {"dense": sum(p.numel() for p in model.dense_parameters()),
                           "embedding": sum(p.numel() for p in tables)}
        self.history: list[dict] = []
        self.best = {"val": -math.inf, "test": math.nan, "epoch": -1}
        self.last_eval: dict = {}
        self.health = Health(task.constant_losses(np.asarray(graph.labels[np.asarray(graph.train_idx)])))
        self.stopped_early = False
        self.first_step_at: float | None = None
        self.start = (0, 0, 0.0)  # (epoch, step, loss sum of its steps before): where training starts
        self.checkpoints = None  # typed_checkpoint.TypedCheckpoints: called after every step and epoch
        self.replacing = Replacement()  # the earlier outputs `overwrite` replaces (train/replacing.py)
        self.world, self.sync = World(), None  # data parallel (typed_distributed.py): the ranks, the reduction
        self.spans = Spans()  # every stage's spans; kept raw in the timeline's window
        self.util: Utilisation | None = None  # CPU (and GPU) busy, sampled on a thread (train_typed starts it)
        self.window = TimelineWindow(bool(config.timeline), config.epochs, config.timeline_steps)

    def open_mode(self):
        """Build the run's mode (exact, device or NeutronOrch, which starts its threads) at ``self.start``, with
        the mode state a resumed checkpoint kept; the caller closes it."""
        graph, (epoch, step, _) = self.graph, self.start
        self.version = epoch * self.num_batches + step
        self.inputs = TypedInputs(graph, typed_stores(self.config, graph, self.sampler, self.world.size > 1,
                                                      gathers_on_host(self.config)))
        self.mode = build_typed_mode(
            self.config, graph, self.model, self.sampler.fanouts, self.train_idx, self.num_batches, self.device,
            self.inputs,
            lambda seeds: torch.from_numpy(np.asarray(graph.labels[seeds], dtype=np.int64)), self.threads,
            self.version, self.resumed_mode, (self.world.rank, self.world.size))
        return self.mode

    def epochs(self) -> None:
        config, (first_epoch, first_step, loss_sum) = self.config, self.start
        if self.stop is not None and self.stop.is_set():  # asked while the data loaded: no step to finish first
            raise Interrupted("stopped on request before the first step")
        for epoch in range(first_epoch, config.epochs):
            record = self.train_epoch(epoch, *((first_step, loss_sum) if epoch == first_epoch else (0, 0.0)))
            last = epoch == config.epochs - 1
            if config.eval_every > 0 and ((epoch + 1) % config.eval_every == 0 or last) or (
                    config.eval_every == 0 and last):
                t0 = time.perf_counter()
                self.last_eval = self.evaluate(epoch)
                record.update(named_scores(self.task, self.last_eval), eval_seconds=time.perf_counter() - t0)
                if self.last_eval["val"] > self.best["val"] or self.best["epoch"] < 0:
                    self.best = {**self.last_eval, "epoch": epoch}
            self.health.after_epoch(record)
            self.history.append(record)
            if self.checkpoints is not None:
                self.checkpoints.after_epoch(epoch, record)
            self.metrics.epoch(record)
            logger.info(epoch_line(record, stages=not config.stage_table, metric=self.task.metric))
            if config.stage_table:
                logger.info(epoch_table(record, TYPED_STAGES))
            if config.patience and "val_acc" in record and self._evaluations_since_best() >= config.patience:
                self.stopped_early = True
                logger.info(f"stopping early: no better validation {self.task.metric} in {config.patience} "
                            f"evaluations (best {self.best['val']:.4f} at epoch {self.best['epoch']})")
                break

    def train_epoch(self, epoch: int, first: int = 0, loss_sum: float = 0.0) -> dict:
        """Train ``epoch`` from step ``first`` on (resumed: ``loss_sum``, the float32 sum of the losses before)."""
        config, model = self.config, self.model
        model.train()
        seconds = dict.fromkeys(STAGES, 0.0)
        edges, inputs, step_losses = 0, 0, []
        total = torch.full((), loss_sum, dtype=torch.float32, device=self.device)  # read once a step on the CPU only
        check_every = DIVERGENCE_CHECK_STEPS if self.device.type == "cuda" else 1
        start = time.perf_counter()
        count, hot = self.num_batches, HotRecord()
        if self.mode is None:
            self.open_mode()
        self.window.begin_epoch(epoch, self.spans, self.util)
        opened = time.perf_counter()  # the producers' spans ended before (made ahead) stay off the timeline
        if self.util is not None:
            self.util.take()  # the epoch's means start here
        with self.mode.epoch(epoch, count, first) as produced:
            clock = time.perf_counter()
            for index, batch in enumerate(produced, start=first):
                clock = _lap(seconds, "wait", clock, self.spans)
                reused = self.mode.hot_rows(batch, self.version)  # NeutronOrch may add its host's seconds
                for stage, value in batch.seconds.items():
                    seconds[stage] = seconds.get(stage, 0.0) + value
                for stage, begun, ended in batch.spans:  # the producer's and the host's, on their lanes
                    if ended >= opened:
                        self.spans.add(stage, begun, ended)
                hot.add(batch.stats)
                with self.precision.autocast(self.device), step_masks(config.seed, epoch, index):
                    logits = model(batch.blocks, batch.features, batch.ids, reused)
                loss = self.task.loss(logits.float(), batch.labels)
                clock = _lap(seconds, "forward", clock, self.spans)
                for optimizer in (self.adam, self.sparse):
                    if optimizer is not None:
                        optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.mode.finish(batch)  # NeutronOrch: the hot rows' gradient, at a super-batch's last step
                if self.sync is not None:  # data parallel: the ranks' gradients reduced, the global batch's loss
                    loss = self.sync(self.task.loss_weight(batch.labels), loss)
                clock = _lap(seconds, "backward", clock, self.spans)
                for optimizer in (self.adam, self.sparse):
                    if optimizer is not None:
                        optimizer.step()
                self.version += 1
                total += loss.detach()  # NaN and infinities survive the sum: it is finite iff every loss was
                if (index + 1) % check_every == 0 or index + 1 == count:
                    mean = float(total) / (index + 1)
                    if not math.isfinite(mean):
                        raise TrainingError(f"the training loss became NaN or infinite in epoch {epoch} (within "
                                            f"its first {index + 1} steps): the run diverged. Lower `lr`, or check "
                                            f"the features for extreme values.")
                    if hasattr(self.progress, "loss"):
                        self.progress.loss(epoch, mean)
                edges += batch.num_sampled_edges
                inputs += batch.num_inputs
                if self.first_step_at is None:
                    self.first_step_at = time.perf_counter()
                if self.metrics.per_step:
                    step_losses.append(loss.detach())
                    if len(step_losses) == self.metrics.every:
                        self.metrics.steps(epoch, index + 1 - len(step_losses), step_losses)
                        step_losses = []
                clock = _lap(seconds, "step", clock, self.spans)
                self.window.after_step(self.spans, index + 1, self.util)
                if self.progress is not None:
                    self.progress(epoch, index + 1, count)
                if self.checkpoints is not None:
                    self.checkpoints.after_step(epoch, index + 1, count, total)
                if self.stop is not None and self.stop.is_set():
                    raise Interrupted(f"stopped on request in epoch {epoch} after step {index + 1} of "
                                      f"{count}")
                clock = time.perf_counter()
        self.window.end_epoch(self.spans, self.util)
        if step_losses:
            self.metrics.steps(epoch, count - len(step_losses), step_losses)
        self.hot.merge(hot)
        wall = time.perf_counter() - start
        return {"epoch": epoch, "seconds": wall, "train_loss": float(total) / max(1, count),
                "stage_seconds": {k: round(v, 4) for k, v in seconds.items()}, "batches": count,
                "lane_busy": TYPED_STAGES.lane_busy(seconds, wall),
                "sampled_edges": edges, "input_nodes_per_batch": inputs / max(1, count - first),
                "peak_rss_mb": round(peak_rss_mb(), 1), **hot.record(), **self.mode.records(),
                **({"utilisation": self.util.take()} if self.util is not None else {})}

    def evaluate(self, epoch: int) -> dict[str, float]:
        """The metric on the validation and test sets (``eval_max_nodes``: a fixed sample of each)."""
        config, scores, done, check = self.config, {}, 0, self.health.evaluation(epoch)
        evaluating = getattr(self.progress, "evaluating", None)
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
            if evaluating is not None:
                evaluating(epoch, 0, done, total)
        return scores

    def _evaluations_since_best(self) -> int:
        return sum(1 for e in self.history if "val_acc" in e and e["epoch"] > self.best["epoch"])

    def summary(self, status: str, started: float, data_seconds: float, threads: Threads) -> dict:
        """The run summary (``typed_summary``), with the keys of the homogeneous one where they mean the same."""
        return typed_summary(self, status, started, data_seconds, threads)


def _lap(seconds: dict[str, float], stage: str, since: float, spans: Spans) -> float:
    now = time.perf_counter()
    seconds[stage] += now - since
    spans.add(stage, since, now)
    return now
