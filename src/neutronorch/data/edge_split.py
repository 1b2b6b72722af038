"""A seeded split of any graph's edges into training, validation and test links (``split_edges``, the spec
``edges:TRAIN,VAL``); held-out links leave the message-passing graph."""

from __future__ import annotations

import dataclasses
import logging
import math

import numpy as np
from numba import njit

from neutronorch.data.csc import drop_edges, edge_hygiene
from neutronorch.data.graph import Graph
from neutronorch.data.links import LinkEnds, LinkSplit
from neutronorch.data.relation import RelationType, relation_label
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, DataError
from neutronorch.jit import read_only

# Edges are handled as int64 keys dst * num_nodes + src, which hold graphs of up to this many vertices.
_KEY_LIMIT = math.isqrt(np.iinfo(np.int64).max)
# How a split treats an edge and its reverse (``split_edges``'s ``direction``, the option `link_direction`).
LINK_DIRECTIONS = ("auto", "undirected", "directed")
# ``auto``: undirected when at least this share of the edges (self loops aside) has its reverse. From half on,
# a directed split would leave at least half of the held-out links' reverse edges in message passing and among
# the training positives; a few one-way edges in a symmetric graph cannot turn it into a directed one.
UNDIRECTED_SHARE = 0.5
logger = logging.getLogger("neutronorch")


def parse_link_split(spec: str) -> tuple[float, float]:
    """``edges:TRAIN,VAL`` as (train, val) fractions of the edges; the test set is the rest."""
    kind, colon, rest = spec.partition(":")
    parts = rest.split(",")
    if kind.strip() != "edges" or not colon or len(parts) != 2:
        raise ConfigError(f"link split {spec!r} is not understood. Use edges:TRAIN,VAL (e.g. edges:0.85,0.05: "
                          f"shares of the edges for training and validation; the rest is the test set).")
    try:
        train, val = float(parts[0]), float(parts[1])
    except ValueError:
        raise ConfigError(f"link split {spec!r}: TRAIN and VAL must be numbers, as in edges:0.85,0.05.") from None
    _check_fractions(train, val, f"link split {spec!r}")
    return train, val


def _check_fractions(train: float, val: float, what: str) -> None:
    if not (0 < train < 1 and 0 < val < 1 and train + val < 1):  # NaN fails every comparison
        raise ConfigError(f"{what}: the training and validation shares must each lie in (0, 1) and sum to "
                          f"less than 1, leaving edges for the test set (got {train} and {val}); e.g. "
                          f"edges:0.85,0.05.")


def split_edges(graph: Graph, train: float, val: float, seed: int = 0, direction: str = "auto") -> Graph:
    """``graph`` with a seeded random ``LinkSplit`` of its edges in ``links``, its validation and test edges
    taken out of its topology; ``direction``: ``LINK_DIRECTIONS`` (docs/datasets.md, "Splitting any graph").
    An undirected link is stored source < target. The same seed gives the same split."""
    _check_fractions(train, val, "split_edges")
    if direction not in LINK_DIRECTIONS:
        raise ConfigError(f"`link_direction` {direction!r}: choose one of {', '.join(LINK_DIRECTIONS)}.")
    if graph.links is not None:
        raise DataError(f"{graph.name}: already carries a link split, and its validation and test edges are "
                        f"out of its topology; split the graph it came from instead.")
    _static(graph)
    num_nodes = graph.num_nodes
    if num_nodes > _KEY_LIMIT:
        raise DataError(f"{graph.name}: {num_nodes:,} vertices are more than a link split handles "
                        f"({_KEY_LIMIT:,}: edges are keyed by int64 dst * num_nodes + src).")
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    undirected, share, why = link_direction(indptr, indices, direction)
    # Each pair once, keyed (larger, smaller): source < target. Stored both ways, the half with src < dst.
    keys = _link_keys(indptr, indices, undirected and share == 1.0)
    if undirected and share < 1.0:
        keys = np.unique(pair_keys(_pairs(keys, num_nodes), num_nodes, True))
    total = keys.shape[0]
    if total == 0:
        raise DataError(f"{graph.name}: has no edges to split (self loops are no links).")
    sizes = (round(train * total), round(val * total))
    sizes = (*sizes, total - sizes[0] - sizes[1])
    if min(sizes) == 0:
        empty = ("training", "validation", "test")[sizes.index(0)]
        raise ConfigError(f"split_edges: shares {train} and {val} of {total} links leave the {empty} set empty; "
                          f"choose shares that give each set at least one edge.")
    order = np.random.default_rng(seed).permutation(total)
    train_keys, val_keys, test_keys = (np.sort(keys[part]) for part in np.split(order, np.cumsum(sizes[:2])))
    del order, keys
    held_out = np.concatenate([val_keys, test_keys])
    if undirected:
        held_out = np.concatenate([held_out, (held_out % num_nodes) * num_nodes + held_out // num_nodes])
    held_out.sort()
    new_indptr, new_indices = drop_edges(indptr, indices, held_out)
    kind = "undirected" if undirected else "directed"
    split = LinkSplit(train=_pairs(train_keys, num_nodes), val=_pairs(val_keys, num_nodes),
                      test=_pairs(test_keys, num_nodes), undirected=undirected, direction=f"{kind}: {why}",
                      issues={})  # nothing to find: no leak, self loop or repeat by construction
    split.checked = split.checked_for(new_indices)
    logger.info(f"{graph.name}: links split as {kind}: {why}"
                + ("; give `link_direction` directed to predict edges one way" if undirected and direction == "auto"
                   else ""))
    note = (f"link split {sizes[0]:,}/{sizes[1]:,}/{sizes[2]:,} of {total:,} {kind} edges (shares {train:g}/{val:g}, "
            f"seed {seed}; {why}); validation and test edges left out of message passing"
            + (" in both directions" if undirected else ""))
    return dataclasses.replace(graph, indptr=new_indptr, indices=new_indices, links=split,
                               notes=[*graph.notes, note])


def _static(graph: Graph | TypedGraph) -> None:
    """A random edge split of a graph with times would train on the future: refused (docs/temporal.md)."""
    if graph.temporal:
        raise DataError(f"{graph.name}: temporal sampling: a random edge split of a graph with times would train on "
                        f"edges after those it tests; a chronological split is not yet offered (docs/temporal.md). "
                        f"Split a copy without times to ignore them knowingly.")


def link_relation(graph: TypedGraph, name: str | None) -> RelationType:
    """The relation a typed graph's link task predicts: ``name`` (a triple ``src/name/dst`` or a name only one
    relation has), or, given none, the graph's only relation; ``ConfigError`` listing the relations else."""
    listed = ", ".join("/".join(r) for r in graph.relations)
    if name is None:
        if len(graph.relations) == 1:
            return next(iter(graph.relations))
        raise ConfigError(f"{graph.name} has {len(graph.relations)} relations: give `link_relation`, the one whose "
                          f"edges a link task predicts: one of {listed}.")
    try:
        return graph.relation(tuple(name.split("/")) if name.count("/") == 2 else name)
    except DataError as error:
        raise ConfigError(f"`link_relation` {name!r}: {error}") from None


def split_relation(graph: TypedGraph, ends: LinkEnds, train: float, val: float, seed: int = 0,
                   direction: str = "auto") -> tuple[TypedGraph, LinkSplit]:
    """``split_edges`` of a typed graph's relation ``ends.relation`` in ``ends``' stacked ids: the graph with
    the held-out edges out of the relation, and the split. Two end types make a bipartite topology: split
    directed."""
    _static(graph)
    src, _, dst = ends.relation
    relation = graph.relations[ends.relation]
    if relation.edge_features is not None:
        raise ConfigError(f"`link_relation` {relation_label(ends.relation)}: its edges have features, which a "
                          f"link task's split does not carry; choose a relation without edge features.")
    whole = stacked_relation(graph, ends, direction)
    start, count = ends.offsets[dst], ends.counts[dst]
    split = split_edges(whole, train, val, seed, direction)
    kept_ptr = split.indptr[start:start + count + 1]
    kept = dataclasses.replace(relation, indptr=kept_ptr - kept_ptr[0],
                               indices=(split.indices[kept_ptr[0]:kept_ptr[-1]] - ends.offsets[src]).astype(
                                   relation.indices.dtype))
    typed = dataclasses.replace(graph, relations={**graph.relations, ends.relation: kept},
                                notes=[*graph.notes, *split.notes[len(whole.notes):]])
    return typed, split.links


def stacked_relation(graph: TypedGraph, ends: LinkEnds, direction: str = "auto") -> Graph:
    """Relation ``ends.relation`` of a typed graph as a homogeneous graph in ``ends``' stacked ids (no features,
    labels or splits; its edge times where it has them), which the homogeneous link splits split; a bipartite
    relation refuses ``direction`` undirected (an edge has no reverse of its own relation)."""
    src, _, dst = ends.relation
    if src != dst and direction == "undirected":
        raise ConfigError(f"`link_direction` undirected: {relation_label(ends.relation)} links {src} to {dst}, so "
                          f"an edge has no reverse of its own relation; leave `link_direction` out (directed).")
    relation = graph.relations[ends.relation]
    indptr = np.asarray(relation.indptr, dtype=np.int64)
    start, count = ends.offsets[dst], ends.counts[dst]  # the destinations' columns; every other column empty
    stacked_ptr = np.concatenate([np.zeros(start, np.int64), indptr,
                                  np.full(ends.num_nodes - start - count, indptr[-1], np.int64)])
    return Graph(f"{graph.name} {relation_label(ends.relation)}", stacked_ptr,
                 np.asarray(relation.indices, dtype=np.int64) + ends.offsets[src], None, None, None, None, None, 0,
                 edge_time=None if relation.edge_time is None else np.asarray(relation.edge_time))


def link_direction(indptr: np.ndarray, indices: np.ndarray, direction: str) -> tuple[bool, float, str]:
    """Whether a split of the CSC's edges takes each link once both ways (``direction``: ``LINK_DIRECTIONS``),
    the share of edges with their reverse, and why, as the split's note says it."""
    share = reciprocity(indptr, indices)
    undirected = direction == "undirected" or (direction == "auto" and share >= UNDIRECTED_SHARE)
    why = (f"{share:.1%} of the edges have their reverse"
           + (f" ({'at least' if undirected else 'below'} {UNDIRECTED_SHARE:.0%})" if direction == "auto"
              else f"; `link_direction` {direction}"))
    return undirected, share, why


def reciprocity(indptr: np.ndarray, indices: np.ndarray) -> float:
    """The share of a CSC's stored edges (self loops aside) whose reverse is an edge too: 1.0 for a graph
    stored both ways (and for one without edges), near 0 for citations (``edge_hygiene``'s count)."""
    hygiene = edge_hygiene(indptr, indices)
    linked = np.asarray(indices).shape[0] - hygiene["self_loops"]
    return 1.0 if linked == 0 else 1.0 - hygiene["edges_without_reverse"] / linked


def pair_keys(pairs: np.ndarray, num_nodes: int, undirected: bool) -> np.ndarray:
    """Each pair's key dst * num_nodes + src (undirected: larger * num_nodes + smaller), in the pairs' order."""
    src, dst = pairs[0], pairs[1]
    if undirected:
        src, dst = np.minimum(src, dst), np.maximum(src, dst)
    return dst * num_nodes + src


def _link_keys(indptr: np.ndarray, indices: np.ndarray, undirected: bool) -> np.ndarray:
    """Sorted unique keys dst * num_nodes + src of the graph's links (undirected: those with src < dst)."""
    keys = _edge_keys(read_only(indptr), read_only(indices), undirected)
    if keys.size > 1 and np.any(keys[1:] < keys[:-1]):  # columns stored unsorted
        keys.sort()
    if keys.size > 1:
        keys = keys[np.concatenate(([True], keys[1:] != keys[:-1]))]
    return keys


@njit(cache=True, nogil=True)
def _edge_keys(indptr, indices, lower_only):
    num_nodes = indptr.shape[0] - 1
    keys = np.empty(indices.shape[0], np.int64)
    at = 0
    for v in range(num_nodes):
        for k in range(indptr[v], indptr[v + 1]):
            if indices[k] < v or (indices[k] > v and not lower_only):
                keys[at] = np.int64(v) * num_nodes + indices[k]
                at += 1
    return keys[:at]


def _pairs(keys: np.ndarray, num_nodes: int) -> np.ndarray:
    """Keys dst * num_nodes + src as a (2, E) int64 array of (src, dst)."""
    return np.stack([keys % num_nodes, keys // num_nodes])
