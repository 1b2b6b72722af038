"""A link-prediction dataset's split in a partition folder (docs/distributed.md, "Partitioned training"): the
training, validation and test positives and any stored evaluation negatives, as whole-graph arrays in the
folder's root (``link_train.npy`` and so on, global ids, memory-mapped by every rank), checksummed in the
manifest as every other file; the manifest's ``links`` holds what the arrays cannot say (directedness, the
negatives' form, the benchmark's metric) and the input rows' statistics a link model starts from
(``links.row_statistics`` of the whole graph's features, which no rank holds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from neutronorch.data.edge_split import parse_link_split, split_edges
from neutronorch.data.files import open_npy
from neutronorch.data.graph import Graph
from neutronorch.data.link_checks import check_graph_links
from neutronorch.data.links import LinkSplit, check_link_split
from neutronorch.errors import ConfigError, DataError

SETS = ("train", "val", "test", "val_neg", "test_neg")


def link_file(name: str) -> str:
    return f"link_{name}.npy"


def split_for_partition(graph: Graph, split: str | None, seed: int, spec: str) -> Graph:
    """``graph`` with a link split: its own, or its edges split by ``split`` (edges:TRAIN,VAL) as ``train --task
    link --split SPLIT --seed SEED`` splits them (the held-out edges out of the topology); checked, and the
    checks' notes added. ``split`` None: ``graph`` as it is (a node task's, or a link dataset's own split)."""
    if split is not None and graph.links is not None:
        raise ConfigError(f"`split` {split}: {spec} carries its own link split; leave `split` out.")
    if split is not None:
        if not split.strip().lower().startswith("edges:"):
            raise ConfigError(f"`split` {split!r}: a partition takes a link split, edges:TRAIN,VAL (such as "
                              f"edges:0.85,0.05); a node dataset is partitioned with its own split.")
        graph = split_edges(graph, *parse_link_split(split), seed=seed)
    if graph.links is None:
        return graph
    if graph.links.timed or graph.links.ends is not None:
        raise DataError(f"{spec}: a link split by time or of a typed graph; a partition does not carry those yet. "
                        f"Partition a homogeneous graph without times.")
    check_link_split(graph.links, graph.num_nodes, graph.name)
    notes = check_graph_links(graph)
    return dataclasses.replace(graph, notes=[*graph.notes, *notes]) if notes else graph


def link_arrays(links: LinkSplit) -> dict[str, np.ndarray]:
    """The files a partition holds of ``links``, by name: the sets it has, int64."""
    return {link_file(name): np.asarray(getattr(links, name), dtype=np.int64) for name in SETS
            if getattr(links, name) is not None}


def link_manifest(links: LinkSplit, input_norm: float, input_mean: np.ndarray | None) -> dict:
    """The manifest's ``links``: what reading the arrays back into a ``LinkSplit`` needs, and the statistics."""
    return {"sets": [name for name in SETS if getattr(links, name) is not None], "undirected": bool(links.undirected),
            "negatives": links.negative_kind, "metric": links.metric, "direction": links.direction,
            "input_norm": float(input_norm),
            "input_mean": None if input_mean is None else [float(v) for v in np.asarray(input_mean, np.float32)]}


def link_files(manifest: dict) -> list[str]:
    """The link files a manifest lists (none for a node task's partition)."""
    links = manifest.get("links")
    return [link_file(name) for name in links["sets"]] if links else []


def load_links(folder: Path, manifest: dict, again: str) -> LinkSplit | None:
    """The folder's ``LinkSplit`` (its arrays memory-mapped), or None for a node task's partition."""
    entry = manifest.get("links")
    if not entry:
        return None
    arrays = {name: open_npy(folder / link_file(name), "an array of a partition", again) for name in entry["sets"]}
    if any(name not in arrays for name in SETS[:3]):
        raise DataError(f"{folder}: its manifest's links lack a training, validation or test set. {again}")
    return LinkSplit(**arrays, undirected=entry["undirected"], negatives=entry["negatives"], metric=entry["metric"],
                     direction=entry["direction"])


def input_statistics(manifest: dict) -> tuple[float, np.ndarray | None]:
    """The whole graph's input rows' statistics the partition holds (``row_statistics``' result)."""
    entry = manifest["links"]
    mean = entry["input_mean"]
    return entry["input_norm"], None if mean is None else np.asarray(mean, dtype=np.float32)
