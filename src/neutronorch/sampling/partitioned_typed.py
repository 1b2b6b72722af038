"""Sampling on one part of a partitioned typed graph (docs/distributed.md, "Sampling a typed graph's parts"):
``PartitionedTypedSampler`` gives exactly the blocks ``TypedNeighborSampler`` gives on the whole graph for the
same seeds and key, while its rank holds only its part's in-edges (``data.typed_parts.TypedPartition``).

It is ``PartitionedSampler``'s way (``partitioned.py``) with every relation of a hop in one round: each
destination type's frontier is grouped by owner, and every rank sends each owner one int64 message: the count
of ids per type, then per relation (in the graph's order) whether it draws, its fanout and its key, then the ids
per type. The owner draws every asked relation for the ids of its destination type from its part's CSC of that
relation, keyed by (the asker's relation key, global id) as the whole graph's sampler keys them, and sends back
the counts (int32), then the neighbours (int64, whatever each relation's ids are stored as). The asker puts
them back in frontier order and relabels them as ``TypedNeighborSampler`` does (``HostFrontiers``). Three
exchanges a hop, every rank taking part in every hop, an empty batch included."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.typed import RelationType, TypedGraph
from neutronorch.data.typed_parts import TypedPartition
from neutronorch.errors import ConfigError
from neutronorch.jit import read_only
from neutronorch.sampling.exchange import Exchange
from neutronorch.sampling.partitioned import by_owner, in_frontier_order, sample_rows
from neutronorch.sampling.typed_sampler import HostFrontiers, TypedHops

HEADER = 3  # per relation in a message: whether it draws (0 or 1), its fanout, its key (uint64 bits as int64)


def part_graph(part: TypedPartition) -> TypedGraph:
    """What ``TypedHops`` reads of a graph, from a part: its name, the whole graph's types and vertex counts,
    its target, and the relations (keys, names; the CSCs are the part's, over its owned destinations). No
    features, labels or splits: not a graph to train or check, only the sampler's."""
    empty = np.zeros(0, np.int64)
    return TypedGraph(part.name, dict(part.num_nodes), dict(part.relations), {}, part.target, None, empty, empty,
                      empty, part.num_classes)


class PartitionedTypedSampler(HostFrontiers, TypedHops):
    """``TypedNeighborSampler``'s blocks for one rank holding ``part``, asking the other parts' ranks through
    ``exchange`` (rank ``part.part`` of ``part.parts``; None: it samples only its part's own vertices and
    exchanges nothing). ``fanouts`` as ``typed_fanouts`` reads them. Every rank must sample the same number of
    hops at the same time, an empty batch included; each asker's keys and fanouts travel with its ids, so the
    ranks' batches may have keys of their own. ``asked`` and ``served``: the vertices this rank asked other
    ranks to draw for, and drew for them (a vertex once a hop, whatever relations into its type draw).

    Not thread-safe (a vertex -> position map per type, sized to its frontiers: ``FrontierMap``)."""

    def __init__(self, part: TypedPartition, exchange: Exchange | None, fanouts, degrees: bool = False):
        if exchange is not None and (exchange.size != part.parts or exchange.rank != part.part):
            raise ConfigError(f"part {part.part} of {part.parts} sampled by rank {exchange.rank} of "
                              f"{exchange.size}: each rank samples the part of its number, one part per rank.")
        if degrees:
            raise ConfigError(f"{part.name}: a typed graph's parts are sampled without their sources' out-degrees "
                              f"(a part holds only its own destinations' in-edges, not the whole graph's "
                              f"out-degrees); sample with degrees=False.")
        super().__init__(part_graph(part), fanouts)
        self.part, self.exchange = part, exchange
        self._make_maps(part.num_nodes, sized_to_frontier=True)
        self.relations = tuple(self.fanouts)  # the fixed order of a message's relations: the graph's
        self.asked = 0  # vertices this rank asked other ranks to draw for
        self.served = 0  # vertices other ranks asked this one to draw for

    def _edge_rows(self, edge_ids: dict[RelationType, torch.Tensor]) -> dict[RelationType, torch.Tensor]:
        return {}  # parts carry no edge features (``check_partitionable``), so no block asks for their rows

    def _draw(self, calls: dict[RelationType, tuple]) -> dict[RelationType, tuple[torch.Tensor, torch.Tensor]]:
        """Each relation's (ptr, sampled source ids) for its ``(destinations, fanout, key)``, as
        ``TypedNeighborSampler._draw`` gives them, every destination's draws made by its owner. A collective:
        every rank calls it at the same time (with ``{}`` when it has nothing to ask)."""
        if self.exchange is None:
            return {r: self._own(r, dst.numpy(), fanout, key) for r, (dst, fanout, key) in calls.items()}
        part, exchange, types = self.part, self.exchange, self.part.node_types
        wanted = {r[2] for r in calls}
        grouped = {t: by_owner(calls_dst(calls, t), part.part_of[t], part.parts) for t in types if t in wanted}
        no_ids = [np.zeros(0, np.int64)] * part.parts
        asks = {t: grouped[t][1] if t in grouped else no_ids for t in types}
        header = np.zeros((len(self.relations), HEADER), np.int64)
        for i, relation in enumerate(self.relations):
            if relation in calls:
                _, fanout, key = calls[relation]
                header[i] = (1, fanout, np.array(key, np.uint64).view(np.int64))
        messages = [np.concatenate([[asks[t][k].shape[0] for t in types], header.reshape(-1),
                                    *[asks[t][k] for t in types]]).astype(np.int64) for k in range(part.parts)]
        self.asked += sum(asks[t][k].shape[0] for t in types for k in range(part.parts) if k != part.part)
        # per rank, the rows of each relation asked of it, in the relations' order: what its counts come back as
        expected = [[asks[r[2]][k].shape[0] if r in calls else 0 for r in self.relations] for k in range(part.parts)]
        with exchange.unit():  # one unit of a ``Lane``: no rank stops within it
            received = [m.reshape(-1) for m in exchange.all_to_all(messages)]
            served = [self._serve(message) for message in received]
            counts = exchange.all_to_all([c for c, _ in served], [sum(e) for e in expected])
            nbrs = exchange.all_to_all([n for _, n in served], [int(c.sum()) for c in counts])
        self.served += sum(int(m[:len(types)].sum()) for k, m in enumerate(received) if k != part.part)
        return self._in_order(calls, grouped, expected, counts, nbrs)

    def _in_order(self, calls, grouped, expected, counts, nbrs) -> dict[RelationType, tuple]:
        """Each relation's (ptr, nbrs) in frontier order from the counts and neighbours each rank sent back,
        every rank's holding the asked relations one after another in the relations' order."""
        split_counts = [np.split(c.reshape(-1).astype(np.int64), np.cumsum(e)[:-1]) for c, e in zip(counts, expected)]
        split_nbrs = [np.split(n.reshape(-1), np.cumsum([int(c.sum()) for c in cs])[:-1])
                      for n, cs in zip(nbrs, split_counts)]
        drawn = {}
        for i, relation in enumerate(self.relations):
            if relation not in calls:
                continue
            order = grouped[relation[2]][0]
            grouped_counts = np.concatenate([cs[i] for cs in split_counts])
            grouped_ptr = np.zeros(order.shape[0] + 1, np.int64)
            np.cumsum(grouped_counts, out=grouped_ptr[1:])
            in_order = np.empty(order.shape[0], np.int64)
            in_order[order] = grouped_counts
            ptr = np.zeros(order.shape[0] + 1, np.int64)
            np.cumsum(in_order, out=ptr[1:])
            dtype = self.part.relations[relation].indices.dtype
            together = np.concatenate([ns[i] for ns in split_nbrs]).astype(dtype, copy=False)
            drawn[relation] = (torch.from_numpy(ptr),
                               torch.from_numpy(in_frontier_order(order, grouped_ptr, together, ptr)))
        return drawn

    def _serve(self, message: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One asker's message answered: the counts (int32) and neighbours (int64) of every relation it asks
        for, one relation after another in the relations' order."""
        types = self.part.node_types
        sizes = message[:len(types)]
        header = message[len(types):len(types) + HEADER * len(self.relations)].reshape(-1, HEADER)
        ids = dict(zip(types, np.split(message[len(types) + header.size:], np.cumsum(sizes)[:-1])))
        counts, nbrs = [np.zeros(0, np.int32)], [np.zeros(0, np.int64)]
        for relation, (asked, fanout, key) in zip(self.relations, header):
            if asked:
                ptr, drawn = self._rows(relation, ids[relation[2]], int(fanout), key.view(np.uint64))
                counts.append(np.diff(ptr).astype(np.int32))
                nbrs.append(drawn.astype(np.int64, copy=False))
        return np.concatenate(counts), np.concatenate(nbrs)

    def _rows(self, relation: RelationType, ids: np.ndarray, fanout: int, key) -> tuple[np.ndarray, np.ndarray]:
        """The whole graph's draws through ``relation`` of ``ids`` (this part's vertices): (ptr, nbrs)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        csc = self.part.relations[relation]
        indptr, indices = read_only(csc.indptr), read_only(csc.indices)
        return sample_rows(indptr, indices, self.part.local(relation[2], ids), ids, fanout, np.uint64(key))

    def _own(self, relation: RelationType, dst: np.ndarray, fanout: int, key: int) -> tuple:
        """``_rows`` without an exchange: every destination must be this part's."""
        node_type, part = relation[2], self.part
        owners = np.asarray(part.part_of[node_type][dst])
        if (owners != part.part).any():
            other = int(np.flatnonzero(owners != part.part)[0])
            raise ConfigError(f"part {part.part} samples without an exchange, so only the vertices it owns; "
                              f"{node_type} vertex {int(dst[other])} is part {int(owners[other])}'s. Give the "
                              f"sampler the ranks' exchange, or ask for this part's vertices only.")
        return tuple(map(torch.from_numpy, self._rows(relation, dst, fanout, key)))


def calls_dst(calls: dict[RelationType, tuple], node_type: str) -> np.ndarray:
    """The destinations of ``node_type`` the relations into it draw for (one frontier, the same for each)."""
    return next(dst for r, (dst, _, _) in calls.items() if r[2] == node_type).numpy()
