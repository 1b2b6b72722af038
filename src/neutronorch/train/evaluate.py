"""Exact evaluation: full-neighbour layer-wise inference, or sampled inference for huge graphs.

Layer-wise inference computes layer l for every vertex that a later layer needs, from all of its
in-neighbours, one chunk of destinations at a time: each vertex's embedding is computed once per layer,
instead of once per appearance in an L-hop neighbourhood. Evaluation is never stale, in every mode.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.features.store import FeatureStore
from neutronorch.nn.models import GNN
from neutronorch.sampling.block import Block
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key


@torch.no_grad()
def full_neighbor_logits(model: GNN, graph: Graph, store: FeatureStore, nodes: torch.Tensor,
                         device: torch.device, chunk_size: int = 4096, layers: int | None = None) -> torch.Tensor:
    """Logits of ``nodes`` computed from complete neighbourhoods, layer by layer; with ``layers`` = K, the
    output of layer K instead (after its activation: an embedding).

    The input layer reads features through relabelled chunks (features stay on the host, possibly as a
    float16 memory map). Later separable layers read the previous layer's embeddings of all vertices in
    place, with global ids as source positions, so nothing is copied per chunk; non-separable layers
    (GAT) use relabelled chunks, since their projection must not run over all vertices per chunk.
    """
    model.eval()
    sampler = NeighborSampler(graph.indptr, graph.indices, [-1])
    with warnings.catch_warnings():
        # Read-only memory maps: the tensors are only read, so torch's writability warning does not apply.
        warnings.simplefilter("ignore", UserWarning)
        indptr = torch.from_numpy(np.asarray(graph.indptr, dtype=np.int64))
        indices = torch.from_numpy(np.asarray(graph.indices))
    hidden: torch.Tensor | None = None
    upto = model.num_layers if layers is None else layers
    for layer in range(upto):
        last = layer == upto - 1
        # Chunks write straight into one preallocated output: peak memory stays at two layers' embeddings.
        if hidden is not None and model.layers[layer].separable:
            output = torch.empty((graph.num_nodes, model.layers[layer].out_dim), device=device)
            for start in range(0, graph.num_nodes, chunk_size):
                end = min(graph.num_nodes, start + chunk_size)
                lo, hi = int(indptr[start]), int(indptr[end])
                block = Block(end - start, graph.num_nodes, indptr[start:end + 1] - lo, indices[lo:hi], start)
                output[start:end] = model.layer_forward(layer, block.to(device), hidden)
        else:
            # The last layer's relabelled chunks need only the requested vertices.
            targets = nodes if last else torch.arange(graph.num_nodes)
            output = torch.empty((targets.shape[0], model.layers[layer].out_dim), device=device)
            for start in range(0, targets.shape[0], chunk_size):
                chunk = targets[start:start + chunk_size]
                subgraph = sampler.sample(chunk.numpy(), 0)
                sources = subgraph.input_nodes
                x_src = store.gather(sources) if hidden is None else hidden[sources.to(hidden.device)]
                output[start:start + chunk.shape[0]] = model.layer_forward(
                    layer, subgraph.blocks[0].to(device), x_src.to(device))
            if last:
                return output.float().cpu()
        hidden = output
    return hidden[nodes.to(hidden.device)].float().cpu()


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
             fanouts: list[int] | None, batch_size: int, seed: int, max_nodes: int = 0) -> dict[str, float]:
    """Validation and test accuracy in one pass; with ``max_nodes``, each set is a seeded random sample of
    at most that many of its vertices (the same sample at every evaluation)."""
    val = torch.from_numpy(_subset(graph.val_idx, max_nodes, seed))
    test = torch.from_numpy(_subset(graph.test_idx, max_nodes, seed + 1))
    nodes = torch.cat([val, test])
    if fanouts is None:
        logits = full_neighbor_logits(model, graph, store, nodes, device, batch_size)
    else:
        logits = sampled_logits(model, graph, store, nodes, fanouts, device, batch_size, seed)
    labels = store.labels[nodes]
    n_val = val.shape[0]
    return {"val_acc": accuracy(logits[:n_val], labels[:n_val]),
            "test_acc": accuracy(logits[n_val:], labels[n_val:])}


def _subset(index: np.ndarray, max_nodes: int, seed: int) -> np.ndarray:
    index = np.array(index, dtype=np.int64)  # small; a writable copy
    if max_nodes <= 0 or index.shape[0] <= max_nodes:
        return index
    return np.sort(np.random.default_rng(seed).choice(index, max_nodes, replace=False))
