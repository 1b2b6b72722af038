"""Hit rate of the device feature cache: which rows to cache, and how much of the PCIe traffic it saves.

    python bench/cache_hit_rate.py [--dataset SPEC [--split S] | --nodes 1000000 --degree 20 --power 0.6]
                                   [--fanouts 15,10,5] [--batch-size 1024] [--shares 0.1,0.25,0.5]
                                   [--policies presample,degree,random] [--epochs 2]

Samples every mini-batch of a few epochs with the training sampler (no training) and counts, for each
cache share and ranking policy, the share of input rows the cache would serve. The cache is filled once
before training (``--cache-policy``), so this is exactly the hit rate a run reports, without a GPU. The
``random`` policy is the baseline any ranking must beat: its hit rate equals the share cached.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from neutronorch.data import SyntheticSpec, generate, load_dataset
from neutronorch.features.cache import hotness_order
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.sampling.fanouts import parse_fanouts
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=None, help="a dataset spec (default: a synthetic graph)")
    parser.add_argument("--split", default=None, help="split of --dataset (e.g. per-class:20,30)")
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--power", type=float, default=0.6)
    parser.add_argument("--degree", type=int, default=20)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--shares", default="0.1,0.25,0.5")
    parser.add_argument("--policies", default="presample,degree,random")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    fanouts = parse_fanouts(args.fanouts)
    shares = [float(s) for s in args.shares.split(",")]
    policies = args.policies.split(",")

    t0 = time.perf_counter()
    if args.dataset:
        graph = load_dataset(args.dataset, args.split, args.seed)
    else:
        graph = generate(SyntheticSpec(nodes=args.nodes, degree=args.degree, power=args.power, features=8,
                                       classes=8))
    print(f"graph: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges ({time.perf_counter() - t0:.0f} s)")
    orders = {}
    for policy in policies:
        t0 = time.perf_counter()
        if policy == "random":
            orders[policy] = np.random.default_rng(args.seed).permutation(graph.num_nodes)
        else:
            orders[policy] = hotness_order(graph, fanouts, args.batch_size, args.seed, policy)
        print(f"ranking {policy}: {time.perf_counter() - t0:.1f} s")
    # rank[v] = position of v in the policy's order; a cache of k rows holds ranks < k.
    ranks = {p: np.empty(graph.num_nodes, np.int64) for p in policies}
    for p, order in orders.items():
        ranks[p][order] = np.arange(graph.num_nodes)
    hits = {(p, s): 0 for p in policies for s in shares}
    rows = 0
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts)
    train_idx = torch.from_numpy(np.asarray(graph.train_idx, dtype=np.int64))
    t0 = time.perf_counter()
    for epoch in range(args.epochs):
        order = epoch_order(train_idx, args.seed, epoch)
        for index, seeds in enumerate(torch.split(order, args.batch_size)):
            frontier = sampler.sample(seeds.numpy(), batch_key(args.seed, epoch, index)).input_nodes.numpy()
            rows += frontier.shape[0]
            for p in policies:
                r = ranks[p][frontier]
                for s in shares:
                    hits[p, s] += int(np.count_nonzero(r < int(s * graph.num_nodes)))
    print(f"sampled {args.epochs} epochs, {rows:,} input rows ({time.perf_counter() - t0:.0f} s)\n")
    print("| cached share of rows | " + " | ".join(f"{p} hit rate" for p in policies) + " |")
    print("|---:|" + "---:|" * len(policies))
    for s in shares:
        print(f"| {100 * s:.0f}% | " + " | ".join(f"{100 * hits[p, s] / rows:.1f}%" for p in policies) + " |")


if __name__ == "__main__":
    main()
