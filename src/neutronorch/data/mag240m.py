"""OGB-LSC's MAG240M as a typed graph, from the folder the ``ogb`` package leaves (torch only for the two
``.pt`` files); docs/heterogeneous.md ("Reading MAG240M's arrays") gives the layout and refusals. The test
papers' labels are hidden, so the test split is the validation split (a note says so); every array is
memory-mapped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from neutronorch.data.checks import SPLITS
from neutronorch.data.files import open_npy, present, reads_files
from neutronorch.data.ogb_link import load_torch_file
from neutronorch.data.relation import RelationType, node_array
from neutronorch.data.splits import stored_split
from neutronorch.data.typed import TypedGraph
from neutronorch.data.typed_arrays import Progress, check_rows, class_ids, edge_files, read_relations
from neutronorch.errors import DataError

TYPES = ("paper", "author", "institution")
RELATIONS: tuple[RelationType, ...] = (("author", "affiliated_with", "institution"), ("author", "writes", "paper"),
                                       ("paper", "cites", "paper"))
TEST_KEYS = ("test", "test-whole", "test-dev", "test-challenge")


def is_mag240m_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds MAG240M's layout: ``processed/`` with a relation folder named as OGB names them
    (``author___writes___paper`` or ``paper___cites___paper``; loading says which other file is missing)."""
    processed = Path(path) / "processed"
    return any((processed / "___".join(key)).is_dir() for key in RELATIONS[1:])


@reads_files
def load_mag240m(directory: str | os.PathLike, progress: Progress | None = None) -> TypedGraph:
    """The MAG240M graph in ``directory``, validated."""
    directory = Path(directory)
    processed = directory / "processed"
    meta_path, split_path = directory / "meta.pt", directory / "split_dict.pt"
    present(meta_path, "the vertex counts and the class count")
    present(split_path, "the split: train, valid and test paper ids")
    edges = edge_files(processed, RELATIONS, "___")  # what is missing is said before the large files are read
    feature_path, label_path = processed / "paper" / "node_feat.npy", processed / "paper" / "node_label.npy"
    num_nodes, num_classes = _meta(meta_path)
    counted = {t: f"{meta_path} says {num_nodes[t]:,} vertices of type {t}" for t in TYPES}
    files = {node_array("paper", "features"): str(feature_path), node_array("paper", "labels"): str(label_path)}
    features = open_npy(feature_path, "the papers' features, a row per paper")
    check_rows(features, num_nodes["paper"], feature_path, counted["paper"], "features")
    values = open_npy(label_path, "the papers' labels, one per paper")
    labels = class_ids(values, num_nodes["paper"], label_path, counted["paper"], progress)
    train, val, hidden = _split(split_path, num_nodes["paper"])
    files.update({node_array("paper", name): str(split_path) for name in SPLITS})
    relations = read_relations(edges, num_nodes, counted, False, files, progress)
    notes = ["OGB-LSC MAG240M: relations one way as OGB stores them (training adds the reverses); authors and "
             "institutions have no features; node_year not read",
             f"the {hidden:,} test papers' labels are hidden (OGB's leaderboard scores test-dev and test-challenge), "
             f"so the test split is the validation split ({len(val):,} papers), whose accuracy OGB's examples report"]
    return TypedGraph(name="mag240m", num_nodes=num_nodes, relations=relations, features={"paper": features},
                      target="paper", labels=labels, train_idx=train, val_idx=val, test_idx=val.copy(),
                      num_classes=num_classes, notes=notes, metric="accuracy").validate(str(directory), files)


def _meta(path: Path) -> tuple[dict[str, int], int]:
    """``meta.pt``'s counts of the three types, in ``TYPES``' order, and its class count."""
    meta = load_torch_file(path)
    if not isinstance(meta, dict):
        raise DataError(f"{path}: holds a {type(meta).__name__}, where OGB stores a dict of counts (paper, author, "
                        f"institution, num_classes). Fetch the dataset again.")
    counts = {}
    for key in (*TYPES, "num_classes"):
        value = meta.get(key)
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()  # a 0-d tensor or numpy number
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
            raise DataError(f"{path}: {key!r} is {value!r}, expected a count (a whole number >= 0); it holds "
                            f"{sorted(map(str, meta))}. The file is damaged or another dataset's; fetch it again.")
        counts[key] = int(value)
    return {t: counts[t] for t in TYPES}, counts["num_classes"]


def _split(path: Path, papers: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``split_dict.pt``'s train and valid paper ids (sorted), and how many test papers it holds: ``test``,
    else ``test-whole``, else ``test-dev`` and ``test-challenge``."""
    split = load_torch_file(path)
    if not isinstance(split, dict):
        raise DataError(f"{path}: holds a {type(split).__name__}, where OGB stores a dict of paper ids (train, "
                        f"valid, test). Fetch the dataset again.")
    parts = [_ids(split, key, path, papers) for key in ("train", "valid")]
    whole = [key for key in TEST_KEYS[:2] if key in split][:1]  # test, else test-whole: else its two parts
    tests = whole or [key for key in TEST_KEYS[2:] if key in split]
    if not tests:
        raise DataError(f"{path}: lacks the test papers ({', '.join(TEST_KEYS)}); it holds "
                        f"{sorted(map(str, split))}. Fetch the dataset again.")
    hidden = sum(_ids(split, key, path, papers).shape[0] for key in tests)
    return parts[0], parts[1], int(hidden)


def _ids(split: dict, key: str, path: Path, papers: int) -> np.ndarray:
    if key not in split:
        raise DataError(f"{path}: lacks {key!r}; it holds {sorted(map(str, split))}. Fetch the dataset again.")
    return stored_split(split[key], path, f"{key!r}", papers, "The files come from different versions of the "
                      "dataset (meta.pt counts the papers); fetch it again.")
