"""A node task on a graph with vertex times in ``train()`` (docs/temporal.md, "Node tasks by time"): every
vertex, trained or evaluated, is sampled as of its own time, so a paper of 2019 reads no paper of 2020
(ogbn-arxiv's years). By vertex times a neighbour exists from its own time (each edge at its source's time:
``times_from_vertices``, as PyG reads a vertex-level ``time_attr``); where the graph has edge times too, they
decide instead. ``split_vertices_by_time`` gives the chronological split ogbn-arxiv has (train on the
earliest vertices, evaluate on the latest)."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.splits import parse_split
from neutronorch.data.times import has_vertex_times
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError
from neutronorch.features.store import FeatureStore, TypedInputs
from neutronorch.orchestration.temporal import TemporalRequest
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler, TemporalTypedSampler
from neutronorch.train.evaluate import eval_subset, scored
from neutronorch.train.health import EvaluationCheck
from neutronorch.train.task import Task


def timed_nodes(config: TrainConfig, graph) -> TemporalRequest | None:
    """The mode's request to sample a node task by its vertices' times (None for any other task or graph; a
    typed graph's by its target type's, each relation by its own edge times or its source type's vertex
    times)."""
    if config.task != "node" or not has_vertex_times(graph):
        return None
    if isinstance(graph, TypedGraph):
        if graph.target not in graph.node_time:
            raise ConfigError(f"{graph.name}: has vertex times of {', '.join(graph.node_time)} but none of its target "
                              f"type {graph.target}, so its seeds have no time to be sampled at; give "
                              f"{graph.target} vertex times, or drop the times to use the graph as a static one "
                              f"(docs/temporal.md).")
        return TemporalRequest(np.asarray(graph.node_time[graph.target])[np.asarray(graph.train_idx)],
                               config.temporal_strategy, by_vertices=True)
    return TemporalRequest(np.asarray(graph.node_time)[np.asarray(graph.train_idx)], config.temporal_strategy,
                           by_vertices=graph.edge_time is None)


def by_time(split: str | None) -> tuple[float, float] | None:
    """The shares of a ``time:TRAIN,VAL`` split (None for any other)."""
    if not isinstance(split, str) or not split.strip().lower().startswith("time:"):
        return None
    _, train, val = parse_split(split.strip().lower())
    return train, val


def split_vertices_by_time(graph: Graph, train: float, val: float, task: str = "node") -> Graph:
    """``graph`` with its labelled vertices split by their times: the earliest ``train`` share for training,
    the next ``val`` share for validation, the latest for the test (ties by vertex id)."""
    if task != "node" or not isinstance(graph, Graph):
        raise ConfigError(f"`split` time:{train:g},{val:g} splits a homogeneous graph's vertices by their times, for "
                          f"a node task; a link task splits its links (edges:TRAIN,VAL, by time on a graph with edge "
                          f"times), a typed graph carries its own split.")
    if graph.node_time is None:
        raise DataError(f"{graph.name}: a chronological vertex split needs vertex times (node_time); the graph has "
                        f"none.")
    if not (0 < train < 1 and 0 < val < 1 and train + val < 1):
        raise ConfigError(f"a chronological vertex split: the training and validation shares must each lie in "
                          f"(0, 1) and sum to less than 1 (got {train} and {val}).")
    labelled = np.flatnonzero(np.asarray(graph.labels).reshape(graph.num_nodes, -1)[:, 0] >= 0)
    ordered = labelled[np.lexsort((labelled, np.asarray(graph.node_time)[labelled]))]
    cuts = np.round(np.array([train, train + val]) * ordered.shape[0]).astype(np.int64)
    parts = [np.sort(p) for p in np.split(ordered, cuts)]
    if min(p.shape[0] for p in parts) == 0:
        raise ConfigError(f"a chronological vertex split of {ordered.shape[0]:,} labelled vertices with shares "
                          f"{train} and {val} leaves a set empty; choose other shares.")
    note = (f"split by vertex time {parts[0].shape[0]:,}/{parts[1].shape[0]:,}/{parts[2].shape[0]:,}: training up to "
            f"time {graph.node_time[parts[0]].max()}, test from {graph.node_time[parts[2]].min()}")
    return dataclasses.replace(graph, train_idx=parts[0], val_idx=parts[1], test_idx=parts[2],
                               notes=[*graph.notes, note])


@torch.no_grad()
def evaluate_timed_nodes(model, graph: Graph | TypedGraph, timed: Graph | TypedGraph, store: FeatureStore | None,
                         device: torch.device, config: TrainConfig, task: Task, check: EvaluationCheck | None = None,
                         progress=None, fanouts=None) -> dict[str, float]:
    """The task's metric on the validation and test vertices as {"val": ..., "test": ...}, each vertex sampled
    at its own time over ``timed`` (the graph as the mode samples it) with the evaluation fanouts (default the
    training ones; a typed graph's ``fanouts`` per relation, ``store`` None), ``eval_batch_size`` at a time,
    each chunk keyed by its number."""
    if isinstance(graph, TypedGraph):
        sampler, inputs = TemporalTypedSampler(timed, fanouts, config.temporal_strategy), TypedInputs(graph)
        embed = lambda blocks, subgraph: model(blocks, *inputs(subgraph.input_nodes, device))  # noqa: E731
        times, width = np.asarray(graph.node_time[graph.target]), model.arguments["num_classes"]
        labels = lambda ids: torch.from_numpy(np.asarray(graph.labels[ids]))  # noqa: E731
    else:
        sampler = TemporalNeighborSampler(timed.indptr, timed.indices, timed.edge_time,
                                          config.eval_fanouts or config.fanouts, config.temporal_strategy)
        embed = lambda blocks, subgraph: model(blocks, store.gather(subgraph.input_nodes).to(device))  # noqa: E731
        times, width = np.asarray(graph.node_time), model.width(model.num_layers - 1)
        labels = lambda ids: store.labels[torch.from_numpy(ids)]  # noqa: E731
    sets = {"val": eval_subset(graph.val_idx, config.eval_max_nodes, config.seed),
            "test": eval_subset(graph.test_idx, config.eval_max_nodes, config.seed + 1)}
    total, done, out = sum(ids.shape[0] for ids in sets.values()), 0, {}
    model.eval()
    for offset, (name, ids) in enumerate(sets.items()):
        logits = [torch.zeros(0, width)]
        for index, start in enumerate(range(0, ids.shape[0], config.eval_batch_size)):
            chunk = ids[start:start + config.eval_batch_size]
            subgraph = sampler.sample(chunk, times[chunk], batch_key(config.seed, -1 - offset, index))
            logits.append(embed([b.to(device) for b in subgraph.blocks], subgraph).float().cpu())
            done += chunk.shape[0]
            if progress is not None:
                progress(0, done, total)
        out[name] = (torch.cat(logits), labels(ids))
    return scored(task, out, check or EvaluationCheck())
