"""Edges a mini-batch must not see: a link task's seed edges, dropped from its own sampled graph after
sampling (docs/link-prediction.md, "No leakage"), the frontiers kept, so a vertex may have fewer neighbours
than its fanout, as in DGL's ``exclude``.

Host blocks go through a numba kernel that reads a destination's edges only when a seed edge ends there (on
the 300k graph, 1,024 seed edges a batch: 12 ms against 88 ms of torch ops); device blocks use torch ops, on
the device. A block that loses nothing is returned as it is."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
from numba import njit

import neutronorch.jit  # noqa: F401 - says when these kernels are compiled (a cold cache)
from neutronorch.errors import ConfigError
from neutronorch.sampling.block import Block, SampledSubgraph, TypedBlock


def pair_keys(pairs: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Sorted unique keys ``u * num_nodes + v`` of the (2, P) pairs and of their reverses."""
    pairs = pairs.long()
    keys = torch.cat([pairs[0] * num_nodes + pairs[1], pairs[1] * num_nodes + pairs[0]])
    return torch.unique(keys)


def exclude_edges(subgraph: SampledSubgraph, pairs: torch.Tensor, num_nodes: int,
                  ends=None) -> SampledSubgraph:
    """``subgraph`` without any sampled edge between the two ends of a (2, P) ``pairs`` column, in either
    direction (global vertex ids; ``num_nodes`` bounds them). The blocks keep their frontiers and dtypes. A
    typed ``subgraph`` loses them from the blocks of ``ends.relation`` and of its reverse, ``pairs`` and
    ``num_nodes`` in ``ends``' stacked ids (``LinkEnds``)."""
    if pairs.shape[1] == 0 or not subgraph.blocks:
        return subgraph
    keys = pair_keys(pairs.to(subgraph.seeds.device), num_nodes)
    if ends is None:
        blocks = [_without(b, f, keys, num_nodes) for b, f in zip(subgraph.blocks, subgraph.frontiers)]
    else:
        blocks = [_typed_without(tblock, keys, num_nodes, ends) for tblock in subgraph.blocks]
    return SampledSubgraph(subgraph.seeds, blocks, subgraph.frontiers)


def exclude_from_block(block: Block, sources: torch.Tensor, pairs: torch.Tensor, num_nodes: int) -> Block:
    """One sampled ``block`` (its source frontier's global ids ``sources``, destinations leading) without its
    edges between the ends of a ``pairs`` column, in either direction."""
    if pairs.shape[1] == 0:
        return block
    return _without(block, sources, pair_keys(pairs.to(sources.device), num_nodes), num_nodes)


def exclude_from_typed_block(tblock: TypedBlock, pairs: torch.Tensor, ends) -> TypedBlock:
    """``exclude_from_block`` of a typed block, ``pairs`` in ``ends``' stacked ids (``LinkEnds``)."""
    if pairs.shape[1] == 0 or not tblock.src_ids:  # no pairs, or a block of no vertices (a rank computing no hot rows)
        return tblock
    device = next(iter(tblock.src_ids.values())).device
    return _typed_without(tblock, pair_keys(pairs.to(device), ends.num_nodes), ends.num_nodes, ends)


def _typed_without(tblock: TypedBlock, keys: torch.Tensor, num_nodes: int, ends) -> TypedBlock:
    """``tblock`` without the edges in ``keys`` of ``ends.relation`` and of its reverse."""
    kept = {}
    for relation in (ends.relation, ends.reverse):
        if relation is not None and relation in tblock.blocks:
            (s, _, d), ids = relation, tblock.src_ids
            kept[relation] = _without(tblock.blocks[relation], ids[s] + ends.offsets[s], keys, num_nodes,
                                      ids[d][:tblock.num_dst[d]] + ends.offsets[d])
    return dataclasses.replace(tblock, blocks={**tblock.blocks, **kept}) if kept else tblock


def _without(block: Block, sources: torch.Tensor, keys: torch.Tensor, num_nodes: int,
             destinations: torch.Tensor | None = None) -> Block:
    """``block`` without its edges whose (source, destination) global pair is in ``keys``; the destinations'
    ids are ``destinations`` (default: the sources' from ``dst_offset`` on, a homogeneous block's)."""
    if block.num_edges == 0:
        return block
    if block.edge_ids is not None:  # a temporal block: its edge ids would no longer match its edges
        raise ConfigError("temporal sampling: a link task's seed-edge exclusion is not yet offered for blocks "
                          "sampled by time (docs/temporal.md).")
    if destinations is None:
        destinations = sources[block.dst_offset:block.dst_offset + block.num_dst]
    if block.indptr.device.type == "cpu":
        indptr, indices = _host_without(block.indptr.numpy(), block.indices.numpy(), sources.long().numpy(),
                                        destinations.long().numpy(), block.num_dst, keys.numpy(), num_nodes)
        if indices.shape[0] == block.num_edges:  # nothing dropped (most blocks): the sampler's tensors as they are
            return block
        return dataclasses.replace(block, indptr=torch.from_numpy(indptr), indices=torch.from_numpy(indices))
    return _torch_without(block, sources, destinations, keys, num_nodes)


def _torch_without(block: Block, sources: torch.Tensor, destinations: torch.Tensor, keys: torch.Tensor,
                   num_nodes: int) -> Block:
    """``_without`` in torch ops, on the block's device."""
    sources = sources.long()
    counts = (block.indptr[1:] - block.indptr[:-1]).long()
    destination = torch.repeat_interleave(torch.arange(block.num_dst, device=counts.device), counts,
                                          output_size=block.num_edges)
    destination_ids = destinations.long()[destination]
    edge_keys = sources[block.indices.long()] * num_nodes + destination_ids
    position = torch.searchsorted(keys, edge_keys).clamp_(max=keys.shape[0] - 1)
    keep = keys[position] != edge_keys
    kept = torch.zeros(block.num_dst, dtype=torch.long, device=counts.device).index_add_(0, destination, keep.long())
    indptr = torch.zeros(block.num_dst + 1, dtype=block.indptr.dtype, device=counts.device)
    indptr[1:] = kept.cumsum(0)
    return dataclasses.replace(block, indptr=indptr, indices=block.indices[keep])


@njit(cache=True, nogil=True)
def _host_without(indptr, indices, sources, destinations, num_dst, keys, num_nodes):
    """The CSC of a block without its edges keyed (``source * num_nodes + destination``) in the sorted
    ``keys``. A destination's edges are looked at only when some key names it as a destination."""
    named = np.unique(keys % num_nodes)
    out_ptr = np.empty(num_dst + 1, indptr.dtype)
    out_idx = np.empty(indices.shape[0], indices.dtype)
    out_ptr[0] = 0
    written = 0
    for i in range(num_dst):
        v = destinations[i]
        lo, hi = indptr[i], indptr[i + 1]
        at = np.searchsorted(named, v)
        if at < named.shape[0] and named[at] == v:
            for j in range(lo, hi):
                key = sources[indices[j]] * num_nodes + v
                k = np.searchsorted(keys, key)
                if k < keys.shape[0] and keys[k] == key:
                    continue
                out_idx[written] = indices[j]
                written += 1
        else:
            out_idx[written:written + hi - lo] = indices[lo:hi]
            written += hi - lo
        out_ptr[i + 1] = written
    return out_ptr, out_idx[:written]
