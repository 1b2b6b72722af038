"""A partitioned rank's vertex map (``FrontierMap``: sized to the frontier) against the whole graph's
(``DenseMap``: 8 bytes a vertex, what a sampler over the whole graph holds): the relabel's time per batch and
the bytes each map holds.

The draws are the host sampler's on the benchmark graph (``kernels.sample_neighbors``, fanouts and batches as
training makes them). ``--spread N`` renames the graph's vertices into ids of an N-vertex graph (``u * K mod N``,
K odd and prime to N: distinct ids stay distinct), so that the same frontiers are relabelled as on a graph of N
vertices whose rank holds a part as large as this graph: the whole graph's map then has N entries. The maps take
turns batch by batch on one thread; every relabel is checked equal.

    python bench/frontier_map.py                          # 1M vertices, fanouts 10,10, batch 1024
    python bench/frontier_map.py --spread 100000000       # the same frontiers in a 100M-vertex graph's ids
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

from common import add_graph_arguments, ensure_graph

SPREAD_FACTOR = 0x9E3779B1  # odd; made prime to N below


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--batches", type=int, default=40, help="timed batches")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    parser.add_argument("--spread", type=int, default=0, help="the vertex ids of a graph this large (0: the graph's)")
    args = parser.parse_args()

    import numba
    import numpy as np
    import torch

    from neutronorch.data import load_native
    from neutronorch.orchestration.seeds import epoch_order
    from neutronorch.sampling import kernels
    from neutronorch.sampling.fanouts import parse_fanouts
    from neutronorch.sampling.frontier_map import DenseMap, FrontierMap
    from neutronorch.sampling.neighbor_sampler import batch_key, layer_key
    from neutronorch.train.resources import keep_freed_memory

    keep_freed_memory()  # as training does
    numba.set_num_threads(1)
    graph = load_native(ensure_graph(args.nodes, args.degree, args.features, args.classes), validate=False)
    indptr, indices, n = graph.indptr, graph.indices, graph.num_nodes
    size = max(args.spread, n)
    factor = SPREAD_FACTOR
    while math.gcd(factor, size) != 1:
        factor += 2
    rename = (lambda ids: ids) if size == n else (lambda ids: (ids.astype(np.int64) * factor) % size)
    fanouts = parse_fanouts(args.fanouts)
    order = epoch_order(torch.from_numpy(np.asarray(graph.train_idx)), 0, 0)
    batches = [b.numpy().copy() for b in torch.split(order, args.batch_size)][:args.warmup + args.batches]

    # The hops' draws, made once: what each map relabels (the draws keyed by the graph's ids, as the sampler's).
    work, frontiers = [], 0
    whole = DenseMap(n)
    for index, seeds in enumerate(batches):
        key, hops, frontier = batch_key(0, 0, index), [], seeds
        whole.start(seeds)
        for hop, fanout in enumerate(fanouts):
            _, nbrs = kernels.sample_neighbors(indptr, indices, frontier, fanout, np.uint64(layer_key(key, hop)),
                                               kernels.NO_ORDER)
            hops.append(rename(nbrs))
            _, frontier = whole.relabel(frontier, [nbrs])
        whole.clear(frontier)
        frontiers = max(frontiers, frontier.shape[0])
        work.append((rename(seeds), hops))
    del whole

    maps = {"whole graph's map": DenseMap(size), "frontier-sized map": FrontierMap()}
    times = {name: [] for name in maps}
    for index, (seeds, hops) in enumerate(work):
        results = []
        for name, vertex_map in maps.items():
            start = time.perf_counter()
            vertex_map.start(seeds)
            frontier, locals_ = seeds, []
            for nbrs in hops:
                (local,), frontier = vertex_map.relabel(frontier, [nbrs])
                locals_.append(local)
            vertex_map.clear(frontier)
            if index >= args.warmup:
                times[name].append(time.perf_counter() - start)
            results.append((frontier, locals_))
        (fa, la), (fb, lb) = results
        assert np.array_equal(fa, fb) and all(np.array_equal(x, y) for x, y in zip(la, lb)), "the maps differ"

    held = {"whole graph's map": maps["whole graph's map"].node_map.nbytes,
            "frontier-sized map": maps["frontier-sized map"]._table.nbytes}
    print(f"\n{graph.name}, ids of a {size:,}-vertex graph: fanouts {args.fanouts}, batch {args.batch_size}, "
          f"{args.batches} timed batches after {args.warmup}, 1 thread; largest frontier {frontiers:,} vertices")
    print("\n| map | relabel, ms per batch (median) | bytes held |")
    print("|---|---:|---:|")
    for name in maps:
        print(f"| {name} | {statistics.median(times[name]) * 1e3:.2f} | {held[name]:,} |")
    small, whole_map = "frontier-sized map", "whole graph's map"
    ratio = statistics.median(times[small]) / statistics.median(times[whole_map])
    print(f"\nfrontier-sized / whole graph's: {ratio:.2f}x the time, {held[small] / held[whole_map]:.4f}x the bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
