"""The host sampler's scaling with threads, against DGL 2.1's CPU ``NeighborSampler``: time per batch at each
thread count, the sampler alone.

Both systems sample the same seed batches (the first ``--warmup`` + ``--batches`` batches of epoch 0's seed
order) with the same fanouts, one process per system and thread count, rounds alternating; ``--warmup``
batches are sampled untimed first. Ours samples as training does (``keep_freed_memory``); its runs at every
thread count must draw the same neighbours (a digest of every block, compared).

    python bench/sampler_scaling.py                        # 1M vertices / 20M edges, fanouts 15,10,5, 1 and 2 threads
    python bench/sampler_scaling.py --threads 1,2,4,8,16 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from common import (OUT, PEER_PYTHON, ROOT, add_graph_arguments, add_sampler_arguments, dgl_available, ensure_graph,
                    run_json)


def seed_batches(data: Path, batch_size: int, count: int) -> Path:
    """The first ``count`` batches of epoch 0's seed order, saved for both systems (one row per batch)."""
    import numpy as np
    import torch

    from neutronorch.data import load_native
    from neutronorch.orchestration.seeds import epoch_order

    graph = load_native(data, validate=False)
    order = epoch_order(torch.from_numpy(np.array(graph.train_idx)), 0, 0).numpy()
    if order.shape[0] < count * batch_size:
        raise SystemExit(f"{data.name} has {order.shape[0]} training seeds: fewer than {count} batches of "
                         f"{batch_size}; ask for fewer --batches")
    path = OUT / f"sampler-scaling-seeds-{data.name}-b{batch_size}-n{count}.npy"
    np.save(path, order[:count * batch_size].reshape(count, batch_size))
    return path


def ours(data: str, seeds_path: str, fanouts: str, threads: int, warmup: int, out: str) -> None:
    import hashlib

    import numba
    import numpy as np

    from neutronorch.data import load_native
    from neutronorch.sampling.fanouts import parse_fanouts
    from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
    from neutronorch.train.resources import keep_freed_memory

    numba.set_num_threads(threads)
    keep_freed_memory()
    graph = load_native(data, validate=False)
    sampler = NeighborSampler(graph.indptr, graph.indices, parse_fanouts(fanouts))
    batches = np.load(seeds_path)
    digest, seconds, edges = hashlib.sha256(), [], 0
    for index, seeds in enumerate(batches):
        start = time.perf_counter()
        sample = sampler.sample(seeds, batch_key(0, 0, index))
        elapsed = time.perf_counter() - start
        for block in sample.blocks:
            digest.update(block.indptr.numpy().tobytes())
            digest.update(block.indices.numpy().tobytes())
        if index >= warmup:
            seconds.append(elapsed)
            edges += sample.num_sampled_edges
    Path(out).write_text(json.dumps({"seconds": seconds, "sampled_edges": edges, "digest": digest.hexdigest()}))


def dgl(data: str, seeds_path: str, fanouts: str, threads: int, warmup: int, out: str) -> None:
    import dgl as dgl_module
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "bench" / "peers"))
    from peer_common import read_native

    torch.set_num_threads(threads)
    dgl_module.utils.set_num_threads(threads)
    _, indptr, src, *_ = read_native(data)  # built as bench/peers/dgl_train.py builds it: in-edges, CSC
    dst = np.repeat(np.arange(indptr.shape[0] - 1, dtype=np.int64), np.diff(indptr))
    graph = dgl_module.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=indptr.shape[0] - 1,
                             idtype=torch.int64).formats("csc")
    graph.create_formats_()
    sampler = dgl_module.dataloading.NeighborSampler([int(f) for f in reversed(fanouts.split(","))])
    seconds, edges = [], 0
    for index, seeds in enumerate(np.load(seeds_path)):
        start = time.perf_counter()
        _, _, blocks = sampler.sample(graph, torch.from_numpy(seeds))
        elapsed = time.perf_counter() - start
        if index >= warmup:
            seconds.append(elapsed)
            edges += sum(int(block.num_edges()) for block in blocks)
    Path(out).write_text(json.dumps({"seconds": seconds, "sampled_edges": edges}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_sampler_arguments(parser)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peers", default="dgl", help="'dgl' or '' (ours alone)")
    parser.add_argument("--worker", nargs=4, metavar=("SYSTEM", "DATA", "SEEDS", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    if args.worker:
        system, data, seeds, out = args.worker
        (ours if system == "ours" else dgl)(data, seeds, args.fanouts, threads[0], args.warmup, out)
        return 0

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    seeds = seed_batches(data, args.batch_size, args.warmup + args.batches)
    systems = ["ours"] + (["dgl"] if args.peers == "dgl" and dgl_available() else [])
    if args.peers == "dgl" and "dgl" not in systems:
        print("DGL not available (bench/peers/README.md): measuring ours only", file=sys.stderr)
    runs: dict[tuple[str, int], list[dict]] = {(s, t): [] for s in systems for t in threads}
    for round_index in range(args.rounds):
        cells = [(s, t) for t in threads for s in systems]
        for system, count in cells if round_index % 2 == 0 else cells[::-1]:
            out = OUT / f"sampler-scaling-{system}-t{count}-{round_index}.json"
            python = sys.executable if system == "ours" else str(PEER_PYTHON)
            command = [python, __file__, "--worker", system, str(data), str(seeds), str(out),
                       "--fanouts", args.fanouts, "--threads", str(count), "--warmup", str(args.warmup)]
            runs[system, count].append(run_json(command, out, count))

    def ms(system: str, count: int) -> list[float]:  # each round's median time per batch
        return [statistics.median(run["seconds"]) * 1e3 for run in runs[system, count]]

    print(f"\n{data.name}: fanouts {args.fanouts}, batch {args.batch_size}, {args.batches} timed batches after "
          f"{args.warmup}, {args.rounds} rounds (ms per batch: median of the rounds' medians, range)\n")
    header = "| threads | ours, ms per batch | speed-up |" + (" DGL 2.1, ms per batch | speed-up | ours / DGL |"
                                                           if "dgl" in systems else "")
    print(header)
    print("|" + "---:|" * (header.count("|") - 1))
    base = {s: statistics.median(ms(s, threads[0])) for s in systems}
    for count in threads:
        row = []
        for system in systems:
            values = ms(system, count)
            median = statistics.median(values)
            row += [f"{median:.1f} ({min(values):.1f}-{max(values):.1f})", f"{base[system] / median:.2f}x"]
        if "dgl" in systems:
            row.append(f"{statistics.median(ms('ours', count)) / statistics.median(ms('dgl', count)):.2f}")
        print(f"| {count} | " + " | ".join(row) + " |")
    digests = {run["digest"] for count in threads for run in runs["ours", count]}
    print(f"\nours: the same neighbours at every thread count and round: {'yes' if len(digests) == 1 else 'NO'}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
