"""Exact evaluation: full-neighbour layer-wise inference (``layerwise.py``), or sampled inference for huge
graphs; a typed graph's sampled inference (``typed_logits``, which its evaluation and its predictions use).
Evaluation is never stale, in every mode."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.features.store import FeatureStore, TypedInputs
from neutronorch.nn.models import GNN
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.distributed import World
from neutronorch.train.health import SPLIT_NAMES, EvaluationCheck, node_collapse, nonfinite_rows
from neutronorch.train.layerwise import LayerProgress, layerwise, sampled_logits
from neutronorch.train.task import Task


def inference_key(seed: int) -> int:
    """The key every chunk of an evaluation or a prediction samples with: one for all chunks, so a vertex's
    neighbourhood depends on the vertex alone (docs/heterogeneous.md)."""
    return batch_key(seed, -1, 0)


@torch.no_grad()
def typed_logits(model: TypedGNN, graph: TypedGraph, sampler: TypedNeighborSampler, nodes: torch.Tensor,
                 device: torch.device, batch_size: int, seed: int) -> torch.Tensor:
    """Logits of ``nodes`` (unique target ids), the model in eval mode, in chunks of ``batch_size`` sampled
    with the one key ``inference_key(seed)``; float32 on the CPU."""
    model.eval()
    outputs, inputs = [torch.zeros(0, model.arguments["num_classes"])], TypedInputs(graph)
    for chunk in torch.split(nodes, batch_size):
        subgraph = sampler.sample(chunk.numpy(), inference_key(seed))
        features, ids = inputs(subgraph.input_nodes, device)
        outputs.append(model([b.to(device) for b in subgraph.blocks], features, ids).float().cpu())
    return torch.cat(outputs)


def evaluate(model: GNN, graph: Graph, store: FeatureStore, device: torch.device, fanouts: list[int] | None,
             batch_size: int, seed: int, max_nodes: int = 0, task: Task | None = None,
             world: World | None = None, file_order: bool = False,
             progress: LayerProgress | None = None, check: EvaluationCheck | None = None) -> dict[str, float]:
    """The task's metric (default: accuracy) on the validation and test sets in one pass, as
    {"val": ..., "test": ...}; with ``max_nodes``, each set is a seeded random sample of at most that many
    of its vertices (the same sample at every evaluation). Data parallel (``world``), each rank computes a
    contiguous share (sampled inference: of the chunks, each keyed as in one process) and every rank scores
    the gathered logits. ``file_order``: sampled inference reads the topology in file order.
    ``progress(layer, done, total)`` after every chunk (layer 0: sampled inference). ``check``
    (``health.py``): non-finite logits are an error, a collapse is noted there."""
    task = task or Task.of(graph)
    val = torch.from_numpy(eval_subset(graph.val_idx, max_nodes, seed))
    test = torch.from_numpy(eval_subset(graph.test_idx, max_nodes, seed + 1))
    nodes = torch.cat([val, test])
    world = world or World()
    logits = _logits_of_share(model, graph, store, nodes, device, fanouts, batch_size, seed, world,
                              file_order, progress)
    if world.distributed:
        logits = torch.cat(world.all_gather_rows(logits, "gathering the evaluation's logits"))
    labels = store.labels[nodes]
    return scored(task, {"val": (logits[:val.shape[0]], labels[:val.shape[0]]),
                         "test": (logits[val.shape[0]:], labels[val.shape[0]:])}, check or EvaluationCheck())


def scored(task: Task, sets: dict[str, tuple[torch.Tensor, torch.Tensor]], check: EvaluationCheck) -> dict[str, float]:
    """``task``'s metric of each split's (logits, labels), the logits checked finite and for a collapse."""
    scores = {}
    for name, (logits, labels) in sets.items():
        split = SPLIT_NAMES.get(name, name)
        check.nonfinite(nonfinite_rows(logits), logits.shape[0], split, "logits", "vertices")
        check.collapsed(node_collapse(logits, labels, task.multilabel))
        scores[name] = task.score(logits, labels)
    return scores


@torch.no_grad()
def _logits_of_share(model: GNN, graph: Graph, store: FeatureStore, nodes: torch.Tensor, device: torch.device,
                     fanouts: list[int] | None, batch_size: int, seed: int, world: World,
                     file_order: bool = False, progress: LayerProgress | None = None) -> torch.Tensor:
    """This rank's share of ``nodes``' logits (float32, on the CPU; one process's: all): layer-wise
    (``fanouts`` None), else sampled (cheaper on huge graphs, slightly noisy) in chunks of ``batch_size``,
    each keyed by its number (``evaluate``)."""
    if fanouts is None:  # every rank takes part in the intermediate layers, even with no vertices of its own
        share = torch.tensor_split(nodes, world.size)[world.rank]
        return layerwise(model, graph, store, share, device, batch_size, world=world, progress=progress)
    mine = torch.tensor_split(torch.arange(-(-nodes.shape[0] // batch_size)), world.size)[world.rank].tolist()
    first, end = (mine[0], mine[-1] + 1) if mine else (0, 0)
    share = nodes[first * batch_size:end * batch_size]
    model.eval()
    logits = sampled_logits(model, graph, store, fanouts, device, file_order)
    outputs = [torch.zeros(0, model.width(model.num_layers - 1))]
    for index, chunk in enumerate(torch.split(share, batch_size), start=first):
        outputs.append(logits(chunk, batch_key(seed, -1, index)).float().cpu())
        if progress is not None:
            progress(0, min(share.shape[0], (index - first + 1) * batch_size), share.shape[0])
    return torch.cat(outputs)


def eval_subset(index: np.ndarray, max_nodes: int, seed: int) -> np.ndarray:
    index = np.array(index, dtype=np.int64)  # small; a writable copy
    if max_nodes <= 0 or index.shape[0] <= max_nodes:
        return index
    return np.sort(np.random.default_rng(seed).choice(index, max_nodes, replace=False))
