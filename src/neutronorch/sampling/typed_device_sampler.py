"""The typed sampler on the training device: ``TypedNeighborSampler``'s contract on tensors of one device.

Every relation's CSC (and edge features) lives on the device (``TypedTopology``) with a homogeneous device
sampler of its own (``make_device_sampler``), whose per-hop draws (``start_draw``) the hops of ``TypedHops``
relabel per source type in torch (``start_relabel``). The blocks, frontiers, edge ids and rows are
``TypedNeighborSampler``'s, bit for bit; the host reads the device twice per hop (``together``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph, relation_label
from neutronorch.sampling.device_sampler import make_device_sampler
from neutronorch.sampling.neighbor_sampler import start_relabel, together
from neutronorch.sampling.typed_sampler import TypedHops, check_edge_features

__all__ = ["TypedDeviceSampler", "TypedTopology", "topology_bytes"]

_DEGREE_CHUNK = 1 << 24  # indices counted at a time for the out-degrees


def topology_bytes(graph: TypedGraph) -> int:
    """Bytes of every relation's CSC and edge features as ``TypedTopology`` holds them (``indptr`` int64,
    ``indices`` as stored, edge features float32)."""
    return sum(8 * rel.indptr.shape[0] + rel.indices.nbytes + (0 if rel.edge_features is None else
                                                                4 * int(np.prod(rel.edge_features.shape)))
               for rel in graph.relations.values())


def _as_tensor(array: np.ndarray, what: str) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array) if array.flags.writeable else np.array(array))


@dataclass
class TypedTopology:
    """A typed graph's topology on one device: its types with their counts (in the graph's order), its
    target, each relation's ``(indptr, indices)`` (``indptr`` int64) in the graph's relation order, and the
    edge features (float32, ``edges x width``) of the relations that have them."""

    num_nodes: dict[str, int]
    target: str
    relations: dict[RelationType, tuple[torch.Tensor, torch.Tensor]]
    device: torch.device
    edge_features: dict[RelationType, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def of(cls, graph: TypedGraph, device: torch.device,
           tensor: Callable[[np.ndarray, str], torch.Tensor] = _as_tensor) -> "TypedTopology":
        """``graph``'s topology and edge features on ``device``; ``tensor(array, what)`` makes a host array a
        tensor (default: ``torch.from_numpy``). Edge features without a row per edge raise ``DataError``."""
        check_edge_features(graph, graph.relations)
        relations, edge_features = {}, {}
        for relation, csc in graph.relations.items():
            what = f"topology of {relation_label(relation)}"
            relations[relation] = (tensor(csc.indptr, what).to(device, torch.int64),
                                   tensor(csc.indices, what).to(device))
            if csc.edge_features is not None:
                rows = tensor(csc.edge_features, f"edge features of {relation_label(relation)}")
                edge_features[relation] = rows.to(device, torch.float32)
        return cls(dict(graph.num_nodes), graph.target, relations, torch.device(device), edge_features)


class TypedDeviceSampler(TypedHops):
    """``TypedNeighborSampler`` on a ``TypedTopology``, taking and returning tensors on its device.
    ``fanouts``: every relation's list, as ``typed_fanouts`` resolves them; ``edge_ids``: None (those with
    edge features) or a collection of triples; ``degrees`` and ``edge_features`` as the host sampler's;
    ``backend``: ``make_device_sampler``'s.

    Not thread-safe: one thread at a time (it owns a vertex -> position map per type, 8 bytes per vertex of
    the types that are sources, made on first use)."""

    def __init__(self, topology: TypedTopology, fanouts: Mapping[RelationType, list[int]], degrees: bool = False,
                 edge_ids: Iterable[RelationType] | None = None, edge_features: bool = True,
                 backend: str | None = None):
        missing = [r for r in topology.relations if r not in fanouts]
        if missing:
            raise ValueError(f"no fanouts for relations {missing}; give every relation its list (typed_fanouts)")
        self.topology = topology
        self.num_nodes, self.target = topology.num_nodes, topology.target
        self.device = topology.device
        self.fanouts = {r: list(fanouts[r]) for r in topology.relations}
        self.num_layers = len(next(iter(self.fanouts.values())))
        self.degrees = degrees
        self.edge_ids = frozenset(topology.edge_features if edge_ids is None else edge_ids)
        self.edge_features = edge_features
        self._samplers = {r: make_device_sampler(indptr, indices, self.fanouts[r], backend=backend)
                          for r, (indptr, indices) in topology.relations.items()}
        # the homogeneous sampler's kind (TritonNeighborSampler or TorchNeighborSampler; the same for every relation)
        self.backend = type(next(iter(self._samplers.values()))).__name__
        self._maps: dict[str, torch.Tensor] = {}
        self._out_degrees = ({r: self._count_out_degrees(indices, topology.num_nodes[r[0]])
                              for r, (_, indices) in topology.relations.items()} if degrees else {})

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
        return {r: self.topology.edge_features[r].index_select(0, ids) for r, ids in edge_ids.items()
                if r in self.topology.edge_features}

    def _map(self, node_type: str) -> torch.Tensor:
        if node_type not in self._maps:
            self._maps[node_type] = torch.empty(self.topology.num_nodes[node_type], dtype=torch.int64,
                                                device=self.device)
        return self._maps[node_type]

    def _count_out_degrees(self, indices: torch.Tensor, num_src: int) -> torch.Tensor:
        """Each source vertex's out-degree through a relation (float32), counted a chunk at a time."""
        counts = torch.zeros(num_src, dtype=torch.int64, device=self.device)
        for begin in range(0, indices.shape[0], _DEGREE_CHUNK):
            counts += torch.bincount(indices[begin:begin + _DEGREE_CHUNK], minlength=num_src)
        return counts.float()
