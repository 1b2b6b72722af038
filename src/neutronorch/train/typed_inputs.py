"""A typed batch's inputs and a typed model's logits: what training, evaluation and prediction of a typed graph
share.

``TypedInputs`` reads the bottom frontier's feature rows of every featured type (``gather_inputs`` and
``gather_frontier``: once); ``typed_logits`` scores target vertices chunk by chunk from samples of one fixed
key (``inference_key``), the model in eval mode; ``typed_files`` lists the files a graph is memory-mapped from
(what no output may overwrite)."""

from __future__ import annotations

from typing import Mapping

import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.features.store import FeatureStore
from neutronorch.nn.typed_models import TypedGNN
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.typed_block import TypedSubgraph
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


class TypedInputs:
    """``inputs(frontier, device) -> (features, ids)``, what the typed modes are handed: the rows of every
    featured type's ids in ``frontier`` (float32) and every type's ids, both on ``device``. Each featured type's
    rows come from a ``FeatureStore`` over its array (``stores``, one per featured type: a run's come from
    ``features/reading.py``'s ``typed_stores``, in file order and through a host cache as configured; default:
    each reads a memory map in file order when it does not fit, as ``FeatureStore`` decides), the gather
    homogeneous runs read through: a memory-mapped array is read at those rows only, float16 and bfloat16
    storage decoded."""

    def __init__(self, graph: TypedGraph, stores: Mapping[str, FeatureStore] | None = None):
        self.stores = dict(stores) if stores is not None else {t: FeatureStore(rows)
                                                               for t, rows in graph.features.items()}
        self._moved: dict[str, tuple[int, int]] = {}  # (rows gathered, host-cache hits) per type, summarised

    def __call__(self, frontier: Mapping[str, torch.Tensor], device: torch.device
                 ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        features = {t: self.stores[t].gather(ids).to(device) for t, ids in frontier.items() if t in self.stores}
        return features, {t: ids.to(device) for t, ids in frontier.items()}

    def summary(self) -> dict:
        """``host_cache`` and ``read_order`` as a homogeneous run's summary has them: the host caches' rows,
        GiB and build seconds summed over the cached types, their hit rate over the rows those types gathered,
        and each type's own (``types``); how the featured types' rows were read (``file`` when any type's
        were) and the topology (the typed sampler's: in batch order)."""
        for t, store in self.stores.items():
            self._moved[t] = tuple(a + b for a, b in zip(self._moved.get(t, (0, 0)), store.take_counts()))
        caches = {t: store.host_cache.summary(*self._moved[t]) for t, store in self.stores.items()
                  if store.host_cache is not None}
        rows, hits = (sum(self._moved[t][i] for t in caches) for i in (0, 1))
        host_cache = None if not caches else {
            "rows": sum(c["rows"] for c in caches.values()), "gib": round(sum(c["gib"] for c in caches.values()), 3),
            "cold_file": all(c["cold_file"] for c in caches.values()),
            "build_seconds": round(sum(c["build_seconds"] for c in caches.values()), 2),
            "hit_rate": hits / rows if rows else None, "types": caches}
        ordered = any(store.ordered for store in self.stores.values())
        return {"host_cache": host_cache, "read_order": {"features": "file" if ordered else "batch",
                                                         "topology": "batch"}}


def gather_inputs(graph: TypedGraph, subgraph: TypedSubgraph, device: torch.device
                  ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The bottom frontier's rows of every featured type and every type's frontier ids, both on ``device``
    (``gather_frontier`` of ``subgraph.input_nodes``). The blocks' edge features are on the blocks already
    (``TypedBlock.edge_features``: the sampler reads them), moved with them by ``TypedBlock.to``."""
    return gather_frontier(graph, subgraph.input_nodes, device)


def gather_frontier(graph: TypedGraph, frontier: Mapping[str, torch.Tensor], device: torch.device
                    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One read of ``frontier``'s inputs (``TypedInputs``) by stores made for it (prediction, embeddings); a
    run and an evaluation read through stores made once (a ``TypedInputs`` of their own)."""
    return TypedInputs(graph)(frontier, device)


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
