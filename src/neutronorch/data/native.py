"""The native on-disk format: one folder of ``.npy`` arrays plus ``meta.json``, for a homogeneous graph and a
typed one alike (docs/heterogeneous.md, "On disk", gives the typed layout; a homogeneous graph is its
one-type case, ``TypedGraph.of``, stored flat and read by the same reader, ``_as_typed``). Arrays are opened
as memory maps, never loaded whole eagerly; a folder is written whole or not at all, ``meta.json`` last
(``atomic.write_folder``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from neutronorch.atomic import existing_ancestor, reserve, write_folder
from neutronorch.data.checks import METRICS, SPLITS
from neutronorch.data.dtypes import BFLOAT16, bfloat16, is_bfloat16
from neutronorch.data.files import open_npy, read_error, reads_files
from neutronorch.data.graph import ARRAYS, Graph
from neutronorch.data.relation import Relation, RelationType, node_array, relation_array, relation_label
from neutronorch.data.times import check_time_dtype
from neutronorch.data.typed import EDGE, TYPED_FORMAT, VERTEX, TypedGraph
from neutronorch.errors import DataError, OutputError
from neutronorch.limits import name_bytes, name_max, shown

FORMAT_VERSION = 1
META_KEYS = ("name", "num_nodes", "num_edges", "feature_dim", "num_classes", "format_version")
OPTIONAL_KEYS = ("notes", "metric", "feature_dtype", "edge_time_dtype", "node_time_dtype")
TYPED_KEYS = ("format", "format_version", "name", "node_types", "relations", "target", "num_classes")
# The fields of one entry of meta.json's node_types and relations, with their types (int: a count >= 0).
_NODE_FIELDS = {"name": str, "count": int, "feature_dim": int}
_RELATION_FIELDS = {"src": str, "name": str, "dst": str, "num_edges": int, "edge_feature_dim": int}
# Arrays a converted graph keeps beside its own: each vertex's id in its source tables, its classes' names.
KEPT = ("node_ids", "class_names")
# A flat folder's arrays under the keys of the typed layout they stand for.
_FLAT = {node_array(VERTEX, name): name for name in ("features", "labels", *SPLITS)}
_FLAT.update({relation_array(EDGE, name): name for name in ("indptr", "indices")})
_FLAT.update({relation_array(EDGE, "edge_time"): "edge_time", node_array(VERTEX, "time"): "node_time"})
TIMES = ("edge_time", "node_time")  # a flat folder's time arrays (docs/temporal.md), when meta.json names them


def is_native_dir(path: Path) -> bool:
    return path.is_dir() and (path / "meta.json").is_file()


def is_typed_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a typed graph (its meta.json names the typed format)."""
    try:
        return json.loads((Path(path) / "meta.json").read_text()).get("format") == TYPED_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


@reads_files
def load_native(directory: str | os.PathLike, mmap: bool = True, validate: bool = True) -> Graph:
    """Open a homogeneous dataset folder; arrays are memory-mapped unless ``mmap`` is False."""
    directory = Path(directory)
    meta_path = directory / "meta.json"
    graph = _read(directory, _as_typed(read_meta(meta_path)), mmap, {}, flat=True).as_graph()
    if validate:
        files = {name: str(directory / f"{name}.npy") for name in (*ARRAYS, *TIMES)}
        graph.validate(str(directory), {**files, "num_classes": str(meta_path), "metric": str(meta_path)})
    return graph


@reads_files
def read_typed(folder: str | os.PathLike, mmap: bool = True) -> TypedGraph:
    """Open a typed graph written by ``write_typed``; arrays are memory-mapped unless ``mmap`` is False."""
    directory = Path(folder)
    meta_path = directory / "meta.json"
    meta = read_meta(meta_path, TYPED_KEYS, ("notes", "metric"), ("num_classes",), "write_typed")
    _check_meta(meta, meta_path)
    files: dict[str, str] = {}
    graph = _read(directory, meta, mmap, files)
    _check_unlisted(directory, meta, set(files))
    return graph.validate(str(directory), files)


def _as_typed(meta: dict) -> dict:
    """A flat (homogeneous) ``meta.json`` as the typed one of its one type and one relation."""
    node = {"name": VERTEX, "count": meta["num_nodes"], "feature_dim": meta["feature_dim"],
            "time_dtype": meta.get("node_time_dtype")}
    return {**meta, "target": VERTEX, "node_types": [{**node, "feature_dtype": meta.get("feature_dtype")}],
            "relations": [{"src": VERTEX, "name": EDGE[1], "dst": VERTEX, "num_edges": meta["num_edges"],
                           "edge_feature_dim": 0, "edge_time_dtype": meta.get("edge_time_dtype")}]}


def _read(directory: Path, meta: dict, mmap: bool, files: dict[str, str], flat: bool = False) -> TypedGraph:
    """The graph of a checked typed ``meta`` (``flat``: one ``_as_typed`` made, its arrays under flat names),
    each array of the shape meta.json gives it; ``files`` gets the file of each array key."""
    def open_array(key: str, shape: tuple | None = None, dtype_name: str | None = None) -> np.ndarray:
        path = directory / f"{_FLAT[key] if flat else key}.npy"
        files[key] = str(path)
        array = open_npy(path, f"the graph's {_FLAT[key]}" if flat else "an array meta.json lists",
                         "Write the dataset again with `neutronorch convert` (or `generate`)." if flat else
                         "The folder is damaged: write it again with write_typed.", mmap)
        if shape is not None and array.shape != shape:
            raise DataError(f"{path}: holds shape {array.shape}, but meta.json says {shape}. The file is truncated "
                            f"or from another graph; write the graph again.")
        if dtype_name == BFLOAT16 and array.dtype == np.uint16:
            return array.view(bfloat16())
        if dtype_name is not None and array.dtype.name != dtype_name:
            raise DataError(f"{path}: meta.json's feature_dtype is {dtype_name!r}, but the file holds {array.dtype}. "
                            f"Write the dataset again.")
        return array

    num_nodes = {entry["name"]: entry["count"] for entry in meta["node_types"]}
    relations: dict[RelationType, Relation] = {}
    for entry in meta["relations"]:
        key, edges = (entry["src"], entry["name"], entry["dst"]), entry["num_edges"]
        edge_features = (open_array(relation_array(key, "edge_features"), (edges, entry["edge_feature_dim"]),
                                    entry.get("edge_feature_dtype")) if entry["edge_feature_dim"] else None)
        edge_time = (open_array(relation_array(key, "edge_time"), (edges,), entry["edge_time_dtype"])
                     if entry.get("edge_time_dtype") else None)
        relations[key] = Relation(open_array(relation_array(key, "indptr"), (num_nodes[key[2]] + 1,)),
                                  open_array(relation_array(key, "indices"), (edges,)), edge_features, edge_time)
    features = {entry["name"]: open_array(node_array(entry["name"], "features"),
                                          (entry["count"], entry["feature_dim"]), entry.get("feature_dtype"))
                for entry in meta["node_types"] if entry["feature_dim"] or flat}
    node_time = {entry["name"]: open_array(node_array(entry["name"], "time"), (entry["count"],), entry["time_dtype"])
                 for entry in meta["node_types"] if entry.get("time_dtype")}
    target, classes = meta["target"], meta["num_classes"]
    unlabelled = not flat and not classes and not (directory / f"{node_array(target, 'labels')}.npy").exists()
    labels = None if unlabelled else open_array(node_array(target, "labels"))
    if labels is not None and labels.ndim == 1 and classes > max(2, labels.shape[0]):
        # A class per vertex at most: anything beyond is a damaged count, and the model's output layer
        # (num_classes wide) would be allocated from it.
        top = int(np.max(labels)) if labels.size else -1
        raise DataError(f"{directory / 'meta.json'}: num_classes is {classes}, more than the {labels.shape[0]} "
                        f"labels can carry (they use classes 0..{top}). Set it to {max(top + 1, 2)}, or convert "
                        f"the data again.")
    return TypedGraph(name=meta["name"], num_nodes=num_nodes, relations=relations, features=features,
                      target=target, labels=labels, **{split: open_array(node_array(target, split)) for split in SPLITS},
                      num_classes=classes, notes=list(meta.get("notes", [])), metric=meta.get("metric"),
                      node_time=node_time)


def read_meta(meta_path: Path, keys: tuple[str, ...] = META_KEYS, optional: tuple[str, ...] = OPTIONAL_KEYS,
              counts: tuple[str, ...] = META_KEYS[1:], written_by: str = "`neutronorch convert` or `generate`") -> dict:
    """``meta.json`` as a dict holding every one of ``keys``, each once, no key outside ``keys`` and
    ``optional`` (a misspelt optional key would otherwise be ignored); its ``counts`` whole numbers >= 0, its
    name a name, its notes strings, its metric one of ``METRICS`` and its ``format_version`` the one read."""
    if not meta_path.is_file():
        raise DataError(f"{meta_path}: file is missing. Is {meta_path.parent} a dataset written by {written_by}? "
                        f"(A folder being written has none until it is complete.)")

    def unique(pairs):
        names = [k for k, _ in pairs]
        repeated = sorted({k for k in names if names.count(k) > 1})
        if repeated:
            raise DataError(f"{meta_path}: gives {', '.join(repeated)} more than once; JSON keeps only the last, "
                            f"so say each once.")
        return dict(pairs)

    try:
        meta = json.loads(meta_path.read_text(), object_pairs_hook=unique)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{meta_path}: not valid JSON ({exc}). Fix or regenerate the file.") from None
    except OSError as exc:
        raise read_error(meta_path, exc, f"{meta_path}: cannot be read ({exc}).") from None
    if not isinstance(meta, dict):
        raise DataError(f"{meta_path}: expected a JSON object with the keys {list(keys)}.")
    if meta.get("format") == TYPED_FORMAT and "format" not in keys:
        raise DataError(typed_refusal(meta_path.parent))
    missing = [k for k in keys if k not in meta]
    if missing:
        raise DataError(f"{meta_path}: missing keys {missing}. It needs {list(keys)}.")
    unknown = sorted(set(meta) - set(keys) - set(optional))
    if unknown:
        raise DataError(f"{meta_path}: unknown keys {unknown}; it takes {list(keys)} and optionally "
                        f"{list(optional)}. Fix the spelling or remove them.")
    for key in ("name", *counts):
        check_meta_value(meta[key], str if key == "name" else int, key, meta_path)
    notes = meta.get("notes", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise DataError(f"{meta_path}: notes is {notes!r}, expected a list of strings.")
    if meta.get("metric") is not None and meta["metric"] not in METRICS:
        raise DataError(f"{meta_path}: metric is {meta['metric']!r}, which names no metric; use one of "
                        f"{', '.join(METRICS)}, or leave the key out.")
    for key in ("edge_time_dtype", "node_time_dtype"):
        check_time_dtype(meta.get(key), meta_path)
    if meta["format_version"] != FORMAT_VERSION:
        raise DataError(f"{meta_path}: format_version {meta['format_version']!r} is not supported (this "
                        f"neutronorch reads version {FORMAT_VERSION}). Write the dataset again.")
    return meta


def typed_refusal(path) -> str:
    """Why a homogeneous reader refuses the typed graph at ``path``, and what reads it."""
    return (f"{path}: holds a typed graph (several vertex and relation types), which the commands read "
            f"(docs/heterogeneous.md) but not as a homogeneous graph. Read it in Python with "
            f"neutronorch.data.load_typed_dataset.")


def check_meta_value(value, kind: type, what: str, meta_path: Path) -> None:
    """A value of meta.json is a whole number >= 0 (``kind`` int) or a name (str)."""
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise DataError(f"{meta_path}: {what} is {value!r}, expected a whole number >= 0. Fix or regenerate the "
                        f"file.")
    if kind is str and (not isinstance(value, str) or not value):
        raise DataError(f"{meta_path}: {what} is {value!r}, expected a name.")


def save_native(graph: Graph, directory: str | os.PathLike, overwrite: bool = False,
                kept: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``graph`` to ``directory`` (the flat layout); features keep their dtype. ``overwrite``: as
    ``write_typed``'s, for a native dataset. ``kept``: arrays of ``KEPT`` written beside it (a vertex or a
    class a row each; the reader leaves them alone)."""
    target = Path(directory)
    if graph.links is not None:  # it would be written without them, and read back as a graph with no task
        raise DataError(f"{graph.name}: the native format does not store a link split yet; train from the "
                        f"dataset it was read from (an OGB link-prediction folder loads directly).")
    check_dataset_folder(target, overwrite)
    arrays = {_FLAT[key]: array for key, array in _layout(TypedGraph.of(graph))[0].items()}
    arrays.update(kept or {})
    times = {f"{name}_dtype": getattr(graph, name).dtype.name for name in TIMES if getattr(graph, name) is not None}
    meta = {"name": graph.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
            "feature_dim": graph.feature_dim, "num_classes": int(graph.num_classes),
            "format_version": FORMAT_VERSION, "notes": list(graph.notes), **times}
    if graph.metric:
        meta["metric"] = graph.metric
    if is_bfloat16(graph.features):
        meta["feature_dtype"] = BFLOAT16
    return _write(target, arrays, meta)


def write_typed(graph: TypedGraph, folder: str | os.PathLike, overwrite: bool = False,
                kept: dict[str, np.ndarray] | None = None) -> Path:
    """Write ``graph`` (validated first) to ``folder``; arrays keep their dtypes. ``folder`` must not exist or
    be empty, unless ``overwrite`` (then it must hold a typed graph and nothing else, which is replaced; a
    graph memory-mapped from ``folder`` itself may be written back over it). Every refusal comes before
    anything is written. A graph without labels (``labels`` None) is written without ``labels.npy``;
    ``kept`` as ``save_native``'s (a graph of one vertex type's)."""
    target = Path(folder)
    graph.validate()
    check_dataset_folder(target, overwrite, typed=True)
    _check_names(graph, target)
    arrays, node_types, relations = _layout(graph)
    arrays.update(kept or {})
    meta = {"format": TYPED_FORMAT, "format_version": FORMAT_VERSION, "name": graph.name, "node_types": node_types,
            "relations": relations, "target": graph.target,
            "num_classes": 0 if graph.labels is None else int(graph.num_classes),
            "notes": list(graph.notes)}
    if graph.metric:
        meta["metric"] = graph.metric
    return _write(target, arrays, meta)


def _layout(graph: TypedGraph) -> tuple[dict[str, np.ndarray], list[dict], list[dict]]:
    """``graph``'s arrays by path in the folder (less ``.npy``); meta.json's node_types and relations."""
    arrays, node_types, relations = {}, [], []
    for node_type, count in graph.num_nodes.items():
        node_types.append({"name": node_type, "count": int(count), "feature_dim": graph.feature_dim(node_type)})
        if (features := graph.features.get(node_type)) is not None:
            node_types[-1]["feature_dtype"] = features.dtype.name
            arrays[node_array(node_type, "features")] = features
        if (times := graph.node_time.get(node_type)) is not None:
            node_types[-1]["time_dtype"] = times.dtype.name
            arrays[node_array(node_type, "time")] = times
    if graph.labels is not None:
        labels = graph.labels  # stored as int64 class ids, or int8 rows of 0/1/-1 (multi-label)
        arrays[node_array(graph.target, "labels")] = labels.astype(np.int8 if labels.ndim == 2 else np.int64,
                                                                   copy=False)
    for split in SPLITS:
        arrays[node_array(graph.target, split)] = np.asarray(getattr(graph, split), dtype=np.int64)
    for key, relation in graph.relations.items():
        relations.append({"src": key[0], "name": key[1], "dst": key[2], "num_edges": relation.num_edges,
                          "edge_feature_dim": relation.edge_feature_dim})
        arrays[relation_array(key, "indptr")] = relation.indptr.astype(np.int64, copy=False)
        arrays[relation_array(key, "indices")] = relation.indices
        if relation.edge_features is not None:
            relations[-1]["edge_feature_dtype"] = relation.edge_features.dtype.name
            arrays[relation_array(key, "edge_features")] = relation.edge_features
        if relation.edge_time is not None:
            relations[-1]["edge_time_dtype"] = relation.edge_time.dtype.name
            arrays[relation_array(key, "edge_time")] = relation.edge_time
    return arrays, node_types, relations


def _write(target: Path, arrays: dict[str, np.ndarray], meta: dict) -> Path:
    """``arrays`` (by path in the folder, less ``.npy``), then ``meta.json``, written to ``target`` whole."""
    def fill(folder: Path) -> None:
        for key, array in arrays.items():
            (folder / key).parent.mkdir(parents=True, exist_ok=True)
            save_array(folder / f"{key}.npy", array)
        (folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")  # last: the folder is complete

    return write_folder(target, fill)


def save_array(path: Path, arr: np.ndarray) -> None:
    """Write in chunks so a memory-mapped source is never loaded whole; bfloat16 as its uint16 bits."""
    arr = arr.view(np.uint16) if is_bfloat16(arr) else arr
    out = np.lib.format.open_memmap(path, mode="w+", dtype=arr.dtype, shape=arr.shape)
    reserve(path)  # a disk too small is an error here, not a SIGBUS while the map is filled
    step = max(1, (1 << 26) // max(1, int(np.prod(arr.shape[1:], dtype=np.int64)) * arr.itemsize))
    for start in range(0, arr.shape[0], step):
        out[start:start + step] = arr[start:start + step]
    out.flush()


def _check_names(graph: TypedGraph, target: Path) -> None:
    """The folders named after types and relations fit the file system's limit on a name (in bytes)."""
    limit = name_max(existing_ancestor(target.absolute()))
    for key in [node_array(t, "features") for t in graph.num_nodes] + [relation_array(r, "indptr")
                                                                       for r in graph.relations]:
        name = key.split("/")[1]
        if name_bytes(name) > limit:
            raise OutputError(f"{target}: the folder {shown(name)} of {key.split('/')[0]} would be "
                              f"{name_bytes(name)} bytes long in UTF-8, and names on this file system take at most "
                              f"{limit} bytes. Give the vertex types and relations shorter names.")


def check_dataset_folder(target: Path, overwrite: bool, typed: bool = False) -> None:
    """A dataset (``typed``: a typed graph) may be written to ``target``: a new or empty folder, or with
    ``overwrite`` one of that kind holding nothing but its own entries."""
    kind = "typed" if typed else "native"
    own = ({"meta.json", "nodes", "relations", *(f"{name}.npy" for name in KEPT)} if typed else
           {"meta.json", *(f"{name}.npy" for name in (*ARRAYS, *KEPT, *TIMES))})
    if target.exists() and not target.is_dir():
        raise DataError(f"{target}: exists and is a file; the {kind} format is a folder. Choose another path.")
    replace = target.is_dir() and any(target.iterdir())
    if replace and not overwrite:
        raise DataError(f"{target}: exists and is not empty. Choose a new folder, or pass --overwrite to "
                        f"replace the dataset in it.")
    if replace and not (is_typed_dir(target) if typed else is_native_dir(target)):
        raise DataError(f"{target}: holds files but no {kind} dataset (no meta.json of one); refusing to "
                        f"replace it. Choose a new folder.")
    others = sorted(p.name for p in target.iterdir() if p.name not in own) if replace else []
    if others:
        raise DataError(f"{target}: holds {', '.join(others[:5])}{' ...' if len(others) > 5 else ''} besides "
                        f"the dataset; replacing the folder would delete them. Move them out first, or "
                        f"choose a new folder.")


def _check_meta(meta: dict, meta_path: Path) -> None:
    """A typed meta.json's values have the types and structure ``read_typed`` relies on."""
    if meta["format"] != TYPED_FORMAT:
        raise DataError(f"{meta_path}: format is {meta['format']!r}, not {TYPED_FORMAT!r}; this folder holds no "
                        f"typed graph.")
    check_meta_value(meta["target"], str, "target", meta_path)
    for key, fields, optional in (("node_types", _NODE_FIELDS, {"feature_dtype", "time_dtype"}),
                                  ("relations", _RELATION_FIELDS, {"edge_feature_dtype", "edge_time_dtype"})):
        entries = meta[key]
        if not isinstance(entries, list):
            raise DataError(f"{meta_path}: {key} is {entries!r}, expected a list of objects.")
        for entry in entries:
            if not isinstance(entry, dict) or set(fields) - set(entry) or set(entry) - set(fields) - optional:
                raise DataError(f"{meta_path}: an entry of {key} is {entry!r}; each takes "
                                f"{', '.join(fields)} (and optionally {', '.join(optional)}).")
            for field, kind in fields.items():
                check_meta_value(entry[field], kind, f"{key} entry {entry.get('name')!r}: {field}", meta_path)
            check_time_dtype(entry.get("time_dtype", entry.get("edge_time_dtype")), meta_path)
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


def _check_unlisted(directory: Path, meta: dict, expected: set[str]) -> None:
    """Every folder under ``nodes/`` and ``relations/`` is one meta.json lists and every array one of
    ``expected`` (the arrays ``_read`` opened), hidden entries aside, as the ogbn-mag reader refuses a relation
    folder its list leaves out."""
    folders = {"nodes", "relations"} | {f"nodes/{entry['name']}" for entry in meta["node_types"]}
    folders |= {f"relations/{e['src']}___{e['name']}___{e['dst']}" for e in meta["relations"]}
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
