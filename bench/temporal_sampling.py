"""Temporal against plain host sampling on one graph: a synthetic power-law graph given a random time per
edge (each vertex's in-edges sorted by time, as a temporal graph stores them), sampled by NeighborSampler
(times ignored) and by TemporalNeighborSampler, taking turns on the same seed batches.

Four kinds of batch: every seed at one time (node classification as of a date: the batch's entries are
vertices, as in plain sampling) or every seed at its own time (a link batch: each seed's entries stay its
own, so a vertex reached under two times is two entries); the times drawn uniformly over the edge times
(about half of a seed's edges valid) or after every edge (every edge valid: with one time, the temporal
sampler draws exactly the plain sampler's sample, so the ratio is the cost of the time checks alone). The
table gives the median time per batch over the rounds, the ratio of the medians, the median of the
per-batch ratios (each batch sampled by both, one after the other: robust to load that drifts over a
run on a shared machine), and the frontier entries and edges each sampler drew per batch.

    NUMBA_NUM_THREADS=1 python bench/temporal_sampling.py
    NUMBA_NUM_THREADS=1 python bench/temporal_sampling.py --nodes 200000 --rounds 20
    NUMBA_NUM_THREADS=1 python bench/temporal_sampling.py --typed    # the typed samplers on the same graph

``--typed`` times TypedNeighborSampler against TemporalTypedSampler instead, on the graph as a typed graph of
one vertex type and one relation (no reverse added), the seeds of its one type.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from neutronorch.data import SyntheticSpec, generate
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.data.relation import Relation
from neutronorch.data.typed import TypedGraph
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler, TemporalTypedSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

LATEST = 1_000_000  # edge times are 0..LATEST-1


def timed_graph(nodes: int, degree: float, seed: int):
    """The synthetic graph and a random int64 time (0..LATEST-1) per edge, each column sorted by time."""
    graph = generate(SyntheticSpec(nodes=nodes, degree=degree, features=4, classes=2, seed=seed))
    rng = np.random.default_rng(seed)
    times = rng.integers(0, LATEST, graph.num_edges)
    dst = np.repeat(np.arange(graph.num_nodes, dtype=np.int64), graph.in_degrees())
    order = np.lexsort((times, dst))
    return graph.indptr, np.ascontiguousarray(graph.indices[order]), times[order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--degree", type=float, default=16.0)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--typed", action="store_true", help="time the typed samplers on the graph as a typed one")
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    start = time.perf_counter()
    indptr, indices, times = timed_graph(args.nodes, args.degree, 0)
    print(f"{args.nodes:,} vertices, {indices.shape[0]:,} edges with times, built in "
          f"{time.perf_counter() - start:.1f} s; fanouts {args.fanouts}, batches of {args.batch_size}, "
          f"{args.rounds} rounds, the samplers taking turns\n")
    plain = NeighborSampler(indptr, indices, fanouts)
    temporal = TemporalNeighborSampler(indptr, indices, times, fanouts)
    if args.typed:
        none = np.empty(0, np.int64)
        typed = TypedGraph("timed", {"vertex": args.nodes}, {("vertex", "to", "vertex"): Relation(
            indptr, indices, edge_time=times)}, {}, "vertex", None, none, none, none, 0)
        plain, temporal = TypedNeighborSampler(typed, fanouts), TemporalTypedSampler(typed, fanouts)
        print("typed samplers: TypedNeighborSampler against TemporalTypedSampler\n")
    rng = np.random.default_rng(1)
    print("| seeds' times | plain median ms | temporal median ms | ratio of medians | median per-batch ratio | "
          "plain entries / edges | temporal entries / edges |")
    print("|---|---|---|---|---|---|---|")
    kinds = {"one time per batch, after every edge": lambda: np.full(args.batch_size, LATEST),
             "a time per seed, after every edge": lambda: LATEST + rng.permutation(args.batch_size),
             "one time per batch, uniform": lambda: np.full(args.batch_size, rng.integers(0, LATEST)),
             "a time per seed, uniform": lambda: rng.integers(0, LATEST, args.batch_size)}
    for kind, times_of in kinds.items():
        spent: dict[str, list[float]] = {"plain": [], "temporal": []}
        sizes: dict[str, list[tuple[int, int]]] = {"plain": [], "temporal": []}
        for round_ in range(args.rounds + 2):  # the first two warm up (compilation, caches)
            seeds = rng.choice(args.nodes, args.batch_size, replace=False)
            at = times_of()
            key = batch_key(0, 0, round_)
            for name in (("plain", "temporal") if round_ % 2 else ("temporal", "plain")):
                begin = time.perf_counter()
                sub = plain.sample(seeds, key) if name == "plain" else temporal.sample(seeds, at, key)
                elapsed = time.perf_counter() - begin
                if round_ >= 2:
                    spent[name].append(elapsed * 1e3)
                    bottom = sub.frontiers[0]  # a typed sample's: per type
                    entries = sum(f.shape[0] for f in bottom.values()) if isinstance(bottom, dict) else bottom.shape[0]
                    sizes[name].append((int(entries), sub.num_sampled_edges))
        medians = {name: statistics.median(values) for name, values in spent.items()}
        shown = {name: f"{statistics.median(n for n, _ in s):,.0f} / {statistics.median(e for _, e in s):,.0f}"
                 for name, s in sizes.items()}
        paired = statistics.median(t / p for t, p in zip(spent["temporal"], spent["plain"]))
        print(f"| {kind} | {medians['plain']:.1f} | {medians['temporal']:.1f} | "
              f"{medians['temporal'] / medians['plain']:.2f}x | {paired:.2f}x | {shown['plain']} | "
              f"{shown['temporal']} |")


if __name__ == "__main__":
    main()
