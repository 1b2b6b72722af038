"""A typed batch's inputs and a typed model's logits: what training and evaluation of a typed graph share.

``gather_inputs`` reads the bottom frontier's feature rows of every featured type; ``typed_logits`` scores
target vertices chunk by chunk from fixed-key samples, the model in eval mode."""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.sampling import kernels
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_block import TypedSubgraph
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


def gather_inputs(graph: TypedGraph, subgraph: TypedSubgraph, device: torch.device
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The bottom frontier's rows of every featured type and every type's frontier ids, both on ``device``
    (``gather_frontier`` of ``subgraph.input_nodes``)."""
    return gather_frontier(graph, subgraph.input_nodes, device)


def gather_frontier(graph: TypedGraph, frontier: Mapping[str, torch.Tensor], device: torch.device
                    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The rows of every featured type's ids in ``frontier`` (float32; a memory-mapped array is read at those
    rows only) and every type's ids, both on ``device``. Contiguous float32 rows go through
    ``kernels.gather_rows`` (prefetching rows ahead: 100,000 random rows of 64 from a memory-mapped 800,000
    took 3.5-4.6 ms on one thread, a numpy fancy index 16-80 ms); other storage through a fancy index."""
    features = {}
    for t, ids in frontier.items():
        if t in graph.features:
            source = graph.features[t]
            if source.dtype == np.float32 and source.ndim == 2 and source.flags.c_contiguous:
                rows = np.empty((ids.shape[0], source.shape[1]), np.float32)
                kernels.gather_rows(source, ids.numpy(), kernels.NO_ORDER, rows)
            else:
                rows = np.asarray(source[ids.numpy()], dtype=np.float32)
            features[t] = torch.from_numpy(rows).to(device)
    return features, {t: ids.to(device) for t, ids in frontier.items()}


@torch.no_grad()
def typed_logits(model: TypedGNN, graph: TypedGraph, sampler: TypedNeighborSampler, nodes: torch.Tensor,
                 device: torch.device, batch_size: int, seed: int, first_chunk: int = 0) -> torch.Tensor:
    """Logits of ``nodes`` (unique target ids), the model in eval mode, in chunks of ``batch_size`` sampled
    with the fixed keys ``batch_key(seed, -1, chunk)``, chunks numbered from ``first_chunk``; float32 on the
    CPU."""
    model.eval()
    outputs = [torch.zeros(0, model.arguments["num_classes"])]
    for index, chunk in enumerate(torch.split(nodes, batch_size), start=first_chunk):
        subgraph = sampler.sample(chunk.numpy(), batch_key(seed, -1, index))
        features, ids = gather_inputs(graph, subgraph, device)
        outputs.append(model([b.to(device) for b in subgraph.blocks], features, ids).float().cpu())
    return torch.cat(outputs)
