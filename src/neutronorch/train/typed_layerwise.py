"""Full-neighbour inference on a typed graph, layer by layer: what ``predict``/``embed`` of a typed checkpoint
run when every neighbour is asked for (``fanouts=-1``).

A relational model's rows at a layer depend on whole neighbourhoods through every relation, and two hops
through a hub relation (a field of study linked to most papers) reach most of the graph from any batch, so
building each chunk's whole computation graph at once, as sampled inference does, repeats most of the graph
per chunk. Here each layer is computed once for every vertex a later layer reads, chunk by chunk of
destinations, from the previous layer's rows of all vertices:

- which rows: layer ``k`` (0-based) computes the types that layer ``k + 1`` reads (the sources of its
  relations into the types it computes, and those types themselves), working back from the asked type at
  the asked layer; only the asked layer is restricted to the asked vertices;
- a chunk: its destinations' in-neighbours through every relation into their type, all of them
  (``TypedNeighborSampler.sample_bottom`` with fanout -1, edge features included), the layer run by the
  model's own code (``TypedGNN.layer_output``, then ``activate`` between layers, in eval mode);
- memory: one float32 table per computed type per layer, ``vertices x hidden`` (a layer's tables are freed
  once the next layer is computed).

The outputs equal sampled inference with fanout -1 to float32 rounding (``tests/test_typed_predict*``).
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.layerwise import LayerProgress
from neutronorch.train.typed_inputs import gather_frontier


def full_neighbours(fanouts, layers: int) -> bool:
    """Whether ``fanouts`` (as ``predict_typed`` takes them) asks for every neighbour of every relation."""
    if fanouts is None:
        return False
    if isinstance(fanouts, int):
        return fanouts == -1
    if isinstance(fanouts, dict):
        return all(all(f == -1 for f in ([v] if isinstance(v, int) else v)) for v in fanouts.values())
    values = list(fanouts)
    return len(values) in (1, layers) and all(v == -1 for v in values)


def needed_types(model: TypedGNN, node_type: str, layer: int) -> list[set[str]]:
    """``out[k]``: the types layer ``k`` (0-based) must compute for ``node_type`` at layer ``layer`` (1-based)."""
    relations = model.spec.relations
    needed = [set() for _ in range(layer)]
    needed[layer - 1] = {node_type}
    for k in range(layer - 1, 0, -1):
        wanted = needed[k]
        needed[k - 1] = wanted | {r[0] for r in relations if r[2] in wanted}
    return needed


@torch.no_grad()
def layerwise_rows(model: TypedGNN, graph: TypedGraph, node_type: str, layer: int, ids: np.ndarray,
                   device: torch.device, chunk_size: int = 4096,
                   progress: LayerProgress | None = None) -> torch.Tensor:
    """Rows of ``node_type``'s ``ids`` at layer ``layer`` (1-based; ``model.num_layers``: the target's logits),
    every neighbourhood whole; float32 on the CPU. ``graph`` two-way, as trained; ``progress(layer, done,
    total)`` after every chunk."""
    model.eval()
    layers = model.num_layers
    sampler = TypedNeighborSampler(graph, [-1] * layers)
    needed = needed_types(model, node_type, layer)
    previous: dict[str, torch.Tensor] = {}
    for k in range(layer):
        last = k == layer - 1
        targets = {node_type: np.asarray(ids, dtype=np.int64)} if last else {
            t: np.arange(graph.num_nodes[t], dtype=np.int64) for t in graph.num_nodes if t in needed[k]}
        total = sum(v.shape[0] for v in targets.values())
        current, done = {}, 0
        for t, wanted in targets.items():
            width = model.arguments["num_classes" if k == layers - 1 else "hidden"]
            rows = torch.empty((wanted.shape[0], width), dtype=torch.float32)  # a type without vertices: none
            for start in range(0, wanted.shape[0], chunk_size):
                chunk = wanted[start:start + chunk_size]
                block = sampler.sample_bottom({t: chunk}, 0)
                if k == 0:
                    features, input_ids = gather_frontier(graph, block.src_ids, device)
                    x = model.input_rows(features, input_ids)
                else:
                    x = {s: previous[s][v].to(device) for s, v in block.src_ids.items() if s in previous}
                y = model.layer_output(k, block.to(device), x)[t]
                y = (y if k == layers - 1 else model.activate(y)).float().cpu()
                rows[start:start + chunk.shape[0]] = y
                done += chunk.shape[0]
                if progress is not None:
                    progress(k, done, total)
            current[t] = rows
        previous = current
    return previous[node_type]
