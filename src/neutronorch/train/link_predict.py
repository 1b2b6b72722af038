"""Scores of vertex pairs from a trained link checkpoint (``--task link``): exact full-neighbour inference
of the distinct vertices the pairs name (``layerwise``), then the head over the pairs a chunk at a time. The
graph is the dataset as given: every edge of it carries messages (docs/link-prediction.md, "Predict and
embed")."""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
from pathlib import Path
from typing import Sequence, Union

import numpy as np
import torch

from neutronorch.data.edge_split import link_relation
from neutronorch.data.graph import Graph
from neutronorch.data.links import LinkEnds
from neutronorch.data.pairs import pair_columns
from neutronorch.data.text_tables import is_number
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError, not_a_file
from neutronorch.features.store import FeatureStore
from neutronorch.nn.link import LinkModel
from neutronorch.orchestration.link_seeds import EndsSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.checkpoint import Checkpoint
from neutronorch.train.evaluate import typed_logits
from neutronorch.train.health import output_check
from neutronorch.train.layerwise import LayerProgress, last_layer_rows
from neutronorch.train.predict import check_request, checkpoint_for
from neutronorch.train.prediction_io import (check_prediction_output, id_lines, ids_in_memory, is_whole, load_array,
                                             scratch_folder, write_rows)

# What ``pairs`` may be: a file, or the pairs themselves.
Pairs = Union[str, os.PathLike, np.ndarray, torch.Tensor, Sequence]
PAIR_FORMS = ("a .npy file of a (2, P) or (P, 2) integer array (not 2 x 2: ambiguous), or a text file of 'u v' "
              "or 'u,v' lines (# starts a comment)")
_SHOWN = 5  # out-of-range ids an error lists
_INT64_LIMIT = 1 << 63  # ids from here on fit no int64 and name no vertex of any graph


def read_pairs(pairs: Pairs, num_nodes: int | tuple | None = None, layout: str | None = None,
               source: str | None = None) -> np.ndarray:
    """The pairs as a (2, P) int64 array (row 0 the first vertex of each pair), in their order: ``PAIR_FORMS``
    or an array, tensor or list, read by ``data.pairs.pair_columns``' rule (``layout`` for a 2 x 2 one). With
    ``num_nodes``, every id must be in 0..num_nodes-1 (a typed link's: (first vertices' type, its count),
    (second's, its count)). ``source`` names pairs given as an array in errors (the
    file they were read from). Anything else is a ``ConfigError`` naming the file and, for a text file, the
    lines."""
    path = Path(pairs) if isinstance(pairs, (str, os.PathLike)) else None
    if path is not None:
        array, what = _read_file(path), f"`pairs` {pairs}"
    else:
        what = f"`pairs` {source}" if source is not None else "`pairs` (given in memory)"
        array = ids_in_memory(pairs, what)
    text = path is not None and path.suffix != ".npy"  # a pair per line
    named = path if text else Path(source) if source is not None and not str(source).endswith(".npy") else None
    if array.size == 0:
        raise ConfigError(f"{what}: holds no pairs; give at least one (u, v) pair to score.")
    if array.dtype.kind not in "iu":
        raise ConfigError(f"{what}: expected integer vertex ids, got {array.dtype}; give the ids as integers "
                          f"(an int32 or int64 array).")
    if text and layout == "columns":
        raise ConfigError(f"{what}: a text file holds a pair per line, so `layout` columns cannot apply; leave "
                          f"`layout` out for a text file.")
    array = pair_columns(array, what, "rows" if text else layout)  # a text file's lines are pairs
    # Without the vertex count, ids int64 cannot hold are still out of range of any graph (never wrapped).
    _check_range(array, _INT64_LIMIT if num_nodes is None else num_nodes, what, named)
    return np.ascontiguousarray(array, dtype=np.int64)


def _read_file(path: Path) -> np.ndarray:
    """A .npy file's array, or a text file's lines of ids (``id_lines``: whitespace or commas between the ids
    of a line, ``#`` comments) as a (P, 2) array of vertex numbers."""
    if not path.is_file():
        raise ConfigError(f"`pairs` {path}: {not_a_file(path, 'no such file')}; give {PAIR_FORMS}.")
    if path.suffix == ".npy":
        return load_array(path, f"`pairs` {path}")
    lines = id_lines(path, f"`pairs` {path}")
    if wrong := next(((number, len(ids)) for number, ids in lines if len(ids) != 2), None):
        raise ConfigError(f"`pairs` {path}: line {wrong[0]} holds {wrong[1]} id{'' if wrong[1] == 1 else 's'}; give two per line, "
                          f"'u v' or 'u,v'.")
    named = next(((number, ids) for number, ids in lines if not all(map(is_whole, ids))), None)
    if named is not None and named[0] == lines[0][0] and not any(map(is_number, named[1])):
        raise ConfigError(f"`pairs` {path}: line {named[0]} holds {named[1][0]!r} and no number: a header? A "
                          f"pairs file has none: remove the line, or make it a '#' comment.")
    if named is not None:  # a vertex's name (or a number that is none) where its number belongs
        token = next(i for i in named[1] if not is_whole(i))
        hint = (" Names are read as your tables' ids only on a dataset `convert` renumbered (it keeps node_ids.npy): "
                "by the command line there, or in Python as np.searchsorted(node_ids, your_names) "
                "(docs/link-prediction.md)."
                if not is_number(token) else " Vertex numbers are whole numbers from 0.")
        raise ConfigError(f"`pairs` {path}: line {named[0]} holds {token!r}, not a vertex number.{hint}")
    return np.asarray([int(i) for _, ids in lines for i in ids], dtype=np.int64).reshape(-1, 2)


def _check_range(pairs: np.ndarray, num_nodes, what: str, text: Path | None = None) -> None:
    """Every id in 0..num_nodes-1 (a typed link's ``num_nodes``: ((type, count), (type, count)), one per end),
    else an error counting the ids out of range and showing the first few with their pairs' positions (a
    ``text`` file's lines), compared and shown in the ids' own type (never wrapped)."""
    ends = num_nodes if isinstance(num_nodes, tuple) else None
    if ends is not None:
        first, second = ends[0][1], ends[1][1]
        bad = np.stack([(pairs[0] < 0) | (pairs[0] >= first), (pairs[1] < 0) | (pairs[1] >= second)])
        num_nodes = max(first, second)
    else:
        bad = (pairs < 0) | (pairs >= num_nodes)
    count = int(bad.sum())
    if count:
        where = np.flatnonzero(bad.any(axis=0))[:_SHOWN]
        lines = _data_lines(text, int(where[-1])) if text is not None else None
        place = (lambda i: f"line {lines[i]}") if lines is not None else (lambda i: f"pair {i}")  # noqa: E731
        shown = ", ".join(f"{place(i)} ({int(pairs[0, i])}, {int(pairs[1, i])})" for i in where)
        limit = (f"0..{num_nodes - 1} (the dataset has {num_nodes:,} vertices)" if num_nodes < _INT64_LIMIT
                 else "(negative: vertex numbers are whole numbers from 0)" if (pairs < 0).any()
                 else "of int64 (no graph has such vertices)")
        if ends is not None:  # a typed link's pairs: each end among its own type's vertices
            limit = (f"(a pair's first id is one of the {ends[0][1]:,} {ends[0][0]} vertices, its second one of the "
                     f"{ends[1][1]:,} {ends[1][0]} vertices)")
        raise ConfigError(f"{what}: {count:,} vertex id{'s' if count > 1 else ''} out of range {limit}, in {shown}"
                          f"{', ...' if bad.any(axis=0).sum() > _SHOWN else ''}"
                          f"{'' if lines is not None else ' (pairs counted from 0)'}. Give ids of this dataset's "
                          f"vertices.")


def _data_lines(path: Path, last: int) -> list[int] | None:
    """The line numbers (from 1) of a text file's pairs 0..last (blank and ``#`` lines skipped, as read)."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            numbers = (n for n, line in enumerate(f, 1) if line.strip() and not line.lstrip().startswith("#"))
            lines = list(itertools.islice(numbers, last + 1))
    except OSError:
        return None
    return lines if len(lines) > last else None


@torch.no_grad()
def score_pairs(checkpoint: Checkpoint | str | os.PathLike, graph: Graph | TypedGraph, pairs: Pairs,
                device: str = "cpu", chunk_size: int = 4096, *, probabilities: bool = False,
                out: str | os.PathLike | None = None,
                scratch: str | None = "auto", progress: LayerProgress | None = None,
                overwrite: bool = False, layout: str | None = None, source: str | None = None) -> np.ndarray:
    """One float32 score per pair, in the pairs' order: the link checkpoint's head applied to the encoder's
    embeddings of the pair's two vertices (its logit), or with ``probabilities`` its sigmoid. ``pairs``,
    ``layout`` and ``source`` as ``read_pairs`` takes them. Memory: the last layer's rows of the distinct
    vertices the pairs name (memory-mapped where ``scratch`` puts the intermediate layers), and the pairs.
    ``device``, ``chunk_size`` (vertices per layer-wise chunk, pairs per head chunk), ``out`` (never one of
    the inputs), ``scratch``, ``progress`` and ``overwrite`` as for ``predict``. A node-classification
    checkpoint is refused (use ``predict``)."""
    device = check_request(graph, device, probabilities=probabilities, overwrite=overwrite)
    check_prediction_output(out, scratch, checkpoint, graph, overwrite,
                            {"pairs": [pairs] if isinstance(pairs, (str, os.PathLike)) else []})
    given = graph
    checkpoint, graph = checkpoint_for(checkpoint, graph, pairs=True)
    # A typed graph's: the relation the run predicted (named as the graph was given, before its reverses).
    relation = link_relation(given, checkpoint.config.link_relation) if isinstance(given, TypedGraph) else None
    model = checkpoint.model.to(device).eval()
    encoder = model.encoder
    check = output_check("scores", "pairs")
    if relation is not None:  # each pair a vertex of the relation's source type and one of its destination type
        ends = LinkEnds.of(graph.num_nodes, relation, graph.reverse_of(relation))
        bounds = ((relation[0], graph.num_nodes[relation[0]]), (relation[2], graph.num_nodes[relation[2]]))
        pairs = torch.from_numpy(read_pairs(pairs, bounds, layout, source))
        stacked = pairs + torch.tensor([[ends.offsets[relation[0]]], [ends.offsets[relation[2]]]])
        sampler = EndsSampler(TypedNeighborSampler(graph, checkpoint.config.eval_fanouts if
                                                   checkpoint.config.eval_fanouts is not None else checkpoint.fanouts),
                              ends)
        nodes = torch.unique(stacked.reshape(-1))  # sorted: a pair's rows are found by binary search
        rows = contextlib.nullcontext(typed_logits(encoder, graph, sampler, nodes, device, chunk_size,
                                                   checkpoint.config.seed))
        return write_rows(out, (pairs.shape[1],), np.float32, functools.partial(
            _scored, model, stacked, nodes, rows, device, chunk_size, check, probabilities))
    pairs = torch.from_numpy(read_pairs(pairs, graph.num_nodes, layout, source))
    folder = scratch_folder(encoder, graph, encoder.num_layers, scratch, out)
    nodes = torch.unique(pairs.reshape(-1))  # sorted: a pair's rows are found by binary search
    rows = last_layer_rows(encoder, graph, FeatureStore(graph.features, graph.labels), nodes, device, chunk_size,
                           scratch=folder, progress=progress)
    return write_rows(out, (pairs.shape[1],), np.float32, functools.partial(
        _scored, model, pairs, nodes, rows, device, chunk_size, check, probabilities))


def _scored(model: LinkModel, pairs: torch.Tensor, nodes: torch.Tensor, embedded, device: torch.device,
            chunk_size: int, check, probabilities: bool, scores: np.ndarray) -> None:
    """``scores[i]``: the head on pair ``i``'s rows of ``embedded`` (a context giving the rows of the sorted
    ``nodes``), ``chunk_size`` pairs at a time, checked finite."""
    with embedded as rows:
        row = lambda ids: rows[torch.searchsorted(nodes, ids)].to(device)  # noqa: E731
        for start in range(0, pairs.shape[1], chunk_size):
            chunk = pairs[:, start:start + chunk_size]
            logits = model.score(row(chunk[0]), row(chunk[1])).float().cpu()
            check(logits)
            scores[start:start + chunk.shape[1]] = (torch.sigmoid(logits) if probabilities else logits).numpy()
