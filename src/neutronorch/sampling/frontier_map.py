"""The vertex -> position maps a host sampler relabels its draws through, one interface for two layouts:

- ``DenseMap``: an entry per vertex of the graph (8 bytes a vertex), what a sampler over the whole graph holds
  (its graph is as large; a lookup is one read).
- ``FrontierMap``: a table of positions in the frontier, hashed by vertex id and sized to the frontier (at most
  half full: 8 bytes per frontier vertex or less), what a rank holding one part of a graph holds: a map of the
  whole graph's size would grow with the graph the rank does not hold (888 MB a sampler on a 111M-vertex graph).

Both give ``relabel_into``'s result bit for bit: sampled ids as positions in the frontier, new vertices
appended in the order they first appear.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import neutronorch.jit  # noqa: F401 - says when these kernels are compiled (a cold cache)
from neutronorch.sampling import kernels
from neutronorch.sampling.kernels import mix
from neutronorch.sampling.neighbor_sampler import relabel_into
from neutronorch.sampling.relabel_kernels import RelabelScratch

MIN_SLOTS = 1 << 10
MAX_SLOTS = 1 << 31  # the table holds int32 positions
FRONTIER_MAP_BYTES = 16  # the most a ``FrontierMap`` holds per vertex of its largest frontier: 4 slots of 4 bytes


@njit(cache=True, nogil=True, inline="always")
def _slot(table, frontier, u):
    """The slot holding vertex ``u``'s position in ``frontier``, or the empty slot where it belongs (linear
    probing)."""
    mask = table.shape[0] - 1
    h = np.int64(mix(np.uint64(u)) & np.uint64(mask))
    while True:
        q = table[h]
        if q < 0 or frontier[q] == u:
            return h
        h = (h + 1) & mask


@njit(cache=True, nogil=True)
def enter(table, frontier, count):
    """Put ``frontier[:count]`` (distinct vertices) in ``table`` at their positions."""
    for p in range(count):
        table[_slot(table, frontier, frontier[p])] = p


@njit(cache=True, nogil=True)
def relabel_hashed(table, frontier, size, nbrs, local, start):
    """``kernels.relabel`` through ``table`` from ``nbrs[start]`` on: each id as its position in ``frontier``
    (``size`` long, room for the rest of ``nbrs``) into ``local``, new vertices appended in order of first
    appearance, until the table is half full. Returns (where it stopped, the new size)."""
    limit = table.shape[0] // 2
    for e in range(start, nbrs.shape[0]):
        if size >= limit:
            return e, size
        u = nbrs[e]
        h = _slot(table, frontier, u)
        q = table[h]
        if q < 0:
            q = size
            table[h] = q
            frontier[q] = u
            size += 1
        local[e] = q
    return nbrs.shape[0], size


@njit(cache=True, nogil=True)
def forget(table, frontier):
    """Empty the slots of ``frontier``'s vertices (all that ``table`` holds): found first, then emptied (an
    emptied slot would end the probe of a vertex placed past it)."""
    slots = np.empty(frontier.shape[0], np.int64)
    for p in range(frontier.shape[0]):
        slots[p] = _slot(table, frontier, frontier[p])
    for p in range(frontier.shape[0]):
        table[slots[p]] = -1


def slots_for(count: int) -> int:
    """The table's size for ``count`` vertices: a power of two at least twice as large."""
    return max(MIN_SLOTS, 1 << int(2 * max(count, 1) - 1).bit_length())


class FrontierMap:
    """A frontier's vertex -> position map sized to the frontier (module docstring). ``start(ids)`` enters the
    seeds, ``relabel`` grows the frontier hop by hop, ``clear`` empties it for the next sample. The table keeps
    the size of the largest frontier it held. Not thread-safe: one per sampler."""

    def __init__(self):
        self._table = np.full(MIN_SLOTS, -1, np.int32)
        self._held = np.empty(0, np.int64)  # the vertices the table holds, at their positions

    def _room(self, frontier: np.ndarray, size: int, count: int) -> None:
        """A table with room for ``count`` vertices, holding ``frontier[:size]``'s positions."""
        slots = slots_for(count)
        if slots > MAX_SLOTS:
            raise ValueError(f"a frontier of {count:,} vertices: a sampler's frontier holds at most {MAX_SLOTS // 2:,}")
        if self._table.shape[0] < slots:  # grown 2x or more: rebuilt
            self._table = np.empty(0, np.int32)  # the smaller one goes first
            self._table = np.full(slots, -1, np.int32)
            enter(self._table, frontier, size)

    def start(self, ids: np.ndarray) -> None:
        """Enter the distinct ``ids`` at positions 0, 1, ... (an empty map)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        self._room(ids, 0, ids.shape[0])
        enter(self._table, ids, ids.shape[0])
        self._held = ids

    def relabel(self, frontier: np.ndarray, parts: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        """``relabel_into(frontier, parts, ...)``: each of ``parts`` as positions in the grown frontier, and that
        frontier (int64); ``frontier`` is the map's as entered so far."""
        size = frontier.shape[0]
        grown = np.empty(size + sum(part.shape[0] for part in parts), np.int64)
        grown[:size] = frontier
        local = []
        for part in parts:
            part = np.ascontiguousarray(part)
            positions, done = np.empty(part.shape[0], np.int64), 0
            while True:
                done, size = relabel_hashed(self._table, grown, size, part, positions, done)
                self._held = grown[:size]
                if done == part.shape[0]:
                    break
                self._room(grown, size, size + 1)  # half full: twice the size
            local.append(positions)
        return local, grown[:size]

    def clear(self, frontier: np.ndarray | None = None) -> None:
        """Empty the map (of what it holds, whatever ``frontier`` says: a hop may have failed half way): slot by
        slot where they are few, else at once."""
        held, self._held = self._held, np.empty(0, np.int64)
        if held.shape[0] * 8 < self._table.shape[0]:
            forget(self._table, held)
        else:
            self._table.fill(-1)


class DenseMap:
    """The vertex -> position map of a sampler over a whole graph of ``num_nodes`` vertices (8 bytes a vertex),
    with ``FrontierMap``'s interface; a large relabel runs on every thread (``relabel_into``'s scratch)."""

    def __init__(self, num_nodes: int):
        self.node_map = np.full(num_nodes, -1, dtype=np.int64)
        self._scratch = RelabelScratch(num_nodes)

    def start(self, ids: np.ndarray) -> None:
        kernels.map_nodes(ids, self.node_map)

    def relabel(self, frontier: np.ndarray, parts: list[np.ndarray]) -> tuple[list[np.ndarray], np.ndarray]:
        return relabel_into(frontier, parts, self.node_map, self._scratch)

    def clear(self, frontier: np.ndarray) -> None:
        kernels.reset_map(frontier, self.node_map)
