"""What a sampler produces: blocks (one bipartite layer each; a typed layer, ``TypedBlock``, one ``Block``
per relation) and the sampled subgraph that holds them, for both kinds of graph, and their layout as PyG's
``NeighborLoader`` yields a sampled subgraph (``pyg_form``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from neutronorch.data.relation import RelationType


@dataclass
class Block:
    """One layer's sampled bipartite graph in local ids.

    Destination ``i`` (0 <= i < num_dst) aggregates sources ``indices[indptr[i]:indptr[i+1]]``; sources
    are positions in the layer's source frontier. Destination ``i``'s own input is source
    ``dst_offset + i``: sampled blocks have ``dst_offset`` 0 (the destinations lead the frontier), while
    full-graph inference uses global vertex ids as source positions and a contiguous range of
    destinations starting at ``dst_offset``. (NeutronOrch's spliced bottom block holds only the cold
    destinations; the model's splice restores the rule.)

    ``src_degree``: each source row's in-degree in the whole graph (float32), when asked for (symmetric
    GCN). ``src_ids``: the source frontier's global ids (int64), what keys a row's dropout mask. A temporal
    sampler's block (docs/temporal.md) also holds ``src_time``, each source entry's time (an id may repeat at
    different times), and ``edge_ids``, each edge's position in the graph's CSC (int64, ``indices``' order).
    """

    num_dst: int
    num_src: int
    indptr: torch.Tensor
    indices: torch.Tensor
    dst_offset: int = 0
    src_degree: torch.Tensor | None = None
    src_ids: torch.Tensor | None = None
    src_time: torch.Tensor | None = None
    edge_ids: torch.Tensor | None = None

    @property
    def dst_ids(self) -> torch.Tensor | None:
        """The destinations' global vertex ids (None when the block has no ``src_ids``)."""
        return None if self.src_ids is None else self.dst_rows(self.src_ids)

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    def in_degrees(self) -> torch.Tensor:
        return self.indptr[1:] - self.indptr[:-1]

    def edges_of(self, first: int, end: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """The edges of destinations ``first`` to ``end - 1``, a contiguous run of ``indices``: their sources
        and destinations (int64) and the run's bounds in ``indices``."""
        ptr = self.indptr
        lo, hi = int(ptr[first]), int(ptr[end])
        rows = torch.arange(first, end, device=ptr.device)
        targets = torch.repeat_interleave(rows, ptr[first + 1:end + 1] - ptr[first:end], output_size=hi - lo)
        return self.indices[lo:hi].long(), targets, lo, hi

    def dst_rows(self, x_src: torch.Tensor) -> torch.Tensor:
        """The destinations' own rows of a source-frontier tensor."""
        return x_src[self.dst_offset:self.dst_offset + self.num_dst]

    def tensors(self) -> list[torch.Tensor]:
        return [self.indptr, self.indices] + ([self.src_degree] if self.src_degree is not None else [])

    def to(self, device: torch.device, non_blocking: bool = False) -> "Block":
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Block(self.num_dst, self.num_src, move(self.indptr), move(self.indices), self.dst_offset,
                     move(self.src_degree), move(self.src_ids), move(self.src_time), move(self.edge_ids))


@dataclass
class TypedBlock:
    """One typed layer in local ids.

    ``num_dst[t]`` / ``num_src[t]``: destination and source counts of vertex type ``t`` (the destinations
    lead ``t``'s source frontier, so ``num_dst[t] <= num_src[t]``); a type absent from ``num_dst`` has no
    destination in this layer. ``blocks[(s, name, d)]``: the relation's block, ``num_dst == num_dst[d]``,
    ``num_src == num_src[s]``, its ``indices`` positions in ``s``'s frontier. ``src_ids[t]``: the global ids
    (within type ``t``) of ``t``'s source frontier, int64, when the sampler knows them.

    ``edge_ids[r]``: the position in relation ``r``'s CSC ``indices`` of each of ``blocks[r]``'s edges (int64,
    in the block's ``indices`` order), for the relations the sampler recorded them for. ``edge_features[r]``:
    those edges' feature rows (``edges x width``) once gathered (``typed_sampler.gather_edge_features``).
    ``src_time[t]``: a temporal sampler's times of ``t``'s source entries (docs/temporal.md).
    """

    num_dst: dict[str, int]
    num_src: dict[str, int]
    blocks: dict[RelationType, Block]
    src_ids: dict[str, torch.Tensor] = field(default_factory=dict)
    edge_ids: dict[RelationType, torch.Tensor] = field(default_factory=dict)
    edge_features: dict[RelationType, torch.Tensor] = field(default_factory=dict)
    src_time: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_edges(self) -> int:
        return sum(block.num_edges for block in self.blocks.values())

    def dst_ids(self, node_type: str) -> torch.Tensor | None:
        ids = self.src_ids.get(node_type)
        return None if ids is None else ids[:self.num_dst.get(node_type, 0)]

    def dst_rows(self, x_src: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each destination type's own rows of per-type source-frontier tensors."""
        return {t: x_src[t][:n] for t, n in self.num_dst.items() if t in x_src}

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the layer: each relation's block's, the frontiers' ids, the edges' ids and rows."""
        return [t for block in self.blocks.values() for t in block.tensors()] + [
            *self.src_ids.values(), *self.edge_ids.values(), *self.edge_features.values()]

    def to(self, device: torch.device, non_blocking: bool = False) -> "TypedBlock":
        def move(tensors: dict) -> dict:
            return {key: t.to(device, non_blocking=non_blocking) for key, t in tensors.items()}

        return TypedBlock(dict(self.num_dst), dict(self.num_src),
                          {key: block.to(device, non_blocking) for key, block in self.blocks.items()},
                          move(self.src_ids), move(self.edge_ids), move(self.edge_features), move(self.src_time))


@dataclass
class SampledSubgraph:
    """The L-hop sampled computation graph of a set of seeds, of either kind of graph.

    ``blocks`` are ordered as a model consumes them: the bottom (input) layer first, the seed layer last.
    ``frontiers[l]`` holds the global ids of block l's source frontier; ``frontiers[-1]`` is the seeds. On a
    typed graph the blocks are ``TypedBlock``s, the frontiers dicts of each type's ids (within the type) and
    the seeds of the target type.
    """

    seeds: torch.Tensor
    blocks: list
    frontiers: list

    @property
    def input_nodes(self):
        return self.frontiers[0]

    @property
    def num_sampled_edges(self) -> int:
        return sum(b.num_edges for b in self.blocks)


def pyg_form(blocks: list[Block]) -> tuple[torch.Tensor, list[int], list[int]]:
    """Homogeneous blocks (bottom layer first) as PyG's ``NeighborLoader`` yields a subgraph: ``(edge_index,
    num_sampled_nodes, num_sampled_edges)``, ``typed_pyg_form`` of their one-type view (``edge_index[0]`` the
    neighbours, ``edge_index[1]`` the vertices they were sampled for, positions in the input frontier)."""
    one = ("", "", "")
    form = typed_pyg_form([TypedBlock({"": b.num_dst}, {"": b.num_src}, {one: b}) for b in blocks], [""], [one])
    return form.edge_index[one], form.num_sampled_nodes[""], form.num_sampled_edges[one]


def pyg_edge_ids(blocks: list[Block]) -> torch.Tensor:
    """The CSC positions (``Block.edge_ids``) of ``pyg_form``'s edges, in its ``edge_index`` order."""
    one = ("", "", "")
    tblocks = [TypedBlock({"": b.num_dst}, {"": b.num_src}, {one: b}, edge_ids={one: b.edge_ids}) for b in blocks]
    return typed_pyg_form(tblocks, [""], [one]).edge_ids[one]


@dataclass
class TypedPygForm:
    """Typed blocks as PyG's heterogeneous ``NeighborLoader`` lays out a sampled subgraph (``typed_pyg_form``).

    ``edge_index[r]``: (2, E) int64 in the local ids of each type's input frontier (row 0 the neighbour, row
    1 the vertex it was drawn for), the seed hop's edges first. ``num_sampled_nodes[t]`` and
    ``num_sampled_edges[r]``: per hop, what PyG's ``trim_to_layer`` reads. ``edge_features[r]`` and
    ``edge_ids[r]``: the kept edges' rows and ids, for the relations whose blocks carry them."""

    edge_index: dict[RelationType, torch.Tensor]
    num_sampled_nodes: dict[str, list[int]]
    num_sampled_edges: dict[RelationType, list[int]]
    edge_features: dict[RelationType, torch.Tensor]
    edge_ids: dict[RelationType, torch.Tensor]


def typed_pyg_form(blocks: list[TypedBlock], node_types, relations) -> TypedPygForm:
    """``blocks`` (bottom layer first) in PyG's layout (``TypedPygForm``), over ``node_types`` and
    ``relations`` (those the blocks lack get no vertex and no edge). As in PyG, a vertex's neighbours come
    from the hop after the one that reached it (each vertex's neighbours once): of each relation's block, the
    rows of the destinations that the hop before newly reached, a contiguous tail of its CSC."""
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
