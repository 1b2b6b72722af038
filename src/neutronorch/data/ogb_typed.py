"""OGB heterogeneous node-property datasets (ogbn-mag) as typed graphs, from the folder the ``ogb`` package
leaves; docs/heterogeneous.md ("Reading OGB's ogbn-mag layout") gives the layout and refusals. The type with
labels is the target; relations are kept one way, repeated edges too; numbers are parsed by ``ogb.py``'s
readers. OGB's binary form is not read."""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import numpy as np

from neutronorch.data.files import reads_files
from neutronorch.data.ogb import (Progress, _blocks, _count, _present, csv_file, dataset_name, read_labels,
                                  read_pairs, read_rows, split_files, split_folder, split_ids)
from neutronorch.data.relation import Relation, RelationType, node_array, relation_array, relation_label
from neutronorch.data.typed import TypedGraph
from neutronorch.data.typed_arrays import relation_from_edge_index
from neutronorch.errors import DataError

_SMALL = 1 << 20  # bytes a list file (counts, relation names) may hold: more is not one of OGB's
_LINE_BLOCK = 1 << 24


def is_ogb_typed_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds OGB's heterogeneous layout: ``raw/num-node-dict.csv.gz`` or ``raw/relations/``
    (the homogeneous layout has ``raw/edge.csv.gz`` or ``raw/data.npz`` instead)."""
    raw = Path(path) / "raw"
    return raw.is_dir() and ((raw / "relations").is_dir() or any(
        (raw / f"num-node-dict{suffix}").is_file() for suffix in (".csv.gz", ".csv")))


@reads_files
def load_ogb_typed(directory: str | os.PathLike, progress: Progress | None = None) -> TypedGraph:
    """The OGB heterogeneous dataset in ``directory``, validated."""
    directory = Path(directory)
    name = dataset_name(directory)
    raw = directory / "raw"
    counts_path = csv_file(raw, "num-node-dict")
    num_nodes = _node_counts(counts_path)
    keys, target = _relation_types(raw, num_nodes, counts_path), _target(raw, num_nodes)
    split_paths = _split_files(directory, target)  # what is missing is said before the large files are read
    files = {node_array(target, split): str(path) for split, path in split_paths.items()}
    relations = {key: _relation(raw, key, num_nodes, counts_path, files, progress) for key in keys}
    features = _features(raw, num_nodes, counts_path, files, progress)
    labels_path = csv_file(raw / "node-label" / target, "node-label")
    files[node_array(target, "labels")] = str(labels_path)
    labels = read_labels(labels_path, num_nodes[target], f"{counts_path} says {num_nodes[target]:,} vertices of type "
                                                         f"{target}, a label each", progress)
    splits = {split: split_ids(path, num_nodes[target]) for split, path in split_paths.items()}
    num_classes = labels.shape[1] if labels.ndim == 2 else (int(labels.max()) + 1 if labels.size else 0)
    unread = _unread(raw, relations)
    notes = [f"OGB {name}: relations one way as OGB gives them (training adds the reverses)"
             + (f"; not read: {', '.join(unread)}" if unread else "")]
    return TypedGraph(name=name, num_nodes=num_nodes, relations=relations, features=features, target=target,
                      labels=labels, **splits, num_classes=num_classes, notes=notes,
                      metric="accuracy" if labels.ndim == 1 else None).validate(str(directory), files)


def _rows(path: Path) -> list[list[str]]:
    """The comma-separated rows of a small text file, blank lines left out."""
    data = next(_blocks(_present(path), _SMALL + 1), b"")
    if len(data) > _SMALL:
        raise DataError(f"{path}: holds more than {_SMALL} bytes, far more than a list of types or relations; it "
                        f"is not OGB's file. Fetch the dataset again.")
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise DataError(f"{path}: is not text; the file is damaged. Fetch the dataset again.") from None
    return [[cell.strip() for cell in row] for row in csv.reader(io.StringIO("\n".join(lines))) if any(row)]


def _per_type(path: Path, values: str) -> tuple[list[str], list[str]]:
    """A header of vertex types over one row of as many ``values``."""
    rows = _rows(path)
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise DataError(f"{path}: holds {len(rows):,} rows; expected a header of vertex types and one row of as "
                        f"many {values}. The file is damaged; fetch the dataset again.")
    return rows[0], rows[1]


def _node_counts(path: Path) -> dict[str, int]:
    """``num-node-dict``: the type names in its header, in their order, with the counts of its one row."""
    header, values = _per_type(path, "counts (a node-property dataset is one graph)")
    if len(set(header)) != len(header) or not all(header):
        raise DataError(f"{path}: the header {header} names a type twice or leaves one unnamed; the file is "
                        f"damaged. Fetch the dataset again.")
    counts = {}
    for node_type, value in zip(header, values):
        if not value.isdigit():
            raise DataError(f"{path}: the count of type {node_type} is {value!r}, not a whole number >= 0. The "
                            f"file is damaged; fetch the dataset again.")
        counts[node_type] = int(value)
    return counts


def _relation_types(raw: Path, num_nodes: dict[str, int], counts_path: Path) -> list[RelationType]:
    """The relations: ``triplet-type-list``'s when it is there (each with its folder, none left out), else the
    folders under ``raw/relations`` in name order; each joining two known types."""
    folder = raw / "relations"
    if not folder.is_dir():
        raise DataError(f"{folder}: folder is missing; an OGB heterogeneous dataset keeps each relation's edges "
                        f"in raw/relations/<src>___<name>___<dst>/. The dataset is incomplete; fetch it again.")
    found = sorted(p.name for p in folder.iterdir() if p.is_dir())
    listing = csv_file(raw, "triplet-type-list")
    listed = listing.is_file()
    keys = [tuple(row) for row in _rows(listing)] if listed else [tuple(entry.split("___")) for entry in found]
    for key in keys:
        if listed and len(key) != 3:
            raise DataError(f"{listing}: the line {','.join(key)!r} is not one src,name,dst relation; the "
                            f"file is damaged. Fetch the dataset again.")
        if not listed and (len(key) != 3 or not all(key)):
            raise DataError(f"{folder / '___'.join(key)}: a relation folder is named <src>___<name>___<dst>; "
                            f"this name does not split into three. Rename or remove it.")
    extra = sorted(set(found) - {"___".join(key) for key in keys})  # none unless a listing leaves some out
    if extra:
        raise DataError(f"{folder / extra[0]}: a relation folder {listing.name} does not list; the files "
                        f"come from different versions of the dataset. Fetch it again.")
    if not keys:
        raise DataError(f"{folder}: holds no relation folder; the dataset is incomplete. Fetch it again.")
    for key in keys:
        for end, node_type in (("source", key[0]), ("destination", key[2])):
            if node_type not in num_nodes:
                raise DataError(f"{folder / '___'.join(key)}: relation {relation_label(key)} names {end} type "
                                f"{node_type!r}, which {counts_path} does not list (types: "
                                f"{', '.join(num_nodes)}). The files come from different versions of the "
                                f"dataset; fetch it again.")
    return keys


def _relation(raw: Path, key: RelationType, num_nodes: dict[str, int], counts_path: Path, files: dict[str, str],
              progress: Progress | None) -> Relation:
    folder = raw / "relations" / "___".join(key)
    path = csv_file(folder, "edge")
    files[relation_array(key, "indptr")] = files[relation_array(key, "indices")] = str(path)
    count_path = csv_file(folder, "num-edge-list")
    if count_path.is_file():
        num_edges = _count(count_path, "edges")
        expect = f"{count_path} says {num_edges:,} edges"
    else:
        num_edges = _lines(_present(path))
        expect = f"the file has {num_edges:,} lines, one edge each"
    edges = read_pairs(path, num_edges, expect, progress, f" of relation {relation_label(key)}")
    counted = {t: f"{counts_path} says {count:,} vertices of type {t}" for t, count in num_nodes.items()}
    return relation_from_edge_index(edges, key, num_nodes, path, counted, pairs_per_row=True)

def _lines(path: Path) -> int:
    """The lines of a (gzip-compressed) text file that hold something."""
    lines, last = 0, b"\n"
    for block in _blocks(path, _LINE_BLOCK):
        lines += block.count(b"\n")
        last = block[-1:]
    return lines + (last != b"\n")


def _features(raw: Path, num_nodes: dict[str, int], counts_path: Path, files: dict[str, str],
              progress: Progress | None) -> dict[str, np.ndarray]:
    """float32 rows of the types with ``node-feat/<type>/node-feat``."""
    folder = raw / "node-feat"
    features = {}
    for entry in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        node_type = entry.name
        if node_type not in num_nodes:
            raise DataError(f"{entry}: features for type {node_type!r}, which {counts_path} does not list (types: "
                            f"{', '.join(num_nodes)}). The files come from different versions of the dataset; "
                            f"fetch it again.")
        path = csv_file(entry, "node-feat")
        if not path.is_file():
            continue
        count = num_nodes[node_type]
        features[node_type] = read_rows(path, count, np.float32, f"{counts_path} says {count:,} vertices of type "
                                                                 f"{node_type}, a row each", progress)
        files[node_array(node_type, "features")] = str(path)
    return features


def _unread(raw: Path, relations: dict[RelationType, Relation]) -> list[str]:
    """The optional files this reader leaves (``node_year``, ``edge_reltype``), by name, for the note."""
    read = {"node-feat", "edge", "num-edge-list"}
    folders = [p for p in (raw / "node-feat").iterdir() if p.is_dir()] if (raw / "node-feat").is_dir() else []
    folders += [raw / "relations" / "___".join(key) for key in relations]
    return sorted({p.name.split(".")[0] for folder in folders for p in folder.iterdir()
                   if p.is_file() and p.name.split(".")[0] not in read})


def _target(raw: Path, num_nodes: dict[str, int]) -> str:
    """The one type with labels: a ``node-label/<type>/`` folder, or one ``nodetype-has-label`` marks."""
    folder = raw / "node-label"
    labelled = [p.name for p in sorted(folder.iterdir()) if p.is_dir()] if folder.is_dir() else []
    flags = csv_file(raw, "nodetype-has-label")
    if flags.is_file():
        labelled += [t for t, flag in zip(*_per_type(flags, "True/False flags"))
                     if flag.lower() in ("true", "1") and t not in labelled]
    for node_type in labelled:
        if node_type not in num_nodes:
            raise DataError(f"{folder / node_type}: labels for type {node_type!r}, which "
                            f"{csv_file(raw, 'num-node-dict').name} does not list (types: {', '.join(num_nodes)}). "
                            f"The files come from different versions of the dataset; fetch it again.")
        _present(csv_file(folder / node_type, "node-label"))
    if not labelled:
        raise DataError(f"{folder}: no vertex type has labels (raw/node-label/<type>/node-label.csv.gz); this is "
                        f"not a node-property dataset. (OGB's heterogeneous link-prediction datasets, such as "
                        f"ogbl-biokg, are not read.)")
    if len(labelled) > 1:
        raise DataError(f"{folder}: types {', '.join(labelled)} all have labels; neutronorch trains one target "
                        f"type. Remove the others' labels.")
    return labelled[0]


def _split_files(directory: Path, target: str) -> dict[str, Path]:
    """``split/<scheme>/<target>/{train,valid,test}``; a split folder of another type is refused."""
    scheme = split_folder(directory)
    for entry in sorted(p for p in scheme.iterdir() if p.is_dir()):
        if entry.name != target:
            raise DataError(f"{entry}: a split of type {entry.name!r}, which has no labels (the labelled type, "
                            f"the target, is {target}). The files come from different versions of the dataset; "
                            f"fetch it again.")
    return split_files(scheme / target)
