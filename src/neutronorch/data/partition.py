"""Partitioning a homogeneous graph for partitioned training (docs/distributed.md, "Partitioned training"):
every vertex gets one owner part, by METIS (``pymetis``) or at random, and each part is written as a folder
of memory-mappable ``.npy`` arrays: its owned vertices' global ids, their in-edges as a CSC whose rows are
the owned vertices in local order and whose columns are GLOBAL ids, and their features, labels and split ids.
The folder's root holds the owner and the local index of every vertex, a link-prediction dataset's split
(``partition_links.py``) and ``partition.json`` (the manifest, ``partition_files.py`` reads and checks it),
written last: a folder is written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np

from neutronorch.atomic import reserve, write_folder
from neutronorch.data.checks import SPLITS
from neutronorch.data.dtypes import is_bfloat16
from neutronorch.data.graph import Graph
from neutronorch.data.native import save_array
from neutronorch.data.links import row_statistics
from neutronorch.data.partition_links import link_arrays, link_manifest
from neutronorch.data.partition_files import GLOBAL_ARRAYS, PART_ARRAYS
from neutronorch.data.partition_meta import (FORMAT, FORMAT_VERSION, MANIFEST, METHODS, PART_META, digest, part_folder,
                                             partition_id)
from neutronorch.errors import ConfigError, DataError

# What METIS balances, in the order of its constraints (DistDGL balances vertices, training vertices, edges).
BALANCE = ("vertices", "training vertices", "in-edges")
TOLERANCE = 1.05  # the largest part's share of a constraint over the mean that is kept (METIS aims at 1.03)
INSTALL = "pip install 'neutronorch[partition]' (or pip install pymetis)"
Say = Callable[[str], None]
_RANDOM_TAG = 0x70617274  # "part"


def check_request(parts, method: str, seed) -> None:
    """What ``partition`` is asked, checked before any graph is read."""
    if method not in METHODS:
        raise ConfigError(f"`method` {method!r}: not a partitioning method; use one of {', '.join(METHODS)}.")
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ConfigError(f"`parts` {parts!r}: expected a whole number of parts >= 1 (one per rank).")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ConfigError(f"`seed` {seed!r}: expected a whole number from 0 to 2**31-1.")
    if method == "metis":
        metis()


def metis():
    """The ``pymetis`` module, or the error that says how to install it."""
    try:
        import pymetis
    except ImportError:
        raise ConfigError(f"--method metis needs the pymetis package, which is not installed: {INSTALL}. "
                          f"Or partition with --method random.") from None
    return pymetis


def check_graph(graph: Graph, spec: str, parts: int) -> None:
    """A homogeneous graph this module can partition into ``parts``: no times, enough vertices (a link split,
    if any, is ``partition_links.split_for_partition``'s to check; a typed graph is ``partition_typed.py``'s)."""
    if graph.temporal:
        raise DataError(f"{spec}: a graph with edge or vertex times; a partition does not carry times yet, and "
                        f"training on parts without them would sample the future (docs/temporal.md). Partition a "
                        f"graph without times.")
    check_parts(parts, graph.num_nodes, spec)


def check_parts(parts: int, nodes: int, spec: str) -> None:
    if parts > nodes:
        raise ConfigError(f"`parts` {parts}: more parts than {spec}'s {nodes:,} vertices; every part "
                          f"needs a vertex. Ask for at most {nodes:,}.")


def assign(graph: Graph, parts: int, method: str, seed: int, say: Say = lambda line: None
           ) -> tuple[np.ndarray, list[str]]:
    """The owner part of every vertex (int32, one per vertex), and what METIS balanced (``BALANCE`` names; none
    for random parts)."""
    if method == "random":
        return random_parts(graph.num_nodes, parts, seed), []
    return metis_parts(graph, parts, seed, say)


def random_parts(n: int, parts: int, seed: int, *stream: int) -> np.ndarray:
    """Vertices dealt out in a seeded random order: the parts' sizes differ by at most one. The stream is
    this function's own (``seed`` and a tag), not the one a split drawn with the same seed uses; ``stream``
    (whole numbers) tells apart several drawn with one seed (a typed graph's types)."""
    part_of = np.empty(n, dtype=np.int32)
    part_of[np.random.default_rng([seed, _RANDOM_TAG, *stream]).permutation(n)] = np.arange(n, dtype=np.int64) % parts
    return part_of


def metis_parts(graph: Graph, parts: int, seed: int, say: Say = lambda line: None) -> tuple[np.ndarray, list[str]]:
    """METIS k-way on the symmetrised graph (no self loops, each pair once), balancing ``BALANCE``
    (``balanced_metis``); and the names it balanced."""
    pymetis = metis()
    if parts == 1:
        return np.zeros(graph.num_nodes, dtype=np.int32), list(constraints(graph))
    say(f"symmetrising {graph.num_edges:,} edges for METIS")
    xadj, adjncy = symmetrised(graph.indptr, graph.indices, graph.num_nodes, pymetis.zero_copy_dtype())
    every = constraints(graph)
    return balanced_metis(xadj, adjncy, every, {"vertices": every["vertices"]}, parts, seed, say)


def balanced_metis(xadj: np.ndarray, adjncy: np.ndarray, every: dict[str, np.ndarray], alone: dict[str, np.ndarray],
                   parts: int, seed: int, say: Say = lambda line: None) -> tuple[np.ndarray, list[str]]:
    """METIS k-way on the undirected adjacency (``xadj``, ``adjncy``, in ``pymetis.zero_copy_dtype()``),
    balancing every vertex weight of ``every`` (by what it balances, a column a vertex each) as several
    constraints (METIS's ``ncon``); the owner of every vertex and the names it balanced.

    METIS may leave several constraints far off balance without saying so (on a 3M-vertex graph, 4 parts of up
    to 1.32 times the mean). Parts off by more than ``TOLERANCE`` in any constraint of ``every`` are made
    again: k-way on ``alone`` (the vertices, which METIS balances well, and which left the training vertices
    and in-edges within 0.5% there), then by recursive bisection with every constraint, then with ``alone``;
    the first within tolerance is kept, else the most even, with a warning."""
    pymetis = metis()
    n = xadj.shape[0] - 1
    adjacency = pymetis.CSRAdjacency(xadj, adjncy)
    tries = [(every, False), (alone, False), (every, True), (alone, True)]
    tried = []
    for columns, recursive in tries:
        names = list(columns)
        weights = np.stack(list(columns.values()), axis=1).astype(pymetis.zero_copy_dtype())
        options = pymetis.Options()
        options.seed = seed
        say(f"METIS{' (recursive bisection)' if recursive else ''}: {parts} parts of {n:,} vertices and "
            f"{adjncy.shape[0] // 2:,} undirected edges, balancing {', '.join(names)}")
        result = pymetis.part_graph(parts, adjacency, vweights=weights.ravel(), options=options, recursive=recursive)
        part_of = np.asarray(result.vertex_part, dtype=np.int32)
        worst = {name: float(np.bincount(part_of, weights=column, minlength=parts).max() / (column.sum() / parts))
                 for name, column in every.items()}
        if max(worst.values()) <= TOLERANCE:
            return part_of, names
        say("METIS left the parts off balance (largest over mean: "
            + ", ".join(f"{name} {value:.3f}" for name, value in worst.items()) + f"; at most {TOLERANCE} is kept)")
        tried.append((max(worst.values()), part_of, names))
    best, part_of, names = min(tried, key=lambda t: t[0])
    say(f"warning: no METIS run balanced every constraint within {TOLERANCE}; kept the most even, {best:.3f} times "
        f"the mean at most (`neutronorch info` shows each part)")
    return part_of, names


def constraints(graph: Graph) -> dict[str, np.ndarray]:
    """METIS's vertex weights by what they balance (``BALANCE``), less those no vertex weighs. A link task's
    training weight of a vertex is the training positives whose source it is (by which its batches are dealt)."""
    training = np.zeros(graph.num_nodes, dtype=np.int64)
    if graph.links is not None:
        training = np.bincount(np.asarray(graph.links.train[0], dtype=np.int64), minlength=graph.num_nodes)
    else:
        training[np.asarray(graph.train_idx)] = 1
    columns = (np.ones(graph.num_nodes, dtype=np.int64), training, np.diff(np.asarray(graph.indptr)).astype(np.int64))
    return weighing(dict(zip(BALANCE, columns)))


def weighing(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The constraints of ``columns`` some vertex weighs."""
    return {name: column for name, column in columns.items() if column.any()}


def symmetrised(indptr: np.ndarray, indices: np.ndarray, n: int, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """The CSR adjacency of the undirected graph of the CSC (``indptr``, ``indices``): each pair of distinct
    vertices joined by an edge either way once in both directions, self loops dropped."""
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(np.asarray(indptr)))
    return symmetrised_pairs(np.asarray(indices, dtype=np.int64), dst, n, dtype)


def symmetrised_pairs(src: np.ndarray, dst: np.ndarray, n: int, dtype=np.int64) -> tuple[np.ndarray, np.ndarray]:
    """``symmetrised`` of the edges ``src`` -> ``dst`` (int64 ids of ``n`` vertices)."""
    keep = src != dst
    src, dst = src[keep], dst[keep]
    keys = np.concatenate([src * n + dst, dst * n + src])
    del src, dst, keep
    keys.sort()  # in place, then duplicates dropped: np.unique took 20x the sort's time (numpy 2.4)
    if keys.size:
        first = np.empty(keys.shape[0], dtype=bool)
        first[0] = True
        np.not_equal(keys[1:], keys[:-1], out=first[1:])
        keys = keys[first]
    rows = keys // n
    xadj = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=xadj[1:])
    return xadj.astype(dtype), (keys - rows * n).astype(dtype)


def edge_cut(indptr: np.ndarray, indices: np.ndarray, part_of: np.ndarray, parts: int) -> np.ndarray:
    """Per part, its in-edges whose source another part owns (the edge cut, counted at the destination)."""
    degrees = np.diff(np.asarray(indptr))
    dst_part = np.repeat(part_of, degrees)
    cut = part_of[np.asarray(indices)] != dst_part
    return np.bincount(dst_part[cut], minlength=parts)


def write_partition(graph: Graph, assigned: tuple[np.ndarray, list[str]], parts: int, out: str | Path, method: str,
                    seed: int, source: str, say: Say = lambda line: None) -> dict:
    """Write ``graph`` split into ``parts`` by ``assigned`` (``assign``'s owner of every vertex and the
    constraints balanced) to the folder ``out`` (checked by the caller: new or empty); returns the manifest
    written. A part METIS left empty is written empty (``info`` shows it)."""
    part_of, balance = assigned
    n = graph.num_nodes
    counts = np.bincount(part_of, minlength=parts)
    local_index = np.empty(n, dtype=np.int32 if counts.max() < 2**31 else np.int64)
    order = np.argsort(part_of, kind="stable")  # each part's vertices, ascending global ids
    starts = np.concatenate([[0], np.cumsum(counts)])
    for k in range(parts):
        local_index[order[starts[k]:starts[k + 1]]] = np.arange(counts[k], dtype=local_index.dtype)
    indptr, indices = np.asarray(graph.indptr), graph.indices
    degrees = np.diff(indptr)
    dst_part = np.repeat(part_of, degrees)
    say("counting the edge cut")
    cut = edge_cut(indptr, indices, part_of, parts)
    files: dict[str, dict] = {}

    def saved(folder: Path, name: str, array: np.ndarray) -> None:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        save_array(path, array)
        files[name] = {"sha256": digest(path), "bytes": path.stat().st_size}

    stats = []

    def fill(folder: Path) -> None:
        saved(folder, "part_of.npy", part_of)
        saved(folder, "local_index.npy", local_index)
        for split in SPLITS:
            saved(folder, f"{split}.npy", np.asarray(getattr(graph, split), dtype=np.int64))
        for name, array in link_arrays(graph.links).items() if graph.links is not None else ():
            saved(folder, name, array)
        owners = files["part_of.npy"]["sha256"]  # and a link split's training edges: another split, another id
        owners += f":{files['link_train.npy']['sha256']}" if graph.links is not None else ""
        ident = partition_id(owners, graph.name, n, graph.num_edges)
        for k in range(parts):
            say(f"writing part {k} of {parts}: {int(counts[k]):,} vertices")
            ids = order[starts[k]:starts[k + 1]].astype(np.int64)
            sub = part_folder(k)
            saved(folder, f"{sub}/ids.npy", ids)
            own = np.zeros(ids.shape[0] + 1, dtype=np.int64)
            np.cumsum(degrees[ids], out=own[1:])
            saved(folder, f"{sub}/indptr.npy", own)
            saved(folder, f"{sub}/indices.npy", np.asarray(indices)[dst_part == k])
            save_rows(folder / sub / "features.npy", graph.features, ids)
            files[f"{sub}/features.npy"] = {"sha256": digest(folder / sub / "features.npy"),
                                            "bytes": (folder / sub / "features.npy").stat().st_size}
            saved(folder, f"{sub}/labels.npy", np.asarray(graph.labels[ids]))
            entry = {"part": k, "nodes": int(counts[k]), "edges": int(own[-1]), "cut_edges": int(cut[k])}
            for split in SPLITS:
                ids_of = np.asarray(getattr(graph, split), dtype=np.int64)
                mine = ids_of[part_of[ids_of] == k]
                saved(folder, f"{sub}/{split}.npy", mine)
                entry[split.removesuffix("_idx")] = int(mine.shape[0])
            if graph.links is not None:  # the training positives this part's rank trains (by their source)
                entry["train_links"] = int(np.count_nonzero(part_of[np.asarray(graph.links.train[0])] == k))
            stats.append(entry)
            (folder / sub / PART_META).write_text(json.dumps({"id": ident, "part": k, "parts": parts}) + "\n")
        manifest.update(id=ident, part_stats=stats, files=files)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")  # last: the folder is complete

    features = graph.features
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "parts": parts, "method": method, "seed": seed,
                "balance": list(balance) if parts > 1 else [], "source": source,
                "graph": {"name": graph.name, "num_nodes": n, "num_edges": graph.num_edges,
                          "feature_dim": graph.feature_dim,
                          "feature_dtype": "bfloat16" if is_bfloat16(features) else features.dtype.name,
                          "num_classes": int(graph.num_classes), "label_shape": list(graph.labels.shape[1:]),
                          "metric": graph.metric, "notes": list(graph.notes)},
                "edge_cut": {"edges": int(cut.sum()), "fraction": float(cut.sum() / max(graph.num_edges, 1))},
                "global_arrays": list(GLOBAL_ARRAYS), "part_arrays": list(PART_ARRAYS)}
    if graph.links is not None:  # the link split, and what a link model starts from (the whole graph's rows)
        manifest["links"] = link_manifest(graph.links, *row_statistics(features))
    write_folder(Path(out), fill)
    return manifest


def save_rows(path: Path, source: np.ndarray, ids: np.ndarray) -> None:
    """``source[ids]`` written to ``path`` a chunk at a time (a memory-mapped source is never read whole);
    bfloat16 as its uint16 bits, as the native format stores it."""
    rows = source.view(np.uint16) if is_bfloat16(source) else source
    out = np.lib.format.open_memmap(path, mode="w+", dtype=rows.dtype, shape=(ids.shape[0], *rows.shape[1:]))
    reserve(path)
    step = max(1, (1 << 26) // max(1, int(np.prod(rows.shape[1:], dtype=np.int64)) * rows.itemsize))
    for start in range(0, ids.shape[0], step):
        out[start:start + step] = rows[ids[start:start + step]]
    out.flush()
