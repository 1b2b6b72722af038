"""Times three hot CPU kernels alone, one thread, the minimum over repetitions: the ReLU + keyed dropout
(20,000 x 128 float32), the host neighbour sampler (40 batches of 512 seeds, fanouts 10,5) and the feature
gather (50,000 rows of 100 from float32 and float16 storage, and float32 into bfloat16). Whole epochs spread
by +-10% on a shared machine; a kernel's minimum shows a change of a few percent. Compare two revisions by
running it with each one's ``src`` first on ``PYTHONPATH``, taking turns.

    NUMBA_NUM_THREADS=1 python bench/kernel_times.py --dataset bench/out/synthetic-n500000-...
"""

from __future__ import annotations

import argparse
import time

import numba
import numpy as np
import torch

from neutronorch.data import load_dataset
from neutronorch.nn.activation import relu_dropout
from neutronorch.sampling.kernels import gather_stored
from neutronorch.sampling.neighbor_sampler import NeighborSampler


def fastest(run, repeats: int, prepare=lambda: None) -> float:
    """The fewest milliseconds ``run(prepare())`` took."""
    best = float("inf")
    for _ in range(repeats):
        value = prepare()
        start = time.perf_counter()
        run(value)
        best = min(best, time.perf_counter() - start)
    return 1e3 * best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a dataset spec or folder (the sampler's graph)")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)

    ids, rows = torch.arange(20000), torch.randn(20000, 128)
    dropout = fastest(lambda y: relu_dropout(y, 0.5, True, ids), 10 * args.repeats, rows.clone)

    graph = load_dataset(args.dataset)
    sampler = NeighborSampler(graph.indptr, graph.indices, [10, 5])
    seeds = [np.sort(rng.choice(graph.num_nodes, 512, replace=False)) for _ in range(40)]
    sample = fastest(lambda _: [sampler.sample(s, 1000 + i) for i, s in enumerate(seeds)], args.repeats)

    source = rng.standard_normal((300000, 100)).astype(np.float32)
    picked, every = rng.integers(0, source.shape[0], 50000), np.empty(0, dtype=np.int64)
    gathers = {}
    for name, stored, dtype in (("float32", source, torch.float32), ("float16", source.astype(np.float16),
                                                                      torch.float32),
                                ("float32 into bfloat16", source, torch.bfloat16)):
        out = torch.empty((picked.shape[0], 100), dtype=dtype)
        gathers[name] = fastest(lambda _: gather_stored(stored, picked, every, out), 2 * args.repeats)
    print(f"relu + keyed dropout 20,000 x 128: {dropout:.3f} ms")
    print(f"host sampler, 40 batches of 512 seeds, fanouts 10,5: {sample:.1f} ms")
    print("gather of 50,000 rows of 100: " + ", ".join(f"{k} {v:.2f} ms" for k, v in gathers.items()))


if __name__ == "__main__":
    main()
