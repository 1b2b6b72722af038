"""The loader's arguments, checked where the user gives them: clear errors instead of failures deep in a
producer thread."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from neutronorch.capabilities import LOADER_KIND_REFUSED, LOADER_MODES, LOADER_REFUSED, TYPED_DOCS
from neutronorch.data import Graph, TypedGraph, is_typed_dataset, load_dataset, load_typed_dataset
from neutronorch.data.pairs import pair_columns
from neutronorch.errors import ConfigError
from neutronorch.limits import check_switch
from neutronorch.orchestration.temporal import TemporalRequest
from neutronorch.sampling.temporal_sampler import check_strategy, seed_times

SEED_SETS = {"train": "train_idx", "val": "val_idx", "valid": "val_idx", "test": "test_idx", "all": None}
LINK_SETS = {"train": "train", "val": "val", "valid": "val", "test": "test"}  # LinkSplit's sets


def resolve_graph(graph) -> Graph | TypedGraph:
    """A ``Graph`` or ``TypedGraph`` as given, or the one a dataset spec string names (``load_dataset``; a typed
    dataset's path: ``load_typed_dataset``)."""
    if isinstance(graph, (Graph, TypedGraph)):
        graph.check_given()
        return graph
    if isinstance(graph, str):
        return load_typed_dataset(graph) if is_typed_dataset(graph) else load_dataset(graph)
    raise ConfigError(f"`graph`: expected a neutronorch TypedGraph, Graph or a dataset spec string (such as "
                      f"'synthetic:nodes=2000'), not a {type(graph).__name__}. Convert a PyG Data with "
                      f"neutronorch.from_pyg(data) (a HeteroData with neutronorch.data.from_pyg_hetero(data, "
                      f"target=...)), a DGL graph with neutronorch.from_dgl(g) (a heterograph with "
                      f"from_dgl_hetero(g, target=...)).")


def resolve_seeds(graph: Graph | TypedGraph, seeds) -> np.ndarray:
    """The seed vertices as unique int64 ids: a split's name (train, val, test, all), ids (a tensor, an
    array or a list), or a boolean mask over the vertices (of a typed graph: over its target type's)."""
    typed = isinstance(graph, TypedGraph)
    n = graph.num_nodes[graph.target] if typed else graph.num_nodes
    what = f"{graph.target} vertices" if typed else "vertices"
    if isinstance(seeds, str):
        if seeds not in SEED_SETS:
            raise ConfigError(f"`seeds` {seeds!r}: name a split ({', '.join(SEED_SETS)}) or give the vertex ids "
                              f"(a tensor, an array or a list) or a boolean mask over the {n:,} {what}.")
        name = SEED_SETS[seeds]
        ids = np.arange(n, dtype=np.int64) if name is None else np.array(getattr(graph, name), dtype=np.int64)
        if ids.size == 0:
            raise ConfigError(f"`seeds` {seeds!r}: the graph's {seeds} split is empty; give the ids to sample from.")
        return ids
    array = _as_array("seeds", seeds, "a split's name or vertex ids (a tensor, an array or a list)")
    if array.dtype == np.bool_:
        if array.shape != (n,):
            raise ConfigError(f"`seeds`: a boolean mask must hold one entry per vertex ({n:,} {what}), not shape "
                              f"{tuple(array.shape)}.")
        array = np.flatnonzero(array)
    if array.ndim != 1:
        raise ConfigError(f"`seeds`: expected a 1-D list of vertex ids, not shape {tuple(array.shape)}.")
    ids = _vertex_ids("seeds", array, n, "vertex", what)
    unique, counts = np.unique(ids, return_counts=True)
    if unique.shape[0] != ids.shape[0]:
        raise ConfigError(f"`seeds` holds {ids.shape[0] - unique.shape[0]} repeated ids (first: "
                          f"{int(unique[counts > 1][0])}); each vertex may be a seed once per epoch "
                          f"(deduplicate with torch.unique).")
    return ids


def resolve_edges(graph: Graph, edges, layout: str | None = None) -> np.ndarray:
    """Supervision edges as a (2, E) int64 array: a set of the graph's link split (train, val, test) or
    the edges themselves (a (2, E) tensor, array or list: row 0 the sources, row 1 the destinations; or
    (E, 2), an edge per row; a 2 x 2 one needs ``layout``, ``data.pairs.pair_columns``' rule). Repeated
    edges are kept (each is a positive of its own, as PyG keeps them)."""
    n = graph.num_nodes
    if isinstance(edges, str):
        if layout is not None:
            raise ConfigError(f"`layout` {layout}: says how an array of edges holds them, and `edges` {edges!r} "
                              f"names a set of the link split (a (2, E) array); leave `layout` out.")
        if edges not in LINK_SETS:
            raise ConfigError(f"`edges` {edges!r}: name a set of the graph's link split ({', '.join(LINK_SETS)}) "
                              f"or give the supervision edges as a (2, E) tensor, array or list.")
        if graph.links is None:
            raise ConfigError(f"`edges` {edges!r}: {graph.name} carries no link split. Split its edges with "
                              f"neutronorch.train.link_task.link_graph(graph, TrainConfig(task='link', "
                              f"split='edges:0.85,0.05')) (validation and test edges then leave the graph that "
                              f"messages pass over), load a link dataset (ogbl-*), or give your own supervision "
                              f"edges as a (2, E) tensor.")
        array = np.array(getattr(graph.links, LINK_SETS[edges]), dtype=np.int64)
        if array.size == 0:
            raise ConfigError(f"`edges` {edges!r}: the graph's {edges} set holds no edges; give another set or "
                              f"the edges themselves.")
        return array.reshape(2, -1)
    array = _as_array("edges", edges, "a link set's name (train, val, test) or a (2, E) tensor of edges")
    if array.ndim != 2 or 2 not in array.shape:
        raise ConfigError(f"`edges`: expected shape (2, E), row 0 the sources and row 1 the destinations (or (E, "
                          f"2), an edge per row), not {tuple(array.shape)}.")
    # The one rule for arrays of pairs (data/pairs.py): (E, 2) is read as rows, 2 x 2 needs `layout`.
    return np.ascontiguousarray(pair_columns(_vertex_ids("edges", array, n, "edge"), "`edges`", layout))


def _as_array(name: str, value, expected: str) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, (np.ndarray, list, tuple, range)):
        return np.asarray(value)
    raise ConfigError(f"`{name}`: expected {expected}, not a {type(value).__name__}.")


def _vertex_ids(name: str, array: np.ndarray, n: int, what: str, vertices: str = "vertices") -> np.ndarray:
    """``array`` as int64 vertex ids, refused when empty, not integers or out of 0..n-1."""
    if array.size and array.dtype.kind not in "iu":
        raise ConfigError(f"`{name}`: vertex ids must be integers, not {array.dtype}.")
    if array.size == 0:
        raise ConfigError(f"`{name}` is empty: give at least one {what} to sample from.")
    low, high = int(array.min()), int(array.max())  # in the ids' own type: 2**64-1 is shown as it is, not -1
    if low < 0 or high >= n:
        bad = low if low < 0 else high
        raise ConfigError(f"`{name}` holds vertex id {bad}, out of range for a graph of {n:,} {vertices} "
                          f"(0..{n - 1}).")
    return array.astype(np.int64)


def check_negatives(value) -> int:
    """Negative destinations per positive: at least one, as the trainer's link task draws them
    (``TrainConfig.negatives``; ``LinkSeeds`` builds every batch's pairs with them)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value < 1:
        raise ConfigError(f"`negatives` {value}: the loader draws at least 1 negative destination per positive "
                          f"(its batches' pairs are built with them; 0 is not offered). For the positives alone, "
                          f"give 1 and read the first P columns of edge_label_index (those with edge_label 1).")
    return check_count("negatives", value, 1)


def check_mode(mode, kind: str = "homogeneous", task: str = "node") -> str:
    """``mode``, where a loader runs it for ``task`` on a graph of ``kind`` (``capabilities.py``'s table)."""
    if (kind, task) in LOADER_KIND_REFUSED:
        raise ConfigError(LOADER_KIND_REFUSED[kind, task] + TYPED_DOCS)
    if mode in LOADER_REFUSED:
        raise ConfigError(LOADER_REFUSED[mode])
    if mode not in LOADER_MODES:
        raise ConfigError(f"`mode` {mode!r}: the loader runs mode exact (sampling and gathering on the host, in a "
                          f"background thread) or device (on the training device).")
    return mode


def check_count(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"`{name}` {value!r}: expected a whole number, not a {type(value).__name__}.")
    if value < low:
        raise ConfigError(f"`{name}` {value}: must be at least {low}.")
    return int(value)


VERTEX_TIMES = ("node_time",)  # time_attr names of the vertex times (and PyG's "time" where the graph has them)


def resolve_temporal(graph: Graph | TypedGraph, seeds: np.ndarray, time_attr, input_time, strategy, strict
                     ) -> TemporalRequest | None:
    """PyG's temporal arguments of ``NeighborLoader`` (docs/temporal.md, "The loader"): ``time_attr`` names
    the times to sample by (``edge_time``, or vertex times: ``node_time``, and ``time`` where the graph has
    them, else its edge times),
    ``input_time`` gives each of ``seeds`` its time (default: the seeds' vertex times), ``temporal_strategy``
    ``uniform`` or ``last``, ``strict`` edges before the time only. None without ``time_attr``."""
    if time_attr is None:
        given = [name for name, unset in (("input_time", input_time is None),
                                          ("temporal_strategy", isinstance(strategy, str) and strategy == "uniform"),
                                          ("strict_time", strict is False)) if not unset]
        if given:
            raise ConfigError(f"`{'`, `'.join(given)}`: settings of sampling by time, which `time_attr` asks for; "
                              f"give time_attr='edge_time' (docs/temporal.md), or leave them out.")
        return None
    if isinstance(graph, TypedGraph):
        return _typed_temporal(graph, seeds, time_attr, input_time, strategy, strict)
    if time_attr not in ("edge_time", "time", *VERTEX_TIMES):
        raise ConfigError(f"`time_attr` {time_attr!r}: give 'edge_time' (the graph's edge times) or 'node_time' "
                          f"(its vertex times; 'time', PyG's name, is the vertex times where the graph has them, "
                          f"else the edge times).")
    by_vertices = time_attr in VERTEX_TIMES or (time_attr == "time" and graph.node_time is not None)
    if by_vertices and graph.node_time is None or not by_vertices and graph.edge_time is None:
        what = "vertex" if by_vertices else "edge"
        raise ConfigError(f"`time_attr` {time_attr!r}: names {what} times, and {graph.name} has none; give "
                          f"time_attr 'edge_time' for edge times or 'node_time' for vertex times "
                          f"(docs/temporal.md).")
    check_switch(strict, "`strict_time`")
    check_strategy(strategy)
    if input_time is None:
        if graph.node_time is None:
            raise ConfigError("`input_time`: give each seed its time (one per seed, in the seeds' order); the graph "
                              "has no vertex times to take them from.")
        input_time = np.asarray(graph.node_time)[seeds]
    else:
        input_time = _as_array("input_time", input_time, "one time per seed (a tensor, an array or a list)")
    dtype = (graph.node_time if by_vertices else graph.edge_time).dtype
    times = seed_times(input_time, seeds.shape[0], dtype, "`input_time`", "loader")
    return TemporalRequest(times, strategy, bool(strict), by_vertices)


def _typed_temporal(graph: TypedGraph, seeds: np.ndarray, time_attr, input_time, strategy, strict
                    ) -> TemporalRequest:
    """``resolve_temporal`` of a typed graph: by its relations' edge times, or by vertex times (each relation
    without times of its own at its source type's, ``timed_relations``); a relation left without times is
    static (every edge valid). ``input_time`` by default the target's vertex times."""
    if time_attr not in ("edge_time", "time", *VERTEX_TIMES):
        raise ConfigError(f"`time_attr` {time_attr!r}: give 'edge_time' (the relations' edge times) or 'node_time' "
                          f"(the types' vertex times; 'time', PyG's name, is the vertex times where the graph has "
                          f"them, else the edge times).")
    by_vertices = time_attr in VERTEX_TIMES or (time_attr == "time" and bool(graph.node_time))
    timed = ([times.dtype for times in graph.node_time.values()] if by_vertices else
             [rel.edge_time.dtype for rel in graph.relations.values() if rel.edge_time is not None])
    if not timed:
        raise ConfigError(f"`time_attr` {time_attr!r}: {graph.name} has no {'vertex' if by_vertices else 'edge'} "
                          f"times to sample by (docs/temporal.md).")
    check_switch(strict, "`strict_time`")
    check_strategy(strategy)
    if input_time is None:
        if graph.target not in graph.node_time:
            raise ConfigError(f"`input_time`: give each seed its time (one per seed, in the seeds' order); the "
                              f"target type {graph.target} has no vertex times to take them from.")
        input_time = np.asarray(graph.node_time[graph.target])[seeds]
    else:
        input_time = _as_array("input_time", input_time, "one time per seed (a tensor, an array or a list)")
    return TemporalRequest(seed_times(input_time, seeds.shape[0], timed[0], "`input_time`", "loader"), strategy,
                           bool(strict), by_vertices)


def resolve_link_temporal(graph: Graph, count: int, time_attr, edge_label_time, strategy) -> TemporalRequest | None:
    """PyG's temporal arguments of ``LinkNeighborLoader``: ``time_attr`` (the graph's edge times) and
    ``edge_label_time``, one time per supervision edge; each edge's ends and negatives are sampled at it,
    strictly before it (a positive never sees itself). None without them."""
    if time_attr is None and edge_label_time is None:
        if not (isinstance(strategy, str) and strategy == "uniform"):
            raise ConfigError("`temporal_strategy`: a setting of sampling by time, which `time_attr` and "
                              "`edge_label_time` ask for (docs/temporal.md); give them, or leave it out.")
        return None
    if time_attr is None or edge_label_time is None:
        missing = "time_attr='edge_time'" if time_attr is None else "edge_label_time (one time per edge)"
        raise ConfigError(f"LinkNeighborLoader samples by time with both `time_attr` and `edge_label_time`, as "
                          f"PyG's does; give {missing} too (docs/temporal.md).")
    if time_attr not in ("edge_time", "time") or graph.edge_time is None or (
            time_attr == "time" and graph.node_time is not None):
        raise ConfigError(f"`time_attr` {time_attr!r}: LinkNeighborLoader samples by the graph's edge times "
                          f"(time_attr 'edge_time'{'' if graph.edge_time is not None else ', which it has not'}); "
                          f"by vertex times is not yet offered (docs/temporal.md).")
    check_strategy(strategy)
    times = _as_array("edge_label_time", edge_label_time, "one time per edge (a tensor, an array or a list)")
    return TemporalRequest(seed_times(times, count, graph.edge_time.dtype, "`edge_label_time`", "loader"),
                           strategy, True, link=True)
