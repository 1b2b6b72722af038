"""A typed graph's relations: the ``(src_type, name, dst_type)`` triple that names one, the native layout's
names of its arrays, and ``Relation``, one relation's edges as a CSC over its destination type. Imports no
torch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from neutronorch.data.arrays import feature_rows
from neutronorch.data.csc import INT32_LIMIT, csc_from_keys, edge_ends
from neutronorch.data.dtypes import id_outside
from neutronorch.data.times import time_array, timed_order
from neutronorch.errors import DataError

RelationType = tuple[str, str, str]  # (source type, relation name, destination type)
# Source and destination ids below this product make one int64 sort key per edge (the cheapest sort).
_KEY_LIMIT = 1 << 62


def relation_label(relation: RelationType) -> str:
    """How messages name a relation: ``(author, writes, paper)``."""
    return f"({', '.join(relation)})"


def node_array(node_type: str, array: str) -> str:
    """An array of one vertex type as the native layout names it (``nodes/paper/features``); the key of
    ``validate``'s ``files``."""
    return f"nodes/{node_type}/{array}"


def relation_array(relation: RelationType, array: str) -> str:
    """An array of one relation as the native layout names it (``relations/author___writes___paper/indptr``)."""
    return f"relations/{'___'.join(relation)}/{array}"


@dataclass
class Relation:
    """One relation's edges as a CSC over its destination type: ``indices`` holds source-type ids (int32 or
    int64); ``edge_features`` (edges x width) and ``edge_time`` (int64 or float64, each destination's in-edges
    ascending by it: ``data/times.py``) follow ``indices``' order, or are None."""

    indptr: np.ndarray
    indices: np.ndarray
    edge_features: np.ndarray | None = None
    edge_time: np.ndarray | None = None

    @property
    def num_edges(self) -> int:
        return int(self.indices.shape[0])

    @property
    def edge_feature_dim(self) -> int:
        return 0 if self.edge_features is None else int(self.edge_features.shape[1])

    def in_degrees(self) -> np.ndarray:
        return np.diff(np.asarray(self.indptr))

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(src, dst)`` of every edge as int64, in CSC order (reads the whole topology)."""
        dst = np.repeat(np.arange(self.indptr.shape[0] - 1, dtype=np.int64), self.in_degrees())
        return np.asarray(self.indices, dtype=np.int64), dst

    @staticmethod
    def from_edges(src, dst, num_src: int, num_dst: int, edge_features=None, deduplicate: bool = False,
                   source: str = "edge list", edge_time=None) -> "Relation":
        """The relation with edges ``src[i] -> dst[i]``, each destination's sources ascending; repeated edges
        are kept unless ``deduplicate`` (the first one's features then kept). Float edge features other than
        the storage dtypes become float32. Ids out of range raise ``DataError`` naming ``source``. With
        ``edge_time`` (a time per edge) each destination's edges are ascending by time, then by source, and
        only edges repeated at the same time are repeats (``timed_order``)."""
        src, dst = edge_ends(src, dst, source)
        for ids, count, end, name in ((src, num_src, "source", "num_src"), (dst, num_dst, "destination", "num_dst")):
            if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
                raise DataError(f"{source}: {name} is {count!r}, expected the number of {end} vertices (a whole "
                                f"number >= 0).")
            if (bad := id_outside(ids, count)) is not None:
                raise DataError(f"{source}: {end} id {bad} is out of range for {count:,} vertices of the "
                                f"{end} type; ids are 0..{count - 1}.")
        features = _edge_feature_rows(edge_features, src.shape[0], source)
        if edge_time is not None:
            return _timed(src, dst, num_src, num_dst, features, time_array(edge_time, src.shape[0], "edge times",
                                                                            source), deduplicate)
        if features is None and num_src * num_dst < _KEY_LIMIT:  # one int64 sort key per edge: the cheapest sort
            keys = dst * num_src  # a new array: the caller's dst is not changed
            keys += src
            return Relation(*csc_from_keys(keys, num_src, num_dst, deduplicate))
        order = np.lexsort((src, dst))  # stable: repeated pairs keep their features' order
        src, dst, features = src[order], dst[order], (features[order] if features is not None else None)
        if deduplicate and src.size:
            keep = np.empty(src.shape[0], dtype=bool)
            keep[0] = True
            keep[1:] = (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
            if not keep.all():
                src, dst = src[keep], dst[keep]
                features = features[keep] if features is not None else None
        indptr = np.zeros(num_dst + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
        return Relation(indptr, src.astype(np.int32 if num_src <= INT32_LIMIT else np.int64, copy=False), features)


def _timed(src, dst, num_src: int, num_dst: int, features, times, deduplicate: bool) -> "Relation":
    order = timed_order(src, dst, times, deduplicate)
    indptr = np.zeros(num_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst[order], minlength=num_dst), out=indptr[1:])
    return Relation(indptr, src[order].astype(np.int32 if num_src <= INT32_LIMIT else np.int64, copy=False),
                    None if features is None else features[order], times[order])


def _edge_feature_rows(edge_features, num_edges: int, source: str) -> np.ndarray | None:
    if edge_features is None:
        return None
    features = np.asarray(edge_features)
    if features.ndim == 1:
        features = features.reshape(-1, 1)  # one weight per edge
    if features.ndim != 2 or features.shape[0] != num_edges:
        raise DataError(f"{source}: edge features of shape {features.shape} for {num_edges:,} edges; give one "
                        f"row per edge.")
    return feature_rows(features, f"{source}: edge features")
