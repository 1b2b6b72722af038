"""Where the host sampler's time goes, phase by phase, at each thread count: the scaling of each phase.

The sampler's hops (``NeighborSampler._hops``) taken apart and timed: the draw's row pointer
(``drawn_ptr``), the draw itself (``sample_neighbors`` less its row pointer), the relabel (``relabel_into``),
the vertex map's set-up and reset, and the rest (tensors, blocks). Thread counts take turns batch by batch in
one process (``numba.set_num_threads``), so a disturbance of the machine falls on each alike. The phases are
timed one after the other: the sampler on 2 to 7 threads draws and relabels at once (``hop_pipeline.py``),
which ``sampler_scaling.py`` times. ``PYTHONPATH=<an older checkout>/src`` profiles that revision.

    python bench/sampler_phases.py                    # 1M vertices / 20M edges, fanouts 15,10,5, 1 and 2 threads
    python bench/sampler_phases.py --threads 1,2,4 --batches 40 --warmup 2
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time

from common import add_graph_arguments, add_sampler_arguments, ensure_graph


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_sampler_arguments(parser)
    args = parser.parse_args()

    import numba
    import numpy as np
    import torch

    from neutronorch.data import load_native
    from neutronorch.orchestration.seeds import epoch_order
    from neutronorch.sampling import kernels
    from neutronorch.sampling.fanouts import parse_fanouts
    from neutronorch.sampling.neighbor_sampler import batch_key, layer_key, relabel_into
    from neutronorch.train.resources import keep_freed_memory

    keep_freed_memory()  # as training does: freed blocks are reused, not returned and faulted in again

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    graph = load_native(data, validate=False)
    indptr, indices = graph.indptr, graph.indices
    fanouts = parse_fanouts(args.fanouts)
    threads = [int(t) for t in args.threads.split(",")]
    order = epoch_order(torch.from_numpy(np.asarray(graph.train_idx)), 0, 0)
    batches = [b.numpy().copy() for b in torch.split(order, args.batch_size)][:args.warmup + args.batches]
    node_map = np.full(indptr.shape[0] - 1, -1, np.int64)
    try:  # as the sampler relabels (on every thread from 8 threads); an older revision has no such scratch
        from neutronorch.sampling.relabel_kernels import RelabelScratch
        extra = (RelabelScratch(node_map.shape[0]),)
    except ImportError:
        extra = ()
    drawn_ptr = getattr(kernels, "drawn_ptr", None) or kernels._drawn_ptr  # its name in older revisions

    def one_batch(seeds: np.ndarray, key: int, times: dict) -> int:
        clock = time.perf_counter
        t0 = clock()
        kernels.map_nodes(seeds, node_map)
        times["map"] += clock() - t0
        frontier, edges = seeds, 0
        for hop, fanout in enumerate(fanouts):
            t0 = clock()
            drawn_ptr(indptr, frontier, fanout, kernels.NO_ORDER)
            t1 = clock()
            ptr, nbrs = kernels.sample_neighbors(indptr, indices, frontier, fanout,
                                                 np.uint64(layer_key(key, hop)), kernels.NO_ORDER)
            t2 = clock()
            (local,), new = relabel_into(frontier, [nbrs], node_map, *extra)
            t3 = clock()
            torch.from_numpy(ptr), torch.from_numpy(local), torch.from_numpy(new)
            t4 = clock()
            times["ptr"] += t1 - t0
            times["draw"] += (t2 - t1) - (t1 - t0)
            times["relabel"] += t3 - t2
            times["rest"] += t4 - t3
            frontier, edges = new, edges + nbrs.shape[0]
        t0 = clock()
        kernels.reset_map(frontier, node_map)
        times["reset"] += clock() - t0
        return edges

    totals = {t: collections.defaultdict(float) for t in threads}
    per_batch = {t: [] for t in threads}
    for index, seeds in enumerate(batches):
        key = batch_key(0, 0, index)
        for t in threads:
            numba.set_num_threads(t)
            times = collections.defaultdict(float)
            start = time.perf_counter()
            one_batch(seeds, key, times)
            elapsed = time.perf_counter() - start
            if index >= args.warmup:
                per_batch[t].append(elapsed)
                for phase, seconds in times.items():
                    totals[t][phase] += seconds

    phases = ["map", "ptr", "draw", "relabel", "reset", "rest"]
    n = args.batches
    print(f"\n{data.name}: fanouts {args.fanouts}, batch {args.batch_size}, {n} timed batches after {args.warmup}")
    print("\n| phase | " + " | ".join(f"{t} thr, ms/batch" for t in threads) + " | speed-up at "
          f"{threads[-1]} thr |")
    print("|---|" + "---:|" * (len(threads) + 1))
    for phase in phases:
        ms = [totals[t][phase] / n * 1e3 for t in threads]
        print(f"| {phase} | " + " | ".join(f"{m:.2f}" for m in ms) + f" | {ms[0] / max(ms[-1], 1e-9):.2f}x |")
    medians = [statistics.median(per_batch[t]) * 1e3 for t in threads]
    print("| batch (median) | " + " | ".join(f"{m:.2f}" for m in medians) +
          f" | {medians[0] / medians[-1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
