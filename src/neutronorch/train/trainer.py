"""``train(config)``: build a run, train its epochs, summarise it. It logs through
``logging.getLogger("neutronorch")`` and prints nothing. Process-wide settings a run changes:

- torch's intra-op thread count: set for the run, restored afterwards;
- torch's random state (CPU, and the training GPU): seeded for the run, restored afterwards;
- the CUDA allocator's memory fraction (``gpu_memory_gb``): set for the run, lifted afterwards;
- glibc malloc's trim and mmap thresholds (``train/resources.py``): kept for the life of the process, since
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
from pathlib import Path

import torch

from neutronorch.capabilities import check_run, check_static
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data import Graph, TypedGraph, is_typed_dataset, load_dataset, load_typed_dataset
from neutronorch.data.feature_norm import normalized
from neutronorch.data.links import row_statistics
from neutronorch.data.relation import relation_label
from neutronorch.data.times import has_vertex_times
from neutronorch.errors import CheckpointError, ConfigError
from neutronorch.nn.custom import UserModel, check_trainable
from neutronorch.nn.link import LinkModel, optimizer_groups
from neutronorch.nn.models import GNN
from neutronorch.nn.precision import resolve_precision
from neutronorch.observe import Spans, Utilisation
from neutronorch.orchestration.factory import Threads, build_mode
from neutronorch.train.health import Health, check_learnable
from neutronorch.train.heterogeneous import TypedOptions, check_own_model_config, typed_model
from neutronorch.train.loop import Progress, check_call
from neutronorch.train.mode_choice import check_auto, resolve_mode
from neutronorch.train.optim import Adam
from neutronorch.train.resources import (check_threading_layer, keep_freed_memory, memory_budget, numba_threads,
                                         resolve_device, thread_budget, torch_threads)
from neutronorch.train.checkpoint import HOMOGENEOUS, TYPED, dataset_fingerprint, load_state
from neutronorch.train.distributed import GradientSync, World, joined, rank_device, rank_settings
from neutronorch.train.outputs import check_checkpoint_space, check_outputs, console_copy
from neutronorch.train.partitioned import build_partitioned_run, check_request as check_partitioned, typed_partition
from neutronorch.train.replacing import claim_outputs
from neutronorch.train.run import Built, Run, summarised
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.summary import MetricLog, given_dataset
from neutronorch.train.link_task import LinkTask, check_node_task, is_link_split, link_graph
from neutronorch.train.task import Task
from neutronorch.train.temporal_links import timed_links
from neutronorch.train.temporal_nodes import by_time, split_vertices_by_time, timed_nodes

logger = logging.getLogger("neutronorch")


def train(config: TrainConfig, graph: Graph | TypedGraph | None = None, progress: Progress | None = None,
          stop: threading.Event | None = None, model: torch.nn.Module | None = None,
          options: TypedOptions | None = None) -> dict:
    """Train as ``config`` says and return the run summary (also written to ``config.summary_json``).
    ``model``: your own module instead of the built-in ``config.model`` (``nn.custom``'s protocol; its
    layers read ``len(config.fanouts)`` hops), trained in place.
    ``progress(epoch, done, total)`` is called after every step. Setting ``stop`` (from a signal handler,
    another thread) finishes the current step, writes ``last.pt`` (with ``checkpoint_dir``) and the summary
    marked ``interrupted``, and raises ``Interrupted``.
    A typed graph (``graph`` a ``TypedGraph``, or ``config.dataset`` a typed native folder or OGB's ogbn-mag
    layout: ``is_typed_dataset``) trains the same way, its relational model built by ``train/heterogeneous.py``
    (``options``: a ``TypedOptions`` of its per-relation fanouts, R-GCN's bases and its tables' width)."""
    started, config = time.perf_counter(), check_call(config, progress, stop)
    # Resolved values (batch size) go into a copy, which names a graph given as what was trained.
    config = dataclasses.replace(config, dataset=given_dataset(graph, config.dataset)).validate()
    check_threading_layer(resolve_device(config.device))  # and the environment: before any data is read
    if options is not None and isinstance(graph, Graph):
        raise ConfigError("`options` (a TypedOptions) are a typed graph's settings, and this graph is homogeneous; "
                          "leave `options` out, or give a TypedGraph.")
    typed = options is not None or isinstance(graph, TypedGraph) or (graph is None and (
        typed_partition(config.partitions) if config.partitions is not None else is_typed_dataset(config.dataset)))
    if typed and model is not None:
        check_own_model_config(config)  # before the graph is read
    check_run(config, TYPED if typed else HOMOGENEOUS)
    check_partitioned(config, graph, model, options, resolve_device(config.device))
    check_auto(config, resolve_device(config.device))  # mode auto on the CPU: exact, by rule
    timed_task = model is None and (  # sampled by time (docs/temporal.md): a link task, a node task by vertex times
        config.task == "link" or has_vertex_times(graph))
    if not timed_task:
        check_static(graph)  # a graph with times refused before any output is made (read by name: by build_mode)
    config = rank_settings(config)  # data parallel: only rank 0 writes the summary and logs
    check_outputs(config, {"graph": graph.files()} if graph is not None else None)
    device = rank_device(resolve_device(config.device))
    keep_freed_memory()
    with contextlib.ExitStack() as stack:
        world = stack.enter_context(joined(device.type, config.dist_timeout))
        # Rank 0 holds checkpoint_dir while the run lasts and sets aside what `overwrite` replaces.
        replacing = stack.enter_context(claim_outputs(config, world.main))
        if config.console_log and world.main:  # after claim_outputs: an earlier run's copy is set aside first
            stack.enter_context(console_copy(config.console_log, config.resume))
        precision = resolve_precision(config.precision, device)
        config.precision = precision.name
        threads = thread_budget(config, world.local_size)
        stack.enter_context(memory_budget(device, config.gpu_memory_gb))
        stack.enter_context(torch_threads(threads.train))
        if typed:  # its trainer runs numba kernels too: torch's and, in this thread, numba's pools take turns
            stack.enter_context(numba_threads(threads.train))
        stack.enter_context(torch.random.fork_rng(devices=[device] if device.type == "cuda" else []))
        torch.manual_seed(config.seed)
        run = build_run(config, graph, device, threads, stack, world, model,
                        (options or TypedOptions()) if typed else None, stop)
        if world.main:
            check_checkpoint_space(config, run.model.parameters())
        run.started, run.precision, run.replacing, run.progress = started, precision, replacing, progress
        logger.info(f"precision {precision.name} ({precision.reason})")
        summary = summarised(run)  # written before the earlier outputs `overwrite` set aside are deleted
    return run.metrics.checked(summary)  # an OutputError for a log or timeline that could not be written


def build_run(config: TrainConfig, graph: Graph | TypedGraph | None, device: torch.device, threads: Threads,
              stack: contextlib.ExitStack, world: World, user_model: torch.nn.Module | None,
              options: TypedOptions | None, stop: threading.Event | None) -> Run:
    """Load the data, build the model, optimizer and mode; every resource is closed by ``stack``. ``options``:
    a typed graph's run (``heterogeneous.typed_model`` builds its model). Data parallel (``world``), rank 0's
    initial weights go to every rank, the step's reduction is ``run.sync`` (a typed model's tables' sparse rows
    too) and the stop is agreed on by every rank."""
    if config.partitions is not None:  # rank r holds part r (train/partitioned.py)
        return build_partitioned_run(config, device, threads, stack, world, stop, node_gnn, options)
    data_seconds, link = 0.0, config.task == "link"
    if user_model is not None and link:
        raise ConfigError("`task` link trains the built-in models as encoders (`model` sage, gcn or gat; rgcn or "
                          "rgat on a typed graph); your own module trains node tasks for now.")
    if graph is None:
        t0 = time.perf_counter()
        if options is not None and config.times:
            raise ConfigError(f"`times`: {config.dataset} is a typed graph, which keeps the times its folder holds; "
                              f"the setting reads an OGB folder's years (docs/temporal.md). Leave it out.")
        graph = load_typed_dataset(config.dataset) if options is not None else load_dataset(
            config.dataset, None if is_link_split(config.split) or by_time(config.split) else config.split,
            config.seed, config.split_index, times=config.times)
        data_seconds = time.perf_counter() - t0
        first, _, types = graph.describe().partition("\n")  # a typed graph's types and relations below the line
        logger.info(f"loaded {first} in {data_seconds:.1f}s" + (f"\n{types}" if types else ""))
    if by_time(config.split) and options is None:  # the vertices re-split by their times (a node task's)
        graph = split_vertices_by_time(graph, *by_time(config.split), config.task)
    for note in graph.notes if world.main else []:  # the same on every rank
        logger.warning(f"note: {note}")
    # Every reader of the rows (each mode, the caches, evaluation, checkpoints' fingerprint) reads these.
    graph = normalized(graph, config.normalize_features)
    built = (typed_model(config, graph, device, user_model, options, stack) if options is not None
             else homogeneous_model(config, graph, device, user_model))
    graph, model = built.graph, built.model
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(graph.links.train.shape[1] if link else len(graph.train_idx))
    task = LinkTask.of(graph, model, config.metric) if link else Task.of(graph, config.metric)
    if world.distributed:
        world.broadcast_module(model, "the initial weights' broadcast")  # the same seed made them equal; make sure
    path, resumed = None, None
    if config.resume:  # a resumed run continues checkpoint_dir/last.pt
        path = Path(config.checkpoint_dir) / "last.pt"
        if not path.is_file():
            raise CheckpointError(f"{path}: no checkpoint to resume from; train with `checkpoint_dir` first.")
        resumed = load_state(path, TYPED if built.typed else HOMOGENEOUS)
    choice = resolve_mode(config, graph, device, threads, model, world, resumed, loss_fn=task.loss)
    spans = Spans()
    node = world.node_link() if config.hot_sets_per_node else None
    if node is not None:
        stack.callback(node.close)  # after the mode's close below (the stack unwinds last in, first out)
    temporal = timed_links(config, graph) or timed_nodes(config, graph)
    if temporal is None and config.settings_given(["temporal_strategy"]):
        raise ConfigError(f"`temporal_strategy` {config.temporal_strategy}: a setting of sampling by time, and this "
                          f"run samples {graph.name} without times; leave it out (docs/temporal.md).")
    mode = build_mode(config, graph, device, threads, spans, shard=(world.rank, world.size), node=node,
                      fanouts=built.typed and built.typed.sampler.fanouts, temporal=temporal)
    stack.callback(mode.close)
    if world.distributed:
        logger.info(f"data parallel: {world.describe()}; batch size {config.batch_size} per rank, "
                    f"{config.batch_size * world.size} per global batch, {mode.num_batches} global batches per epoch")
    fanouts, kind, note = config.fanouts, getattr(model, "kind", config.model), ""
    if built.typed:  # its own fanouts per relation where TypedOptions gives them, and its tables' parameters
        kind, counts = f"{config.model} (typed: {', '.join(graph.node_types)})", built.typed.parameters
        note = f", parameters {counts['dense']:,} dense + {counts['embedding']:,} in embedding tables"
        if any(f != list(config.fanouts) for f in built.typed.sampler.fanouts.values()):
            fanouts = "; ".join(f"{relation_label(r)} {f}" for r, f in built.typed.sampler.fanouts.items())
    logger.info(f"mode {mode.name}, model {kind}, fanouts {fanouts}, device {device}, batch size "
                f"{config.batch_size}, train threads {threads.train}, {mode.describe()}, {mode.num_batches} "
                f"batches per epoch{note}")
    if mode.placement is not None and (device.type == "cuda" or mode.cache is not None):
        logger.info(f"placement: {mode.placement.describe()}")
    for note in mode.placement.notes if mode.placement is not None else []:
        logger.warning(f"note: {note}")
    util = stack.enter_context(contextlib.closing(Utilisation(device)))
    metrics = stack.enter_context(contextlib.closing(MetricLog(config.logging, task.key, append=config.resume)))
    logger.info(f"task: {task.describe()}")
    run = Run(config, graph, device, threads, model, built.optimizer, mode, spans, TRAINER_STAGES.merge(mode.stages),
              util, metrics, task, data_seconds=data_seconds, world=world, typed=built.typed, stop=stop,
              mode_choice=None if choice is None else choice.to_dict(),
              health=Health(task.constant_losses(None if link else graph.labels[graph.train_idx]), built.warnings))
    if config.checkpoint_dir:
        run.fingerprint = dataset_fingerprint(graph)  # once: the graph does not change while the run lasts
    if world.distributed:
        run.sync = GradientSync(world, built.dense, stop, mode.averaged_gradients, built.tables)
        run.stop = run.sync.agreed  # every rank stops after the same step
    run.appearance = getattr(temporal, "appearance", None)
    if resumed is not None:
        run.resume(path, resumed)
    return run


def homogeneous_model(config: TrainConfig, graph: Graph, device: torch.device,
                      user_model: torch.nn.Module | None) -> Built:
    """A homogeneous graph's model (``GNN``, a link task's ``LinkModel`` over one, or your own module's
    ``UserModel``) and its Adam."""
    link = config.task == "link"
    if link:
        graph = link_graph(graph, config)
        logger.info(f"{graph.links.describe()}")
    else:
        check_node_task(graph, config)
    warnings = check_learnable(graph, not link, None if user_model is not None else graph.feature_dim)
    if user_model is not None:
        # NeutronOrch mode asks for its bottom layer when it starts (UserModel.bottom says what it needs).
        model = UserModel.wrap(user_model, len(config.fanouts), graph.num_classes)
        check_trainable(model.module, model.kind)  # predict and embed take a frozen one
        model = model.to(device)
    else:
        model = node_gnn(config, graph.feature_dim, config.hidden if link else graph.num_classes)
        if link:
            norm, mean = row_statistics(graph.features)
            model = LinkModel(model, config.link_head, input_norm=norm,
                              input_mean=None if mean is None else torch.from_numpy(mean))
        model = model.to(device)
    optimizer = Adam(optimizer_groups(model, config.lr), lr=config.lr, weight_decay=config.weight_decay)
    return Built(graph, model, optimizer, warnings, list(model.parameters()))


def node_gnn(config: TrainConfig, feature_dim: int, outputs: int) -> GNN:
    """The built-in model of ``config`` (on the CPU) over ``feature_dim`` features with ``outputs`` outputs."""
    return GNN(config.model, feature_dim, config.hidden, outputs, len(config.fanouts), dropout=config.dropout,
               heads=config.heads, gcn_norm=config.gcn_norm, residual=config.residual, norm=config.norm,
               architecture=config.architecture)
