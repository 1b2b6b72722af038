"""A typed graph's link split in its partition folder (docs/distributed.md, "Typed graphs on parts"): the split
of one relation (``link_task.split_typed_relation``) in its end types' stacked ids (``LinkEnds``), written at
the folder's root as a homogeneous folder's is (``partition_links.py``: ``link_train.npy`` and so on, every rank
memory-mapping them whole); the manifest's ``links`` adds the relation and its reverse, and each featured
type's input-row statistics (``links.row_statistics`` of the whole graph's rows of the type, which no rank
holds) that a typed link model starts from. Imports no torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from neutronorch.data.links import LinkEnds, LinkSplit, row_statistics
from neutronorch.data.partition_links import link_manifest, load_links
from neutronorch.data.partition_meta import AGAIN
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError


def relation_name(relation) -> str:
    return "/".join(relation)


def typed_link_manifest(graph: TypedGraph) -> dict:
    """The manifest's ``links`` of ``graph``'s split (``graph.links``, with its ``ends``): ``link_manifest``'s
    entries, the relation and its reverse, and per featured type its rows' statistics (norm, mean row)."""
    links = graph.links
    statistics = {t: row_statistics(rows) for t, rows in graph.features.items()}
    entry = link_manifest(links, 1.0, None)
    entry.update(relation=list(links.ends.relation), reverse=list(links.ends.reverse),
                 input_norm={t: float(norm) for t, (norm, _) in statistics.items()},
                 input_mean={t: None if mean is None else [float(v) for v in np.asarray(mean, np.float32)]
                             for t, (_, mean) in statistics.items()})
    return entry


def link_ends(manifest: dict) -> LinkEnds:
    """The stacked ids the folder's link split holds (``LinkEnds`` of its relation in the whole graph)."""
    entry = manifest["links"]
    return LinkEnds.of(dict(manifest["graph"]["num_nodes"]), tuple(entry["relation"]), tuple(entry["reverse"]))


def load_typed_links(folder: Path, manifest: dict) -> LinkSplit | None:
    """A typed folder's ``LinkSplit`` (memory-mapped, with its ``ends``), or None for a node task's folder."""
    links = load_links(folder, manifest, AGAIN)
    if links is not None:
        links.ends = link_ends(manifest)
    return links


def input_statistics(manifest: dict) -> dict[str, tuple[float, np.ndarray | None]]:
    """Each featured type's input-row statistics the folder holds (``row_statistics``' results, by type)."""
    entry = manifest["links"]
    return {t: (float(norm), None if entry["input_mean"][t] is None else np.asarray(entry["input_mean"][t], np.float32))
            for t, norm in entry["input_norm"].items()}


def check_link_relation(manifest: dict, folder, given: str | None) -> None:
    """``given`` (a run's ``link_relation``: a ``src/name/dst`` triple or a name) must name the relation the
    folder's split is of (None: it is the folder's)."""
    relation = tuple(manifest["links"]["relation"])
    if given is None or given == relation_name(relation) or given == relation[1]:
        return
    raise ConfigError(f"`link_relation` {given}: {folder} holds a link split of {relation_name(relation)}; give "
                      f"that relation (or leave `link_relation` out), or partition the graph with `--link-relation "
                      f"{given}`.")
