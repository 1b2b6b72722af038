"""Exact evaluation: full-neighbour layer-wise inference, or sampled inference for huge graphs.

Layer-wise inference computes layer l for every vertex that a later layer needs, from all of its
in-neighbours, one chunk of destinations at a time: each vertex's embedding is computed once per layer,
instead of once per appearance in an L-hop neighbourhood. Evaluation is never stale, in every mode.
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.features.store import FeatureStore
from neutronorch.nn.models import GNN
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key


@torch.no_grad()
def full_neighbor_logits(model: GNN, graph: Graph, store: FeatureStore, nodes: torch.Tensor,
                         device: torch.device, chunk_size: int = 4096) -> torch.Tensor:
    """Logits of ``nodes`` computed from complete neighbourhoods, layer by layer."""
    model.eval()
    sampler = NeighborSampler(graph.indptr, graph.indices, [-1])
    all_nodes = torch.arange(graph.num_nodes)
    hidden: torch.Tensor | None = None
    for layer in range(model.num_layers):
        last = layer == model.num_layers - 1
        targets = nodes if last else all_nodes
        outputs = []
        for chunk in torch.split(targets, chunk_size):
            subgraph = sampler.sample(chunk.numpy(), 0)
            sources = subgraph.input_nodes
            x_src = store.gather(sources) if hidden is None else hidden[sources]
            y = model.layer_forward(layer, subgraph.blocks[0].to(device), x_src.to(device))
            outputs.append(y.float().cpu())
        hidden = torch.cat(outputs)
    return hidden


@torch.no_grad()
def sampled_logits(model: GNN, graph: Graph, store: FeatureStore, nodes: torch.Tensor, fanouts: list[int],
                   device: torch.device, batch_size: int, seed: int) -> torch.Tensor:
    """Logits of ``nodes`` from sampled neighbourhoods (cheaper on huge graphs, slightly noisy)."""
    model.eval()
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts)
    outputs = []
    for index, chunk in enumerate(torch.split(nodes, batch_size)):
        subgraph = sampler.sample(chunk.numpy(), batch_key(seed, -1, index))
        x = store.gather(subgraph.input_nodes).to(device)
        blocks = [b.to(device) for b in subgraph.blocks]
        outputs.append(model(blocks, x).float().cpu())
    return torch.cat(outputs)


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(1) == labels).float().mean()) if labels.numel() else float("nan")


def evaluate(model: GNN, graph: Graph, store: FeatureStore, device: torch.device,
             fanouts: list[int] | None, batch_size: int, seed: int) -> dict[str, float]:
    """Validation and test accuracy in one pass."""
    val = torch.from_numpy(np.asarray(graph.val_idx, dtype=np.int64))
    test = torch.from_numpy(np.asarray(graph.test_idx, dtype=np.int64))
    nodes = torch.cat([val, test])
    if fanouts is None:
        logits = full_neighbor_logits(model, graph, store, nodes, device, batch_size)
    else:
        logits = sampled_logits(model, graph, store, nodes, fanouts, device, batch_size, seed)
    labels = store.labels[nodes]
    n_val = val.shape[0]
    return {"val_acc": accuracy(logits[:n_val], labels[:n_val]),
            "test_acc": accuracy(logits[n_val:], labels[n_val:])}
