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
from neutronorch.observe import Spans
from neutronorch.orchestration.access import FeatureAccess
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.factory import Threads
from neutronorch.orchestration.link_seeds import EndsSampler, LinkSeeds
from neutronorch.orchestration.remote_rows import RemoteRows
from neutronorch.train.distributed import World
from neutronorch.train.heterogeneous import TypedOptions
from neutronorch.train.link_task import LinkTask, check_link_settings
from neutronorch.train.part_links import PartLinkEvaluation
from neutronorch.train.part_tables import PartTables
from neutronorch.train.part_typed import (TypedPartLoader, TypedRemoteRows, check_typed_request, part_graph,
                                          sampled_rows, typed_mode, typed_run, typed_setup)
from neutronorch.train.run import Run

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

    def __init__(self, part: TypedPartition, exchange, world: World, ends: LinkEnds, tables: PartTables):
        self.part, self.world, self.ends, self.part_tables = part, world, ends, tables
        self.fetcher = TypedRemoteRows(part, exchange)  # the inputs' rows (and the exchange every chunk counts on)
        self.tables = {t: RemoteRows(part.view(t), exchange) for t in ends.types}
        self.owner = stacked_owners(part, ends)

    def vertices(self, run) -> tuple[int, tuple[int, int]]:
        return self.ends.num_nodes, self.ends.destinations

    def embed_named(self, run, nodes: np.ndarray, progress=None):
        part, ends = self.part, self.ends
        owned = np.ascontiguousarray(nodes[self.owner[nodes] == part.part])
        rows = self.embedded(run, owned, progress).numpy()
        tables, at = {}, 0
        for t, ids in ends.split(owned).items():  # owned is sorted: the first end type's, then the second's
            tables[t] = np.zeros((part.ids[t].shape[0], rows.shape[1]), np.float32)
            tables[t][part.local(t, ids)] = rows[at:at + ids.shape[0]]
            at += ids.shape[0]
        return lambda ids: np.concatenate([self.tables[t].fetch(local, table=tables[t])[0]
                                           for t, local in ends.split(ids).items()])

    def embedded(self, run, owned: np.ndarray, progress=None) -> torch.Tensor:
        """The encoder's rows of ``owned`` (stacked ids this part owns, ascending), sampled as a full-copy run's
        evaluation samples them (``part_typed.sampled_rows``)."""
        encoder = run.model.encoder
        encoder.eval()
        return sampled_rows(self, encoder, EndsSampler(run.typed.eval_sampler, self.ends), owned, run,
                            self.part_tables, encoder.arguments["num_classes"], progress)


def build_typed_link_run(config: TrainConfig, part: TypedPartition, device: torch.device, threads: Threads,
                         stack: contextlib.ExitStack, world: World, stop: threading.Event | None,
                         data_seconds: float, options: TypedOptions | None = None, neutronorch=None) -> Run:
    """``part_typed.build_typed_part_run`` for a folder holding a link split: this rank's link model, optimizers
    and mode."""
    check_typed_request(config)
    graph = part_graph(part, None)  # a link task reads no labels
    graph.links = part.links
    for note in graph.notes if world.main else []:
        logger.warning(f"note: {note}")
    check_link_settings(graph, config)  # as a full-copy run checks them against its split
    links, ends = graph.links, graph.links.ends
    setup = typed_setup(config, part, graph, device, stack, world, options or TypedOptions(),
                        statistics=input_statistics(part.manifest))
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(links.train.shape[1])
    task = LinkTask.of(graph, setup.built.model, config.metric)
    spans = Spans()
    sampling = dataclasses.replace(config.sampling, rank=world.rank, world=world.size)
    access = FeatureAccess(device, None, None, None, None, None, graph)
    loader = TypedPartLinkLoader(access, TypedRemoteRows(part, setup.sampling), spans)
    seeds = LinkSeeds(links.train, ends.num_nodes, sampling, config.negatives, ends,
                      owner=stacked_owners(part, ends))  # each global batch's positives dealt by their source's owner
    mode = typed_mode(setup, part, world, seeds, loader, sampling, spans, threads, stack) if neutronorch is None \
        else neutronorch(config, part, graph, world, setup, access, seeds, sampling, spans, threads, stack,
                         TypedPartLinkLoader)
    evaluation = PartTypedLinkEvaluation(part, setup.evaluation, world, ends, setup.tables)
    return typed_run(config, part, graph, device, threads, stack, world, stop, setup, mode, task, data_seconds, None,
                     evaluation, f"; {links.describe()} of {'/'.join(ends.relation)}")
