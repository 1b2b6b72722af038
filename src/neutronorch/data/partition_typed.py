"""Partitioning a typed graph (docs/distributed.md, "Typed graphs on parts"): every vertex of every type gets
one owner part (``assign_typed``: at random, type by type, or by METIS on the graph with its types stacked),
and each part is written as a folder of memory-mappable ``.npy`` arrays (``write_typed_partition``): per type
its owned vertices' ids and feature rows, per relation its owned destinations' in-edges (``owned_in_edges``,
sources as whole-graph ids), the target's labels and split ids. The root holds every type's owners and local
indices, the target's split, a link task's split of one relation (``partition_typed_links.py``) and
``partition.json``, written last (``partition_typed_files.py`` reads it)."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import numpy as np

from neutronorch.atomic import write_folder
from neutronorch.data.checks import SPLITS
from neutronorch.data.dtypes import is_bfloat16
from neutronorch.data.native import save_array
from neutronorch.data.partition import (Say, balanced_metis, check_parts, metis, random_parts, save_rows,
                                        symmetrised_pairs, weighing)
from neutronorch.data.partition_meta import (FORMAT, FORMAT_VERSION, MANIFEST, PART_META, TYPED, digest, part_folder,
                                             partition_id)
from neutronorch.data.partition_links import link_arrays
from neutronorch.data.partition_typed_links import typed_link_manifest
from neutronorch.data.partition_typed_files import (TYPED_GLOBAL_ARRAYS, TYPED_PART_ARRAYS, relation_file,
                                                    type_file)
from neutronorch.data.typed import TypedGraph, type_offsets
from neutronorch.data.typed_parts import check_partitionable, local_indices, owned_in_edges

Owners = dict[str, np.ndarray]
STACKED = "vertices of every type"  # the one constraint METIS balances where several are left off


def check_typed_graph(graph: TypedGraph, spec: str, parts: int) -> None:
    """A typed graph this module can partition into ``parts``: ``check_partitionable``'s, and a vertex a part."""
    check_partitionable(graph, spec)
    check_parts(parts, sum(graph.num_nodes.values()), spec)


def vertices_of(node_type: str) -> str:
    """The name of the METIS constraint that balances ``node_type``'s vertices."""
    return f"{node_type} vertices"


def assign_typed(graph: TypedGraph, parts: int, method: str, seed: int, say: Say = lambda line: None
                 ) -> tuple[Owners, list[str]]:
    """The owner part of every vertex, per type (int32, one per vertex of the type), and what METIS balanced
    (none for random parts). Random: each type's vertices dealt out as ``random_parts`` deals them, each type
    from a stream of its own (the seed, and the CRC-32 of the type's name)."""
    if method == "random":
        return {t: random_parts(n, parts, seed, zlib.crc32(t.encode())) for t, n in graph.num_nodes.items()}, []
    return typed_metis_parts(graph, parts, seed, say)


def typed_constraints(graph: TypedGraph) -> dict[str, np.ndarray]:
    """METIS's vertex weights over the stacked vertices (``type_offsets``), by what they balance, as DistDGL
    balances a typed graph: each type's vertices (1 on the type's), the target's training vertices and the
    in-edges over every relation; less those no vertex weighs."""
    offsets, total = type_offsets(graph), sum(graph.num_nodes.values())
    columns = {}
    for t, n in graph.num_nodes.items():
        columns[vertices_of(t)] = np.zeros(total, dtype=np.int64)
        columns[vertices_of(t)][offsets[t]:offsets[t] + n] = 1
    training = np.zeros(total, dtype=np.int64)
    if graph.links is not None:  # a link task's: the training edges whose source it is (the dealing's weight)
        ends = graph.links.ends
        src = ends.relation[0]
        sources = np.asarray(graph.links.train[0], dtype=np.int64) - ends.offsets[src]
        training[offsets[src]:offsets[src] + graph.num_nodes[src]] = np.bincount(sources, minlength=ends.counts[src])
    else:
        training[offsets[graph.target] + np.asarray(graph.train_idx, dtype=np.int64)] = 1
    in_edges = np.zeros(total, dtype=np.int64)
    for (_, _, dst), relation in graph.relations.items():
        in_edges[offsets[dst]:offsets[dst] + graph.num_nodes[dst]] += np.diff(np.asarray(relation.indptr))
    return weighing({**columns, "training vertices": training, "in-edges": in_edges})


def typed_metis_parts(graph: TypedGraph, parts: int, seed: int, say: Say = lambda line: None
                      ) -> tuple[Owners, list[str]]:
    """METIS on the graph with its types stacked, every relation's edges symmetrised into one adjacency,
    balancing ``typed_constraints`` (``balanced_metis``; where the parts are off balance, again with the
    stacked vertices as the one constraint, ``STACKED``); the owners cut back per type, and the names
    balanced."""
    pymetis = metis()
    offsets, total = type_offsets(graph), sum(graph.num_nodes.values())
    every = typed_constraints(graph)
    if parts == 1:
        return {t: np.zeros(n, dtype=np.int32) for t, n in graph.num_nodes.items()}, list(every)
    say(f"symmetrising {graph.num_edges:,} edges of {len(graph.relations)} relations for METIS")
    sources, destinations = [], []
    for (src_type, _, dst_type), relation in graph.relations.items():
        src, dst = relation.edges()
        sources.append(np.asarray(src, dtype=np.int64) + offsets[src_type])
        destinations.append(np.asarray(dst, dtype=np.int64) + offsets[dst_type])
    empty = np.zeros(0, np.int64)
    xadj, adjncy = symmetrised_pairs(np.concatenate(sources or [empty]), np.concatenate(destinations or [empty]),
                                     total, pymetis.zero_copy_dtype())
    del sources, destinations
    stacked, names = balanced_metis(xadj, adjncy, every, {STACKED: np.ones(total, dtype=np.int64)}, parts, seed, say)
    return {t: stacked[offsets[t]:offsets[t] + n].copy() for t, n in graph.num_nodes.items()}, names


def cut_edges(graph: TypedGraph, owners: Owners, parts: int) -> np.ndarray:
    """Per part, its in-edges (over every relation) whose source another part owns, counted at the destination."""
    cut = np.zeros(parts, dtype=np.int64)
    for (src, _, dst), relation in graph.relations.items():
        dst_part = np.repeat(owners[dst], np.diff(np.asarray(relation.indptr)))
        crossing = owners[src][np.asarray(relation.indices)] != dst_part
        cut += np.bincount(dst_part[crossing], minlength=parts)
    return cut


def write_typed_partition(graph: TypedGraph, assigned: tuple[Owners, list[str]], parts: int, out: str | Path,
                          method: str, seed: int, source: str, say: Say = lambda line: None) -> dict:
    """Write ``graph`` split into ``parts`` by ``assigned`` (``assign_typed``'s owners and the constraints
    balanced) to the folder ``out`` (checked by the caller: new or empty); returns the manifest written. Every
    relation of ``graph`` is written and listed: a run trains with the reverse relations, so partition
    ``graph.with_reverse()``. A part METIS left without vertices of a type is written so (``info`` shows it)."""
    check_partitionable(graph, source)
    owners = {t: np.asarray(assigned[0][t], dtype=np.int32) for t in graph.num_nodes}
    balance = assigned[1]
    local, owned = {}, {}
    for t in graph.num_nodes:
        local[t], owned[t] = local_indices(owners[t], parts)
    say("counting the edge cut")
    cut = cut_edges(graph, owners, parts)
    target, files, stats = graph.target, {}, []
    split_of = {s: np.asarray(getattr(graph, s), dtype=np.int64) for s in SPLITS}

    def saved(folder: Path, name: str, array: np.ndarray) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_array(path, array)
        recorded(folder, name)

    def recorded(folder: Path, name: str) -> None:
        files[name] = {"sha256": digest(folder / name), "bytes": (folder / name).stat().st_size}

    def fill(folder: Path) -> None:
        for t in graph.num_nodes:
            saved(folder, type_file(t, "part_of"), owners[t])
            saved(folder, type_file(t, "local_index"), local[t])
        for split, ids in split_of.items():
            saved(folder, f"{split}.npy", ids)
        for name, array in link_arrays(graph.links).items() if graph.links is not None else ():
            saved(folder, name, array)
        owners_sha = [files[type_file(t, "part_of")]["sha256"] for t in graph.num_nodes]
        owners_sha += [files["link_train.npy"]["sha256"]] if graph.links is not None else []  # another split
        ident = partition_id(":".join(owners_sha), graph.name, sum(graph.num_nodes.values()), graph.num_edges)
        for k in range(parts):
            sub = part_folder(k)
            say(f"writing part {k} of {parts}: " + ", ".join(f"{owned[t][k].shape[0]:,} {t}" for t in graph.num_nodes))
            for t in graph.num_nodes:
                ids = owned[t][k]
                saved(folder, f"{sub}/{type_file(t, 'ids')}", ids)
                if t in graph.features:
                    name = f"{sub}/{type_file(t, 'features')}"
                    save_rows(folder / name, graph.features[t], ids)
                    recorded(folder, name)
            saved(folder, f"{sub}/labels.npy", np.asarray(graph.labels[owned[target][k]]))
            edges = 0
            for r, relation in graph.relations.items():
                mine = owned_in_edges(relation, owned[r[2]][k])
                saved(folder, f"{sub}/{relation_file(r, 'indptr')}", mine.indptr)
                saved(folder, f"{sub}/{relation_file(r, 'indices')}", mine.indices)
                edges += mine.num_edges
            entry = {"part": k, "nodes": {t: int(owned[t][k].shape[0]) for t in graph.num_nodes}, "edges": edges,
                     "cut_edges": int(cut[k])}
            if graph.links is not None:  # the training positives this part's rank trains (by their source)
                ends = graph.links.ends
                src = ends.relation[0]
                sources = np.asarray(graph.links.train[0], dtype=np.int64) - ends.offsets[src]
                entry["train_links"] = int(np.count_nonzero(owners[src][sources] == k))
            for split, ids in split_of.items():
                mine = ids[owners[target][ids] == k]
                saved(folder, f"{sub}/{split}.npy", mine)
                entry[split.removesuffix("_idx")] = int(mine.shape[0])
            stats.append(entry)
            (folder / sub / PART_META).write_text(json.dumps({"id": ident, "part": k, "parts": parts}) + "\n")
        manifest.update(id=ident, part_stats=stats, files=files)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")  # last: the folder is complete

    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "kind": TYPED, "parts": parts, "method": method,
                "seed": seed, "balance": list(balance) if parts > 1 else [], "source": source,
                "graph": {"name": graph.name, "num_nodes": dict(graph.num_nodes), "num_edges": graph.num_edges,
                          "target": target, "relations": [list(r) for r in graph.relations],
                          "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes},
                          "feature_dtype": {t: "bfloat16" if is_bfloat16(rows) else rows.dtype.name
                                            for t, rows in graph.features.items()},
                          "num_classes": int(graph.num_classes), "label_shape": list(graph.labels.shape[1:]),
                          "metric": graph.metric, "notes": list(graph.notes)},
                "edge_cut": {"edges": int(cut.sum()), "fraction": float(cut.sum() / max(graph.num_edges, 1))},
                "global_arrays": list(TYPED_GLOBAL_ARRAYS), "part_arrays": list(TYPED_PART_ARRAYS)}
    if graph.links is not None:  # a link task's split of one relation, and its model's input statistics
        manifest["links"] = typed_link_manifest(graph)
    write_folder(Path(out), fill)
    return manifest
