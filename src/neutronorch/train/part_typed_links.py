"""A typed graph's link task on its parts (``train --partitions DIR --task link`` on a folder that ``neutronorch
partition TYPED --split edges:T,V --link-relation REL`` made; docs/distributed.md, "Typed graphs on parts"). The
folder holds the message-passing graph a full-copy typed link run trains with (``link_task.split_typed_relation``)
and the split of the relation in its end types' stacked ids (``data/partition_typed_links.py``). Rank r trains
the positives of each global batch whose source its part owns, with the negatives one process draws (``LinkSeeds``
with ``owner``), the batch's positives excluded from the sampled graph as in a full-copy run; the model is a
full-copy run's (``heterogeneous.typed_model``), its first layer started from the manifest's statistics of each
featured type's rows. Evaluation is the full-copy run's (``evaluate_links``: the same pairs, negatives and
metric), computed across the parts (``PartTypedLinkEvaluation``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading

import numpy as np
import torch

from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data.links import LinkEnds
from neutronorch.data.partition_typed_links import input_statistics
from neutronorch.data.typed_parts import TypedPartition
from neutronorch.observe import Spans, Utilisation
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.factory import Threads
from neutronorch.orchestration.link_seeds import EndsSampler, LinkSeeds
from neutronorch.orchestration.remote_rows import RemoteRows
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.partitioned_typed import PartitionedTypedSampler
from neutronorch.train.checkpoint import TYPED, dataset_fingerprint
from neutronorch.train.distributed import GradientSync, World
from neutronorch.train.evaluate import inference_key
from neutronorch.train.health import SPLIT_NAMES, Health
from neutronorch.train.heterogeneous import TypedOptions, typed_model
from neutronorch.train.link_task import LinkTask, check_link_settings, eval_sets, named_vertices, set_metrics
from neutronorch.train.part_checkpoint import attach_checkpoints
from neutronorch.train.part_exchange import GlooExchange
from neutronorch.train.part_links import PartLinkEvaluation
from neutronorch.train.part_mode import PartitionedMode
from neutronorch.train.part_typed import TypedPartLoader, TypedRemoteRows, check_typed_request, part_graph
from neutronorch.train.run import Run
from neutronorch.train.step import TRAINER_STAGES
from neutronorch.train.summary import MetricLog

logger = logging.getLogger("neutronorch")


def stacked_owners(part: TypedPartition, ends: LinkEnds) -> np.ndarray:
    """The owner part of each of ``ends``' stacked ids (its end types' owners one after the other)."""
    return np.concatenate([np.asarray(part.part_of[t]) for t in ends.types])


class TypedPartLinkLoader(TypedPartLoader):
    """A typed link batch's rows fetched from their owners; its targets (the positions of its pairs' ends) are
    the loss's labels."""

    def load(self, epoch: int, index: int, subgraph, make=None, targets=None) -> MiniBatch:
        with self.spans.stage("gather", index):
            return (make or MiniBatch)(epoch, index, subgraph, self.fetcher.rows(subgraph.input_nodes), targets)


class PartTypedLinkEvaluation(PartLinkEvaluation):
    """``evaluate_links`` of a typed graph across its parts: the full-copy run's sets (pairs and negatives in the
    stacked ids), each rank embedding the named vertices it owns with the eval fanouts and the one key a full-copy
    run's ``typed_logits`` samples with (``PartitionedTypedSampler``, their inputs' rows fetched from their
    owners), into a table per end type by local index; the rows each rank's share of the pairs names are then
    fetched from their owners (``RemoteRows`` over the tables, one fetch an end type) and scored as
    ``PartLinkEvaluation`` scores a homogeneous graph's."""

    def __init__(self, part: TypedPartition, exchange, world: World, ends: LinkEnds):
        self.part, self.world, self.ends = part, world, ends
        self.fetcher = TypedRemoteRows(part, exchange)  # the inputs' rows (and the exchange every chunk counts on)
        self.tables = {t: RemoteRows(part.view(t), exchange) for t in ends.types}
        self.owner = stacked_owners(part, ends)

    def evaluate(self, run, check, progress=None) -> dict[str, float]:
        config, model, part, ends = run.config, run.model, self.part, self.ends
        self.prepare(model)
        model.eval()
        sets = eval_sets(run.graph.links, config.seed, config.eval_negatives, ends.destinations)
        nodes = named_vertices(sets, ends.num_nodes).numpy()
        owned = np.ascontiguousarray(nodes[self.owner[nodes] == part.part])
        rows = self.embedded(run, owned, progress).numpy()
        tables, at = {}, 0
        for t, ids in ends.split(owned).items():  # owned is sorted: the first end type's, then the second's
            tables[t] = np.zeros((part.ids[t].shape[0], rows.shape[1]), np.float32)
            tables[t][part.local(t, ids)] = rows[at:at + ids.shape[0]]
            at += ids.shape[0]
        del rows
        shares = {name: self.share_of(pairs) for name, pairs in sets.items()}
        named = torch.zeros(ends.num_nodes, dtype=torch.bool)  # the rows the shares name, fetched at once
        for lo, positives, negatives in shares.values():
            named[positives.reshape(-1)] = True
            for _, chunk in negatives():
                named[chunk.reshape(-1)] = True
        ids = named.nonzero().reshape(-1)
        del named
        got = torch.from_numpy(np.concatenate([self.tables[t].fetch(local, table=tables[t])[0]
                                               for t, local in ends.split(ids.numpy()).items()]))
        del tables
        row = lambda v: got[torch.searchsorted(ids, v)].to(run.device)  # noqa: E731
        out: dict[str, float] = {}
        with torch.no_grad():
            for name, pairs in sets.items():
                scores = self.scored(model, pairs, *shares[name], row, check, SPLIT_NAMES[name])
                out.update(set_metrics(name, scores, run.task.metric, check))
        return out

    @torch.no_grad()
    def embedded(self, run, owned: np.ndarray, progress=None) -> torch.Tensor:
        """The encoder's rows of ``owned`` (stacked ids this part owns, ascending), sampled in chunks of the
        evaluation's batch size with ``inference_key``; every rank takes as many chunks (collectives)."""
        encoder, device = run.model.encoder, run.device
        sampler, chunk_size = EndsSampler(run.typed.eval_sampler, self.ends), max(1, run.config.eval_batch_size)
        outputs = [torch.zeros(0, encoder.arguments["num_classes"])]
        for start in self._chunks(owned.shape[0], chunk_size):
            chunk = owned[start:start + chunk_size]
            subgraph = sampler.sample(chunk, inference_key(run.config.seed))
            features = {t: rows.to(device) for t, rows in self.fetcher.rows(subgraph.input_nodes).items()}
            if chunk.shape[0]:
                ids = {t: v.to(device) for t, v in subgraph.input_nodes.items()}
                outputs.append(encoder([b.to(device) for b in subgraph.blocks], features, ids).float().cpu())
            if progress is not None:
                progress(0, min(owned.shape[0], start + chunk_size), owned.shape[0])
        return torch.cat(outputs)


def build_typed_link_run(config: TrainConfig, part: TypedPartition, device: torch.device, threads: Threads,
                         stack: contextlib.ExitStack, world: World, stop: threading.Event | None,
                         data_seconds: float, options: TypedOptions | None = None) -> Run:
    """``part_typed.build_typed_part_run`` for a folder holding a link split: this rank's link model, optimizers
    and mode."""
    check_typed_request(config)
    options = options or TypedOptions()
    graph = part_graph(part, None)  # a link task reads no labels
    graph.links = part.links
    for note in graph.notes if world.main else []:
        logger.warning(f"note: {note}")
    check_link_settings(graph, config)  # as a full-copy run checks them against its split
    links, ends = graph.links, graph.links.ends
    if world.distributed:
        sampling_exchange = GlooExchange.new(world, "the partitioned sampling's exchange")
        stack.callback(sampling_exchange.close)  # after the mode's close (its producer thread stopped)
        evaluation_exchange = GlooExchange(world, what="the partitioned evaluation's exchange")
    else:
        sampling_exchange, evaluation_exchange = ThreadExchange.group(1)[0], ThreadExchange.group(1)[0]
    built = typed_model(config, graph, device, None, options, stack,
                        samplers=lambda fanouts: PartitionedTypedSampler(part, evaluation_exchange, fanouts),
                        statistics=input_statistics(part.manifest))
    model, fanouts = built.model, built.typed.sampler.fanouts
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(links.train.shape[1])
    task = LinkTask.of(graph, model, config.metric)
    if world.distributed:
        world.broadcast_module(model, "the initial weights' broadcast")
    spans = Spans()
    sampling = dataclasses.replace(config.sampling, rank=world.rank, world=world.size)
    access = FeatureAccess(device, None, None, None, None, None, graph)
    loader = TypedPartLinkLoader(access, TypedRemoteRows(part, sampling_exchange), spans)
    seeds = LinkSeeds(links.train, ends.num_nodes, sampling, config.negatives, ends,
                      owner=stacked_owners(part, ends))  # each global batch's positives dealt by their source's owner
    mode = PartitionedMode(world, evaluation_exchange, seeds,
                           lambda: PartitionedTypedSampler(part, sampling_exchange, fanouts), loader, sampling, spans,
                           threads.sampler)
    stack.callback(mode.close)
    logger.info(f"partitioned: {world.describe()}; batch size {config.batch_size} per rank, "
                f"{config.batch_size * world.size} per global batch, {mode.num_batches} global batches per epoch")
    counts = built.typed.parameters
    logger.info(f"mode {mode.name}, model {config.model} (typed: {', '.join(graph.node_types)}), fanouts "
                f"{config.fanouts}, device {device}, batch size {config.batch_size}, train threads {threads.train}, "
                f"{mode.describe()}, parameters {counts['dense']:,} dense + {counts['embedding']:,} in embedding "
                f"tables; {links.describe()} of {'/'.join(ends.relation)}")
    util = stack.enter_context(contextlib.closing(Utilisation(device)))
    metrics = stack.enter_context(contextlib.closing(MetricLog(config.logging, task.key, append=config.resume)))
    logger.info(f"task: {task.describe()}")
    run = Run(config, graph, device, threads, model, built.optimizer, mode, spans, TRAINER_STAGES.merge(mode.stages),
              util, metrics, task, data_seconds=data_seconds, world=world, typed=built.typed, stop=stop,
              health=Health(task.constant_losses(), built.warnings))
    run.partitioned = PartTypedLinkEvaluation(part, evaluation_exchange, world, ends)
    if world.distributed:
        run.sync = GradientSync(world, built.dense, stop, mode.averaged_gradients, built.tables)
        run.stop = run.sync.agreed  # every rank stops after the same step
    attach_checkpoints(run, part, world, dataset_fingerprint(graph), TYPED)
    return run
