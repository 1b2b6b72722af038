"""A typed graph's run: ``train_typed(config, graph)``, which ``neutronorch.train(config, graph=typed_graph)`` (or
``config.dataset`` naming a typed folder or OGB's ogbn-mag layout: ``is_typed_run``) runs through
``train_typed_run``; docs/heterogeneous.md describes what it trains and how.

It builds the same ``Run`` (``run.py``) as a homogeneous graph's, over the graph with its reverse relations
added (``TypedGraph.with_reverse``), with what differs held in ``TypedParts``: the samplers per relation
(``config.fanouts`` for every relation, or ``fanouts`` as ``typed_fanouts`` reads them; evaluation's from
``eval_fanouts``), the model (``TypedGNN``, or your own module: ``typed_own.py``), the embedding tables
(``typed_tables.py``) and their optimizer (``RowAdam`` on the CPU, ``SparseAdam`` elsewhere) beside Adam for
the dense weights, the graph's fingerprint, and the evaluation: the validation and test vertices scored in
batches of ``eval_batch_size`` from samples of the one key ``inference_key(seed)``, as predictions sample, so
every evaluation sees the same neighbourhoods whatever the batches. Batches come from the run's mode
(``build_mode`` given the typed graph) and train through the same loop and step; a training forward's dropout
masks are keyed by the global batch (``step.py``'s ``step_masks``), so the same seed gives the same losses,
on one rank or several (``distributed.py``'s ``GradientSync`` reduces the tables' sparse rows too).

What typed graphs cannot do yet is refused with the reason (``capabilities.check_run``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data import Graph, TypedGraph, is_typed_dataset, load_typed_dataset
from neutronorch.data.typed import relation_label
from neutronorch.data.typed_native import is_typed_dir, read_typed
from neutronorch.errors import CheckpointError, ConfigError
from neutronorch.nn.link import LinkModel
from neutronorch.nn.precision import resolve_precision
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.observe import Spans, Utilisation
from neutronorch.orchestration.factory import Threads, build_mode
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.checkpoint import TYPED, fanouts_of, load_state
from neutronorch.train.distributed import (GradientSync, World, join_ranks, launched_rank, rank_device, rank_settings,
                                           ranks_here, shared_logits, world_size)
from neutronorch.train.evaluate import eval_subset, scored
from neutronorch.train.feasible import check_learnable
from neutronorch.train.health import Health
from neutronorch.train.link_task import LinkTask, evaluate_typed_links, typed_link_graph
from neutronorch.train.loop import Progress
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.optim import Adam
from neutronorch.train.outputs import check_checkpoint_space, check_outputs
from neutronorch.train.resources import (check_threading_layer, numba_threads, resolve_device, thread_budget,
                                         torch_threads)
from neutronorch.train.resume import dataset_fingerprint, last_checkpoint
from neutronorch.train.row_adam import RowAdam
from neutronorch.train.run import Run, summarised
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.task import Task
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
    link = config.task == "link"  # a relation's edges (train/link_task.py's typed_link_graph)
    if graph.labels is None and not link:
        raise ConfigError(f"{graph.name}: its target type {graph.target!r} has no labels to train on.")
    if model is not None and link:
        raise ConfigError("`task` link trains the built-in relational models as encoders; your own module trains "
                          "node tasks for now.")
    for note in graph.notes if launched_rank() == 0 else []:  # the same on every rank
        logger.warning(f"note: {note}")
    warnings = check_learnable(graph, not link)
    graph = typed_link_graph(graph, config) if link else graph.with_reverse()
    logger.info(graph.describe())
    device = rank_device(resolve_device(config.device))  # data parallel on CUDA: this rank's GPU
    precision = resolve_precision(config.precision, device)
    config.precision = precision.name
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(graph.links.train.shape[1] if link else len(graph.train_idx))
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
    task = None if link else Task.of(graph, config.metric)
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
            model = own or TypedGNN(config.model, TypedSpec.of(graph), config.hidden,
                                    config.hidden if link else graph.num_classes, sampler.num_layers,
                                    dropout=config.dropout, heads=config.heads, num_bases=num_bases,
                                    embed_dim=embed_dim, tables=tables.maker).to(device)
        except ValueError as exc:
            raise ConfigError(f"{graph.name}: {exc}.") from None
        if link:  # the typed GNN's rows of the relation's two end types are the embeddings a link head scores
            model = LinkModel(model, config.link_head).to(device)
            task = LinkTask.of(graph, model, config.metric)
        metrics = stack.enter_context(contextlib.closing(MetricLog(config.logging, task.key, append=config.resume)))
        util = stack.enter_context(contextlib.closing(Utilisation(device)))
        run = typed_run(config, graph, model, task, sampler, eval_sampler, device, metrics, progress, stop, budget,
                        None if own else tables, world, util)  # your own module's tables are its own
        stack.callback(run.mode.close)
        run.precision, run.replacing, run.started, run.data_seconds = precision, replacing, started, data_seconds
        run.health.warnings[:0] = warnings  # the settings' (train/feasible.py), before any collapse
        if config.checkpoint_dir:
            check_checkpoint_space(config, run.model.parameters())
            run.typed.fingerprint = dataset_fingerprint(graph)  # the graph does not change while the run lasts
            if config.resume:  # every rank, from last.pt
                run.resume(*last_checkpoint(config, lambda path: load_state(path, TYPED)))
        parameters = run.typed.parameters
        logger.info(f"mode {run.mode.name}, model {config.model} (typed: {', '.join(graph.node_types)}), fanouts "
                    f"{config.fanouts if fanouts is None else fanouts}, device {device}, batch size "
                    f"{config.batch_size}, train threads {threads}, {run.mode.describe()}, {run.num_batches} batches "
                    f"per epoch, parameters {parameters['dense']:,} dense + {parameters['embedding']:,} in "
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


@dataclass
class TypedParts:
    """What a typed graph's run holds besides a homogeneous one's parts (``run.py``'s ``Run.typed``)."""

    sampler: TypedNeighborSampler  # the training fanouts, per relation
    eval_sampler: TypedNeighborSampler
    adam: Adam | None  # the dense weights' optimizer; None where your own module keeps every weight in tables
    sparse: object  # the embedding tables' (``_table_optimizer``), or None without tables
    tables: TypedTables | None  # where the tables live (train/typed_tables.py), memory-mapped ones' moments too
    parameters: dict  # {"dense": ..., "embedding": ...} counts
    fingerprint: dict | None = None  # the graph's, which checkpoints hold (with checkpoint_dir)

    def evaluate(self, run, check, progress=None) -> dict[str, float]:
        """The metric on the validation and test sets (``eval_max_nodes``: a fixed sample of each), from
        samples of the one evaluation key (``typed_logits``); ``progress(0, done, total)`` after each set."""
        config, graph, scores, done = run.config, run.graph, {}, 0
        if isinstance(run.task, LinkTask):
            return evaluate_typed_links(run.model, graph, self.eval_sampler, run.device, config.eval_batch_size,
                                        config.seed, config.eval_negatives, run.task, check)
        sets = {"val": eval_subset(graph.val_idx, config.eval_max_nodes, config.seed),
                "test": eval_subset(graph.test_idx, config.eval_max_nodes, config.seed + 1)}
        total = sum(len(nodes) for nodes in sets.values())
        for name, nodes in sets.items():
            logits = shared_logits(run.world, lambda part: typed_logits(
                run.model, graph, self.eval_sampler, part, run.device, config.eval_batch_size, config.seed),
                torch.from_numpy(nodes))  # data parallel: a share on each rank, gathered
            labels = torch.from_numpy(np.asarray(graph.labels[nodes]))
            scores.update(scored(run.task, {name: (logits, labels)}, check))  # finite, collapse noted
            done += len(nodes)
            if progress is not None:
                progress(0, done, total)
        return scores

    def check_resumable(self, state: dict, model: TypedGNN, source: str) -> None:
        """A typed run continues the checkpoint's only with its model arguments (``train_typed``'s
        ``num_bases`` and ``embed_dim`` too), fanouts per relation and tables' optimizer."""
        saved, now = state["model_args"], model.arguments
        differ = [f"the model's `{k}` {saved.get(k)!r} then, {now[k]!r} now" for k in now
                  if k != "spec" and saved.get(k) != now[k]]
        before, after = fanouts_of(state), self.sampler.fanouts
        differ += [f"the fanouts of {relation_label(r)} {before.get(r)} then, {after.get(r)} now"
                   for r in {**before, **after} if before.get(r) != after.get(r)]
        tables, sparse = state["tables_optimizer"], self.sparse and type(self.sparse).__name__
        if (tables and tables.get("class")) != sparse:
            differ.append(f"the embedding tables' optimizer {tables and tables.get('class')} then (RowAdam for CPU "
                          f"tables, SparseAdam elsewhere), {sparse} now: resume on the device the run started on")
        if differ:
            raise CheckpointError(f"{source}: the run it continues trained otherwise: {'; '.join(differ)}. Resume "
                                  f"with the same `fanouts`, `num_bases` and `embed_dim` (train_typed's arguments) "
                                  f"and device, or start a new run in another `checkpoint_dir`.")

    def load_optimizers(self, state: dict) -> None:
        self.adam.load_state_dict(state["optimizer"])
        if self.sparse is not None:
            self.sparse.load_state_dict(state["tables_optimizer"]["state"])


def typed_run(config: TrainConfig, graph: TypedGraph, model: TypedGNN, task: Task, sampler: TypedNeighborSampler,
              eval_sampler: TypedNeighborSampler, device: torch.device, metrics: MetricLog,
              progress: Progress | None, stop: threading.Event | None, threads: Threads = Threads(1, 1, 1),
              storage: TypedTables | None = None, world: World | None = None, util: Utilisation | None = None
              ) -> Run:
    """A typed graph's ``Run``: its optimizers (Adam for the dense weights, ``_table_optimizer`` for the
    tables) and its mode, rank ``world.rank`` of the ranks (data parallel: batches of ``batch_size`` per rank,
    rank 0's weights on every rank, the step's reduction ``run.sync`` with the tables' sparse rows, and the
    stop agreed on by every rank). The caller closes ``run.mode`` (and ``util``)."""
    world = world or World()
    dense = model.dense_parameters()  # none where your own module keeps every weight in sparse tables
    adam = Adam(dense, lr=config.lr, weight_decay=config.weight_decay) if dense else None
    tables = model.embedding_parameters()
    sparse = _table_optimizer(tables, config.lr, storage) if tables else None
    parts = TypedParts(sampler, eval_sampler, adam, sparse, storage,
                       {"dense": sum(p.numel() for p in dense), "embedding": sum(p.numel() for p in tables)})
    if world.distributed:
        world.broadcast_module(model, "the initial weights' broadcast")
    spans = Spans()  # every stage's spans; kept raw in the timeline's window
    mode = build_mode(config, graph, device, threads, spans, (world.rank, world.size), fanouts=sampler.fanouts)
    run = Run(config, graph, device, threads, model, [o for o in (adam, sparse) if o is not None], mode, spans,
              TRAINER_STAGES.merge(mode.stages), util or Utilisation(device), metrics, task, typed=parts,
              stop=stop, progress=progress, world=world,
              health=Health(task.constant_losses(None if isinstance(task, LinkTask)
                                                 else np.asarray(graph.labels[np.asarray(graph.train_idx)]))))
    if world.distributed:
        run.sync = GradientSync(world, dense, stop, tables=tables)
        run.stop = run.sync.agreed  # every rank stops after the same step
        batch = config.batch_size
        logger.info(f"data parallel: {world.describe()}; batch size {batch} per rank, {batch * world.size} per "
                    f"global batch, {run.num_batches} global batches per epoch")
    return run
