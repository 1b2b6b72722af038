"""How long a link task's edge split takes (``data/edge_split.py``'s ``split_edges``), with the direction
measured (``--link-direction auto``: the share of edges whose reverse is stored) and given (``undirected``), and the
measure alone (``reciprocity``), on a symmetric random graph.

    NUMBA_NUM_THREADS=1 python bench/link_split.py                 # 500,000 vertices, 2.5M stored edges
    NUMBA_NUM_THREADS=1 python bench/link_split.py --nodes 100000

Each figure is the median of ``--repeats`` timings (the first, which compiles, included in the list shown).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from neutronorch import Graph
from neutronorch.data.edge_split import reciprocity, split_edges


def timed(call, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500_000)
    parser.add_argument("--degree", type=float, default=5.0, help="stored edges per vertex (both directions)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    half = int(args.nodes * args.degree / 2)
    src, dst = rng.integers(0, args.nodes, half), rng.integers(0, args.nodes, half)
    graph = Graph.from_arrays(np.concatenate([src, dst]), np.concatenate([dst, src]),
                              rng.standard_normal((args.nodes, 4)).astype(np.float32),
                              rng.integers(0, 2, args.nodes))
    print(f"{args.nodes:,} vertices, {graph.indices.shape[0]:,} stored edges")
    runs = {"split, direction auto": lambda: split_edges(graph, 0.85, 0.05, 0, "auto"),
            "split, direction undirected": lambda: split_edges(graph, 0.85, 0.05, 0, "undirected"),
            "reverse share alone": lambda: reciprocity(graph.indptr, graph.indices)}
    for name, call in runs.items():
        times = timed(call, args.repeats)
        print(f"{name}: median {statistics.median(times):.3f} s ({', '.join(f'{t:.3f}' for t in times)})")


if __name__ == "__main__":
    main()
