"""``train(config)``: build a run, train its epochs, summarise it.

The core logs through ``logging.getLogger("neutronorch")`` and reports progress through a callback; it
prints nothing (the command line configures both). Process-wide settings a run changes:

- torch's intra-op thread count: set for the run, restored afterwards;
- torch's random state (CPU, and the training GPU): seeded for the run, restored afterwards;
- the CUDA allocator's memory fraction (``gpu_memory_gb``): set for the run, lifted afterwards;
- glibc malloc's trim and mmap thresholds (``train/memory.py``): kept for the life of the process, since
  freed memory must stay mapped to be reused; ``NEUTRONORCH_SYSTEM_MALLOC=1`` opts out;
- numba's threading layer (``NUMBA_THREADING_LAYER=omp`` unless set) when ``neutronorch`` is imported;
- launched data parallel (``torchrun``), the default process group: initialised for the run and destroyed
  afterwards, unless the caller initialised it (``train/distributed.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data import Graph, TypedGraph, load_dataset
from neutronorch.errors import CheckpointError, ConfigError
from neutronorch.nn.custom import UserModel
from neutronorch.nn.link import LinkModel
from neutronorch.nn.models import GNN
from neutronorch.nn.precision import resolve_precision
from neutronorch.observe import Spans, StageTable, Utilisation
from neutronorch.orchestration.factory import Threads, build_mode
from neutronorch.orchestration.mode import Mode
from neutronorch.train.evaluate import evaluate
from neutronorch.train.feasible import check_learnable
from neutronorch.train.health import Health
from neutronorch.train.loop import EpochControl, Progress, TimelineWindow, check_call, step_sync, train_epoch
from neutronorch.train.memory import keep_freed_memory
from neutronorch.train.mode_choice import resolve_mode
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.optim import Adam
from neutronorch.train.resources import (check_threading_layer, memory_budget, resolve_device, thread_budget,
                                         torch_threads)
from neutronorch.train.checkpoint import check_resumable, load_state, save_checkpoint
from neutronorch.train.distributed import GradientSync, World, join_ranks, rank_device, world_size
from neutronorch.train.outputs import check_checkpoint_space, check_outputs
from neutronorch.train.resume import last_checkpoint, restore, write_checkpoint
from neutronorch.train.run import RunState, run_epochs, summarised
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.summary import ENDED, given_dataset, summarise, topology_in_file_order
from neutronorch.train.link_task import (LinkTask, check_node_task, evaluate_links, is_link_split, link_graph,
                                         rms_row_norm)
from neutronorch.train.task import Task
from neutronorch.train.typed_task import is_typed_run, train_typed_run

logger = logging.getLogger("neutronorch")


@dataclass
class Run(RunState):
    """Everything one homogeneous run holds; its resources are released by the ``ExitStack`` it was built in."""

    config: TrainConfig
    graph: Graph
    device: torch.device
    threads: Threads
    model: GNN
    optimizer: Adam
    mode: Mode
    spans: Spans
    stages: StageTable
    util: Utilisation
    metrics: MetricLog
    task: Task
    mode_choice: dict | None = None  # mode auto: the mode chosen, why, and from what (None: the mode was given)

    @property
    def num_batches(self) -> int:
        return self.mode.num_batches

    def epochs(self) -> dict | None:
        return run_epochs(self, self.progress)

    def train_epoch(self, epoch: int, control: EpochControl, window: TimelineWindow, progress: Progress | None,
                    loss_progress) -> dict:
        return train_epoch(self.model, self.optimizer, self.mode, epoch, self.spans, self.stages, self.util,
                           self.metrics, window, progress, control, self.task.loss, self.precision, step_sync(self),
                           loss_progress)

    def evaluate(self, epoch: int, progress=None) -> dict[str, float]:
        """The metric on the validation and test sets: {"val": ..., "test": ...}; ``progress(layer, done,
        total)`` as inference goes; checked (``train/health.py``) as the evaluation after ``epoch``."""
        config, check = self.config, self.health.evaluation(epoch)
        if self.world.distributed:  # batch normalisation's running statistics: rank 0's, on every rank
            self.world.broadcast_module(self.model, "the buffers' broadcast before evaluation", buffers_only=True)
        store = self.mode.store.as_dtype(torch.float32)  # evaluation runs in float32 whatever the training precision
        if isinstance(self.task, LinkTask):
            return evaluate_links(self.model, self.graph, store, self.device, config.eval_batch_size, config.seed,
                                  config.eval_negatives, self.task, self.world, progress, check)
        return evaluate(self.model, self.graph, store, self.device, config.eval_fanouts, config.eval_batch_size,
                        config.seed, config.eval_max_nodes, self.task, self.world, topology_in_file_order(self.mode),
                        progress, check)

    def checkpoint(self, name: str, epoch: int, position: tuple[int, float] | None = None) -> None:
        """Save the run; ``position`` (steps done, their loss sum) when mid-epoch, else the epoch is complete."""
        step, loss_sum = position if position is not None else (self.mode.num_batches, 0.0)
        mode_state = self.mode.state_dict()
        if self.world.distributed:  # every rank's (NeutronOrch's hot sets differ); rank 0 writes them all
            states = self.world.gather_objects(mode_state, f"gathering the mode state for {name}")
            if not self.world.main:
                return
            mode_state = {"ranks": states}
        save = lambda path: save_checkpoint(  # noqa: E731
            path, config=self.config, graph=self.graph, model=self.model, optimizer=self.optimizer, epoch=epoch,
            history=self.history, best=self.best, position={"step": step, "loss_sum": loss_sum},
            mode_state=mode_state, world_size=self.world.size, mode_choice=self.mode_choice)
        write_checkpoint(self, name, save)

    def summary(self, status: str, timeline: dict | None = None) -> dict:
        """The run summary (``summarise``): an ended run's scores; a stopped or failed one's, none."""
        ended = status in ENDED
        return summarise(self, self.last_eval if ended else {}, timeline, status, gather=ended)


def train(config: TrainConfig, graph: Graph | TypedGraph | None = None, progress: Progress | None = None,
          stop: threading.Event | None = None, model: torch.nn.Module | None = None) -> dict:
    """Train as ``config`` says and return the run summary (also written to ``config.summary_json``).
    ``model``: your own module instead of the built-in ``config.model`` (``nn.custom``'s protocol; its
    layers read ``len(config.fanouts)`` hops), trained in place.
    ``progress(epoch, done, total)`` is called after every step. Setting ``stop`` (from a signal handler,
    another thread) finishes the current step, writes ``last.pt`` (with ``checkpoint_dir``) and the summary
    marked ``interrupted``, and raises ``Interrupted``. ``overwrite`` replaces an earlier run's outputs only once
    this run has written its own, and puts them back if it ends before (``train/replacing.py``).
    A typed graph (``graph`` a ``TypedGraph``, or ``config.dataset`` a typed native folder or OGB's ogbn-mag
    layout: ``is_typed_dataset``) trains in exact mode through ``train/typed_task.py``'s ``train_typed``."""
    started, config = time.perf_counter(), check_call(config, progress, stop)
    # Resolved values (batch size) go into a copy, which names a graph given as what was trained.
    config = dataclasses.replace(config, dataset=given_dataset(graph, config.dataset)).validate()
    check_threading_layer(resolve_device(config.device))  # and the environment: before any data is read
    if is_typed_run(config, graph):
        return train_typed_run(config, graph, progress, stop, model)
    check_run(config, "homogeneous", world_size())
    check_outputs(config, {"graph": graph.files()} if graph is not None else None)
    device = rank_device(resolve_device(config.device))
    keep_freed_memory()
    with contextlib.ExitStack() as stack:
        world, replacing = join_ranks(stack, config, device)
        precision = resolve_precision(config.precision, device)
        config.precision = precision.name
        threads = thread_budget(config, world.local_size)
        stack.enter_context(memory_budget(device, config.gpu_memory_gb))
        stack.enter_context(torch_threads(threads.train))
        stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda" else []))
        torch.manual_seed(config.seed)
        run = build_run(config, graph, device, threads, stack, world, model)
        if world.main:
            check_checkpoint_space(config, run.model.parameters())
        run.stop, run.started, run.precision, run.replacing = stop, started, precision, replacing
        run.progress = progress
        if world.distributed:
            run.sync = GradientSync(world, list(run.model.parameters()), stop, run.mode.averaged_gradients)
            run.stop = run.sync.agreed  # every rank stops after the same step
        logger.info(f"precision {precision.name} ({precision.reason})")
        summary = summarised(run)  # written before the earlier outputs `overwrite` set aside are deleted
    return run.metrics.checked(summary)  # an OutputError for a log or timeline that could not be written


def build_run(config: TrainConfig, graph: Graph | None, device: torch.device, threads: Threads,
              stack: contextlib.ExitStack, world: World | None = None, user_model: torch.nn.Module | None = None
              ) -> Run:
    """Load the data, build the model, optimizer and mode; every resource is closed by ``stack``. Data
    parallel (``world``), only rank 0 writes metric logs, and rank 0's initial weights go to every rank."""
    world = world or World()
    data_seconds = 0.0
    link = config.task == "link"
    if graph is None:
        t0 = time.perf_counter()
        graph = load_dataset(config.dataset, None if is_link_split(config.split) else config.split, config.seed,
                             config.split_index)
        data_seconds = time.perf_counter() - t0
        logger.info(f"loaded {graph.describe()} in {data_seconds:.1f}s")
    for note in graph.notes if world.main else []:  # the same on every rank
        logger.warning(f"note: {note}")
    if link:
        graph = link_graph(graph, config)
        logger.info(f"{graph.links.describe()}")
    else:
        check_node_task(graph, config)
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(graph.links.train.shape[1] if link else len(graph.train_idx))
    if user_model is not None and link:
        raise ConfigError("`task` link trains the built-in models (`model` sage, gcn or gat) as encoders; your own "
                          "module trains node tasks for now.")
    warnings = check_learnable(graph, not link, None if user_model is not None else graph.feature_dim)
    if user_model is not None:
        # NeutronOrch mode asks for its bottom layer when it starts (UserModel.bottom says what it needs).
        model = UserModel.to_train(user_model, len(config.fanouts), graph.num_classes).to(device)
    else:
        model = GNN(config.model, graph.feature_dim, config.hidden, config.hidden if link else graph.num_classes,
                    len(config.fanouts), dropout=config.dropout, heads=config.heads, gcn_norm=config.gcn_norm,
                    residual=config.residual, norm=config.norm, architecture=config.architecture)
        if link:
            model = LinkModel(model, config.link_head, input_norm=rms_row_norm(graph.features))
        model = model.to(device)
    if world.distributed:
        world.broadcast_module(model, "the initial weights' broadcast")  # the same seed made them equal; make sure
        logger.info(f"data parallel: {world.describe()}; batch size {config.batch_size} per rank, "
                    f"{config.batch_size * world.size} per global batch")
    optimizer = Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    path, resumed = last_checkpoint(config, load_state) if config.resume else (None, None)
    task = LinkTask.of(graph, model, config.metric) if link else Task.of(graph, config.metric)
    choice = resolve_mode(config, graph, device, threads, model, world, resumed, loss_fn=task.loss)
    spans = Spans()
    node = world.node_link() if config.hot_sets_per_node else None
    mode = build_mode(config, graph, device, threads, spans, shard=(world.rank, world.size), node=node)
    stack.callback(mode.close)
    logger.info(f"mode {mode.name}, model {getattr(model, 'kind', config.model)}, fanouts {config.fanouts}, device {device}, batch size "
                f"{config.batch_size}, train threads {threads.train}, {mode.describe()}, {mode.num_batches} "
                f"batches per epoch")
    if device.type == "cuda" or mode.cache is not None:
        logger.info(f"placement: {mode.placement.describe()}")
    for note in mode.placement.notes:
        logger.warning(f"note: {note}")
    util = stack.enter_context(contextlib.closing(Utilisation(device)))
    logs = config.logging if world.main else dataclasses.replace(config.logging, log_jsonl=None, log_csv=None,
                                                                  tensorboard=None)
    metrics = stack.enter_context(contextlib.closing(MetricLog(logs, task.key, append=config.resume)))
    logger.info("task: " + (task.describe() if link else
                            f"{'multi-label' if task.multilabel else 'multi-class'}, {task.num_classes} "
                            f"{'tasks' if task.multilabel else 'classes'}, metric {task.metric}"))
    run = Run(config, graph, device, threads, model, optimizer, mode, spans, TRAINER_STAGES.merge(mode.stages),
              util, metrics, task, data_seconds=data_seconds, world=world,
              mode_choice=None if choice is None else choice.to_dict(),
              health=Health(task.constant_losses(None if link else graph.labels[graph.train_idx]), warnings))
    if resumed is not None:
        _resume(run, path, resumed)
    return run


def _resume(run: Run, path: Path, state: dict) -> None:
    """Continue from ``checkpoint_dir``/last.pt (``state``, read from ``path``): ``restore``'s parts, the
    optimizer and the mode's state (NeutronOrch's snapshots, super-batch in progress and controller)."""
    check_resumable(state, run.config, run.graph, str(path), run.world.size)
    if not run.mode.resumable:
        raise CheckpointError(f"{run.mode.name} mode cannot resume from a checkpoint.")
    saved_model, model = state["model_args"].get("custom"), getattr(run.model, "arguments", {}).get("custom")
    if saved_model != model:
        describe = lambda name: f"your own model {name}" if name else "a built-in model"  # noqa: E731
        raise CheckpointError(f"{path}: the run it continues trained {describe(saved_model)}; this one trains "
                              f"{describe(model)}. Resume with the same model, or start a new run in another "
                              f"`checkpoint_dir`.")

    def optimizer_and_mode(state: dict) -> None:
        run.optimizer.load_state_dict(state["optimizer"])
        mode_state = state["mode_state"]
        run.mode.load_state_dict(mode_state["ranks"][run.world.rank] if run.world.distributed else mode_state)

    restore(run, state, path, optimizer_and_mode)
