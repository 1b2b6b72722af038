"""The checks of a link split that comes with its graph (an OGB link dataset, a PyG split, a ``Graph`` built
with ``links``): leaks are refused, except in a benchmark's own split, where they are a loud warning;
oddities are kept and warned about (docs/datasets.md, "Stored link splits are checked"); the counts go to
``LinkSplit.issues`` and the notes."""

from __future__ import annotations

import logging

import numpy as np

from neutronorch.data.edge_split import _link_keys, pair_keys
from neutronorch.data.graph import Graph
from neutronorch.data.links import SHARED, LinkSplit, check_link_split, count_positive_negatives, member_mask
from neutronorch.errors import DataError

__all__ = ["check_stored_links", "check_graph_links", "link_graph"]

logger = logging.getLogger("neutronorch")


def check_stored_links(split: LinkSplit, indptr, indices, source: str, graph_name: str = "the graph's edges",
                       benchmark: bool = False) -> list[str]:
    """Count the leaks and oddities of ``split`` (in range already: ``check_link_split``) against the
    message-passing graph (``indptr``, ``indices``, named ``graph_name`` in messages); raise ``DataError`` for
    leaks unless ``benchmark``; warn about the rest. Sets ``split.issues`` (kind -> count, those found) and
    returns the notes to keep with the graph."""
    num_nodes = np.asarray(indptr).shape[0] - 1
    keys = {name: pair_keys(getattr(split, name), num_nodes, split.undirected) for name in ("train", "val", "test")}
    passing = _link_keys(np.asarray(indptr), np.asarray(indices), False)
    issues: dict[str, int] = {}
    examples: dict[str, tuple[int, int]] = {}
    for name in ("val", "test"):  # undirected: a held-out link passes messages if either direction does
        _count(issues, examples, f"{name}_in_message_passing", keys[name], passing, num_nodes, split.undirected)
        _count(issues, examples, f"{name}_in_train", keys[name], np.unique(keys["train"]), num_nodes)
    leaks = dict(issues)
    _count(issues, examples, "val_in_test", keys["val"], np.unique(keys["test"]), num_nodes)
    for name in ("train", "val", "test"):
        pairs = getattr(split, name)
        loops = pairs[0] == pairs[1]
        if loops.any():
            issues[f"{name}_self_loops"] = int(loops.sum())
            examples[f"{name}_self_loops"] = tuple(pairs[:, np.argmax(loops)].tolist())
        ordered = np.sort(keys[name])
        again = ordered[1:][ordered[1:] == ordered[:-1]]
        if again.size:
            issues[f"{name}_repeated"] = int(again.size)
            examples[f"{name}_repeated"] = (int(again[0] % num_nodes), int(again[0] // num_nodes))
    either = " (either direction)" if split.undirected else ""
    if leaks and not benchmark:  # not marked checked: refused again however often it is given
        said = "; ".join(_said(kind, count, examples, split, graph_name, either) for kind, count in leaks.items())
        raise DataError(f"{source}: the link split leaks: {said}. The model would see the links it is scored on; "
                        f"take validation and test links out of the message-passing graph and the training set "
                        f"(both directions when undirected), as split_edges and RandomLinkSplit do.")
    split.issues, split.checked = issues, split.checked_for(indices)
    notes = []
    for kind, count in issues.items():
        text = _said(kind, count, examples, split, graph_name, either)
        leak = kind in leaks
        logger.warning(f"{source}: {text}" + (" (a leak: the benchmark's own split, scored as it is given)" if leak
                                               else " (kept)"))
        notes.append(f"link split check: {text}" + (" (leak, kept: the benchmark's own)" if leak else " (kept)"))
    return notes


def check_graph_links(graph) -> list[str]:
    """``check_stored_links`` of a ``Graph``'s own split against its topology, unless that split was checked
    against it already (by its loader, ``split_edges`` or an earlier call) and has not changed since: a split
    given with the graph, or edited (``dataclasses.replace``), is checked, leaks refused; a timed split's times
    are checked every time. The notes to add."""
    links = graph.links
    if links is not None and links.timed:  # its times, however it was made (a pass over each set)
        check_link_times(links, graph)
    if links is None or links.checked == links.checked_for(graph.indices):
        return []
    check_link_split(links, graph.num_nodes, graph.name)  # shapes, ids in range
    if links.timed:  # held-out links are edges of the topology, sampled only before their times: no leak
        return []
    return check_stored_links(links, graph.indptr, graph.indices, graph.name)


def check_link_times(links: LinkSplit, graph) -> None:
    """A timed split's times: one per link of each set, finite, of the edge times' kind; shared negative pairs
    only where each evaluated set's links share one time (they are scored at it); ``DataError`` else."""
    kind = None if graph.edge_time is None else np.asarray(graph.edge_time).dtype
    for name in ("train", "val", "test"):
        times, count = getattr(links, f"{name}_time"), getattr(links, name).shape[1]
        where = f"{graph.name}: the {name} links' times ({name}_time)"
        if times is None or np.ndim(times) != 1 or len(times) != count:
            raise DataError(f"{where}: expected one per {name} link ({count:,}), got "
                            f"{'none' if times is None else np.shape(times)}; give all three sets their times.")
        times = np.asarray(times)
        if kind is None or times.dtype != kind:
            raise DataError(f"{where}: dtype {times.dtype}, and the graph's edge times are "
                            f"{'missing' if kind is None else kind}; links are sampled against the edge times, so "
                            f"give them in that dtype.")
        if times.dtype.kind == "f" and not np.isfinite(times).all():
            raise DataError(f"{where}: position {int(np.flatnonzero(~np.isfinite(times))[0])} is not finite.")
        if links.negative_kind == SHARED and name != "train" and times.size and times.min() != times.max():
            raise DataError(f"{where}: span {times.min()}..{times.max()}, and the split's negatives are shared "
                            f"pairs (2, K) of no time of their own, scored at their set's time where its links "
                            f"share one (ogbl-collab's years); give per-positive negatives (val_neg and test_neg "
                            f"of shape (P, K)) or none, to have them drawn as of each link's time.")


def link_graph(name: str, indptr, indices, features, split: LinkSplit, notes: list[str], kept: str, source: str,
               files: dict[str, str] | None = None, edge_time=None) -> Graph:
    """The validated link graph (no node task) of a stored ``split``; its notes count the fixed negatives
    that are positives of their own set too, scored as given (``kept`` says as whose evaluator does).
    ``edge_time``: the message edges' times, in ``indices``' order."""
    num_nodes = indptr.shape[0] - 1
    for part in ("val", "test"):
        clashes = count_positive_negatives(split, part, num_nodes)
        if clashes:
            notes.append(f"{clashes:,} of {name}'s {part} negatives are also {part} positives (kept{kept})")
    none = np.empty(0, np.int64)
    return Graph(name, indptr, indices, features, np.full(num_nodes, -1, np.int64), none, none.copy(),
                 none.copy(), 0, notes, links=split, edge_time=edge_time).validate(source, files)


def _count(issues: dict, examples: dict, kind: str, keys: np.ndarray, known: np.ndarray, num_nodes: int,
           either: bool = False) -> None:
    """How many of ``keys`` are in sorted ``known`` (``either``: or their reverses are), under ``kind`` when
    any, with the first of them."""
    found = member_mask(keys, known)
    if either:
        found |= member_mask((keys % num_nodes) * num_nodes + keys // num_nodes, known)
    count = int(found.sum())
    if count:
        first = int(keys[np.argmax(found)])
        issues[kind] = count
        examples[kind] = (first % num_nodes, first // num_nodes)


def _said(kind: str, count: int, examples: dict, split: LinkSplit, graph_name: str, either: str) -> str:
    name, _, what = kind.partition("_")
    total = getattr(split, name).shape[1]
    first = f" (first {examples[kind][0]} -> {examples[kind][1]})" if kind in examples else ""
    text = {"in_message_passing": f"are in {graph_name}{either}",
            "in_train": f"are training positives too{either}", "in_test": f"are test positives too{either}",
            "self_loops": "are self loops", "repeated": "repeat an edge of their own set"}[what]
    return f"{count:,} {name} edges{first} {text} (of {total:,})"

