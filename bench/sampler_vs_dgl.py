"""Sampler throughput (sampled edges per second) against DGL 2.1's CPU NeighborSampler.

Each system samples one epoch of mini-batches (the training seeds in a shuffled order, the same fanouts and
batch size) on the same graph with the same number of threads, in its own process; rounds alternate.

    python bench/sampler_vs_dgl.py                    # 1M vertices / 20M edges, fanouts 15,10,5, 2 threads
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from common import PEER_PYTHON, ROOT, add_graph_arguments, alternate, dgl_available, ensure_graph


def sample_epoch(data: str, fanouts: str, batch_size: int, threads: int, out: str) -> None:
    """Worker: time our sampler over one epoch and write the result."""
    import numba
    import numpy as np
    import torch

    from neutronorch.data import load_native
    from neutronorch.orchestration.seeds import epoch_order
    from neutronorch.sampling.fanouts import parse_fanouts
    from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
    from neutronorch.train.resources import keep_freed_memory

    numba.set_num_threads(threads)
    keep_freed_memory()  # as training does: freed blocks are reused, not returned and faulted in again
    graph = load_native(data, validate=False)
    sampler = NeighborSampler(graph.indptr, graph.indices, parse_fanouts(fanouts))
    order = epoch_order(torch.from_numpy(np.asarray(graph.train_idx)), 0, 0)
    batches = torch.split(order, batch_size)
    sampler.sample(batches[0].numpy(), 0)  # compile and warm the caches
    edges = 0
    start = time.perf_counter()
    for index, seeds in enumerate(batches):
        edges += sampler.sample(seeds.numpy(), batch_key(0, 0, index)).num_sampled_edges
    seconds = time.perf_counter() - start
    with open(out, "w") as f:
        json.dump({"system": "neutronorch", "seconds": seconds, "sampled_edges": edges,
                   "sampled_edges_per_second": edges / seconds, "batches": len(batches)}, f)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", nargs=2, metavar=("DATA", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        sample_epoch(args.worker[0], args.fanouts, args.batch_size, args.threads, args.worker[1])
        return 0

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    systems = {"neutronorch": lambda out: [sys.executable, __file__, "--worker", str(data), str(out),
                                           "--fanouts", args.fanouts, "--batch-size", str(args.batch_size),
                                           "--threads", str(args.threads)]}
    if dgl_available():
        systems["dgl-2.1"] = lambda out: [str(PEER_PYTHON), str(ROOT / "bench" / "peers" / "dgl_train.py"),
                                          "--dataset", str(data), "--sampler-only", "--fanouts", args.fanouts,
                                          "--batch-size", str(args.batch_size), "--threads", str(args.threads),
                                          "--epochs", "1", "--summary-json", str(out)]
    else:
        print("DGL not available: measuring neutronorch only", file=sys.stderr)
    rates = {name: [run["sampled_edges_per_second"] for run in runs]
             for name, runs in alternate(systems, args.rounds, "sampler", args.threads).items()}

    print(f"\n{data.name}: fanouts {args.fanouts}, batch {args.batch_size}, {args.threads} threads, "
          f"{args.rounds} rounds\n")
    print("| sampler | sampled edges/s (median) | all rounds (M/s) |")
    print("|---|---:|---|")
    for name, values in rates.items():
        print(f"| {name} | {statistics.median(values) / 1e6:.1f} M | "
              f"{', '.join(f'{v / 1e6:.1f}' for v in values)} |")
    if "dgl-2.1" in rates:
        ratio = statistics.median(rates["neutronorch"]) / statistics.median(rates["dgl-2.1"])
        print(f"\nsampled edges/s ratio neutronorch / dgl-2.1 = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
