"""IGBH (the Illinois Graph Benchmark's heterogeneous graphs, tiny to full; full is MLPerf's GNN benchmark) as
a typed graph, every array memory-mapped from those IGB ships; docs/heterogeneous.md ("Reading IGBH's
arrays") gives the layout, split rules and refusals."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from neutronorch.data.files import open_npy, present, reads_files
from neutronorch.data.ogb_link import load_torch_file
from neutronorch.data.relation import RelationType, node_array
from neutronorch.data.splits import stored_split
from neutronorch.data.typed import TypedGraph
from neutronorch.data.typed_arrays import Progress, class_ids, edge_files, is_npy, open_raw, read_relations
from neutronorch.errors import DataError

TYPES = ("paper", "author", "institute", "fos", "journal", "conference")
RELATIONS: tuple[RelationType, ...] = (
    ("paper", "cites", "paper"), ("paper", "written_by", "author"), ("author", "affiliated_to", "institute"),
    ("paper", "topic", "fos"), ("paper", "published", "journal"), ("paper", "venue", "conference"))
EXTRA = RELATIONS[4:]  # only in large and full
LARGE_SIZES = ("large", "full")
LABEL_FILES = {19: "node_label_19.npy", 2983: "node_label_2K.npy"}
WIDTH = 1024  # features per row of the raw (headerless) files
# The loaders' constants: raw files' vertices, and full's labelled papers (the first ones) per label set.
RAW_COUNTS = {"large": {"paper": 100_000_000, "author": 116_959_896},
              "full": {"paper": 269_346_174, "author": 277_220_883}}
FULL_LABELLED = {19: 227_130_858, 2983: 157_675_969}
SPLIT_RULES = ("auto", "mlperf", "random")
TRAIN, VAL = 0.6, 0.2  # IGB's fractions (n_train = int(n * 0.6), n_val = int(n * 0.2))
_SEEDS = ("train_idx.pt", "val_idx.pt")


def processed_folder(path: str | os.PathLike) -> Path:
    """``path/processed`` (``path`` being ``<root>/<size>``), or ``path`` itself when it is the ``processed``
    folder."""
    path = Path(path)
    return path if path.name == "processed" and not (path / "processed").is_dir() else path / "processed"


def is_igbh_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` (``<root>/<size>`` or its ``processed`` folder) holds IGBH's layout: a
    ``paper__written_by__author`` folder beside ``paper__cites__paper`` (IGB's homogeneous graphs have only
    the latter)."""
    processed = processed_folder(path)
    return (processed / "paper__cites__paper").is_dir() and (processed / "paper__written_by__author").is_dir()


@reads_files
def load_igbh(directory: str | os.PathLike, classes: int = 19, split: str = "auto", seed: int = 0,
              progress: Progress | None = None) -> TypedGraph:
    """The IGBH graph in ``directory`` (``<root>/<size>`` or its ``processed`` folder), validated: ``classes``
    19 or 2983, ``split`` one of ``SPLIT_RULES`` (``seed`` draws the random one)."""
    if classes not in LABEL_FILES:
        raise DataError(f"IGBH: classes {classes!r}; IGBH labels papers with 19 or 2983 classes. Give one of those.")
    if split not in SPLIT_RULES:
        raise DataError(f"IGBH: split {split!r}; give one of {', '.join(SPLIT_RULES)}.")
    processed = processed_folder(directory)
    size = processed.resolve().parent.name
    keys = [key for key in RELATIONS if key not in EXTRA or size in LARGE_SIZES
            or (processed / "__".join(key)).is_dir()]
    edges = edge_files(processed, keys, "__")
    types = [t for t in TYPES if any(t in (key[0], key[2]) for key in keys)]
    files: dict[str, str] = {}
    features = {t: _features(processed, t, size, files) for t in types}
    num_nodes = {t: int(rows.shape[0]) for t, rows in features.items()}
    counted = {t: f"{files[node_array(t, 'features')]} has {num_nodes[t]:,} rows: {num_nodes[t]:,} vertices of type {t}"
               for t in types}
    labels_path = processed / "paper" / LABEL_FILES[classes]
    files[node_array("paper", "labels")] = str(labels_path)
    labels = _labels(labels_path, size, num_nodes["paper"], counted["paper"], classes, progress)
    notes = [f"IGBH {size}: relations one way as stored (training adds the reverses); citations as stored (IGB's "
             f"and MLPerf's loaders add self loops, MLPerf's the reverse citations too)",
             f"labels: {labels_path.name} ({classes:,} classes)"]
    if size == "full":
        notes.append(f"full's labelled papers are its first {FULL_LABELLED[classes]:,} (IGB's loader); the rest "
                     f"have no label")
    splits = _split(processed, labels, split, seed, files, notes)
    relations = read_relations(edges, num_nodes, counted, True, files, progress)
    return TypedGraph(name=f"igbh-{size}", num_nodes=num_nodes, relations=relations, features=features,
                      target="paper", labels=labels, **splits, num_classes=classes, notes=notes,
                      metric="accuracy").validate(str(processed), files)


def _features(processed: Path, node_type: str, size: str, files: dict[str, str]) -> np.ndarray:
    path = processed / node_type / "node_feat.npy"
    files[node_array(node_type, "features")] = str(path)
    return _open(path, size, node_type, WIDTH, f"the features of type {node_type}, a row per vertex",
                 f"rows of {WIDTH} float32 values")


def _open(path: Path, size: str, node_type: str, width: int, what: str, unit: str) -> np.ndarray:
    """A ``.npy`` array, or large and full's raw float32 rows of ``width`` (0: single values), holding the
    loaders' count of ``node_type``."""
    if is_npy(present(path, what)):
        return open_npy(path, what)
    array = open_raw(path, np.float32, width, what)
    count = RAW_COUNTS.get(size, {}).get(node_type)
    if count is not None and array.shape[0] != count:
        raise DataError(f"{path}: {array.shape[0]:,} {unit}, but IGBH {size} has {count:,} vertices of type "
                        f"{node_type} (IGB's loader); the file is truncated or from another size. Fetch it again.")
    return array


def _labels(path: Path, size: str, papers: int, counted: str, classes: int, progress: Progress | None) -> np.ndarray:
    other = 19 if classes == 2983 else 2983
    what = f"the papers' {classes}-class labels (for the other label set, {LABEL_FILES[other]}, give classes={other})"
    values = _open(path, size, "paper", 0, what, "float32 labels")
    labels = class_ids(values, papers, path, counted, progress)
    if size == "full":
        labels[FULL_LABELLED[classes]:] = -1
    return labels


def _split(processed: Path, labels: np.ndarray, rule: str, seed: int, files: dict[str, str],
           notes: list[str]) -> dict[str, np.ndarray]:
    """MLPerf's seed files, or IGB's 60/20/20 rule over the labelled papers."""
    seeds = [processed / name for name in _SEEDS]
    if rule == "mlperf" or (rule == "auto" and any(path.is_file() for path in seeds)):
        fix = "Run MLPerf's split_seeds.py to write both, or give split='random' (IGB's rule)."
        train, val = (_seed_file(present(path, "MLPerf's split of the papers", fix), labels) for path in seeds)
        files[node_array("paper", "train_idx")], files[node_array("paper", "val_idx")] = map(str, seeds)
        rest = labels >= 0
        rest[train] = rest[val] = False
        test = np.flatnonzero(rest)
        files[node_array("paper", "test_idx")] = f"{processed} (the labelled papers in neither of {', '.join(_SEEDS)})"
        notes.append(f"split: MLPerf's {' and '.join(_SEEDS)} ({len(train):,}/{len(val):,}); test: the {len(test):,} "
                     f"labelled papers in neither (MLPerf defines no test set)")
        return {"train_idx": train, "val_idx": val, "test_idx": test}
    labelled = np.flatnonzero(labels >= 0)
    order = np.random.default_rng(seed).permutation(labelled)
    n_train, n_val = int(labelled.shape[0] * TRAIN), int(labelled.shape[0] * VAL)
    for name in ("train_idx", "val_idx", "test_idx"):
        files[node_array("paper", name)] = f"{processed} (IGB's random split, seed {seed})"
    notes.append(f"split: IGB's rule, 60%/20%/20% of the {labelled.shape[0]:,} labelled papers in a random order "
                 f"(seed {seed}; IGB's own order is unseeded)")
    return {"train_idx": np.sort(order[:n_train]), "val_idx": np.sort(order[n_train:n_train + n_val]),
            "test_idx": np.sort(order[n_train + n_val:])}


def _seed_file(path: Path, labels: np.ndarray) -> np.ndarray:
    """One of MLPerf's seed files: a 1-D tensor of labelled paper ids, sorted."""
    ids = stored_split(load_torch_file(path), path, "the paper ids", labels.shape[0],
                     "It was made for another size of IGBH, or is damaged; run MLPerf's split_seeds.py for this one.")
    unlabelled = np.flatnonzero(labels[ids] < 0)
    if unlabelled.size:
        raise DataError(f"{path}: holds {unlabelled.size:,} papers without a label (first: "
                        f"{int(ids[unlabelled[0]])}); it was made for the other label set. Load with the classes "
                        f"split_seeds.py was given (--num_classes), or run it again.")
    return ids
