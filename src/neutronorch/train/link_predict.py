"""Scores of vertex pairs from a trained link checkpoint (``--task link``): exact full-neighbour inference.

The encoder's last layer is computed for the distinct vertices the pairs name only, layer by layer over
their complete neighbourhoods (``layerwise``, as ``predict`` runs it: the intermediate layers in memory or
memory-mapped under ``scratch``), then the head scores the pairs a chunk at a time. The graph is the dataset
as given: every edge of it carries messages (training had taken its validation and test edges out).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.features.store import FeatureStore
from neutronorch.train.checkpoint import Checkpoint
from neutronorch.train.health import output_check
from neutronorch.train.layerwise import LayerProgress, last_layer_rows
from neutronorch.train.predict import (check_prediction_output, checkpoint_for, ids_in_memory, scratch_folder,
                                       write_rows)

__all__ = ["PAIR_FORMS", "read_pairs", "score_pairs"]

# What ``pairs`` may be: a file, or the pairs themselves.
Pairs = Union[str, os.PathLike, np.ndarray, torch.Tensor, Sequence]
PAIR_FORMS = ("a .npy file of a (P, 2) or (2, P) integer array, or a text file of 'u v' or 'u,v' lines "
              "(# starts a comment)")
_SHOWN = 5  # out-of-range ids an error lists


def read_pairs(pairs: Pairs, num_nodes: int | None = None) -> np.ndarray:
    """The pairs as a (2, P) int64 array (row 0 the first vertex of each pair, row 1 the second), in their
    order. ``pairs``: a (P, 2) or (2, P) integer array, tensor or list (a 2 x 2 one is read as two (u, v)
    rows), a ``.npy`` file of either, or a text file of ``u v`` or ``u,v`` lines (blank lines and ``#``
    comments skipped). With ``num_nodes``, every id must be in 0..num_nodes-1. Anything else is a
    ``ConfigError`` saying what is wrong."""
    if isinstance(pairs, (str, os.PathLike)):
        array, what = _read_file(Path(pairs)), f"`pairs` {pairs}"
    else:
        array, what = ids_in_memory(pairs, "`pairs` (given in memory)"), "`pairs` (given in memory)"
    if array.size == 0:
        raise ConfigError(f"{what}: holds no pairs; give at least one (u, v) pair to score.")
    if array.dtype.kind not in "iu":
        raise ConfigError(f"{what}: expected integer vertex ids, got {array.dtype}; give the ids as integers "
                          f"(an int32 or int64 array).")
    if array.ndim != 2 or 2 not in array.shape:
        raise ConfigError(f"{what}: expected a (P, 2) or (2, P) array of vertex pairs, got shape "
                          f"{tuple(array.shape)}.")
    array = array.T if array.shape[1] == 2 else array  # (P, 2) rows, the 2 x 2 case included, to (2, P)
    if num_nodes is not None:
        _check_range(array, num_nodes, what)
    return np.ascontiguousarray(array, dtype=np.int64)


def _read_file(path: Path) -> np.ndarray:
    if not path.is_file():
        raise ConfigError(f"`pairs` {path}: no such file; give {PAIR_FORMS}.")
    try:
        if path.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        return _read_text(path)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - unreadable, damaged or malformed files are the same user error
        reason = str(exc).split("; use `usecols`")[0]  # numpy's advice is about its own arguments
        kind = "a .npy array" if path.suffix == ".npy" else "'u v' or 'u,v' lines"
        raise ConfigError(f"`pairs` {path}: cannot be read as {kind} ({type(exc).__name__}: {reason}); "
                          f"give {PAIR_FORMS}.") from None


def _read_text(path: Path) -> np.ndarray:
    """A text file's pairs as a (P, 2) array: whitespace or commas between the two ids of a line, as its
    first line with ids shows."""
    with open(path, encoding="utf-8") as f:
        first = next((line for line in f if line.strip() and not line.lstrip().startswith("#")), "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # an empty file: said below, as for any empty input
        array = np.loadtxt(path, dtype=np.int64, delimiter="," if "," in first else None, comments="#",
                           ndmin=2, encoding="utf-8")
    if array.size and array.shape[1] != 2:
        raise ConfigError(f"`pairs` {path}: its lines hold {array.shape[1]} ids each; give two per line, "
                          f"'u v' or 'u,v'.")
    return array


def _check_range(pairs: np.ndarray, num_nodes: int, what: str) -> None:
    """Every id in 0..num_nodes-1, else an error counting the ids out of range and showing the first few
    with the positions of their pairs (compared in the ids' own type, so no huge unsigned id wraps)."""
    bad = (pairs < 0) | (pairs >= num_nodes)
    count = int(bad.sum())
    if count:
        where = np.flatnonzero(bad.any(axis=0))[:_SHOWN]
        shown = ", ".join(f"pair {i} ({pairs[0, i]}, {pairs[1, i]})" for i in where)
        raise ConfigError(f"{what}: {count:,} vertex id{'s' if count > 1 else ''} out of range 0..{num_nodes - 1} "
                          f"(the dataset has {num_nodes:,} vertices), in {shown}"
                          f"{', ...' if bad.any(axis=0).sum() > _SHOWN else ''} (pairs counted from 0). Give "
                          f"ids of this dataset's vertices.")


@torch.no_grad()
def score_pairs(checkpoint: Checkpoint | str | os.PathLike, graph: Graph, pairs: Pairs, device: str = "cpu",
                chunk_size: int = 4096, *, probabilities: bool = False, out: str | os.PathLike | None = None,
                scratch: str | None = "auto", progress: LayerProgress | None = None,
                overwrite: bool = False) -> np.ndarray:
    """One float32 score per pair, in the pairs' order: the link checkpoint's head applied to the encoder's
    embeddings of the pair's two vertices (its logit), or with ``probabilities`` its sigmoid. ``pairs`` as
    ``read_pairs`` takes them: a (P, 2) or (2, P) integer array, tensor or list, a ``.npy`` file of either,
    or a text file of ``u v`` or ``u,v`` lines.

    Memory: the last layer's rows of the distinct vertices the pairs name (in memory, or memory-mapped
    where ``scratch`` puts the intermediate layers), and the pairs. ``device``, ``chunk_size`` (vertices
    per layer-wise chunk, pairs per head chunk), ``out``, ``scratch``, ``progress`` and ``overwrite`` as for
    ``predict``; ``out`` must not be the checkpoint, a file of the graph or the ``pairs`` file. A
    node-classification checkpoint is refused (use ``predict``)."""
    check_prediction_output(out, scratch, checkpoint, graph, overwrite,
                            {"pairs": [pairs] if isinstance(pairs, (str, os.PathLike)) else []})
    checkpoint = checkpoint_for(checkpoint, graph, pairs=True)
    pairs = torch.from_numpy(read_pairs(pairs, graph.num_nodes))
    target = torch.device(device)
    model = checkpoint.model.to(target).eval()
    encoder = model.encoder
    folder = scratch_folder(encoder, graph, encoder.num_layers, scratch, out)
    check = output_check("scores", "pairs")

    def fill(scores: np.ndarray) -> None:
        nodes = torch.unique(pairs.reshape(-1))  # sorted: a pair's rows are found by binary search
        # The distinct vertices' embeddings: memory-mapped where the intermediate layers are.
        with last_layer_rows(encoder, graph, FeatureStore(graph.features, graph.labels), nodes, target, chunk_size,
                             scratch=folder, progress=progress) as rows:
            row = lambda ids: rows[torch.searchsorted(nodes, ids)].to(target)  # noqa: E731
            for start in range(0, pairs.shape[1], chunk_size):
                chunk = pairs[:, start:start + chunk_size]
                logits = model.score(row(chunk[0]), row(chunk[1])).float().cpu()
                check(logits)
                scores[start:start + chunk.shape[1]] = (torch.sigmoid(logits) if probabilities else logits).numpy()

    return write_rows(out, (pairs.shape[1],), np.float32, fill)
