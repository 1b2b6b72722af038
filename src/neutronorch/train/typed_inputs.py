"""A typed batch's inputs and a typed model's logits: what training, evaluation and prediction of a typed graph
share.

``gather_inputs`` reads the bottom frontier's feature rows of every featured type (through
``features.store.TypedInputs``, the feature stores of a typed graph); ``typed_logits`` scores
target vertices chunk by chunk from samples of one fixed key (``inference_key``), the model in eval mode;
``typed_files`` lists the files a graph is memory-mapped from (what no output may overwrite)."""

from __future__ import annotations

import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.features.store import TypedInputs, gather_frontier
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.block import SampledSubgraph
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


def gather_inputs(graph: TypedGraph, subgraph: SampledSubgraph, device: torch.device
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The bottom frontier's rows of every featured type and every type's frontier ids, both on ``device``
    (``gather_frontier`` of ``subgraph.input_nodes``). The blocks' edge features are on the blocks already
    (``TypedBlock.edge_features``: the sampler reads them), moved with them by ``TypedBlock.to``."""
    return gather_frontier(graph, subgraph.input_nodes, device)


def inference_key(seed: int) -> int:
    """The key every chunk of an evaluation or a prediction samples with. The sampler keys each vertex's draws
    by the key and the vertex, so with one key for all chunks a vertex's neighbourhood depends on the vertex
    alone (its output too, to float32 rounding): not on the chunk it falls in, the chunk size or the other
    vertices asked for."""
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


def typed_files(graph: TypedGraph) -> list[str]:
    """The files the graph's arrays are memory-mapped from (what no output may overwrite)."""
    arrays = [graph.labels, graph.train_idx, graph.val_idx, graph.test_idx, *graph.features.values()]
    for relation in graph.relations.values():
        arrays += [relation.indptr, relation.indices, relation.edge_features]
    found = []
    for array in arrays:
        while array is not None and getattr(array, "filename", None) is None:
            array = getattr(array, "base", None)
        if array is not None and array.filename not in found:
            found.append(array.filename)
    return found
