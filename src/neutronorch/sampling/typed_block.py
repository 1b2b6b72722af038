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

from neutronorch.sampling.block import Block

RelationType = tuple[str, str, str]


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


@dataclass
class TypedSubgraph:
    """The L-hop typed computation graph of seeds of one target type.

    ``blocks`` bottom layer first, as a model consumes them; ``frontiers[l][t]`` the global ids (within type
    ``t``) of block ``l``'s source frontier of type ``t``; ``frontiers[-1]`` holds the seeds alone."""

    target: str
    seeds: torch.Tensor
    blocks: list[TypedBlock]
    frontiers: list[dict[str, torch.Tensor]]

    @property
    def input_nodes(self) -> dict[str, torch.Tensor]:
        return self.frontiers[0]

    @property
    def num_sampled_edges(self) -> int:
        return sum(block.num_edges for block in self.blocks)
