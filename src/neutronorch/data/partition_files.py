"""Reading a partition folder written by ``neutronorch partition`` (``partition.py``; the layout is in
docs/distributed.md, "Partitioned training"). ``load_partition(folder, part)`` opens one part and the
global arrays, memory-mapped, after checking them against the manifest (``partition_meta.py``): every refusal
names the file and the fix; a typed graph's part is ``partition_typed_files.py``'s. ``partition_summary`` is
what ``neutronorch info`` shows of a folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neutronorch.data.checks import SPLITS
from neutronorch.data.dtypes import BFLOAT16, bfloat16
from neutronorch.data.links import LinkSplit
from neutronorch.data.partition_links import link_files, load_links
from neutronorch.data.partition_meta import (AGAIN, FORMAT, FORMAT_VERSION, MANIFEST, METHODS,  # noqa: F401
                                             PART_META, balance, check_files, check_kind, check_part,
                                             check_part_meta, check_world, checksum_states, digest, file_states,
                                             is_partition_dir, is_typed, part_array, part_folder, partition_id,
                                             read_manifest)
from neutronorch.data.partition_typed_files import load_typed_partition, typed_owners, typed_summary
from neutronorch.data.typed_parts import OwnedRows, TypedPartition
from neutronorch.errors import ConfigError

GLOBAL_ARRAYS = ("part_of", "local_index", *SPLITS)
PART_ARRAYS = ("ids", "indptr", "indices", "features", "labels", *SPLITS)


def dealing_owners(folder: str | Path, world_size: int, num_nodes: int, typed: bool | None = None) -> np.ndarray:
    """The owner of every vertex in the partition folder ``folder``, by which a full-copy run of ``world_size``
    ranks on a graph of ``num_nodes`` vertices deals its seeds (``deal_by``), its checksum checked. A typed
    graph's folder: its target's owners (``num_nodes``: the target's vertices). ``typed``: whether the run's
    graph is typed, which the folder's must then be."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    if typed is not None:
        check_kind(manifest, folder, typed)
    check_world(manifest, world_size, folder)
    if is_typed(manifest):
        return typed_owners(folder, manifest, num_nodes)
    if manifest["graph"]["num_nodes"] != num_nodes:
        graph = manifest["graph"]
        raise ConfigError(f"{folder}: is a partition of {graph['name']} ({graph['num_nodes']:,} vertices), but the "
                          f"run's graph has {num_nodes:,}. Give the folder `neutronorch partition` made of this graph.")
    check_files(folder, manifest, ["part_of.npy"])
    return part_array(folder, "part_of.npy")


@dataclass(kw_only=True)
class Partition(OwnedRows):
    """One part of a partitioned graph: its owned vertices (``ids``, ascending global ids; local index i is
    ``ids[i]``), their in-edges as a CSC over the local rows whose ``indices`` are global ids, and their
    features, labels and split ids (global ids of owned vertices, in the source split's order); plus the
    global ``part_of`` (owner of every vertex), ``local_index`` (its index in its owner) and ``global_splits``
    (the whole graph's split, in its order), and a link dataset's ``links``; ``local`` and ``owner`` are
    ``OwnedRows``'."""

    manifest: dict
    ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    splits: dict[str, np.ndarray]
    global_splits: dict[str, np.ndarray]
    links: LinkSplit | None = None  # a link-prediction dataset's split, whole (``partition_links.py``)


def load_partition(folder: str | Path, part: int, world_size: int | None = None, verify: bool = True
                   ) -> Partition | TypedPartition:
    """Part ``part`` of the partition folder ``folder``, memory-mapped (a typed graph's: a ``TypedPartition``).
    ``world_size``: the ranks of the run that reads it (their count must be the parts'). ``verify``: the
    checksums of the files opened are checked (reading them once); the files' presence, sizes, shapes and the
    part's membership always are."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    check_part(folder, manifest, part, world_size)
    if is_typed(manifest):
        return load_typed_partition(folder, manifest, part, verify)
    parts, graph = manifest["parts"], manifest["graph"]
    names = [f"{a}.npy" for a in GLOBAL_ARRAYS] + [f"{part_folder(part)}/{a}.npy" for a in PART_ARRAYS]
    names += link_files(manifest)
    if verify:
        check_files(folder, manifest, names)
    stats, n = manifest["part_stats"][part], graph["num_nodes"]

    def array(name: str, shape: tuple | None = None) -> np.ndarray:
        return part_array(folder, name, shape)

    sub = part_folder(part)
    features = array(f"{sub}/features.npy", (stats["nodes"], graph["feature_dim"]))
    if graph["feature_dtype"] == BFLOAT16:
        features = features.view(bfloat16())
    label_shape = (stats["nodes"], *graph["label_shape"])
    return Partition(
        part=part, parts=parts, manifest=manifest, ids=array(f"{sub}/ids.npy", (stats["nodes"],)),
        indptr=array(f"{sub}/indptr.npy", (stats["nodes"] + 1,)),
        indices=array(f"{sub}/indices.npy", (stats["edges"],)),
        features=features, labels=array(f"{sub}/labels.npy", label_shape),
        splits={s: array(f"{sub}/{s}.npy", (stats[s.removesuffix('_idx')],)) for s in SPLITS},
        part_of=array("part_of.npy", (n,)), local_index=array("local_index.npy", (n,)),
        global_splits={s: array(f"{s}.npy") for s in SPLITS}, links=load_links(folder, manifest, AGAIN))


def partition_summary(folder: str | Path) -> dict:
    """What ``neutronorch info`` shows of a partition folder: its parts and method, per part its vertices,
    edges, training vertices and cut edges, their balance (max / mean), the edge cut, and the checksums'
    state (every file read once). A typed graph's: ``typed_summary``."""
    manifest = read_manifest(folder)
    if is_typed(manifest):
        return typed_summary(folder, manifest)
    stats, parts = manifest["part_stats"], manifest["parts"]
    graph = manifest["graph"]
    return {"partition": str(folder), "graph": graph["name"], "nodes": graph["num_nodes"], "edges": graph["num_edges"],
            "parts": parts, "method": manifest["method"], "seed": manifest["seed"], "balanced_on": manifest["balance"],
            "source": manifest["source"],
            "per_part": [{key: entry[key] for key in ("nodes", "edges", "train", "val", "test", "train_links",
                                                      "cut_edges") if key in entry} for entry in stats],
            **({"links": {key: manifest["links"][key] for key in ("sets", "undirected", "negatives", "metric")}}
               if manifest.get("links") else {}),
            "balance_max_over_mean": {key: balance(stats, key, parts) for key in ("nodes", "edges", "train")},
            "edge_cut": manifest["edge_cut"], "checksums": checksum_states(folder, manifest)}
