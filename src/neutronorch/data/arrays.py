"""What ``Graph.from_arrays`` makes of arrays a user holds (numpy arrays or torch tensors): a graph's fields,
cleaned as every loader cleans its data, no value truncated or wrapped."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from neutronorch.data.csc import INT32_LIMIT, edge_ends, edges_to_csc
from neutronorch.data.dtypes import STORAGE_DTYPES, as_int64, bfloat16
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.data.times import time_array, timed_order
from neutronorch.errors import DataError
from neutronorch.limits import check_seed, check_switch

SPLITS = ("train", "val", "test")


def graph_fields(src, dst, features, labels, splits: Mapping | Sequence | None = None, *, name: str = "arrays",
                 num_nodes: int | None = None, undirected: bool = True, split: str = DEFAULT_SPLIT, seed: int = 0,
                 num_classes: int | None = None, metric: str | None = None, edge_time=None, node_time=None) -> dict:
    """The fields of the graph (``Graph``'s keywords) with edges ``src[i] -> dst[i]``, a feature row and a
    label per vertex. ``splits``: {"train", "val", "test"} or a triple, each vertex ids or a boolean mask;
    None draws one by ``split`` and ``seed``. ``num_nodes`` defaults to the feature rows, ``num_classes`` to
    the labels'. ``edge_time`` (a time per edge) and ``node_time`` (a time per vertex): docs/temporal.md; with
    edge times an edge repeated at another time is another edge (only repeats at one time are dropped)."""
    if not isinstance(name, str):
        raise DataError(f"`name` {name!r}: expected a string (it names the graph in messages and summaries).")
    check_switch(undirected, "`undirected`")
    check_seed(seed)
    for what, count in (("num_classes", num_classes), ("num_nodes", num_nodes)):
        if count is not None and (not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0):
            raise DataError(f"{name}: {what} is {count!r}, expected a whole number >= 0.")
    features = feature_rows(features, f"{name}: features")
    n = features.shape[0] if num_nodes is None else int(num_nodes)
    labels = class_labels(_array(labels, "labels"), n, name)
    if num_classes is None:
        num_classes = labels.shape[1] if labels.ndim == 2 else int(labels.max(initial=-1)) + 1
    src, dst = _array(src, "src"), _array(dst, "dst")
    for what, ends in (("src", src), ("dst", dst)):
        if ends.ndim > 1:  # a (2, E) edge_index given as one end would be read flat, as edges it does not hold
            raise DataError(f"{name}: `{what}` has shape {ends.shape}; give the edges' {what} ids as a 1-D array "
                            f"(of a (2, E) edge_index: src=edge_index[0], dst=edge_index[1]).")
    if edge_time is None:
        indptr, indices = edges_to_csc(src, dst, n, symmetric=undirected, source=name)
        times = None
    else:
        indptr, indices, times = timed_csc(src, dst, edge_time, n, undirected, name)
    if node_time is not None:
        node_time = time_array(node_time, n, "vertex times", name)
    if splits is None:
        train, val, test = make_split(labels if labels.ndim == 1 else np.zeros(n, np.int64), num_classes, split,
                                      seed)
    else:
        train, val, test = _splits(splits, n, name)
    return dict(name=name, indptr=indptr, indices=indices, features=features, labels=labels, train_idx=train,
                val_idx=val, test_idx=test, num_classes=int(num_classes), metric=metric, edge_time=times,
                node_time=node_time)


def timed_csc(src, dst, edge_time, n: int, undirected: bool, name: str) -> tuple[np.ndarray, ...]:
    """``(indptr, indices, edge_time)`` of the timed edges ``src[i] -> dst[i]`` at ``edge_time[i]``
    (``undirected``: both ways, at the same time), self loops dropped as ``edges_to_csc`` drops them."""
    src, dst = edge_ends(src, dst, name)
    times = time_array(edge_time, src.shape[0], "edge times", name)
    keep = src != dst
    src, dst, times = src[keep], dst[keep], times[keep]
    if undirected:
        src, dst, times = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([times, times])
    order = timed_order(src, dst, times, deduplicate=True)
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst[order], minlength=n), out=indptr[1:])
    return indptr, src[order].astype(np.int32 if n <= INT32_LIMIT else np.int64, copy=False), times[order]


def _array(value, what: str) -> np.ndarray:
    if getattr(value, "is_meta", False):
        raise DataError(f"{what}: a tensor on the meta device, which holds no values; give one on the CPU or a GPU.")
    if hasattr(value, "detach"):  # a torch tensor (on any device)
        value = value.detach().cpu()
        if str(value.dtype) == "torch.bfloat16":  # numpy's bfloat16 over the same bits (torch is loaded)
            from neutronorch.bfloat16 import numpy_view
            return numpy_view(value).view(bfloat16())
        value = value.numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{what}: cannot be read as an array ({exc}).") from None


def feature_rows(value, what: str) -> np.ndarray:
    """``value`` (an array or a tensor) as a feature row per vertex: float32, float16 and bfloat16 kept as they
    are, other real numbers as float32; ``what`` names it in an error."""
    features = _array(value, what)
    if features.ndim != 2:
        raise DataError(f"{what} must be a 2-D array (a row per vertex), got shape {features.shape}.")
    if features.dtype.kind not in "fiub" and features.dtype.name not in STORAGE_DTYPES:
        raise DataError(f"{what} have dtype {features.dtype}, expected real numbers.")
    return features if features.dtype.name in STORAGE_DTYPES else features.astype(np.float32)


def class_labels(labels: np.ndarray, n: int, name: str) -> np.ndarray:
    """Class ids with -1 for none (from integers, or floats with NaN), or a 0/1/-1 row per vertex."""
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]  # a column of class ids, as PyG and OGB often store them
    if labels.shape[0] != n:
        raise DataError(f"{name}: {labels.shape[0]:,} labels for {n:,} vertices; give one label (or one row of "
                        f"0/1 task labels) per vertex.")
    if labels.dtype == bool:
        labels = labels.astype(np.int64)
    elif labels.dtype.kind == "f":
        labels = np.where(np.isnan(labels), -1, labels)  # NaN: no label (ogbn-papers100M)
    # Never truncated or wrapped: 1.5 would read as class 1, 2**64-1 as -1 (no label).
    labels = as_int64(labels, name, "labels (whole class ids, or NaN for none)")
    if labels.ndim == 2:
        if labels.size and (int(labels.min()) < -1 or int(labels.max()) > 1):
            raise DataError(f"{name}: multi-label labels hold {int(labels.min())}..{int(labels.max())}; each "
                            f"entry is 0 or 1, or -1 where unknown.")
        return labels.astype(np.int8)
    return labels


def _splits(splits: Mapping | Sequence, n: int, name: str) -> tuple[np.ndarray, ...]:
    if isinstance(splits, Mapping) and set(splits) != set(SPLITS):
        raise DataError(f"{name}: splits has the keys {sorted(map(str, splits))}; give exactly "
                        f"{', '.join(SPLITS)} (a set left out would be empty, a key not one of them ignored).")
    parts = [splits[k] for k in SPLITS] if isinstance(splits, Mapping) else list(splits)
    if len(parts) != 3:
        raise DataError(f"{name}: splits must be train, val and test (a dict with those keys or a triple).")
    out = []
    for key, part in zip(SPLITS, parts):
        part = _array(part, f"{key} split")
        if part.dtype == bool:
            if part.shape != (n,):
                raise DataError(f"{name}: the {key} mask has shape {part.shape}, expected ({n},).")
            part = np.flatnonzero(part)
        out.append(as_int64(part, name, f"the {key} split's vertex ids"))
    return tuple(out)
