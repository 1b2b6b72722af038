"""Graph data: ``Graph``, the native format, loaders for common formats and synthetic graphs; and typed graphs
(``TypedGraph``). ``load_dataset(spec)`` turns a user's dataset spec into a validated graph,
``load_typed_dataset(spec)`` a typed one, for the specs ``is_typed_dataset`` accepts."""

from __future__ import annotations

from pathlib import Path

from neutronorch.data.files import reads_files
from neutronorch.data.graph import Graph
from neutronorch.data.interop import (from_dgl, from_dgl_hetero, from_pyg, from_pyg_hetero, to_dgl, to_dgl_hetero,
                                      load_pyg_dataset, to_pyg, to_pyg_hetero)
from neutronorch.data.native import (is_native_dir, is_typed_dir, load_native, read_typed, save_native, typed_refusal,
                                     write_typed)
from neutronorch.data.splits import DEFAULT_SPLIT, make_split
from neutronorch.data.synthetic import SyntheticSpec, generate
from neutronorch.data.synthetic_temporal import synthetic_temporal
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.data.tabular import SNAP_SUFFIXES, load_tables, only_a_table
from neutronorch.data.typed import Relation, TypedGraph
from neutronorch.errors import DataError
from neutronorch.limits import check_seed

__all__ = ["Graph", "load_dataset", "load_native", "save_native", "load_tables", "SyntheticSpec", "generate",
           "make_split", "DEFAULT_SPLIT", "DATASET_SPEC_HELP", "dataset_paths", "from_pyg", "to_pyg", "from_dgl",
           "to_dgl", "TypedGraph", "Relation", "read_typed", "write_typed", "synthetic_typed", "is_typed_dataset",
           "load_typed_dataset", "synthetic_temporal", "to_pyg_hetero", "from_pyg_hetero", "to_dgl_hetero",
           "from_dgl_hetero"]

DATASET_SPEC_HELP = (
    "synthetic[:nodes=N,degree=D,features=F,classes=C,seed=S,...] | a native dataset directory (meta.json"
    " + .npy arrays) | an OGB dataset folder (raw/, split/; ogbn- or ogbl-) | a Planetoid folder "
    "(ind.<name>.*) | a GraphGallery/gnn-benchmark/heterophilous .npz | a SNAP edge list (.txt, .txt.gz, "
    ".edges, .tsv or .tsv.gz; features and labels are then synthetic) | pyg:NAME@ROOT (a PyG dataset "
    "already downloaded under ROOT, e.g. pyg:Cora@~/data) | a typed graph: a typed native folder, OGB's "
    "ogbn-mag folder, an IGBH folder (<root>/<size>) or OGB-LSC's MAG240M folder")


@reads_files
def load_dataset(spec: str, split: str | None = None, seed: int = 0, split_index: int = 0,
                 progress=None, times: bool = False) -> Graph:
    """Open the dataset ``spec`` names (``DATASET_SPEC_HELP``). ``split`` applies to data without a split of
    its own; ``split_index`` picks one of several stored splits (the heterophilous ``.npz`` files hold 10).
    Unlabelled vertices leave the splits. ``progress(file, bytes done, bytes total)`` is called while large
    text files are parsed. ``times``: read the times an OGB folder's layout carries (vertex years: ogbn-arxiv,
    ogbn-papers100M; edge and link years: ogbl-collab; docs/temporal.md), refused for any other source."""
    check_seed(seed)
    if times:
        return _timed(spec, split, progress)
    graph = _load(spec, split, seed, split_index, progress)
    graph.drop_unlabelled_from_splits()
    return graph


def _load(spec: str, split: str | None, seed: int, split_index: int, progress) -> Graph:
    if spec.startswith("graph:"):
        raise DataError(f"{spec}: a graph that was given to train() in memory (its summary and checkpoints "
                        f"record it so); name the files it came from instead. `dataset` takes {DATASET_SPEC_HELP}.")
    if spec.startswith("pyg:"):
        return load_pyg_dataset(spec[len("pyg:"):], split_index)
    if split_index and not spec.lower().endswith(".npz"):
        raise DataError(f"{spec}: carries a single split, so `split_index` {split_index} has nothing to pick; "
                        f"leave it at 0 (only .npz files with stored splits, such as the heterophilous graphs', "
                        f"hold several).")
    if spec == "synthetic" or spec.startswith("synthetic:"):
        return generate(SyntheticSpec.parse(spec), split, seed)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DataError(f"{spec}: no such file or directory. `dataset` takes {DATASET_SPEC_HELP}.")
    if is_typed_dataset(spec):
        raise DataError(typed_refusal(path))
    if is_native_dir(path):
        return _own_split(load_native(path), split)
    if path.is_dir():
        from neutronorch.data.ogb import is_ogb_dir, load_ogb
        from neutronorch.data.ogb_link import is_ogb_link_dir, load_ogb_link
        if is_ogb_link_dir(path):  # before is_ogb_dir, which a link dataset's raw/ satisfies too
            return _own_split(load_ogb_link(path, progress), split)
        if is_ogb_dir(path):
            return _own_split(load_ogb(path, progress), split)
        if any(path.glob("ind.*.graph")):
            from neutronorch.data.planetoid import load_planetoid
            return _own_split(load_planetoid(path), split)
        if (path / "partition.json").is_file():
            raise DataError(f"{path}: a partition folder (`neutronorch partition`), which `partitions` trains, one rank "
                            f"a part (docs/distributed.md, \"Partitioned training\"); `dataset` takes the graph it "
                            f"was made from, or {DATASET_SPEC_HELP}.")
        raise DataError(f"{path}: directory holds neither meta.json (native format), ind.<name>.* files "
                        f"(Planetoid) nor raw/ (an OGB dataset). `dataset` takes {DATASET_SPEC_HELP}.")
    name = path.name.lower()
    if name.endswith(".npz"):
        from neutronorch.data.npz import load_npz
        return load_npz(path, split or DEFAULT_SPLIT, seed, split_index)
    if only_a_table(path):  # before SNAP's suffixes: a .tsv or .txt with a header or names is a table
        raise DataError(f"{path}: a table, not a dataset; make one of your tables with `neutronorch convert "
                        f"{path} OUT_DIR [--features F] [--labels L]` (docs/datasets.md, \"Your own tables\").")
    if name.endswith(SNAP_SUFFIXES):
        from neutronorch.data.snap import load_snap
        return load_snap(path, split or DEFAULT_SPLIT, seed)
    raise DataError(f"{path}: unknown file type. `dataset` takes {DATASET_SPEC_HELP}.")


def _timed(spec: str, split: str | None, progress) -> Graph:
    """``load_dataset(spec, times=True)``: an OGB node dataset with its vertices' years, or a link dataset with
    its edges' and links' years."""
    from neutronorch.data.ogb import is_ogb_dir, load_ogb
    from neutronorch.data.ogb_link import is_ogb_link_dir, load_ogb_link

    path = Path(spec).expanduser()
    if not (path.is_dir() and is_ogb_dir(path)):
        raise DataError(f"{spec}: reading its times was asked for, but it is no OGB folder, the one layout whose "
                        f"times are read on request; a native folder, a converted JODIE file and PyG or DGL graphs "
                        f"keep the times they have (docs/temporal.md).")
    reader = load_ogb_link if is_ogb_link_dir(path) else load_ogb  # a link dataset's raw/ is an OGB folder's too
    graph = _own_split(reader(path, progress, times=True), split)
    graph.drop_unlabelled_from_splits()
    return graph


def is_typed_dataset(spec: str) -> bool:
    """Whether ``spec`` names a typed graph: a folder ``write_typed`` wrote, or OGB's heterogeneous, IGBH's or
    MAG240M's layout."""
    if spec.startswith(("pyg:", "graph:")) or spec == "synthetic" or spec.startswith("synthetic:"):
        return False
    path = Path(spec).expanduser()
    return path.is_dir() and _typed_reader(path) is not None


def _typed_reader(path: Path):
    """The reader (``reader(path, progress=...)``) of the typed dataset layout in folder ``path``, or None."""
    from neutronorch.data.igbh import is_igbh_dir, load_igbh
    from neutronorch.data.mag240m import is_mag240m_dir, load_mag240m
    from neutronorch.data.ogb_typed import is_ogb_typed_dir, load_ogb_typed

    readers = ((is_typed_dir, lambda folder, progress: read_typed(folder)), (is_ogb_typed_dir, load_ogb_typed),
               (is_igbh_dir, load_igbh), (is_mag240m_dir, load_mag240m))
    return next((reader for is_layout, reader in readers if is_layout(path)), None)


@reads_files
def load_typed_dataset(spec: str, split: str | None = None, progress=None) -> TypedGraph:
    """Open the typed graph ``spec`` names (``is_typed_dataset``); each carries its own split, and a ``split``
    given is noted as ignored."""
    path = Path(spec).expanduser()
    reader = _typed_reader(path)
    if reader is None:
        raise DataError(f"{spec}: not a typed graph: neither a folder write_typed wrote (its meta.json says "
                        f"\"neutronorch-typed\"), OGB's heterogeneous layout (raw/num-node-dict.csv.gz, "
                        f"raw/relations/), IGBH's (processed/paper__written_by__author/) nor MAG240M's "
                        f"(processed/author___writes___paper/).")
    return _own_split(reader(path, progress=progress), split)


def dataset_paths(spec: str) -> list[Path]:
    """The files or folders ``load_dataset(spec)`` reads: what no output may overwrite."""
    if spec.startswith("pyg:"):
        return [Path(spec.partition("@")[2] or ".").expanduser()]
    if spec == "synthetic" or spec.startswith(("synthetic:", "graph:")):
        return []
    return [Path(spec).expanduser()]


def _own_split(graph: Graph | TypedGraph, split: str | None) -> Graph | TypedGraph:
    """Data that carries its own split keeps it; a ``split`` given for it is said to be ignored."""
    if split is not None:
        graph.notes.append(f"`split` {split} ignored: {graph.name} carries its own split, which is used")
    return graph
