"""A chronological link split of a graph with edge times (docs/temporal.md, "Temporal link prediction").

Every stored edge is an interaction at its time. Sorted by time (ties by destination, then source), the
earliest ``train`` share of them is the training set, the next ``val`` share the validation set, the rest the
test set: a model trains on the past and is scored on the future. An undirected graph's interaction is stored
both ways at one time and is one link (kept as source < target). The topology keeps every edge: the temporal
sampler takes only edges strictly before each seed's time, so a held-out edge carries no message before it
happens, and a later one is history for the links after it (the streaming protocol of TGB and TGN).

Negatives are drawn as of the positive's time, among the vertices that exist then (``Appearance``): a vertex
exists from its own time (``node_time``) where the graph has vertex times, else from its first edge."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from neutronorch.data.edge_split import LINK_DIRECTIONS, _check_fractions, link_direction, stacked_relation
from neutronorch.data.graph import Graph
from neutronorch.data.links import LinkEnds, LinkSplit
from neutronorch.data.relation import relation_label
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError

logger = logging.getLogger("neutronorch")


def split_edges_by_time(graph: Graph, train: float, val: float, direction: str = "auto") -> Graph:
    """``graph`` with a chronological ``LinkSplit`` of its edges in ``links`` (each set's times in
    ``train_time``, ``val_time``, ``test_time``), its topology unchanged; ``direction`` as ``split_edges``'s."""
    _check_fractions(train, val, "a chronological link split")
    if direction not in LINK_DIRECTIONS:
        raise ConfigError(f"`link_direction` {direction!r}: choose one of {', '.join(LINK_DIRECTIONS)}.")
    if graph.links is not None:
        raise DataError(f"{graph.name}: already carries a link split; split the graph it came from instead.")
    if graph.edge_time is None:
        raise DataError(f"{graph.name}: a temporal link task needs edge times (each link's time), and the graph has "
                        + ("only vertex times" if graph.node_time is not None else "none")
                        + "; give the edges their times (docs/temporal.md, \"Times in the data\").")
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    dst = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), np.diff(indptr))
    src, time = indices.astype(np.int64, copy=False), np.asarray(graph.edge_time)
    undirected, _, why = link_direction(indptr, indices, direction)
    keep = src != dst  # self loops are no links
    if undirected:
        keep &= src < dst
    src, dst, time = src[keep], dst[keep], time[keep]
    if src.shape[0] == 0:
        raise DataError(f"{graph.name}: has no edges to split (self loops are no links).")
    order = np.lexsort((src, dst, time))  # by time, then destination, then source
    src, dst, time = src[order], dst[order], time[order]
    total = src.shape[0]
    sizes = (round(train * total), round(val * total))
    if min(*sizes, total - sum(sizes)) == 0:
        raise ConfigError(f"a chronological link split: shares {train} and {val} of {total:,} links leave a set "
                          f"empty; choose shares that give each set at least one link.")
    cuts = np.cumsum(sizes)
    pairs, times = np.split(np.stack([src, dst]), cuts, axis=1), np.split(time, cuts)
    kind = "undirected" if undirected else "directed"
    split = LinkSplit(train=pairs[0], val=pairs[1], test=pairs[2], undirected=undirected, direction=f"{kind}: {why}",
                      issues={}, train_time=times[0], val_time=times[1], test_time=times[2])
    split.checked = split.checked_for(graph.indices)
    note = (f"chronological link split {sizes[0]:,}/{sizes[1]:,}/{total - cuts[1]:,} of {total:,} {kind} links "
            f"(shares {train:g}/{val:g}): training up to time {times[0][-1]}, validation from {times[1][0]}, test "
            f"from {times[2][0]} to {times[2][-1]}; every edge stays in the topology, sampled only before each "
            f"seed's time")
    logger.info(f"{graph.name}: links split by time as {kind}: {why}")
    return dataclasses.replace(graph, links=split, notes=[*graph.notes, note])


def split_relation_by_time(graph: TypedGraph, ends: LinkEnds, train: float, val: float,
                           direction: str = "auto") -> tuple[LinkSplit, list[str]]:
    """``split_edges_by_time`` of a typed graph's relation ``ends.relation`` in ``ends``' stacked ids (two
    end types make a bipartite topology: split directed): the split and its note. The graph keeps every
    edge, as a homogeneous one does: the temporal sampler takes only edges before each seed's time."""
    relation = graph.relations[ends.relation]
    if relation.edge_time is None:
        timed = [relation_label(r) for r, rel in graph.relations.items() if rel.edge_time is not None]
        held = f"edge times on {', '.join(timed)}" if timed else "vertex times"
        raise DataError(f"{graph.name}: `link_relation` {relation_label(ends.relation)} has no edge times, so its "
                        f"links cannot be split by time, and a random split would leak the graph's {held}; predict "
                        f"a timed relation, or drop the times to use the graph as a static one (docs/temporal.md).")
    split = split_edges_by_time(stacked_relation(graph, ends, direction), train, val, direction)
    return split.links, split.notes


class Appearance:
    """When each vertex exists: ``times[i]`` (ascending) is the time vertex ``order[i]`` appears. ``draw``
    gives negatives as of a time: uniform among the vertices that exist by then. A typed graph's link task
    draws among its destination type's vertices, in its ends' stacked ids (``links.ends``)."""

    def __init__(self, graph: Graph | TypedGraph):
        if isinstance(graph, TypedGraph):
            ends = graph.links.ends
            kind, offset = ends.relation[2], ends.destinations[0]
            first = _first_times(graph.num_nodes[kind], graph.node_time.get(kind), [
                (r.indptr if d == kind else None, r.indices if s == kind else None, r.edge_time)
                for (s, _, d), r in graph.relations.items() if r.edge_time is not None and kind in (s, d)])
        else:
            offset = 0
            first = _first_times(graph.num_nodes, graph.node_time, [(graph.indptr, graph.indices, graph.edge_time)])
        order = np.argsort(first, kind="stable")
        self.order = torch.from_numpy(order + offset)
        self.times = torch.from_numpy(np.ascontiguousarray(first[order]))

    def existing(self, at: torch.Tensor) -> torch.Tensor:
        """How many vertices exist at each time of ``at`` (those appearing at or before it; whole and
        fractional clocks compared as float64, whole ones exactly)."""
        times = self.times
        if times.dtype.is_floating_point != at.dtype.is_floating_point:
            times, at = times.double(), at.double()
        return torch.searchsorted(times, at.to(times.dtype), right=True)

    def draw(self, generator: torch.Generator, at: torch.Tensor, per_positive: int) -> torch.Tensor:
        """(len(at), per_positive) vertices, each uniform among those existing at its row's time (all of them
        where none does yet), from ``generator``'s stream."""
        count = self.existing(at)
        count = torch.where(count > 0, count, self.order.shape[0]).unsqueeze(1)
        picks = (torch.rand((at.shape[0], per_positive), generator=generator, dtype=torch.float64) * count).long()
        return self.order[torch.minimum(picks, count - 1)]


def _first_times(count: int, node_time, timed: list) -> np.ndarray:
    """Each of ``count`` vertices' time of appearance: its own (``node_time``), else its first edge's, of
    ``timed`` (indptr, indices, edge_time) CSCs whose columns (``indptr``) or sources (``indices``) are these
    vertices, either None where they are not; never (the dtype's largest) without an edge."""
    if node_time is not None:
        return np.asarray(node_time)
    dtype = np.result_type(*(np.asarray(time).dtype for _, _, time in timed))
    first = np.full(count, np.iinfo(np.int64).max if dtype.kind == "i" else np.inf, dtype=dtype)
    for indptr, indices, time in timed:
        time = np.asarray(time)
        if indptr is not None:
            indptr = np.asarray(indptr)
            has = indptr[1:] > indptr[:-1]
            first[has] = np.minimum(first[has], time[indptr[:-1][has]])  # its first in-edge (columns by time)
        if indices is not None:
            np.minimum.at(first, np.asarray(indices), time)  # ... or out-edge
    return first
