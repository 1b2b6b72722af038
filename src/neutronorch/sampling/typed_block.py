"""What a typed sampler produces: per layer, one ``Block`` per relation over per-type frontiers.

A typed layer has, for every vertex type, a source frontier (local ids of that type, the type's destinations
first) and a destination count. Each relation ``(src_type, name, dst_type)`` contributes one homogeneous
``Block`` whose destinations are the first ``num_dst[dst_type]`` rows of ``dst_type``'s frontier and whose
sources are positions in ``src_type``'s frontier. A relational layer reads ``x_src[src_type]`` through each
relation's block and writes one tensor per destination type, so every edge says which relation it came from
by the block that holds it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from neutronorch.data.relation import RelationType
from neutronorch.sampling.block import Block, SampledSubgraph


@dataclass
class TypedBlock:
    """One typed layer in local ids.

    ``num_dst[t]`` / ``num_src[t]``: destination and source counts of vertex type ``t`` (the destinations
    lead ``t``'s source frontier, so ``num_dst[t] <= num_src[t]``); a type absent from ``num_dst`` has no
    destination in this layer. ``blocks[(s, name, d)]``: the relation's block, ``num_dst == num_dst[d]``,
    ``num_src == num_src[s]``, its ``indices`` positions in ``s``'s frontier. ``src_ids[t]``: the global ids
    (within type ``t``) of ``t``'s source frontier, int64, when the sampler knows them.

    ``edge_ids[r]``: the position in relation ``r``'s CSC ``indices`` of each of ``blocks[r]``'s edges (int64,
    in the block's ``indices`` order), for the relations the sampler recorded them for (by default those with
    edge features). ``edge_features[r]``: those edges' feature rows (``edges x width``) once gathered
    (``train/typed_inputs.py``); the models read them as attention features or edge weights. ``to`` moves
    every tensor.
    """

    num_dst: dict[str, int]
    num_src: dict[str, int]
    blocks: dict[RelationType, Block]
    src_ids: dict[str, torch.Tensor] = field(default_factory=dict)
    edge_ids: dict[RelationType, torch.Tensor] = field(default_factory=dict)
    edge_features: dict[RelationType, torch.Tensor] = field(default_factory=dict)

    @property
    def dst_types(self) -> tuple[str, ...]:
        return tuple(t for t, n in self.num_dst.items() if n > 0)

    @property
    def num_edges(self) -> int:
        return sum(block.num_edges for block in self.blocks.values())

    def dst_ids(self, node_type: str) -> torch.Tensor | None:
        ids = self.src_ids.get(node_type)
        return None if ids is None else ids[:self.num_dst.get(node_type, 0)]

    def dst_rows(self, x_src: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each destination type's own rows of per-type source-frontier tensors."""
        return {t: x_src[t][:n] for t, n in self.num_dst.items() if t in x_src}

    def to(self, device: torch.device, non_blocking: bool = False) -> "TypedBlock":
        def move(tensors: dict) -> dict:
            return {key: t.to(device, non_blocking=non_blocking) for key, t in tensors.items()}

        return TypedBlock(dict(self.num_dst), dict(self.num_src),
                          {key: block.to(device, non_blocking) for key, block in self.blocks.items()},
                          move(self.src_ids), move(self.edge_ids), move(self.edge_features))


TypedSubgraph = SampledSubgraph  # the one subgraph type, its blocks TypedBlocks


@dataclass
class TypedPygForm:
    """Typed blocks as PyG's heterogeneous ``NeighborLoader`` lays out a sampled subgraph (``typed_pyg_form``).

    ``edge_index[r]``: (2, E) int64 in the local ids of each type's input frontier (row 0 the neighbour, of
    ``r``'s source type; row 1 the vertex it was drawn for, of its destination type), the seed hop's edges
    first, then each hop's. ``num_sampled_nodes[t]``: type ``t``'s vertices per hop (the seeds, then those
    each hop added); ``num_sampled_edges[r]``: ``r``'s edges per hop; both what PyG's ``trim_to_layer`` reads.
    ``edge_features[r]``/``edge_ids[r]``: the kept edges' rows and ids, for the relations whose blocks carry
    them."""

    edge_index: dict[RelationType, torch.Tensor]
    num_sampled_nodes: dict[str, list[int]]
    num_sampled_edges: dict[RelationType, list[int]]
    edge_features: dict[RelationType, torch.Tensor]
    edge_ids: dict[RelationType, torch.Tensor]


def typed_pyg_form(blocks: list[TypedBlock], node_types, relations) -> TypedPygForm:
    """``blocks`` (bottom layer first) in PyG's layout, over ``node_types`` and ``relations`` (those the
    blocks lack get no vertex and no edge). As in PyG, a vertex's neighbours come from the hop after the one
    that reached it (each vertex's neighbours once): of each relation's block, the rows of the destinations
    that the hop before newly reached, a contiguous tail of its CSC (``sampling.block.pyg_form``, typed)."""
    device = next((b.indptr.device for tblock in blocks for b in tblock.blocks.values()), torch.device("cpu"))
    sizes = _sizes(blocks, node_types)
    nodes = hop_counts(blocks, node_types)
    parts: dict = {r: ([], [], [], []) for r in relations}  # sources, targets, edge features, edge ids
    edges: dict[RelationType, list[int]] = {r: [] for r in relations}
    for hop, tblock in enumerate(reversed(blocks)):
        for r in relations:
            block = tblock.blocks.get(r)
            if block is None:
                edges[r].append(0)
                continue
            hop_sources, hop_targets, lo, hi = block.edges_of(0 if hop == 0 else sizes[hop - 1][r[2]], block.num_dst)
            sources, targets, features, ids = parts[r]
            sources.append(hop_sources)
            targets.append(hop_targets)
            if r in tblock.edge_features:
                features.append(tblock.edge_features[r][lo:hi])
            if r in tblock.edge_ids:
                ids.append(tblock.edge_ids[r][lo:hi])
            edges[r].append(hi - lo)
    empty = torch.zeros(0, dtype=torch.int64, device=device)
    edge_index = {r: torch.stack([torch.cat(s), torch.cat(d)]) if s else torch.stack([empty, empty])
                  for r, (s, d, _, _) in parts.items()}
    return TypedPygForm(edge_index, nodes, edges, {r: torch.cat(p[2]) for r, p in parts.items() if p[2]},
                        {r: torch.cat(p[3]) for r, p in parts.items() if p[3]})


def hop_counts(blocks: list[TypedBlock], node_types) -> dict[str, list[int]]:
    """Per type of ``node_types``, its vertices per hop of ``blocks`` (bottom layer first): the seeds (the
    target's; 0 for the others), then those each hop added (PyG's ``num_sampled_nodes``)."""
    sizes = _sizes(blocks, node_types)
    return {t: [sizes[0][t]] + [after[t] - before[t] for before, after in zip(sizes, sizes[1:])] for t in node_types}


def _sizes(blocks: list[TypedBlock], node_types) -> list[dict[str, int]]:
    """Each type's vertices after 0, 1, ... hops (a type's frontier leads with those of the hop before)."""
    if not blocks:
        raise ValueError("no blocks: nothing was sampled")
    sizes = [{t: blocks[-1].num_dst.get(t, 0) for t in node_types}]
    return sizes + [{t: tblock.num_src.get(t, 0) for t in node_types} for tblock in reversed(blocks)]
