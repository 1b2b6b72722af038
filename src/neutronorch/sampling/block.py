"""What a sampler produces: blocks (one bipartite layer each) and the sampled subgraph that holds them."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Block:
    """One layer's sampled bipartite graph in local ids.

    Destination ``i`` (0 <= i < num_dst) aggregates sources ``indices[indptr[i]:indptr[i+1]]``; sources
    are positions in the layer's source frontier. Destination ``i``'s own input is source
    ``dst_offset + i``: sampled blocks have ``dst_offset`` 0 (the destinations lead the frontier), while
    full-graph inference uses global vertex ids as source positions and a contiguous range of
    destinations starting at ``dst_offset``. (NeutronOrch's spliced batches are the one exception: their
    bottom block holds only the cold destinations, and the model's splice restores the rule.)

    ``src_degree``, when the sampler was asked for it, holds each source row's in-degree in the whole
    graph (float32), not in the block: what a normalisation by graph degrees (symmetric GCN) reads.
    ``src_ids``, set by the samplers, holds the source frontier's global vertex ids (int64): what keys a
    row's dropout mask to its vertex (``nn.activation``).
    """

    num_dst: int
    num_src: int
    indptr: torch.Tensor
    indices: torch.Tensor
    dst_offset: int = 0
    src_degree: torch.Tensor | None = None
    src_ids: torch.Tensor | None = None

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
                     move(self.src_degree), move(self.src_ids))


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

    def pyg_form(self) -> tuple[torch.Tensor, list[int], list[int]]:
        """``pyg_form(self.blocks)`` (homogeneous blocks)."""
        return pyg_form(self.blocks)


def pyg_form(self) -> tuple[torch.Tensor, list[int], list[int]]:
        """``pyg_form(self.blocks)``."""
        return pyg_form(self.blocks)


def pyg_form(blocks: list[Block]) -> tuple[torch.Tensor, list[int], list[int]]:
    """Sampled blocks (bottom layer first) as PyG's ``NeighborLoader`` yields a subgraph: ``(edge_index,
    num_sampled_nodes, num_sampled_edges)`` over the input frontier's positions (seeds first, then each
    hop's new vertices), ``edge_index[0]`` the neighbours and ``edge_index[1]`` the vertices they were
    sampled for, hop by hop from the seed hop. As in PyG, a vertex's neighbours come from the hop after the
    one that reached it (each vertex's neighbours once): of each block, the rows of the vertices that the
    hop before newly reached. The per-hop counts are what ``torch_geometric.utils.trim_to_layer`` reads."""
    if not blocks:
        raise ValueError("no blocks: nothing was sampled")
    sizes = [blocks[-1].num_dst] + [b.num_src for b in reversed(blocks)]  # after 0, 1, ... hops
    nodes = [sizes[0]] + [b - a for a, b in zip(sizes, sizes[1:])]
    sources, targets, edges = [], [], []
    for hop, block in enumerate(reversed(blocks)):
        hop_sources, hop_targets, lo, hi = block.edges_of(0 if hop == 0 else sizes[hop - 1], sizes[hop])
        sources.append(hop_sources)
        targets.append(hop_targets)
        edges.append(hi - lo)
    return torch.stack([torch.cat(sources), torch.cat(targets)]), nodes, edges
