"""Where NeutronOrch's planning time goes: the upper-hop sampling of a super-batch's mini-batches, and the plan.

The planner thread (lane ``planner``, stage ``hot_select``) does both for every super-batch. This script
does the same work on its own thread, with nothing else running, and prints medians per super-batch
over ``--super-batches`` super-batches of epoch 0 (after one warm-up), for each thread count given.

    python bench/planner_profile.py --dataset /path/to/graph --threads 1,8
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from neutronorch.data import load_dataset
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.orchestration.seeds import epoch_order, training_seeds
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--super-batch", type=int, default=8)
    p.add_argument("--ratio", type=float, default=0.1)
    p.add_argument("--super-batches", type=int, default=8)
    p.add_argument("--threads", default="1,8", help="numba thread counts to time (default: %(default)s)")
    args = p.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    graph = load_dataset(args.dataset)
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts)
    planner = Planner(graph.indptr, fanouts[-1])
    order = epoch_order(training_seeds(graph), 0, 0).numpy()
    size, per = args.batch_size, args.super_batch
    available = order.shape[0] // (size * per)
    count = min(args.super_batches + 1, available)
    print(f"{graph.num_nodes:,} vertices; fanouts {fanouts}, batch {size}, super-batch {per}, ratio {args.ratio}; "
          f"medians over {count - 1} super-batches")
    for threads in (int(t) for t in args.threads.split(",")):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        upper, plan, reached = [], [], []
        for s in range(count):
            t0 = time.perf_counter()
            uppers = []
            for i in range(s * per, (s + 1) * per):
                key = batch_key(0, 0, i)
                uppers.append((i, key, sampler.sample(order[i * size:(i + 1) * size], key, fanouts[:-1])))
            t1 = time.perf_counter()
            result = planner.plan(s, 0, uppers, args.ratio)
            t2 = time.perf_counter()
            if s:  # the first compiles and warms the caches
                upper.append(t1 - t0)
                plan.append(t2 - t1)
                reached.append(result.stats.reached)
        print(f"  {numba.get_num_threads():2d} threads: upper hops {1e3 * statistics.median(upper):7.1f} ms, "
              f"plan {1e3 * statistics.median(plan):7.1f} ms ({np.median(reached):,.0f} distinct bottom-layer "
              f"destinations)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
