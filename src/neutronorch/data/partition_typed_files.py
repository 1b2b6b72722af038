"""Reading a typed graph's partition folder (``partition_typed.py`` writes it; the layout is in
docs/distributed.md, "Typed graphs on parts"): ``load_typed_partition`` opens one part as a ``TypedPartition``,
its arrays memory-mapped, after the checks a homogeneous part gets (``partition_meta.py``); ``typed_owners``
is the target's owners a full-copy run deals its seeds by, ``typed_link_owners`` a link task's end types';
``typed_summary`` is what ``neutronorch info`` shows. ``partition_files.py``'s ``load_partition``, ``dealing_owners`` and ``partition_summary`` call these
for a folder whose manifest's ``kind`` is ``typed``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from neutronorch.data.checks import SPLITS
from neutronorch.data.dtypes import BFLOAT16, bfloat16
from neutronorch.data.partition_meta import (AGAIN, MANIFEST, balance, check_files, check_kind, check_world,
                                             checksum_states, part_array, part_folder, read_manifest)
from neutronorch.data.partition_links import link_files
from neutronorch.data.links import LinkEnds
from neutronorch.data.partition_typed_links import check_link_relation, load_typed_links, relation_name
from neutronorch.data.relation import Relation, RelationType
from neutronorch.data.typed_parts import TypedPartition
from neutronorch.errors import ConfigError, DataError

# What the manifest's global_arrays and part_arrays list (per type, per relation or once).
TYPED_GLOBAL_ARRAYS = ("types/<type>/part_of", "types/<type>/local_index", *SPLITS)
TYPED_PART_ARRAYS = ("types/<type>/ids", "types/<type>/features", "labels", *SPLITS,
                     "relations/<src>___<name>___<dst>/indptr", "relations/<src>___<name>___<dst>/indices")


def type_file(node_type: str, array: str) -> str:
    """A type's array in the folder's root or a part's (``types/paper/part_of.npy``)."""
    return f"types/{node_type}/{array}.npy"


def relation_file(relation: RelationType, array: str) -> str:
    """A relation's array in a part (``relations/author___writes___paper/indptr.npy``)."""
    return f"relations/{'___'.join(relation)}/{array}.npy"


def relations_of(manifest: dict) -> list[RelationType]:
    return [tuple(r) for r in manifest["graph"]["relations"]]


def typed_files(manifest: dict, part: int) -> list[str]:
    """The files opening part ``part`` reads: the root's owners, local indices, splits and link split, and the
    part's."""
    graph, sub = manifest["graph"], part_folder(part)
    names = [type_file(t, a) for t in graph["num_nodes"] for a in ("part_of", "local_index")]
    names += [f"{s}.npy" for s in SPLITS] + [f"{sub}/labels.npy"] + [f"{sub}/{s}.npy" for s in SPLITS]
    names += [f"{sub}/{type_file(t, 'ids')}" for t in graph["num_nodes"]]
    names += [f"{sub}/{type_file(t, 'features')}" for t in graph["feature_dtype"]]
    names += [f"{sub}/{relation_file(r, a)}" for r in relations_of(manifest) for a in ("indptr", "indices")]
    return names + link_files(manifest)


def load_typed_partition(folder: Path, manifest: dict, part: int, verify: bool) -> TypedPartition:
    """Part ``part`` of the typed partition folder ``folder`` (its manifest, and ``part.json``, checked by the
    caller), memory-mapped; ``verify``: the checksums of the files opened are checked (reading them once)."""
    if verify:
        check_files(folder, manifest, typed_files(manifest, part))
    graph, stats, sub = manifest["graph"], manifest["part_stats"][part], part_folder(part)
    num_nodes, target = dict(graph["num_nodes"]), graph["target"]
    owned = stats["nodes"]

    def array(name: str, shape: tuple | None = None) -> np.ndarray:
        return part_array(folder, name, shape)

    ids = {t: array(f"{sub}/{type_file(t, 'ids')}", (owned[t],)) for t in num_nodes}
    features = {}
    for t, dtype in graph["feature_dtype"].items():
        rows = array(f"{sub}/{type_file(t, 'features')}", (owned[t], graph["feature_dims"][t]))
        features[t] = rows.view(bfloat16()) if dtype == BFLOAT16 else rows
    relations, edges = {}, 0
    for r in relations_of(manifest):
        indptr = array(f"{sub}/{relation_file(r, 'indptr')}", (owned[r[2]] + 1,))
        count = int(indptr[-1])
        relations[r] = Relation(indptr, array(f"{sub}/{relation_file(r, 'indices')}", (count,)))
        edges += count
    if edges != stats["edges"]:
        raise DataError(f"{folder / sub}: its relations hold {edges:,} in-edges, but {MANIFEST} says "
                        f"{stats['edges']:,}. {AGAIN}")
    return TypedPartition(
        part=part, parts=manifest["parts"], name=graph["name"], num_nodes=num_nodes, target=target,
        part_of={t: array(type_file(t, "part_of"), (n,)) for t, n in num_nodes.items()},
        local_index={t: array(type_file(t, "local_index"), (n,)) for t, n in num_nodes.items()}, ids=ids,
        relations=relations, features=features, feature_dims=dict(graph["feature_dims"]),
        labels=array(f"{sub}/labels.npy", (owned[target], *graph["label_shape"])),
        splits={s: array(f"{sub}/{s}.npy", (stats[s.removesuffix('_idx')],)) for s in SPLITS},
        global_splits={s: array(f"{s}.npy") for s in SPLITS}, num_classes=graph["num_classes"],
        metric=graph["metric"], notes=list(graph["notes"]), manifest=manifest,
        links=load_typed_links(folder, manifest))


def typed_owners(folder: Path, manifest: dict, num_nodes: int) -> np.ndarray:
    """The owner of every vertex of the target type (``num_nodes`` of them in the run's graph), its checksum
    checked: what a typed full-copy run deals its seeds by."""
    graph = manifest["graph"]
    target = graph["target"]
    held = graph["num_nodes"][target]
    if held != num_nodes:
        raise ConfigError(f"{folder}: is a partition of {graph['name']} ({held:,} vertices of its target type "
                          f"{target}), but the run's graph has {num_nodes:,} of its target type. Give the folder "
                          f"`neutronorch partition` made of this graph.")
    name = type_file(target, "part_of")
    check_files(folder, manifest, [name])
    return part_array(folder, name, (held,))


def typed_link_owners(folder: str | Path, world_size: int, ends: LinkEnds, link_relation: str | None) -> np.ndarray:
    """The owner part of each of ``ends``' stacked ids (its end types' owners one after the other), in the typed
    partition folder ``folder`` made of the same graph and relation for ``world_size`` ranks, checksums checked:
    what a full-copy typed link run deals its seed edges by (the owner of each positive's source)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    check_kind(manifest, folder, True)
    relation = relation_name(ends.relation)
    if not manifest.get("links"):
        raise ConfigError(f"`deal_by` {folder}: holds a typed graph's parts for a node task, no link split; deal a "
                          f"typed link task's seed edges by a folder partitioned with `--split edges:T,V "
                          f"--link-relation {relation}`.")
    check_link_relation(manifest, folder, link_relation or relation)
    check_world(manifest, world_size, folder)
    num_nodes = manifest["graph"]["num_nodes"]
    differ = [t for t in ends.types if num_nodes.get(t) != ends.counts[t]]
    if differ:
        raise ConfigError(f"`deal_by` {folder}: is a partition of {manifest['graph']['name']}, whose type "
                          f"{differ[0]} has {num_nodes.get(differ[0], 0):,} vertices, but the run's graph has "
                          f"{ends.counts[differ[0]]:,}. Give the folder `neutronorch partition` made of this graph.")
    names = [type_file(t, "part_of") for t in ends.types]
    check_files(folder, manifest, names)
    owners = [np.asarray(part_array(folder, name, (ends.counts[t],))) for t, name in zip(ends.types, names)]
    if not owners:
        raise DataError(f"{folder}: its link split names no vertex type. {AGAIN}")
    return np.concatenate(owners)


def typed_summary(folder, manifest: dict) -> dict:
    """``partition_summary`` of a typed graph's folder: per part its vertices per type, in-edges, training,
    validation and test vertices (and a link split's training edges by source) and cut edges; their balance
    (largest over mean: vertices of each type, in-edges, training vertices or edges), a link split's form and
    relation, the edge cut and the checksums' state (every file read once)."""
    stats, parts, graph = manifest["part_stats"], manifest["parts"], manifest["graph"]
    per_type = [{f"{t} vertices": entry["nodes"][t] for t in graph["num_nodes"]} for entry in stats]
    flat = [{**counts, **entry} for counts, entry in zip(per_type, stats)]
    keys = [*per_type[0], "edges", "train", *(["train_links"] if manifest.get("links") else [])]
    return {"partition": str(folder), "graph": graph["name"], "target": graph["target"],
            "nodes": dict(graph["num_nodes"]), "edges": graph["num_edges"],
            "relations": [" ".join(r) for r in graph["relations"]], "parts": parts, "method": manifest["method"],
            "seed": manifest["seed"], "balanced_on": manifest["balance"], "source": manifest["source"],
            "per_part": [{key: entry[key] for key in ("nodes", "edges", "train", "val", "test", "train_links",
                                                      "cut_edges") if key in entry} for entry in stats],
            **({"links": {key: manifest["links"][key] for key in ("sets", "undirected", "negatives", "metric",
                                                                  "relation")}} if manifest.get("links") else {}),
            "balance_max_over_mean": {key: balance(flat, key, parts) for key in keys},
            "edge_cut": manifest["edge_cut"], "checksums": checksum_states(folder, manifest)}
