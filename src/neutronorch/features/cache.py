"""The device feature cache: the hottest rows on the device (ranked by ``hotness_order``), the rest read
from the host.

Two ways to serve a mini-batch's rows, both assembling the same ``features[rows]`` on the device:
``split`` + ``assemble`` (modes that sample on the host; only the misses are gathered and copied) and
``gather`` (modes that sample on the device; misses read through a UVA view or a host gather).

On the CPU the cache is a host tensor and both paths run unchanged, which is how the tests cover them.
"""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.csc import out_degrees
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.features.placement import to_device_in_slices
from neutronorch.features.store import FeatureStore
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


def hotness_order(graph: Graph | TypedGraph, fanouts, batch_size: int, seed: int, policy: str = "presample",
                  batches: int = 32) -> np.ndarray | dict[str, np.ndarray]:
    """Every vertex, hottest first; of a typed graph, per featured type. ``presample`` scores a vertex by its
    appearances in the input frontiers of the first ``batches`` mini-batches of the training seeds shuffled
    by ``seed`` (epoch -1's keys), sampled with the training ``fanouts``, plus a degree prior worth the same
    total (counts over a few batches are noisy); ``degree`` by out-degree alone, a typed vertex's summed over
    the relations out of its type (docs/gpu.md, "Placement")."""
    typed = isinstance(graph, TypedGraph)
    if typed:
        sampler = TypedNeighborSampler(graph, fanouts)
        degree = {t: np.zeros(graph.num_nodes[t], np.float64) for t in graph.features if graph.num_nodes[t]}
        for (source, _, _), relation in graph.relations.items():
            if source in degree:
                degree[source] += out_degrees(relation.indices, graph.num_nodes[source])
    else:
        sampler = NeighborSampler(graph.indptr, graph.indices, fanouts)
        degree = {"": out_degrees(graph.indices, graph.num_nodes).astype(np.float64)}
    counts = {t: np.zeros(d.shape[0], np.float64) for t, d in degree.items()}
    order = np.random.default_rng(seed).permutation(np.asarray(graph.train_idx, dtype=np.int64))
    for b in range(min(batches, -(-order.shape[0] // batch_size)) if policy != "degree" else 0):
        frontier = sampler.sample(order[b * batch_size:(b + 1) * batch_size], batch_key(seed, -1, b)).input_nodes
        for t, ids in frontier.items() if typed else [("", frontier)]:
            if t in counts:
                counts[t][ids.numpy()] += 1  # frontiers hold distinct vertices
    ranked = {t: _ranked(counts[t], degree[t]) for t in degree}
    return ranked if typed else ranked[""]


def _ranked(counts: np.ndarray, degree: np.ndarray) -> np.ndarray:
    """Vertices by ``counts`` plus a degree prior worth the same total, hottest first (ties: lower id first);
    by degree alone where nothing was counted (``degree``, no training seed or batch, a type never reached)."""
    if not counts.any():
        return np.argsort(-degree, kind="stable")
    prior = degree * (counts.sum() / max(1.0, degree.sum()))
    return np.argsort(-(counts + prior), kind="stable")


class FeatureCache:
    """``rows`` hottest vertices' features on ``device``; ``slot_map[v]`` is v's cache row or -1."""

    def __init__(self, store: FeatureStore, hot_order: np.ndarray, rows: int, device: torch.device,
                 device_lookup: bool = True):
        num_nodes = store.features.shape[0]
        self.rows = int(min(rows, num_nodes))
        self.full = self.rows == num_nodes
        if self.full:
            # Every row: the features themselves on the device (zero-copy on the CPU); slot = vertex id.
            self.slot_map = self.device_slot_map = None
            self.table = _rows_as(store.features, store.dtype, device)
            return
        cached = np.sort(hot_order[:self.rows])
        self.slot_map = np.full(num_nodes, -1, np.int32)  # int32: half the memory; slots < 2**31
        self.slot_map[cached] = np.arange(self.rows, dtype=np.int32)
        self.table = store.gather(torch.from_numpy(cached)).to(device)
        # Only modes that sample on the device look slots up there; the others split on the host.
        self.device_slot_map = torch.from_numpy(self.slot_map).to(device) if device_lookup else None

    def split(self, rows: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Host side: (every row's cache slot, misses clamped to slot 0; positions of the misses; the missed
        vertex ids). With every row cached the slots are the vertex ids and nothing is missed."""
        ids = rows.numpy()
        if self.full:
            none = np.empty(0, np.int64)
            return ids, none, none
        slots = self.slot_map[ids]
        miss_pos = np.flatnonzero(slots < 0)
        missed = ids[miss_pos]
        slots[miss_pos] = 0
        return slots, miss_pos, missed

    def assemble(self, slots: torch.Tensor, miss_pos: torch.Tensor, misses: torch.Tensor) -> torch.Tensor:
        """Device side: every row read from its cache slot, then the misses' rows overwritten with the
        copied ones (all on the cache's device)."""
        if self.rows == 0:
            return misses  # every row missed, in order
        out = self.table.index_select(0, slots)
        if misses.shape[0]:
            out.index_copy_(0, miss_pos, misses)
        return out

    def gather(self, rows: torch.Tensor, host_view: torch.Tensor | None, fetch=None) -> tuple[torch.Tensor, int, int]:
        """Device side, rows on the device: ``features[rows]`` from the cache and, for misses, from
        ``host_view`` (the host features as the device sees them, UVA) or else ``fetch(missed_ids)`` (a host
        gather copied to the device). Returns (features, hits, bytes read from the host)."""
        if self.full:
            return self.table.index_select(0, rows), rows.shape[0], 0
        slots = self.device_slot_map.index_select(0, rows)
        miss_pos = torch.nonzero(slots < 0).flatten()  # its size is needed: one sync, in the sampler's thread
        missed = rows.index_select(0, miss_pos)
        misses = fetch(missed) if host_view is None else host_view.index_select(0, missed).to(self.table.dtype)
        out = self.assemble(slots.clamp(min=0), miss_pos, misses)
        return out, rows.shape[0] - miss_pos.shape[0], misses.nbytes


def _rows_as(features: np.ndarray, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Every feature row as ``dtype`` on ``device``: float32 storage in memory as is (zero-copy on the CPU),
    anything else (other storage types, memory maps) widened and moved a slice of rows at a time."""
    if dtype == torch.float32 and features.dtype == np.float32 and not isinstance(features, np.memmap):
        return torch.from_numpy(features if features.flags.writeable else np.array(features)).to(device)
    widen = lambda rows: torch.from_numpy(rows.astype(np.float32, copy=False))  # noqa: E731
    return to_device_in_slices(features, device, dtype, widen)
