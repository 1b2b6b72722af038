"""The typed sampler on the training device: ``TypedNeighborSampler``'s contract on tensors of one device.

Every relation's CSC (and edge features) lives on the device with a homogeneous device sampler of its own
(``make_device_sampler``), whose per-hop draws (``start_draw``) the hops of ``TypedHops`` relabel per source
type in torch (``start_relabel``). The blocks, frontiers, edge ids and rows are ``TypedNeighborSampler``'s,
bit for bit; the host reads the device twice per hop (``together``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph, relation_label
from neutronorch.sampling.device_sampler import make_device_sampler
from neutronorch.sampling.neighbor_sampler import start_relabel, together
from neutronorch.sampling.typed_sampler import TypedHops, check_edge_features


def topology_bytes(graph: TypedGraph) -> int:
    """Bytes of every relation's CSC and edge features as ``TypedDeviceSampler`` holds them (``indptr`` int64,
    ``indices`` as stored, edge features float32)."""
    return sum(8 * rel.indptr.shape[0] + rel.indices.nbytes + (0 if rel.edge_features is None else
                                                                4 * int(np.prod(rel.edge_features.shape)))
               for rel in graph.relations.values())


def as_tensor(array: np.ndarray, what: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array))


class TypedDeviceSampler(TypedHops):
    """``TypedNeighborSampler`` (its arguments) on tensors of ``device``: ``relations`` holds every relation's
    CSC there, ``tensor(array, what)`` making each host array a tensor (default: ``torch.from_numpy``); edge
    features without a row per edge raise ``DataError``. ``backend``: ``make_device_sampler``'s.

    Not thread-safe: one thread at a time (a vertex -> position map per source type, 8 bytes a vertex, made
    on first use)."""

    def __init__(self, graph: TypedGraph, device: torch.device, fanouts, degrees: bool = False, edge_ids=None,
                 edge_features: bool = True, backend: str | None = None,
                 tensor: Callable[[np.ndarray, str], torch.Tensor] = as_tensor):
        check_edge_features(graph, graph.relations)
        super().__init__(graph, fanouts, degrees, edge_ids, edge_features)
        self.device = torch.device(device)
        self.relations: dict[RelationType, tuple[torch.Tensor, torch.Tensor]] = {}
        self._edge_features: dict[RelationType, torch.Tensor] = {}
        for relation, csc in graph.relations.items():
            what = f"topology of {relation_label(relation)}"
            self.relations[relation] = (tensor(csc.indptr, what).to(device, torch.int64),
                                        tensor(csc.indices, what).to(device))
            if csc.edge_features is not None:
                rows = tensor(csc.edge_features, f"edge features of {relation_label(relation)}")
                self._edge_features[relation] = rows.to(device, torch.float32)
        self._samplers = {r: make_device_sampler(indptr, indices, self.fanouts[r], backend=backend)
                          for r, (indptr, indices) in self.relations.items()}
        # the homogeneous sampler's kind (TritonNeighborSampler or TorchNeighborSampler; the same for every relation)
        self.backend = type(next(iter(self._samplers.values()))).__name__
        self._maps: dict[str, torch.Tensor] = {}
        self._out_degrees = {r: counts.to(self.device) for r, counts in self._out_degrees.items()}

    def _ids(self, ids: torch.Tensor) -> torch.Tensor:
        return ids.to(self.device, torch.int64)

    def _draw(self, calls: dict[RelationType, tuple]) -> dict[RelationType, tuple[torch.Tensor, ...]]:
        """``TypedNeighborSampler._draw``, after one read of the device for all the edge counts."""
        return dict(zip(calls, together([self._samplers[r].start_draw(dst, fanout, key, r in self.edge_ids)
                                         for r, (dst, fanout, key) in calls.items()])))

    def _relabel(self, parts: dict[str, list[torch.Tensor]], frontier: dict[str, torch.Tensor]
                 ) -> dict[str, list[torch.Tensor]]:
        """``TypedNeighborSampler._relabel`` in torch: a relabel per type, one read of the device for all."""
        empty = torch.empty(0, dtype=torch.int64, device=self.device)
        relabelled = together([start_relabel(self._map(t), frontier.get(t, empty), torch.cat(nbrs))
                               for t, nbrs in parts.items()])
        local = {}
        for (node_type, nbrs), (positions, frontier[node_type]) in zip(parts.items(), relabelled):
            local[node_type] = torch.split(positions, [int(n.shape[0]) for n in nbrs])
        return local

    def _edge_rows(self, edge_ids: dict[RelationType, torch.Tensor]) -> dict[RelationType, torch.Tensor]:
        return {r: self._edge_features[r].index_select(0, ids) for r, ids in edge_ids.items()
                if r in self._edge_features}

    def _map(self, node_type: str) -> torch.Tensor:
        if node_type not in self._maps:
            self._maps[node_type] = torch.empty(self.num_nodes[node_type], dtype=torch.int64,
                                                device=self.device)
        return self._maps[node_type]
