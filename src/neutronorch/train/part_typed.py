"""``train --partitions DIR`` on a typed graph's partition (docs/distributed.md, "Typed graphs on parts"): rank r
loads part r (``data/typed_parts.py``), trains the target's training vertices of each global batch that its part
owns, sampled across the parts with the global batch's key (``sampling/partitioned_typed.py``), each featured
type's input rows fetched from their owners (``TypedRemoteRows``). The relational model and its optimizers are
built as a full-copy typed run builds them (``heterogeneous.typed_model``), its embedding tables (the featureless
types') split by owner, each rank holding its part's rows (``part_tables.py``). Evaluation samples
the validation and test vertices as a full-copy typed run does, each rank its own (``PartTypedEvaluation``).
The target's labels (8 bytes a target vertex) are gathered whole once, for the checks and the loss's constants
a full-copy run makes from them; everything else a rank holds is its part's."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data.typed import TypedGraph
from neutronorch.data.typed_parts import TypedPartition
from neutronorch.errors import ConfigError
from neutronorch.observe import Spans, Utilisation
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.factory import Threads
from neutronorch.orchestration.remote_rows import PartitionedLoader, RemoteRows
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.exchange import Exchange, ThreadExchange
from neutronorch.sampling.partitioned_typed import PartitionedTypedSampler
from neutronorch.train.checkpoint import TYPED, dataset_fingerprint
from neutronorch.train.distributed import GradientSync, World
from neutronorch.train.evaluate import inference_key
from neutronorch.train.health import Health
from neutronorch.train.heterogeneous import TypedOptions, typed_model
from neutronorch.train.part_checkpoint import attach_checkpoints
from neutronorch.train.part_states import table_rows
from neutronorch.train.part_eval import PartEvaluation, joined
from neutronorch.train.part_exchange import GlooExchange
from neutronorch.train.part_mode import PartitionedMode
from neutronorch.train.part_tables import PartTables, TableSteps, check_storage
from neutronorch.train.run import Built, Run
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.summary import MetricLog
from neutronorch.train.task import Task
from neutronorch.train.typed_tables import TypedTables

logger = logging.getLogger("neutronorch")


class PartTypedGraph(TypedGraph):
    """What a rank holding one part of a typed graph trains with as a ``TypedGraph``: the whole graph's types,
    vertex counts, relations' names, target, split and labels, and its own part's relations (rows: its owned
    destinations) and feature rows, which give the model its widths; ``num_edges`` is the whole graph's."""

    whole_edges: int = 0

    @property
    def num_edges(self) -> int:
        return self.whole_edges


def part_graph(part: TypedPartition, labels: np.ndarray) -> PartTypedGraph:
    """``part`` as the graph a rank trains with, ``labels`` the whole target's (``gathered_labels``)."""
    splits = part.global_splits
    features = {t: part.features[t] for t in part.node_types if part.feature_dims.get(t)}
    graph = PartTypedGraph(part.name, dict(part.num_nodes), dict(part.relations), features, part.target, labels,
                           splits["train_idx"], splits["val_idx"], splits["test_idx"], part.num_classes,
                           list(part.notes), part.metric)
    graph.whole_edges = int(part.manifest.get("graph", {}).get("num_edges", sum(
        r.num_edges for r in part.relations.values())))
    return graph


def gathered_labels(part: TypedPartition, world: World) -> np.ndarray:
    """The target's labels of the whole graph, each part's own gathered (a collective)."""
    own = torch.from_numpy(np.array(part.labels, dtype=np.int64))  # a copy of its own (the map is read-only)
    parts = world.all_gather_rows(own, "gathering the target's labels") if world.distributed else [own]
    labels = np.empty((part.num_nodes[part.target], *own.shape[1:]), dtype=np.int64)
    owners = np.asarray(part.part_of[part.target])
    for k, rows in enumerate(parts):
        labels[np.flatnonzero(owners == k)] = rows.numpy()  # each part's vertices ascending: its local order
    return labels


class TypedRemoteRows:
    """Each featured type's rows of a typed frontier, fetched from their owners (``RemoteRows`` of the type's
    ``OwnedRows``, every featured type in the graph's order, every rank taking part even with no row to ask)."""

    def __init__(self, part: TypedPartition, exchange):
        self.part, self.exchange = part, exchange
        self.fetchers = {t: RemoteRows(part.view(t), exchange) for t in part.node_types if part.feature_dims.get(t)}

    @property
    def fetched(self) -> int:
        return sum(f.fetched for f in self.fetchers.values())

    def drop_buffers(self) -> None:
        for fetcher in self.fetchers.values():
            fetcher.drop_buffers()

    def rows(self, frontier: dict) -> dict[str, torch.Tensor]:
        """float32 rows of every featured type's ids in ``frontier`` (a collective)."""
        empty = torch.zeros(0, dtype=torch.int64)
        out = {}
        for t, fetcher in self.fetchers.items():
            ids = frontier.get(t, empty)
            rows, _ = fetcher.fetch(ids.numpy() if isinstance(ids, torch.Tensor) else ids)
            if t in frontier:
                out[t] = torch.from_numpy(np.asarray(rows, dtype=np.float32))
        return out


class TypedPartLoader(PartitionedLoader):
    """A typed mini-batch's rows fetched from their owners (``TypedRemoteRows``), its seeds' labels read from
    the part (a partitioned run's seeds are its own); the rest as ``PartitionedLoader``."""

    def load(self, epoch: int, index: int, subgraph, make=None, targets=None) -> MiniBatch:
        part = self.fetcher.part
        with self.spans.stage("gather", index):
            features = self.fetcher.rows(subgraph.input_nodes)
            seeds = subgraph.seeds.numpy()
            labels = torch.from_numpy(np.asarray(part.labels[part.local(part.target, seeds)], dtype=np.int64))
            return (make or MiniBatch)(epoch, index, subgraph, features, labels)


class PartTypedEvaluation(PartEvaluation):
    """A typed partitioned run's evaluation: each rank's own validation and test vertices sampled with the eval
    fanouts and the one key of a full-copy typed run's evaluation (``evaluate.typed_logits``), so that each
    vertex's logits are the full-copy run's (to float-sum order); scored as ``PartEvaluation`` scores them."""

    def __init__(self, part: TypedPartition, exchange, world: World, tables: PartTables):
        self.part, self.world, self.tables = part, world, tables
        self.fetcher = TypedRemoteRows(part, exchange)

    @property
    def owners(self) -> np.ndarray:
        return self.part.part_of[self.part.target]

    def labels_of(self, ids: np.ndarray) -> np.ndarray:
        return self.part.labels[self.part.local(self.part.target, ids)]

    def share_rows(self, run, own: np.ndarray, positions: np.ndarray, progress=None) -> Iterator[torch.Tensor]:
        run.model.eval()
        return sampled_chunks(self, run.model, run.typed.eval_sampler, own, run, self.tables, progress)

    def out_width(self, model) -> int:
        return model.arguments["num_classes"]


def sampled_rows(evaluation, module, sampler, ids: np.ndarray, run, tables: PartTables, width: int,
                 progress=None) -> torch.Tensor:
    """``module``'s rows of ``ids`` (vertices this rank owns), sampled by ``sampler`` in chunks of the
    evaluation's batch size with the one key of a full-copy typed evaluation (``inference_key``); every rank
    takes as many chunks (``evaluation._chunks``), each fetching its inputs' rows and table rows from their
    owners (collectives over ``evaluation.fetcher``'s exchange)."""
    return joined(sampled_chunks(evaluation, module, sampler, ids, run, tables, progress), ids.shape[0], width)


@torch.no_grad()
def sampled_chunks(evaluation, module, sampler, ids: np.ndarray, run, tables: PartTables,
                   progress=None) -> Iterator[torch.Tensor]:
    """``sampled_rows`` chunk by chunk (collectives: to be read to the end)."""
    config, device, chunk_size = run.config, run.device, max(1, run.config.eval_batch_size)
    for start in evaluation._chunks(ids.shape[0], chunk_size):
        chunk = ids[start:start + chunk_size]
        subgraph = sampler.sample(chunk, inference_key(config.seed))
        features = {t: rows.to(device) for t, rows in evaluation.fetcher.rows(subgraph.input_nodes).items()}
        tables.fetch(subgraph.input_nodes, evaluation.fetcher.exchange, grad=False)
        if chunk.shape[0]:
            inputs = {t: v.to(device) for t, v in subgraph.input_nodes.items()}
            yield module([b.to(device) for b in subgraph.blocks], features, inputs).float().cpu()
        if progress is not None:
            progress(0, min(ids.shape[0], start + chunk_size), ids.shape[0])
    evaluation.fetcher.drop_buffers()


class TypedPartMode(TableSteps, PartitionedMode):
    """``PartitionedMode`` of a typed graph's part whose embedding tables are split by owner (``TableSteps``)."""

    def __init__(self, tables: PartTables, world: World, *args):
        super().__init__(world, *args)
        self.tables, self.alone = tables, not world.distributed


def check_typed_request(config: TrainConfig) -> None:
    """What a typed partition's run refuses beyond what any partitioned run refuses, with the reason (its modes
    are any partitioned run's: ``partitioned.check_request`` refuses the others)."""
    if config.normalize_features != "none":  # the task is the folder's (``part_links.check_task``)
        raise ConfigError(f"normalize_features: a typed graph's parts train on rows as written, so far "
                          f"(docs/distributed.md, \"Typed graphs on parts\"). Leave it out, or train the typed graph "
                          f"whole (`dataset`).")
    check_storage(config)


@dataclass
class TypedSetup:
    """What the runs of both tasks on a typed graph's parts build alike (``typed_setup``)."""

    built: Built  # the model, its optimizers, tables (split by owner) and samplers
    tables: PartTables
    sampling: Exchange  # the producer thread's exchange
    evaluation: Exchange  # the training thread's, for evaluation
    tables_exchange: Exchange  # the training thread's, for the tables' rows and gradients

    @property
    def fanouts(self) -> dict:
        return self.built.typed.sampler.fanouts


def typed_setup(config: TrainConfig, part: TypedPartition, graph: TypedGraph, device: torch.device,
                stack: contextlib.ExitStack, world: World, options: TypedOptions, statistics=None) -> TypedSetup:
    """The exchanges, and the model built as a full-copy typed run builds it (``typed_model``; ``statistics``: a
    link model's), its tables split by owner (``PartTables``), the initial weights rank 0's but for each rank's
    rows of the tables."""
    if world.distributed:
        sampling_exchange = GlooExchange.new(world, "the partitioned sampling's exchange")
        stack.callback(sampling_exchange.close)  # after the mode's close (its producer thread stopped)
        evaluation_exchange = GlooExchange(world, what="the partitioned evaluation's exchange")
        tables_exchange = GlooExchange(world, what="the embedding tables' exchange")  # the training thread's
    else:
        sampling_exchange, evaluation_exchange, tables_exchange = (ThreadExchange.group(1)[0] for _ in range(3))
    config.embedding_storage = "memory"  # each rank's rows of the tables (mmap is refused on parts)
    tables = PartTables(part, tables_exchange)
    built = typed_model(config, graph, device, None, options, stack, table_maker=tables.maker(), statistics=statistics,
                        samplers=lambda fanouts: PartitionedTypedSampler(part, evaluation_exchange, fanouts))
    tables.attach(built.model)
    built.typed.tables = TypedTables("memory", "split by owner on the parts", tables.shapes(), fill=False)
    if tables.tables:
        logger.info(f"embedding tables split by owner: this rank holds {sum(r for r, _ in tables.shapes().values()):,} "
                    f"of their {sum(part.num_nodes[t] for t in tables.tables):,} rows, "
                    f"{built.typed.tables.nbytes / 2**20:.1f} MiB with both moments")
    if world.distributed:
        owned = [t.weight for t in tables.tables.values()]  # each rank's rows of the tables: its own
        world.broadcast_module(built.model, "the initial weights' broadcast", keep=frozenset(
            n for n, p in built.model.named_parameters() if any(p is w for w in owned)))
    return TypedSetup(built, tables, sampling_exchange, evaluation_exchange, tables_exchange)


def typed_mode(setup: TypedSetup, part: TypedPartition, world: World, seeds, loader, sampling, spans: Spans,
               threads: Threads, stack: contextlib.ExitStack) -> "TypedPartMode":
    """Exact mode on a typed graph's part, sampling with the partitioned typed sampler; closed with ``stack``."""
    mode = TypedPartMode(setup.tables, world, setup.evaluation, seeds,
                         lambda: PartitionedTypedSampler(part, setup.sampling, setup.fanouts), loader, sampling, spans,
                         threads.sampler)
    mode.traffic.lanes["tables"] = setup.tables_exchange
    stack.callback(mode.close)
    return mode


def typed_run(config: TrainConfig, part: TypedPartition, graph: TypedGraph, device: torch.device, threads: Threads,
              stack: contextlib.ExitStack, world: World, stop: threading.Event | None, setup: TypedSetup, mode, task,
              data_seconds: float, constants, evaluation, described: str = "") -> Run:
    """The ``Run`` of a typed graph's part: its logs, metrics, evaluation (``evaluation``), the gradient sync with
    the tables' reduction, and checkpoints. ``constants``: the training labels' a node task's health reads."""
    built = setup.built
    logger.info(f"partitioned: {world.describe()}; batch size {config.batch_size} per rank, "
                f"{config.batch_size * world.size} per global batch, {mode.num_batches} global batches per epoch")
    counts = built.typed.parameters
    logger.info(f"mode {mode.name}, model {config.model} (typed: {', '.join(graph.node_types)}), fanouts "
                f"{config.fanouts}, device {device}, batch size {config.batch_size}, train threads {threads.train}, "
                f"{mode.describe()}, parameters {counts['dense']:,} dense + {counts['embedding']:,} in this rank's "
                f"rows of the embedding tables{described}")
    util = stack.enter_context(contextlib.closing(Utilisation(device)))
    metrics = stack.enter_context(contextlib.closing(MetricLog(config.logging, task.key, append=config.resume)))
    logger.info(f"task: {task.describe()}")
    run = Run(config, graph, device, threads, built.model, built.optimizer, mode, mode.spans,
              TRAINER_STAGES.merge(mode.stages), util, metrics, task, data_seconds=data_seconds, world=world,
              typed=built.typed, stop=stop, health=Health(task.constant_losses(constants), built.warnings))
    run.partitioned = evaluation
    if world.distributed:
        run.sync = GradientSync(world, built.dense, stop, mode.averaged_gradients,
                                setup.tables.reduce if setup.tables.tables else ())
        run.stop = run.sync.agreed  # every rank stops after the same step
    attach_checkpoints(run, part, world, dataset_fingerprint(graph), TYPED)
    if part.parts > 1:  # each rank's file names its rows of the tables: prediction makes them whole from all
        run.partition["table_rows"] = table_rows(part, setup.tables.tables)
    return run


def build_typed_part_run(config: TrainConfig, part: TypedPartition, device: torch.device, threads: Threads,
                         stack: contextlib.ExitStack, world: World, stop: threading.Event | None,
                         data_seconds: float, options: TypedOptions | None = None, neutronorch=None) -> Run:
    """``partitioned.build_partitioned_run`` for a typed partition: this rank's model, optimizers and mode (exact;
    ``neutronorch``: ``part_typed_neutronorch.build_typed_mode``, which makes NeutronOrch mode's)."""
    check_typed_request(config)
    t0 = time.perf_counter()
    graph = part_graph(part, gathered_labels(part, world))
    data_seconds += time.perf_counter() - t0
    for note in graph.notes if world.main else []:
        logger.warning(f"note: {note}")
    setup = typed_setup(config, part, graph, device, stack, world, options or TypedOptions())
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(len(graph.train_idx))
    task = Task.of(graph, config.metric)
    spans = Spans()
    sampling = dataclasses.replace(config.sampling, rank=world.rank, world=world.size)
    access = FeatureAccess(device, None, None, None, None, None, graph)
    loader = TypedPartLoader(access, TypedRemoteRows(part, setup.sampling), spans)
    seeds = NodeSeeds(graph, sampling, part.part_of[part.target])  # each global batch dealt by owner
    mode = typed_mode(setup, part, world, seeds, loader, sampling, spans, threads, stack) if neutronorch is None \
        else neutronorch(config, part, graph, world, setup, access, seeds, sampling, spans, threads, stack)
    return typed_run(config, part, graph, device, threads, stack, world, stop, setup, mode, task, data_seconds,
                     graph.labels[graph.train_idx], PartTypedEvaluation(part, setup.evaluation, world, setup.tables))
