"""Where NeutronOrch's planning time goes: the upper-hop sampling of a super-batch's mini-batches, and the plan.

Without device sampling the planner thread (lane ``planner``, stage ``hot_select``) does both on the host
for every super-batch; with it the cold sampler's thread does both on the device (the torch sampler and
``DevicePlanner``). This script does the same work on its own thread, with nothing else running, and prints
medians per super-batch over ``--super-batches`` super-batches of epoch 0 (after one warm-up): on the host
for each thread count given, then on each device of ``--devices`` (times taken after a synchronisation).

    python bench/planner_profile.py --dataset /path/to/graph --threads 1,8 --devices cuda
    python bench/planner_profile.py --dataset /path/to/graph --threads 2 --devices cpu
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np
import torch

from neutronorch.data import load_dataset
from neutronorch.orchestration.neutronorch.device_planner import DevicePlanner
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.orchestration.seeds import epoch_order, training_seeds
from neutronorch.sampling.neighbor_sampler import NeighborSampler, TorchNeighborSampler, batch_key


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--super-batch", type=int, default=8)
    p.add_argument("--ratio", type=float, default=0.1)
    p.add_argument("--super-batches", type=int, default=8)
    p.add_argument("--threads", default="1,8", help="numba thread counts to time (default: %(default)s)")
    p.add_argument("--devices", default="", help="devices to plan on as well, e.g. cuda or cpu (default: none)")
    args = p.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    graph = load_dataset(args.dataset)
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts)
    planner = Planner(graph, fanouts[-1])
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
    for name in filter(None, args.devices.split(",")):
        device = torch.device(name)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        sampler = TorchNeighborSampler(torch.from_numpy(np.array(graph.indptr)).to(device),
                                       torch.from_numpy(np.array(graph.indices)).to(device), fanouts)
        planner = DevicePlanner(graph, fanouts[-1], sampler.indptr)
        seeds = torch.from_numpy(order).to(device)
        upper, plan = [], []
        for s in range(count):
            sync()
            t0 = time.perf_counter()
            uppers = []
            for i in range(s * per, (s + 1) * per):
                key = batch_key(0, 0, i)
                uppers.append((i, key, sampler.sample(seeds[i * size:(i + 1) * size], key, fanouts[:-1])))
            sync()
            t1 = time.perf_counter()
            planner.plan(s, 0, uppers, args.ratio)
            sync()
            t2 = time.perf_counter()
            if s:
                upper.append(t1 - t0)
                plan.append(t2 - t1)
        print(f"  on {name}: upper hops {1e3 * statistics.median(upper):7.1f} ms, plan "
              f"{1e3 * statistics.median(plan):7.1f} ms (torch sampler and DevicePlanner)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
