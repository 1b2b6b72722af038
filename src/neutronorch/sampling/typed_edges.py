"""Edge features of sampled typed blocks: each relation's rows at its sampled edges' ids
(``TypedBlock.edge_ids``), read by the gather feature rows go through (``kernels.gather_stored``: a memory map
at the sampled rows only; float16 and bfloat16 storage decoded into float32). The typed samplers read them
into the blocks they return; ``gather_edge_features`` gives them to a block sampled without them.
"""

from __future__ import annotations

from typing import Iterable

import torch

from neutronorch.data.typed import RelationType, TypedGraph, relation_label
from neutronorch.errors import DataError
from neutronorch.sampling import kernels
from neutronorch.sampling.block import TypedBlock

__all__ = ["check_edge_features", "edge_rows", "gather_edge_features"]


def edge_rows(source, ids) -> torch.Tensor:
    """``source``'s rows (edges x width) at the edge ids ``ids`` (int64 numpy), float32 on the CPU."""
    rows = torch.empty((ids.shape[0], source.shape[1]), dtype=torch.float32)
    kernels.gather_stored(source, ids, kernels.NO_ORDER, rows)
    return rows


def check_edge_features(graph: TypedGraph, relations: Iterable[RelationType]) -> None:
    """Raise ``DataError`` naming the relation when one of ``relations`` has edge features that are not one
    row per edge (``edges x width``): a gather at the edges' ids would read past them."""
    for relation in relations:
        csc = graph.relations[relation]
        source = csc.edge_features
        if source is not None and (source.ndim != 2 or source.shape[0] != csc.num_edges):
            raise DataError(f"{graph.name}: relation {relation_label(relation)} has edge features of shape "
                            f"{tuple(source.shape)} for {csc.num_edges} edges; give one row (edges x width) per "
                            f"edge.")


def gather_edge_features(graph: TypedGraph, blocks: Iterable[TypedBlock],
                         device: torch.device | str = "cpu") -> None:
    """Set each typed block's ``edge_features[r]`` to relation ``r``'s edge feature rows at the block's
    ``edge_ids[r]`` (float32, on ``device``), for every relation with edge features whose edge ids the
    block holds. Raises ``DataError`` naming the relation when its edge features have a row count other than
    its edges'."""
    for tblock in blocks:
        check_edge_features(graph, tblock.edge_ids)
        for relation, ids in tblock.edge_ids.items():
            source = graph.relations[relation].edge_features
            if source is not None:
                tblock.edge_features[relation] = edge_rows(source, ids.cpu().numpy()).to(device)
