"""``train --partitions DIR``: training on a partition folder (``neutronorch partition``), launched with one
rank per part (docs/distributed.md, "Partitioned training"). Rank r loads part r and the global arrays only.
Its global mini-batches are the full-copy data-parallel run's (the root's split files in the epoch's order),
and rank r trains the seeds of each that part r owns (``orchestration/seeds.py``, as a full-copy run with
``deal_by`` deals them), sampled across the parts with the global batch's key (``sampling/partitioned.py``),
their rows and labels fetched from their owners (``orchestration/remote_rows.py``); gradients are averaged as
in any data-parallel run, and evaluation runs the full-neighbour (or sampled) inference across the parts
(``part_eval.py``). A link split's folder trains a link task the same way, its seed edges dealt by their
source's owner (``part_links.py``). What is not built yet is refused, saying so."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from neutronorch.capabilities import PARTITIONED_MODES
from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data.feature_norm import row_normalized
from neutronorch.data.partition_files import is_partition_dir, is_typed, load_partition, read_manifest
from neutronorch.data.typed_parts import TypedPartition
from neutronorch.errors import ConfigError
from neutronorch.features.placement import Placement
from neutronorch.features.store import FeatureStore
from neutronorch.nn.link import optimizer_groups
from neutronorch.nn.precision import precision_dtype
from neutronorch.observe import Spans, Utilisation
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.factory import Threads
from neutronorch.orchestration.remote_rows import PartitionedLoader, RemoteRows, RowBuffers
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.partitioned import PartitionedSampler, global_in_degrees
from neutronorch.train.distributed import GradientSync, World
from neutronorch.train.health import Health
from neutronorch.train.link_task import LinkTask, check_link_settings, check_node_task
from neutronorch.train.optim import Adam
from neutronorch.train.part_checkpoint import attach_checkpoints
from neutronorch.train.part_eval import PartEvaluation
from neutronorch.train.part_exchange import GlooExchange
from neutronorch.train.part_mode import PartitionedMode
from neutronorch.train.part_links import PartLinkEvaluation, check_task, link_model
from neutronorch.train.part_typed import build_typed_part_run, check_typed_request
from neutronorch.train.part_typed_neutronorch import build_typed_mode as build_typed_neutronorch
from neutronorch.train.part_typed_links import build_typed_link_run
from neutronorch.train.part_neutronorch import build_mode as build_neutronorch, check_request as check_neutronorch
from neutronorch.train.run import Run
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.summary import MetricLog
from neutronorch.train.task import Task

logger = logging.getLogger("neutronorch")
BUILT = "partitioned training (--partitions) is built for node and link tasks in exact and neutronorch mode on the CPU"
WHY = "(docs/distributed.md, \"Partitioned training\")"


def check_request(config: TrainConfig, graph, model, options, device: torch.device) -> None:
    """Refuse, before any output is made, what a partitioned run cannot do yet, each with the reason."""
    if config.deal_by is not None and config.partitions is not None:
        raise ConfigError(f"`deal_by` {config.deal_by}: deals a full-copy run's seeds on the whole graph as a "
                          f"partitioned run deals them; a partitioned run deals by its own parts. Leave `deal_by` "
                          f"out.")
    if config.partitions is None:
        return

    def refuse(what: str, fix: str) -> ConfigError:
        return ConfigError(f"{what}: {BUILT} {WHY}. {fix}")

    if graph is not None or model is not None:
        raise refuse("`graph` or `model` given with `partitions`", "Train on the partition folder alone (rank r loads "
                     "part r), with a built-in model.")
    if options is not None and not typed_partition(config.partitions):
        raise ConfigError(f"`options` (a TypedOptions) are a typed graph's settings, and {config.partitions} holds "
                          f"a homogeneous graph's parts; leave `options` out.")
    if config.settings_given(["dataset"]):
        raise ConfigError(f"`dataset` {config.dataset} and `partitions` {config.partitions}: the partition folder "
                          f"holds the graph it was made from; give one of them.")
    check_task(config)  # a link split's folder trains a link task, any other a node task
    if typed_partition(config.partitions):
        check_typed_request(config)
    if config.mode not in PARTITIONED_MODES:
        raise refuse(f"`mode` {config.mode}", "Give `mode` exact (or leave it out) or neutronorch.")
    CHECKS.get(config.mode, lambda _: None)(config)
    if device.type != "cpu":
        raise refuse(f"device {device}", "Give `device` cpu: the ranks exchange over gloo.")
    given = config.settings_given(["split", "times", "link_direction"])
    if given:
        raise refuse(", ".join(given), "Leave it out: the partition holds its split and rows as written.")
    given = config.settings_given(["eval_fanouts", "normalize_features"]) if config.task == "link" and not \
        typed_partition(config.partitions) else []  # a typed graph's link task samples its evaluation
    if given:
        raise refuse(", ".join(given) + " with `task` link", "Leave it out: a link task's evaluation embeds every "
                     "vertex its pairs name layer by layer, and its model starts from the manifest's statistics of "
                     "the rows as written.")


def typed_partition(folder) -> bool:
    """Whether ``folder`` is a typed graph's partition (a folder that is none is refused when it is loaded)."""
    return is_partition_dir(folder) and is_typed(read_manifest(folder))


@dataclass
class PartGraph:
    """What a run reads of the whole graph where a rank holds one part: the manifest's sizes and classes, the
    whole split (the root's files), the part's own labels (their shape says the task's kind) and a link
    dataset's split."""

    name: str
    num_nodes: int
    num_edges: int
    feature_dim: int
    num_classes: int
    metric: str | None
    labels: np.ndarray
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    links: object = None  # ``LinkSplit``: a link dataset's
    notes: list = field(default_factory=list)
    terms: tuple | None = None  # (the training vertices, ascending; each one's known labels): ``loss_terms``

    def loss_terms(self, ids: np.ndarray) -> int:
        """``Graph.loss_terms`` of training vertices (what NeutronOrch's hot gradient weighs the ranks by)."""
        order, terms = self.terms
        return int(terms[np.searchsorted(order, np.asarray(ids))].sum())

    @classmethod
    def of(cls, part) -> "PartGraph":
        graph = part.manifest["graph"]
        return cls(graph["name"], graph["num_nodes"], graph["num_edges"], graph["feature_dim"], graph["num_classes"],
                   graph["metric"], part.labels, *(part.global_splits[s] for s in ("train_idx", "val_idx", "test_idx")),
                   links=part.links, notes=list(graph["notes"]))


def build_partitioned_run(config: TrainConfig, device: torch.device, threads: Threads, stack: contextlib.ExitStack,
                          world: World, stop: threading.Event | None, gnn, options=None) -> Run:
    """``trainer.build_run`` for a partition folder: this rank's part, model (``gnn(config, feature_dim,
    classes)``, made as a full-copy run makes it; a typed graph's by ``part_typed.py``, with its
    ``TypedOptions``), optimizer and partitioned mode."""
    t0 = time.perf_counter()
    part = load_partition(Path(config.partitions), world.rank, world_size=world.size)
    manifest = part.manifest
    config.dataset = manifest["source"]  # what the summary and logs name: the graph the parts were made from
    data_seconds = time.perf_counter() - t0
    if isinstance(part, TypedPartition):  # a link split's folder: part_typed_links.py's
        if part.links is not None:
            return build_typed_link_run(config, part, device, threads, stack, world, stop, data_seconds, options,
                                        TYPED_MODES.get(config.mode))
        return build_typed_part_run(config, part, device, threads, stack, world, stop, data_seconds, options,
                                    TYPED_MODES.get(config.mode))
    graph = PartGraph.of(part)
    logger.info(f"loaded part {part.part} of {part.parts} of {graph.name} ({manifest['method']} parts): "
                f"{part.ids.shape[0]:,} of {graph.num_nodes:,} vertices, {part.indices.shape[0]:,} of "
                f"{graph.num_edges:,} edges, in {data_seconds:.1f}s")
    if config.normalize_features != "none":  # row by row: each rank its own part's rows, which it then serves
        part.features = on_every_rank(world, lambda: row_normalized(part.features, f"part {part.part}'s rows"),
                                      "agreeing on the normalised feature rows")
        logger.info(f"`normalize_features` {config.normalize_features}: each part's rows divided by their sums "
                    f"where above 1")
    for note in graph.notes if world.main else []:
        logger.warning(f"note: {note}")
    link = graph.links is not None
    if link:  # the link settings checked against the split, as a full-copy run checks them
        check_link_settings(graph, config)
    else:  # and a link task's settings refused on a node task, as a full-copy run refuses them
        check_node_task(graph, config)
    model = (link_model(config, gnn(config, graph.feature_dim, config.hidden), manifest) if link else
             gnn(config, graph.feature_dim, graph.num_classes)).to(device)
    optimizer = Adam(optimizer_groups(model, config.lr), lr=config.lr, weight_decay=config.weight_decay)
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(graph.links.train.shape[1] if link else len(graph.train_idx))
    task = LinkTask.of(graph, model, config.metric) if link else Task.of(graph, config.metric)
    if world.distributed:
        world.broadcast_module(model, "the initial weights' broadcast")
        sampling_exchange = GlooExchange.new(world, "the partitioned sampling's exchange")
        stack.callback(sampling_exchange.close)  # after the mode's close below (its producer thread stopped)
        evaluation_exchange = GlooExchange(world, what="the partitioned evaluation's exchange")
    else:
        sampling_exchange, evaluation_exchange = ThreadExchange.group(1)[0], ThreadExchange.group(1)[0]
    spans = Spans()
    sampling = dataclasses.replace(config.sampling, rank=world.rank, world=world.size)
    topology = part.indptr.nbytes + part.indices.nbytes
    placement = Placement("cpu", None, 0, "host", "host", 0, "none", topology, part.features.nbytes, 0)
    access = FeatureAccess(device, FeatureStore(part.features, part.labels), placement, None, None)
    loader = PartitionedLoader(access, RemoteRows(part, sampling_exchange), spans, precision_dtype(config.precision))
    # Symmetric GCN's blocks carry their sources' in-degrees in the whole graph: each part's own, gathered.
    degrees = global_in_degrees(part, world.rows_gatherer("gathering the in-degrees")) if model.needs_degrees \
        else None
    seeds = (LinkSeeds(graph.links.train, graph.num_nodes, sampling, config.negatives, owner=part.part_of) if link
             else NodeSeeds(graph, sampling, part.part_of))  # each global batch dealt by owner
    mode = MODES[config.mode](config, part, graph, world, access, loader, sampling, spans, threads, degrees, seeds,
                              sampling_exchange, evaluation_exchange, stack)
    logger.info(f"partitioned: {world.describe()}; batch size {config.batch_size} per rank, "
                f"{config.batch_size * world.size} per global batch, {mode.num_batches} global batches per epoch")
    logger.info(f"mode {mode.name}, model {config.model}, fanouts {config.fanouts}, device {device}, batch size "
                f"{config.batch_size}, train threads {threads.train}, {mode.describe()}")
    util = stack.enter_context(contextlib.closing(Utilisation(device)))
    metrics = stack.enter_context(contextlib.closing(MetricLog(config.logging, task.key, append=config.resume)))
    logger.info(f"task: {task.describe()}")
    own = None if link else np.asarray(part.labels[part.local(part.splits["train_idx"])])
    train_labels = (torch.cat(world.all_gather_rows(torch.from_numpy(own.astype(np.int64)),
                                                    "gathering the training labels")).numpy()
                    if world.distributed and not link else own)
    if not link:  # every training vertex's known labels, in the order of the labels just gathered
        ids = np.array(part.splits["train_idx"], dtype=np.int64)  # a writable copy
        ids = torch.cat(world.all_gather_rows(torch.from_numpy(ids), "gathering the training vertices")).numpy() \
            if world.distributed else ids
        known, order = (train_labels >= 0).reshape(train_labels.shape[0], -1).sum(1), np.argsort(ids)
        graph.terms = (ids[order], known[order])
    run = Run(config, graph, device, threads, model, optimizer, mode, spans, TRAINER_STAGES.merge(mode.stages),
              util, metrics, task, data_seconds=data_seconds, world=world, stop=stop,
              health=Health(task.constant_losses(train_labels), []))
    run.partitioned = (PartLinkEvaluation if link else PartEvaluation)(part, evaluation_exchange, world, degrees)
    if world.distributed:
        run.sync = GradientSync(world, list(model.parameters()), stop, mode.averaged_gradients)
        run.stop = run.sync.agreed  # every rank stops after the same step
    attach_checkpoints(run, part, world)  # each rank's own file, and with `resume`, every rank's checked
    return run


def exact_mode(config: TrainConfig, part, graph: PartGraph, world: World, access, loader: PartitionedLoader, sampling,
               spans: Spans, threads: Threads, degrees, seeds, cold, evaluation_exchange, stack) -> PartitionedMode:
    """Exact mode on ``part``, sampling over the exchange ``cold`` (``part_neutronorch.build_mode``'s arguments)."""
    loader.buffers = RowBuffers(sampling.prefetch + 2)  # the queue's, one being made, one being trained on
    mode = PartitionedMode(world, evaluation_exchange, seeds,
                           lambda: PartitionedSampler(part, cold, sampling.fanouts, degrees), loader, sampling, spans,
                           threads.sampler)
    stack.callback(mode.close)
    return mode


MODES = {"exact": exact_mode, "neutronorch": build_neutronorch}  # what `partitions` trains in, by name
CHECKS = {"neutronorch": check_neutronorch}  # ... and what each refuses before any output is made
TYPED_MODES = {"neutronorch": build_typed_neutronorch}  # a typed graph's parts beyond exact mode (part_typed.py's)


def on_every_rank(world: World, make, what: str):
    """``make()``, whose ``ConfigError`` on any rank (the first, by rank) is raised on every rank, so that no
    rank is left waiting for the others' next collective."""
    try:
        value, problem = make(), None
    except ConfigError as exc:
        value, problem = None, str(exc)
    problems = world.all_gather_objects(problem, what) if world.distributed else [problem]
    for rank, theirs in enumerate(problems):
        if theirs:
            raise ConfigError(f"rank {rank}: {theirs}" if world.distributed else theirs)
    return value
