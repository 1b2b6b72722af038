"""The Planetoid citation datasets (Cora, CiteSeer, PubMed) from their original ``ind.<name>.*`` files,
assembled as Kipf & Welling's ``load_data`` and PyG's ``Planetoid`` do, with the public split (train: the
first ``len(y)`` vertices, val: the next 500, test: ``test.index``). Features are left raw."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.files import present, reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.sparse_pickle import dense_features, load_pickle
from neutronorch.errors import DataError

# The public split validates on the 500 vertices after the training vertices (Kipf & Welling, PyG).
NUM_VAL = 500


@reads_files
def load_planetoid(directory: str | os.PathLike, name: str | None = None) -> Graph:
    """Load ``directory/ind.<name>.*``; ``name`` is inferred from the ``.graph`` file when None."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: directory is missing. Point to the folder holding the ind.<name>.* files.")
    if name is None:
        name = _infer_name(directory)
    prefix = directory / f"ind.{name}"
    # ind.<name>.x is not read: its rows are the first rows of allx; y is read only for its length.
    y, allx, ally, tx, ty, adjacency = (_read_pickle(Path(f"{prefix}.{part}"))
                                        for part in ("y", "allx", "ally", "tx", "ty", "graph"))
    test_index = _read_test_index(Path(f"{prefix}.test.index"))
    allx, tx = dense_features(allx, f"{prefix}.allx"), dense_features(tx, f"{prefix}.tx")
    ally, ty = dense_features(ally, f"{prefix}.ally"), dense_features(ty, f"{prefix}.ty")
    for part, features, labels in (("all", allx, ally), ("t", tx, ty)):
        if features.shape[0] != labels.shape[0]:
            raise DataError(f"{prefix}.{part}x has {features.shape[0]:,} rows but {prefix}.{part}y has "
                            f"{labels.shape[0]:,}. The files come from different datasets; fetch them again.")
    if allx.shape[1] != tx.shape[1] or ally.shape[1] != ty.shape[1]:
        raise DataError(f"{prefix}.allx/.tx ({allx.shape[1]}/{tx.shape[1]} features) or .ally/.ty "
                        f"({ally.shape[1]}/{ty.shape[1]} classes) disagree in width. Fetch the dataset again.")
    if test_index.shape[0] != tx.shape[0]:
        raise DataError(f"{prefix}.test.index lists {test_index.shape[0]:,} ids but {prefix}.tx has {tx.shape[0]:,} "
                        f"rows. The files come from different datasets; fetch them again.")

    num_train = dense_features(y, f"{prefix}.y").shape[0]
    if int(test_index.min()) < allx.shape[0]:
        raise DataError(f"{prefix}.test.index: test id {int(test_index.min())} falls among the {allx.shape[0]} "
                        f"vertices of allx; test ids must come after them. Fetch the dataset again.")
    # Test vertices follow all others. CiteSeer's test.index skips isolated vertices; like Kipf and PyG,
    # count them as vertices with all-zero features and label rows (their label becomes 0, in no split).
    num_nodes = allx.shape[0] + int(test_index.max()) - int(test_index.min()) + 1
    if num_train + NUM_VAL > allx.shape[0]:
        raise DataError(f"{prefix}.allx: its {allx.shape[0]:,} rows leave no room for the {num_train:,} training "
                        f"and {NUM_VAL} validation vertices of the public split. Fetch the dataset again.")
    features = np.zeros((num_nodes, allx.shape[1]), dtype=np.float32)
    features[:allx.shape[0]] = allx
    features[test_index] = tx
    one_hot = np.zeros((num_nodes, ally.shape[1]), dtype=ally.dtype)
    one_hot[:ally.shape[0]] = ally
    one_hot[test_index] = ty
    _check_one_hot(one_hot, f"{prefix}.ally/.ty")
    labels = one_hot.argmax(axis=1).astype(np.int64)

    src, dst = _adjacency_edges(adjacency, f"{prefix}.graph")
    indptr, indices = edges_to_csc(src, dst, num_nodes, source=f"{prefix}.graph")
    notes = []
    padded = num_nodes - allx.shape[0] - test_index.shape[0]
    if padded:
        notes.append(f"{padded:,} vertices missing from test.index have zero features and no label "
                     f"(stored as class 0); they are in no split")
    return Graph(name=name, indptr=indptr, indices=indices, features=features, labels=labels,
                 train_idx=np.arange(num_train, dtype=np.int64),
                 val_idx=np.arange(num_train, num_train + NUM_VAL, dtype=np.int64),
                 test_idx=np.sort(test_index), num_classes=int(ally.shape[1]),
                 notes=notes).validate(str(directory))


def _check_one_hot(one_hot: np.ndarray, source: str) -> None:
    """Each label row is all zeros (CiteSeer's padded vertices) or a single 1."""
    if not np.isin(one_hot, (0, 1)).all() or (one_hot.sum(axis=1) > 1).any():
        raise DataError(f"{source}: a label row holds other than a single 1 (one class per vertex). Fetch the "
                        f"dataset again.")


def _infer_name(directory: Path) -> str:
    names = sorted(p.name[len("ind."):-len(".graph")] for p in directory.glob("ind.*.graph"))
    if not names:
        raise DataError(f"{directory}: no ind.<name>.graph file. A Planetoid folder holds "
                        f"ind.<name>.{{x,y,allx,ally,tx,ty,graph,test.index}}.")
    if len(names) > 1:
        raise DataError(f"{directory}: holds several Planetoid datasets ({', '.join(names)}); say which one.")
    return names[0]


def _read_pickle(path: Path):
    present(path, "a part of the Planetoid dataset, which needs all of ind.<name>.{x,y,allx,ally,tx,ty,graph,"
            "test.index}", "Fetch the missing file (e.g. from kimiyoung/planetoid).")
    with open(path, "rb") as file:
        return load_pickle(file, str(path))


def _read_test_index(path: Path) -> np.ndarray:
    present(path, "the test vertex ids, one per line", "Fetch it again.")
    try:
        ids = np.array(path.read_bytes().split(), dtype=np.int64)
    except ValueError as exc:
        raise DataError(f"{path}: not a list of integer ids ({exc}). Fetch the file again.") from None
    if ids.size == 0:
        raise DataError(f"{path}: holds no test ids. The file is truncated; fetch it again.")
    if np.unique(ids).size != ids.size:
        raise DataError(f"{path}: lists a test id twice. The file is corrupt; fetch it again.")
    return ids


def _adjacency_edges(adjacency, source: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(adjacency, dict):
        raise DataError(f"{source}: expected a dict of adjacency lists, found {type(adjacency).__name__}. "
                        f"Fetch the file again.")
    lengths = np.fromiter((len(neighbours) for neighbours in adjacency.values()), dtype=np.int64,
                          count=len(adjacency))
    src = np.repeat(np.fromiter(adjacency.keys(), dtype=np.int64, count=len(adjacency)), lengths)
    dst = np.fromiter((v for neighbours in adjacency.values() for v in neighbours), dtype=np.int64,
                      count=int(lengths.sum()))
    return src, dst
