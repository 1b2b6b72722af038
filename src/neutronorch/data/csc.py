"""CSC topology: built from an edge list by ``edges_to_csc``, which every loader and generator uses (column
``v`` lists ``v``'s in-neighbours ascending, no self loops or duplicates, an undirected edge stored both
ways), and read, thinned or transposed as stored (``drop_edges`` never copies it; ``transpose_edges`` is what
the layers' backward passes gather through)."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from neutronorch.data.dtypes import as_int64, id_outside
from neutronorch.errors import DataError
from neutronorch.jit import read_only

# Graphs with fewer vertices than this store neighbour ids as int32, halving the size of ``indices``.
INT32_LIMIT = np.iinfo(np.int32).max
_DEGREE_CHUNK = 1 << 24  # indices counted at a time by out_degrees (128 MiB as int64)


def edges_to_csc(src: np.ndarray, dst: np.ndarray, num_nodes: int, symmetric: bool = True,
                 source: str = "edge list") -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the graph with edges ``src[i] -> dst[i]`` (``symmetric``: both ways), self
    loops and repeated edges dropped; ``indptr`` int64, ``indices`` int32 when ``num_nodes`` fits. Ids outside
    ``0..num_nodes-1`` raise ``DataError`` naming ``source``. Cost: one sort of the int64 edge keys (20
    million edges: about 3 s on two cores, 1 GB of temporaries)."""
    src, dst = edge_ends(src, dst, source)
    for ids in (src, dst):
        if (bad := id_outside(ids, num_nodes)) is not None:
            raise DataError(f"{source}: vertex id {bad} is out of range for {num_nodes:,} nodes. Vertex ids must "
                            f"be 0..{num_nodes - 1}; the file is corrupt or belongs to another graph.")
    keep = src != dst
    if not keep.all():
        src, dst = src[keep], dst[keep]
    del keep
    # One int64 key per edge, destination first and source second, so sorting the keys gives exactly CSC
    # order and duplicates end up adjacent. Filled in place: at 20M edges every temporary costs ~0.3 s.
    num_kept = src.shape[0]
    keys = np.empty(2 * num_kept if symmetric else num_kept, dtype=np.int64)
    np.multiply(dst, num_nodes, out=keys[:num_kept])
    keys[:num_kept] += src
    if symmetric:
        np.multiply(src, num_nodes, out=keys[num_kept:])
        keys[num_kept:] += dst
    del src, dst
    return csc_from_keys(keys, num_nodes, num_nodes, deduplicate=True)


def edge_ends(src, dst, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Edge sources and destinations as flat int64 arrays of one length, else a ``DataError`` naming ``source``."""
    src = as_int64(src, source, "edge sources").ravel()
    dst = as_int64(dst, source, "edge destinations").ravel()
    if src.shape != dst.shape:
        raise DataError(f"{source}: {src.shape[0]} edge sources but {dst.shape[0]} destinations; give one of "
                        f"each per edge.")
    return src, dst


def csc_from_keys(keys: np.ndarray, num_src: int, num_dst: int, deduplicate: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the edges whose int64 keys ``dst * num_src + src`` are ``keys`` (sorted here, in
    place; sorted keys are CSC order): each column's sources ascending, a repeated edge kept once with
    ``deduplicate``. ``indptr`` is int64; ``indices`` int32 when ``num_src`` fits, else int64."""
    keys.sort()
    if deduplicate and keys.size:
        first = np.empty(keys.shape[0], dtype=bool)
        first[0] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        keys = keys[first]
        del first
    destinations = keys // max(num_src, 1)
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(destinations, minlength=num_dst), out=indptr[1:])
    destinations *= num_src
    keys -= destinations
    return indptr, keys.astype(np.int32 if num_src <= INT32_LIMIT else np.int64, copy=False)


def out_degrees(indices: np.ndarray, num_nodes: int) -> np.ndarray:
    """How often each of ``num_nodes`` vertices occurs in a CSC's ``indices`` (its out-degree; int64),
    counted a chunk at a time, so memory-mapped topology is read once and never copied whole."""
    counts = np.zeros(num_nodes, np.int64)
    for start in range(0, indices.shape[0], _DEGREE_CHUNK):
        counts += np.bincount(indices[start:start + _DEGREE_CHUNK], minlength=num_nodes)
    return counts


def edge_hygiene(indptr: np.ndarray, indices: np.ndarray) -> dict[str, int]:
    """What ``edges_to_csc`` would have removed or added, counted in a CSC as stored: self loops,
    repeated in-neighbours, and edges whose reverse is missing (0 for an undirected graph). Reads the
    topology once and holds a sorted int64 copy of ``indices`` (8 bytes an edge)."""
    loops, repeats, one_way = _count_hygiene(read_only(np.asarray(indptr, np.int64)), read_only(np.asarray(indices)))
    return {"self_loops": int(loops), "duplicate_edges": int(repeats), "edges_without_reverse": int(one_way)}


@njit(cache=True, nogil=True)
def _count_hygiene(indptr, indices):
    num_nodes = indptr.shape[0] - 1
    ordered = np.empty(indices.shape[0], np.int64)
    loops = repeats = one_way = 0
    for v in range(num_nodes):
        start, end = indptr[v], indptr[v + 1]
        ordered[start:end] = np.sort(indices[start:end])
        for k in range(start, end):
            if ordered[k] == v:
                loops += 1
            if k > start and ordered[k] == ordered[k - 1]:
                repeats += 1
    for v in range(num_nodes):
        for k in range(indptr[v], indptr[v + 1]):
            u = ordered[k]  # the edge u -> v; its reverse v -> u sits in u's column
            lo, hi = indptr[u], indptr[u + 1]
            at = lo + np.searchsorted(ordered[lo:hi], v)
            if at >= hi or ordered[at] != v:
                one_way += 1
    return loops, repeats, one_way


def drop_edges(indptr: np.ndarray, indices: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The CSC without the edges named by ``keys``: sorted int64 ``dst * num_nodes + src``, one per edge
    ``src -> dst`` to drop (every stored copy of it goes). Each column keeps its order; the result is new
    arrays (``indptr`` int64, ``indices`` of the input's dtype), the input is read in place."""
    indptr, indices = read_only(np.asarray(indptr)), read_only(np.asarray(indices))
    num_nodes = indptr.shape[0] - 1
    starts = np.zeros(num_nodes + 1, np.int64)  # keys of column v: keys[starts[v]:starts[v + 1]]
    if keys.size:
        np.cumsum(np.bincount(keys // num_nodes, minlength=num_nodes), out=starts[1:])
    kept = np.zeros(num_nodes + 1, np.int64)
    _keep(indptr, indices, keys, starts, kept, np.empty(0, indices.dtype), False)
    np.cumsum(kept, out=kept)
    out = np.empty(int(kept[-1]), indices.dtype)
    _keep(indptr, indices, keys, starts, kept, out, True)
    return kept, out


@njit(cache=True, nogil=True, inline="always")
def _dropped(keys, lo, hi, key):
    at = lo + np.searchsorted(keys[lo:hi], key)
    return at < hi and keys[at] == key


@njit(cache=True, nogil=True, parallel=True)
def _keep(indptr, indices, keys, starts, kept, out, copy):
    """Each column's edges that ``keys`` do not drop: counted into ``kept[v + 1]``, or with ``copy`` written
    to ``out`` from offset ``kept[v]``."""
    num_nodes = indptr.shape[0] - 1
    for v in prange(num_nodes):
        base = np.int64(v) * num_nodes
        at = kept[v] if copy else 0
        for k in range(indptr[v], indptr[v + 1]):
            if not _dropped(keys, starts[v], starts[v + 1], base + indices[k]):
                if copy:
                    out[at] = indices[k]
                at += 1
        if not copy:
            kept[v + 1] = at


@njit(cache=True, nogil=True)
def transpose_edges(indptr, indices, num_src):
    """For each source, the edges that read it (CSR of the transpose, in a stable order), and every edge's
    destination: ``(src_ptr, edges, dst)``, ``edges[src_ptr[u]:src_ptr[u + 1]]`` the edges from ``u``."""
    counts = np.zeros(num_src + 1, np.int64)
    for e in range(indices.shape[0]):
        counts[indices[e] + 1] += 1
    src_ptr = np.cumsum(counts)
    fill = src_ptr[:-1].copy()
    edges = np.empty(indices.shape[0], np.int64)
    dst = np.empty(indices.shape[0], np.int64)
    for d in range(indptr.shape[0] - 1):
        for e in range(indptr[d], indptr[d + 1]):
            u = indices[e]
            edges[fill[u]] = e
            fill[u] += 1
            dst[e] = d
    return src_ptr, edges, dst
