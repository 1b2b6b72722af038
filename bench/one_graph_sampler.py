"""The one-graph view's cost: a homogeneous graph sampled by NeighborSampler and, as the typed graph of one
vertex type and one relation (``TypedGraph.of``), by TypedNeighborSampler, which draws the same blocks.

Both samplers take turns on the same seed batches (random training vertices, one key per batch) in one
process; the table gives each one's best and median time per batch and their ratio, per batch size.

    NUMBA_NUM_THREADS=1 python bench/one_graph_sampler.py
    NUMBA_NUM_THREADS=1 python bench/one_graph_sampler.py --nodes 100000 --fanouts 10,5 --batch-sizes 512,4096 --repeats 40
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from neutronorch.data import SyntheticSpec, generate
from neutronorch.data.typed import TypedGraph
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--degree", type=float, default=20.0)
    parser.add_argument("--fanouts", default="10,5")
    parser.add_argument("--batch-sizes", default="512,4096")
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    graph = generate(SyntheticSpec(nodes=args.nodes, degree=args.degree, features=8, classes=4))
    homogeneous = NeighborSampler(graph.indptr, graph.indices, fanouts)
    typed = TypedNeighborSampler(TypedGraph.of(graph), fanouts)
    rng = np.random.default_rng(0)
    print(f"{args.nodes:,} vertices, {graph.num_edges:,} edges, fanouts {args.fanouts}, {args.repeats} batches "
          f"per size, the samplers taking turns\n")
    print("| batch | NeighborSampler best / median ms | typed over the view best / median ms | median ratio |")
    print("|---:|---:|---:|---:|")
    for size in (int(b) for b in args.batch_sizes.split(",")):
        times = {"homogeneous": [], "typed": []}
        for repeat in range(args.repeats + 2):  # the first two warm the kernels and caches
            seeds = rng.choice(graph.num_nodes, size, replace=False).astype(np.int64)
            key = batch_key(0, 0, repeat)
            turns = (("homogeneous", homogeneous.sample), ("typed", typed.sample))
            for name, sample in turns if repeat % 2 == 0 else turns[::-1]:
                start = time.perf_counter()
                sample(seeds, key)
                if repeat >= 2:
                    times[name].append((time.perf_counter() - start) * 1e3)
        h, t = times["homogeneous"], times["typed"]
        print(f"| {size} | {min(h):.2f} / {statistics.median(h):.2f} | {min(t):.2f} / {statistics.median(t):.2f} | "
              f"{statistics.median(t) / statistics.median(h):.2f}x |")


if __name__ == "__main__":
    main()
