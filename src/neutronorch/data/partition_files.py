"""Reading a partition folder written by ``neutronorch partition`` (``partition.py``; the layout is in
docs/distributed.md, "Partitioned training"). ``load_partition(folder, part)`` opens one part and the two
global arrays, memory-mapped, after checking them against the manifest: every refusal names the file and
the fix. ``partition_summary`` is what ``neutronorch info`` shows of a folder."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from neutronorch.data.checks import SPLITS
from neutronorch.data.dtypes import BFLOAT16, bfloat16
from neutronorch.data.files import open_npy
from neutronorch.data.links import LinkSplit
from neutronorch.data.partition_links import link_files, load_links
from neutronorch.errors import ConfigError, DataError

FORMAT, FORMAT_VERSION = "neutronorch-partition", 1
MANIFEST, PART_META = "partition.json", "part.json"
METHODS = ("metis", "random")
GLOBAL_ARRAYS = ("part_of", "local_index", *SPLITS)
PART_ARRAYS = ("ids", "indptr", "indices", "features", "labels", *SPLITS)
_KEYS = ("format", "format_version", "parts", "method", "seed", "balance", "source", "graph", "edge_cut",
         "global_arrays", "part_arrays", "id", "part_stats", "files")
AGAIN = "Partition the graph again with `neutronorch partition`, or copy the partition folder whole."


def part_folder(part: int) -> str:
    return f"part-{part}"


def is_partition_dir(path) -> bool:
    return Path(path).is_dir() and (Path(path) / MANIFEST).is_file()


def digest(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a chunk at a time."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            sha.update(chunk)
    return sha.hexdigest()


def partition_id(part_of_sha: str, name: str, nodes: int, edges: int) -> str:
    """What names one partition of one graph: its owner array and the graph's name and size."""
    return hashlib.sha256(f"{part_of_sha}:{name}:{nodes}:{edges}".encode()).hexdigest()[:16]


def read_manifest(folder: str | Path) -> dict:
    """``partition.json`` of ``folder``, with the keys and kinds the readers rely on."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        raise DataError(f"{path}: file is missing, so {folder} is no partition folder (`neutronorch partition` "
                        f"writes it last: a folder without it was not finished). {AGAIN}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as JSON ({exc}). {AGAIN}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DataError(f"{path}: not a manifest of `neutronorch partition` (its format is not {FORMAT!r}). {AGAIN}")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise DataError(f"{path}: format_version {manifest.get('format_version')!r}; this neutronorch reads "
                        f"version {FORMAT_VERSION}. {AGAIN}")
    missing = [key for key in _KEYS if key not in manifest]
    if missing:
        raise DataError(f"{path}: lacks {', '.join(missing)}. {AGAIN}")
    parts, stats = manifest["parts"], manifest["part_stats"]
    listed = len(stats) if isinstance(stats, list) else stats
    if not isinstance(parts, int) or parts < 1 or listed != parts:
        raise DataError(f"{path}: parts is {parts!r}, but part_stats lists {listed!r} parts. {AGAIN}")
    return manifest


def check_world(manifest: dict, world_size: int, folder) -> None:
    """A run of ``world_size`` ranks takes a partition of as many parts: rank r loads part r."""
    if world_size != manifest["parts"]:
        raise ConfigError(f"{folder}: holds {manifest['parts']} parts, but the run has {world_size} ranks; each rank "
                          f"loads the part of its number. Launch {manifest['parts']} ranks, or partition the graph "
                          f"again with --parts {world_size}.")


def dealing_owners(folder: str | Path, world_size: int, num_nodes: int) -> np.ndarray:
    """The owner of every vertex in the partition folder ``folder``, by which a full-copy run of ``world_size``
    ranks on a graph of ``num_nodes`` vertices deals its seeds (``deal_by``), its checksum checked."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    check_world(manifest, world_size, folder)
    if manifest["graph"]["num_nodes"] != num_nodes:
        raise ConfigError(f"{folder}: is a partition of {manifest['graph']['name']} ({manifest['graph']['num_nodes']:,} "
                          f"vertices), but the run's graph has {num_nodes:,}. Give the folder `neutronorch partition` "
                          f"made of this graph.")
    state = file_states(folder, manifest, ["part_of.npy"])["part_of.npy"]
    if state != "ok":
        raise DataError(f"{folder / 'part_of.npy'}: {state}. {AGAIN}")
    return open_npy(folder / "part_of.npy", "an array of a partition", AGAIN)


def file_states(folder: str | Path, manifest: dict, names=None) -> dict[str, str]:
    """Each file the manifest lists (or ``names`` of them): ok, missing, size differs, or checksum differs."""
    states = {}
    for name in names if names is not None else manifest["files"]:
        entry, path = manifest["files"].get(name), Path(folder) / name
        if entry is None:
            states[name] = "not in the manifest"
        elif not path.is_file():
            states[name] = "missing"
        elif path.stat().st_size != entry["bytes"]:
            states[name] = f"size differs ({path.stat().st_size} bytes, the manifest says {entry['bytes']})"
        else:
            states[name] = "ok" if digest(path) == entry["sha256"] else "checksum differs"
    return states


def check_part_meta(folder: Path, manifest: dict, part: int) -> None:
    """``part-K/part.json`` belongs to this manifest's partition and names part K."""
    path = folder / part_folder(part) / PART_META
    if not path.is_file():
        raise DataError(f"{path}: file is missing; the part folder is incomplete or missing. {AGAIN}")
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: cannot be read as JSON ({exc}). {AGAIN}") from None
    meta = meta if isinstance(meta, dict) else {}
    if meta.get("id") != manifest["id"]:
        raise DataError(f"{path}: belongs to another partition (id {meta.get('id')!r}, the manifest's is "
                        f"{manifest['id']!r}): the part folder and {MANIFEST} come from different runs of "
                        f"`neutronorch partition` (another graph, method or part count). {AGAIN}")
    if meta.get("part") != part or meta.get("parts") != manifest["parts"]:
        raise DataError(f"{path}: says part {meta.get('part')!r} of {meta.get('parts')!r}, but sits in "
                        f"{part_folder(part)} of a {manifest['parts']}-part partition. {AGAIN}")


@dataclass
class Partition:
    """One part of a partitioned graph: its owned vertices (``ids``, ascending global ids; local index i is
    ``ids[i]``), their in-edges as a CSC over the local rows whose ``indices`` are global ids, and their
    features, labels and split ids (global ids of owned vertices, in the source split's order); plus the
    global ``part_of`` (owner of every vertex), ``local_index`` (its index in its owner) and ``global_splits``
    (the whole graph's split, in its order), and a link dataset's ``links``."""

    part: int
    parts: int
    manifest: dict
    ids: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    splits: dict[str, np.ndarray]
    part_of: np.ndarray
    local_index: np.ndarray
    global_splits: dict[str, np.ndarray]
    links: LinkSplit | None = None  # a link-prediction dataset's split, whole (``partition_links.py``)

    @property
    def num_nodes(self) -> int:
        """The vertices of the whole graph."""
        return int(self.part_of.shape[0])

    def owner(self, ids: np.ndarray) -> np.ndarray:
        return np.asarray(self.part_of[np.asarray(ids)])

    def local(self, ids: np.ndarray) -> np.ndarray:
        """The local index of each of ``ids``, which this part must own."""
        ids = np.asarray(ids)
        if (self.part_of[ids] != self.part).any():
            raise DataError(f"part {self.part}: asked for the local index of vertices another part owns.")
        return np.asarray(self.local_index[ids], dtype=np.int64)


def load_partition(folder: str | Path, part: int, world_size: int | None = None, verify: bool = True) -> Partition:
    """Part ``part`` of the partition folder ``folder``, memory-mapped. ``world_size``: the ranks of the run
    that reads it (their count must be the parts'). ``verify``: the checksums of the files opened are checked
    (reading them once); the files' presence, sizes, shapes and the part's membership always are."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    parts, graph = manifest["parts"], manifest["graph"]
    if world_size is not None:
        check_world(manifest, world_size, folder)
    if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < parts:
        raise ConfigError(f"{folder}: part {part!r} is out of range; the folder holds parts 0 to {parts - 1}.")
    check_part_meta(folder, manifest, part)
    names = [f"{a}.npy" for a in GLOBAL_ARRAYS] + [f"{part_folder(part)}/{a}.npy" for a in PART_ARRAYS]
    names += link_files(manifest)
    if verify:
        bad = {name: state for name, state in file_states(folder, manifest, names).items() if state != "ok"}
        if bad:
            raise DataError(f"{folder}: " + "; ".join(f"{name}: {state}" for name, state in bad.items())
                            + f". The folder is damaged or mixed with another partition's files. {AGAIN}")
    stats, n = manifest["part_stats"][part], graph["num_nodes"]

    def array(name: str, shape: tuple | None = None) -> np.ndarray:
        path = folder / name
        opened = open_npy(path, "an array of a partition", AGAIN)
        if shape is not None and opened.shape != shape:
            raise DataError(f"{path}: holds shape {opened.shape}, but {MANIFEST} says {shape}. {AGAIN}")
        return opened

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
    state (every file read once)."""
    manifest = read_manifest(folder)
    stats, parts = manifest["part_stats"], manifest["parts"]

    def balance(key: str) -> float:
        values = [entry[key] for entry in stats]
        mean = sum(values) / parts
        return round(max(values) / mean, 4) if mean else 1.0

    states = file_states(folder, manifest)
    for part in range(parts):
        try:
            check_part_meta(Path(folder), manifest, part)
        except DataError as exc:
            states[f"{part_folder(part)}/{PART_META}"] = str(exc).split(": ", 1)[1].split(". ")[0]
    bad = {name: state for name, state in states.items() if state != "ok"}
    graph = manifest["graph"]
    return {"partition": str(folder), "graph": graph["name"], "nodes": graph["num_nodes"], "edges": graph["num_edges"],
            "parts": parts, "method": manifest["method"], "seed": manifest["seed"], "balanced_on": manifest["balance"],
            "source": manifest["source"],
            "per_part": [{key: entry[key] for key in ("nodes", "edges", "train", "val", "test", "train_links",
                                                      "cut_edges") if key in entry} for entry in stats],
            **({"links": {key: manifest["links"][key] for key in ("sets", "undirected", "negatives", "metric")}}
               if manifest.get("links") else {}),
            "balance_max_over_mean": {"nodes": balance("nodes"), "edges": balance("edges"), "train": balance("train")},
            "edge_cut": manifest["edge_cut"],
            "checksums": {"files": len(states), "state": "ok" if not bad else f"{len(bad)} of {len(states)} bad",
                          **({"bad": bad} if bad else {})}}
