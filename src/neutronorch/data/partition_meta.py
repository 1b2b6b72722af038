"""The manifest of a partition folder (``partition.json``) and what every reader of one checks: the manifest's
keys, the part count against the run's ranks, each part's ``part.json``, and the files' sizes and checksums
(``partition_files.py`` reads a homogeneous graph's parts, ``partition_typed_files.py`` a typed graph's)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from neutronorch.data.files import open_npy
from neutronorch.errors import ConfigError, DataError

FORMAT, FORMAT_VERSION = "neutronorch-partition", 1
MANIFEST, PART_META = "partition.json", "part.json"
METHODS = ("metis", "random")
_KEYS = ("format", "format_version", "parts", "method", "seed", "balance", "source", "graph", "edge_cut",
         "global_arrays", "part_arrays", "id", "part_stats", "files")
AGAIN = "Partition the graph again with `neutronorch partition`, or copy the partition folder whole."
# The manifest's "kind": a typed graph's folder says "typed"; a homogeneous graph's has none (or "homogeneous").
TYPED, HOMOGENEOUS = "typed", "homogeneous"


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
    if manifest.get("kind", HOMOGENEOUS) not in (TYPED, HOMOGENEOUS):
        raise DataError(f"{path}: kind {manifest['kind']!r}; this neutronorch reads {HOMOGENEOUS!r} and {TYPED!r} "
                        f"partitions. {AGAIN}")
    parts, stats = manifest["parts"], manifest["part_stats"]
    listed = len(stats) if isinstance(stats, list) else stats
    if not isinstance(parts, int) or parts < 1 or listed != parts:
        raise DataError(f"{path}: parts is {parts!r}, but part_stats lists {listed!r} parts. {AGAIN}")
    return manifest


def check_world(manifest: dict, world_size: int, folder) -> None:
    """A run of ``world_size`` ranks takes a partition of as many parts: rank r loads part r."""
    if world_size != manifest["parts"]:
        ranks = f"{world_size} rank{'s' * (world_size != 1)}"
        raise ConfigError(f"{folder}: holds {manifest['parts']} parts, but the run has {ranks}; each rank "
                          f"loads the part of its number. Launch {manifest['parts']} ranks, or partition the graph "
                          f"again with --parts {world_size}.")


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


def is_typed(manifest: dict) -> bool:
    """Whether the manifest is a typed graph's partition's."""
    return manifest.get("kind") == TYPED


def check_kind(manifest: dict, folder, typed: bool) -> None:
    """The folder is a partition of a typed graph where a typed run reads it, of a homogeneous one elsewhere."""
    if is_typed(manifest) != typed:
        held, run = ("a typed", "homogeneous") if is_typed(manifest) else ("a homogeneous", "typed")
        raise ConfigError(f"{folder}: is a partition of {held} graph ({manifest['graph']['name']}), but the run's "
                          f"graph is {run}. Give the folder `neutronorch partition` made of the run's graph.")


def check_files(folder: Path, manifest: dict, names: list[str]) -> None:
    """Every file of ``names`` is as the manifest lists it (its checksum read once), or the error naming them."""
    bad = {name: state for name, state in file_states(folder, manifest, names).items() if state != "ok"}
    if bad:
        raise DataError(f"{folder}: " + "; ".join(f"{name}: {state}" for name, state in bad.items())
                        + f". The folder is damaged or mixed with another partition's files. {AGAIN}")


def part_array(folder: Path, name: str, shape: tuple | None = None) -> np.ndarray:
    """The array ``name`` of a partition folder, memory-mapped, of ``shape`` where given."""
    path = folder / name
    opened = open_npy(path, "an array of a partition", AGAIN)
    if shape is not None and opened.shape != shape:
        raise DataError(f"{path}: holds shape {opened.shape}, but {MANIFEST} says {shape}. {AGAIN}")
    return opened


def check_part(folder: Path, manifest: dict, part: int, world_size: int | None) -> None:
    """What opening part ``part`` checks first: the run's ranks, the part's range and its ``part.json``."""
    if world_size is not None:
        check_world(manifest, world_size, folder)
    parts = manifest["parts"]
    if isinstance(part, bool) or not isinstance(part, int) or not 0 <= part < parts:
        raise ConfigError(f"{folder}: part {part!r} is out of range; the folder holds parts 0 to {parts - 1}.")
    check_part_meta(folder, manifest, part)


def balance(stats: list[dict], key: str, parts: int) -> float:
    """The largest part's ``key`` over the mean (1 where the mean is 0)."""
    values = [entry[key] for entry in stats]
    mean = sum(values) / parts
    return round(max(values) / mean, 4) if mean else 1.0


def checksum_states(folder, manifest: dict) -> dict:
    """``info``'s checksums: every file's state (each read once) and every ``part.json``'s."""
    states = file_states(folder, manifest)
    for part in range(manifest["parts"]):
        try:
            check_part_meta(Path(folder), manifest, part)
        except DataError as exc:
            states[f"{part_folder(part)}/{PART_META}"] = str(exc).split(": ", 1)[1].split(". ")[0]
    bad = {name: state for name, state in states.items() if state != "ok"}
    return {"files": len(states), "state": "ok" if not bad else f"{len(bad)} of {len(states)} bad",
            **({"bad": bad} if bad else {})}
