"""Typed graphs on disk: one folder of ``.npy`` arrays under readable names, plus ``meta.json``.

Arrays are opened as memory maps, as in the homogeneous native format (``native.py``, whose folder swap,
array writer and readers this module uses), so a typed graph larger than RAM opens without being read.

Layout (``"format": "neutronorch-typed"``, ``format_version`` 1)::

    meta.json        format, format_version, name, node_types, relations, target, num_classes[, notes, metric]
                     node_types: [{name, count, feature_dim[, feature_dtype]}], in the graph's type order
                     relations: [{src, name, dst, num_edges, edge_feature_dim[, edge_feature_dtype]}]
    nodes/<type>/features.npy         float32/float16, count x feature_dim (bfloat16: its uint16 bits, with
                                      feature_dtype "bfloat16"); none for a type without features
    nodes/<target>/labels.npy         int64 per vertex (-1: none), or int8 rows of 0/1/-1 (multi-label)
    nodes/<target>/train_idx.npy, val_idx.npy, test_idx.npy     int64 local ids of the target type
    relations/<src>___<name>___<dst>/indptr.npy          int64, count(dst)+1: the CSC over the destination
    relations/<src>___<name>___<dst>/indices.npy         int32/int64 local ids of the source type
    relations/<src>___<name>___<dst>/edge_features.npy   edges x edge_feature_dim (only when there are any)

The arrays are written into a hidden folder beside the target, ``meta.json`` last, and the folder is
renamed into place at the end: a folder killed mid-write is never mistaken for a finished one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from neutronorch.data.checks import SPLITS
from neutronorch.data.files import open_npy, reads_files
from neutronorch.data.native import (FORMAT_VERSION, as_stored, check_dataset_folder, check_meta_value, read_meta,
                                     save_array, write_folder)
from neutronorch.data.relation import Relation, RelationType, node_array, relation_array, relation_label
from neutronorch.data.typed import TYPED_FORMAT, TypedGraph
from neutronorch.errors import DataError, OutputError
from neutronorch.limits import name_bytes, name_max, shown

META_KEYS = ("format", "format_version", "name", "node_types", "relations", "target", "num_classes")
OPTIONAL_KEYS = ("notes", "metric")
# The fields of one entry of meta.json's node_types and relations, with their types (int: a count >= 0).
_NODE_FIELDS = {"name": str, "count": int, "feature_dim": int}
_RELATION_FIELDS = {"src": str, "name": str, "dst": str, "num_edges": int, "edge_feature_dim": int}
_OWN_ENTRIES = {"meta.json", "nodes", "relations"}


def is_typed_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a typed graph (its meta.json names the typed format)."""
    meta_path = Path(path) / "meta.json"
    try:
        return json.loads(meta_path.read_text()).get("format") == TYPED_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def write_typed(graph: TypedGraph, folder: str | os.PathLike, overwrite: bool = False) -> Path:
    """Write ``graph`` (validated first) to ``folder``; arrays keep their dtypes.

    ``folder`` must not exist or be empty, unless ``overwrite`` (then it must hold a typed graph and nothing
    else, which is replaced; a graph memory-mapped from ``folder`` itself may be written back over it). Every
    refusal comes before anything is written."""
    target = Path(folder)
    graph.validate()
    check_typed_target(target, overwrite)
    _check_names(graph, target)
    return write_folder(target, lambda partial: _write_arrays(graph, partial))


def _check_names(graph: TypedGraph, target: Path) -> None:
    """The folders named after vertex types and relations (``nodes/<type>``, ``relations/<src>___<name>___<dst>``)
    fit the file system's limit on a name, which counts bytes: refused before anything is written."""
    ancestor = next(p for p in [target.absolute(), *target.absolute().parents] if p.exists())
    limit = name_max(ancestor)
    for key in [node_array(t, "features") for t in graph.num_nodes] + [relation_array(r, "indptr")
                                                                       for r in graph.relations]:
        name = key.split("/")[1]
        if name_bytes(name) > limit:
            raise OutputError(f"{target}: the folder {shown(name)} of {key.split('/')[0]} would be "
                              f"{name_bytes(name)} bytes long in UTF-8, and names on this file system take at most "
                              f"{limit} bytes. Give the vertex types and relations shorter names.")


def check_typed_target(target: Path, overwrite: bool) -> None:
    """``write_typed`` may write ``target``: a new or empty folder, or with ``overwrite`` a typed graph
    holding nothing else (checked before anything is read, by ``neutronorch convert``, and again here)."""
    check_dataset_folder(target, overwrite, "typed", is_typed_dir(target), _OWN_ENTRIES)


def _write_arrays(graph: TypedGraph, folder: Path) -> None:
    node_types = []
    for node_type, count in graph.num_nodes.items():
        entry = {"name": node_type, "count": int(count), "feature_dim": graph.feature_dim(node_type)}
        features = graph.features.get(node_type)
        if features is not None:
            entry["feature_dtype"] = features.dtype.name
            _save(folder, node_array(node_type, "features"), features)
        node_types.append(entry)
    labels = graph.labels
    _save(folder, node_array(graph.target, "labels"), labels.astype(np.int8 if labels.ndim == 2 else np.int64,
                                                                     copy=False))
    for split in SPLITS:
        _save(folder, node_array(graph.target, split), np.asarray(getattr(graph, split), dtype=np.int64))
    relations = []
    for key, relation in graph.relations.items():
        entry = {"src": key[0], "name": key[1], "dst": key[2], "num_edges": relation.num_edges,
                 "edge_feature_dim": relation.edge_feature_dim}
        _save(folder, relation_array(key, "indptr"), relation.indptr.astype(np.int64, copy=False))
        _save(folder, relation_array(key, "indices"), relation.indices)
        if relation.edge_features is not None:
            entry["edge_feature_dtype"] = relation.edge_features.dtype.name
            _save(folder, relation_array(key, "edge_features"), relation.edge_features)
        relations.append(entry)
    meta = {"format": TYPED_FORMAT, "format_version": FORMAT_VERSION, "name": graph.name,
            "node_types": node_types, "relations": relations, "target": graph.target,
            "num_classes": int(graph.num_classes), "notes": list(graph.notes)}
    if graph.metric:
        meta["metric"] = graph.metric
    (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")  # last: the folder is complete


def _save(folder: Path, key: str, array: np.ndarray) -> None:
    path = folder / f"{key}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_array(path, array)


@reads_files
def read_typed(folder: str | os.PathLike, mmap: bool = True, validate: bool = True) -> TypedGraph:
    """Open a typed graph written by ``write_typed``; arrays are memory-mapped unless ``mmap`` is False."""
    directory = Path(folder)
    meta_path = directory / "meta.json"
    meta = read_meta(meta_path, META_KEYS, OPTIONAL_KEYS, ("num_classes",), "write_typed")
    _check_meta(meta, meta_path)
    _check_unlisted(directory, meta)
    files: dict[str, str] = {}

    def open_array(key: str, dtype_name: str | None = None) -> np.ndarray:
        path = directory / f"{key}.npy"
        files[key] = str(path)
        return as_stored(open_npy(path, "an array meta.json lists", "The folder is damaged: write it again with "
                                  "write_typed.", mmap), dtype_name, path)

    num_nodes = {entry["name"]: entry["count"] for entry in meta["node_types"]}
    features = {entry["name"]: open_array(node_array(entry["name"], "features"), entry.get("feature_dtype"))
                for entry in meta["node_types"] if entry["feature_dim"]}
    relations: dict[RelationType, Relation] = {}
    for entry in meta["relations"]:
        key = (entry["src"], entry["name"], entry["dst"])
        edge_features = (open_array(relation_array(key, "edge_features"), entry.get("edge_feature_dtype"))
                         if entry["edge_feature_dim"] else None)
        relations[key] = Relation(open_array(relation_array(key, "indptr")),
                                  open_array(relation_array(key, "indices")), edge_features)
    target = meta["target"]
    graph = TypedGraph(name=meta["name"], num_nodes=num_nodes, relations=relations, features=features,
                       target=target, labels=open_array(node_array(target, "labels")),
                       **{split: open_array(node_array(target, split)) for split in SPLITS},
                       num_classes=meta["num_classes"], notes=list(meta.get("notes", [])), metric=meta.get("metric"))
    _check_against_meta(graph, meta, files)
    if validate:
        graph.validate(str(directory), files)
    return graph


def _check_meta(meta: dict, meta_path: Path) -> None:
    """meta.json's values have the types and structure ``read_typed`` relies on."""
    if meta["format"] != TYPED_FORMAT:
        raise DataError(f"{meta_path}: format is {meta['format']!r}, not {TYPED_FORMAT!r}; this folder holds no "
                        f"typed graph.")
    check_meta_value(meta["target"], str, "target", meta_path)
    for key, fields in (("node_types", _NODE_FIELDS), ("relations", _RELATION_FIELDS)):
        entries = meta[key]
        if not isinstance(entries, list):
            raise DataError(f"{meta_path}: {key} is {entries!r}, expected a list of objects.")
        for entry in entries:
            optional = {"feature_dtype"} if key == "node_types" else {"edge_feature_dtype"}
            if not isinstance(entry, dict) or set(fields) - set(entry) or set(entry) - set(fields) - optional:
                raise DataError(f"{meta_path}: an entry of {key} is {entry!r}; each takes "
                                f"{', '.join(fields)} (and optionally {', '.join(optional)}).")
            for field, kind in fields.items():
                check_meta_value(entry[field], kind, f"{key} entry {entry.get('name')!r}: {field}", meta_path)
    names = [entry["name"] for entry in meta["node_types"]]
    if len(set(names)) != len(names):
        raise DataError(f"{meta_path}: node_types lists a type more than once ({names}).")
    for entry in meta["relations"]:
        missing = [t for t in (entry["src"], entry["dst"]) if t not in names]
        if missing:
            raise DataError(f"{meta_path}: relation {relation_label((entry['src'], entry['name'], entry['dst']))} "
                            f"names type {missing[0]!r}, which node_types does not list.")
    triples = [(entry["src"], entry["name"], entry["dst"]) for entry in meta["relations"]]
    if len(set(triples)) != len(triples):
        raise DataError(f"{meta_path}: relations lists a relation more than once.")
    if meta["target"] not in names:
        raise DataError(f"{meta_path}: target {meta['target']!r} is not one of node_types ({', '.join(names)}).")


def _check_unlisted(directory: Path, meta: dict) -> None:
    """Every folder and array under ``nodes/`` and ``relations/`` is one meta.json accounts for (hidden
    entries aside): a relation or vertex type left out of meta.json is refused, as the ogbn-mag reader
    refuses a relation folder its list leaves out, never read as if it were not there."""
    types = {entry["name"]: entry for entry in meta["node_types"]}
    keys = {(e["src"], e["name"], e["dst"]): e for e in meta["relations"]}
    expected = {node_array(t, "features") for t, entry in types.items() if entry["feature_dim"]}
    expected |= {node_array(meta["target"], array) for array in ("labels", *SPLITS)}
    for key, entry in keys.items():
        expected |= {relation_array(key, array) for array in ("indptr", "indices")}
        expected |= {relation_array(key, "edge_features")} if entry["edge_feature_dim"] else set()
    folders = {"nodes", "relations"} | {f"nodes/{t}" for t in types} | {f"relations/{'___'.join(k)}" for k in keys}
    for top in ("nodes", "relations"):
        for path in sorted((directory / top).rglob("*")) if (directory / top).is_dir() else []:
            name = path.relative_to(directory).as_posix()
            if any(part.startswith(".") for part in path.relative_to(directory).parts):
                continue
            if path.is_dir() and name not in folders and name.count("/") == 1:
                what = ("a relation folder", "relations (src, name, dst, num_edges, edge_feature_dim)") \
                    if top == "relations" else ("a vertex type folder", "node_types (name, count, feature_dim)")
                raise DataError(f"{path}: {what[0]} that meta.json does not list; list it in meta.json's "
                                f"{what[1]}, or remove the folder.")
            if not path.is_dir() and name.removesuffix(".npy") not in expected:
                raise DataError(f"{path}: an array that meta.json does not account for ({_unlisted_why(name, meta)}); "
                                f"list it in meta.json, or remove the file.")


def _unlisted_why(name: str, meta: dict) -> str:
    """Why meta.json leaves the file ``name`` (under ``nodes/`` or ``relations/``) out."""
    parts = name.removesuffix(".npy").split("/")
    if len(parts) == 3 and parts[0] == "nodes" and parts[2] == "features":
        return f"type {parts[1]}'s feature_dim is 0"
    if len(parts) == 3 and parts[0] == "nodes" and parts[2] in ("labels", *SPLITS):
        return f"labels and splits belong to the target type, {meta['target']}"
    if len(parts) == 3 and parts[0] == "relations" and parts[2] == "edge_features":
        return "the relation's edge_feature_dim is 0"
    return "not an array of the typed layout"


def _check_against_meta(graph: TypedGraph, meta: dict, files: dict[str, str]) -> None:
    """Every array has the shape meta.json gives it: a mismatch means a truncated or foreign file."""
    expected = {}
    for entry in meta["node_types"]:
        if entry["feature_dim"]:
            expected[node_array(entry["name"], "features")] = (entry["count"], entry["feature_dim"])
    for entry in meta["relations"]:
        key = (entry["src"], entry["name"], entry["dst"])
        expected[relation_array(key, "indptr")] = (graph.num_nodes[key[2]] + 1,)
        expected[relation_array(key, "indices")] = (entry["num_edges"],)
        if entry["edge_feature_dim"]:
            expected[relation_array(key, "edge_features")] = (entry["num_edges"], entry["edge_feature_dim"])
    arrays = {node_array(t, "features"): f for t, f in graph.features.items()}
    for key, relation in graph.relations.items():
        arrays.update({relation_array(key, "indptr"): relation.indptr, relation_array(key, "indices"): relation.indices,
                       relation_array(key, "edge_features"): relation.edge_features})
    for key, shape in expected.items():
        if tuple(arrays[key].shape) != shape:
            raise DataError(f"{files[key]}: holds shape {tuple(arrays[key].shape)}, but meta.json says {shape}. "
                            f"The file is truncated or from another graph; write the graph again.")
