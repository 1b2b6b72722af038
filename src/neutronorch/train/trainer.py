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

import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data import Graph, TypedGraph, load_dataset
from neutronorch.errors import ConfigError
from neutronorch.nn.custom import UserModel
from neutronorch.nn.link import LinkModel
from neutronorch.nn.models import GNN
from neutronorch.nn.precision import resolve_precision
from neutronorch.observe import Spans, Utilisation
from neutronorch.orchestration.factory import Threads, build_mode
from neutronorch.train.feasible import check_learnable
from neutronorch.train.health import Health
from neutronorch.train.heterogeneous import is_typed_run, train_typed_run
from neutronorch.train.loop import Progress, check_call
from neutronorch.train.memory import keep_freed_memory
from neutronorch.train.mode_choice import resolve_mode
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.optim import Adam
from neutronorch.train.resources import (check_threading_layer, memory_budget, resolve_device, thread_budget,
                                         torch_threads)
from neutronorch.train.checkpoint import load_state
from neutronorch.train.distributed import GradientSync, World, join_ranks, rank_device, world_size
from neutronorch.train.outputs import check_checkpoint_space, check_outputs
from neutronorch.train.resume import last_checkpoint
from neutronorch.train.run import Run, summarised
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.summary import given_dataset
from neutronorch.train.link_task import LinkTask, check_node_task, is_link_split, link_graph, rms_row_norm
from neutronorch.train.task import Task

logger = logging.getLogger("neutronorch")


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
    layout: ``is_typed_dataset``) trains through ``train/heterogeneous.py``'s ``train_typed``."""
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
        run.resume(path, resumed)
    return run
