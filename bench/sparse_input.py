"""Mostly-zero feature rows multiplied through their nonzeros (``nn/sparse_input.py``) against the dense
product, alone and in whole link-prediction epochs.

    python bench/sparse_input.py                      # products at several densities, then Cora and CiteSeer
    python bench/sparse_input.py --graphs none        # products only

Products: rows x width (default Cora's, 2,700 x 1,433) by a width x 128 weight, forward and the weight's
gradient, each median of ``--repeats`` timings taken in turns. Epochs: the link training of
``bench/link_vs_pyg.py`` on its split (``bench/out/link-split-<graph>-s0.npz``, written by that script's first
run), exact mode, fp32, 2 threads, the same run with the nonzeros path on and off (``MAX_DENSITY`` set below
any density), alternately ``--rounds`` times; the median epoch of each run, then the median over rounds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def products(rows: int, width: int, densities: list[float], repeats: int) -> None:
    import torch
    from torch.nn import functional as F

    from neutronorch.nn import sparse_input

    print(f"products: {rows} x {width} rows by a {width} x 128 weight, forward and weight gradient (ms)")
    print(f"{'density':>8} {'dense':>8} {'nonzeros':>9} {'ratio':>6}")
    for density in densities:
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(rows, width, generator=g) < density) * torch.rand(rows, width, generator=g)
        w = torch.randn(128, width, requires_grad=True)
        grad = torch.randn(rows, 128)
        sides = {"dense": lambda: F.linear(x, w).backward(grad),
                 "nonzeros": lambda: sparse_input._SparseRowsProduct.apply(x, None, w).backward(grad)}
        times = {name: [] for name in sides}
        for fn in sides.values():
            fn()  # compile and warm
        for _ in range(repeats):
            for name, fn in sides.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        dense, sparse = (statistics.median(times[k]) * 1e3 for k in ("dense", "nonzeros"))
        print(f"{density:>8.4f} {dense:>8.2f} {sparse:>9.2f} {sparse / dense:>6.2f}")


def epochs(graph_name: str, rounds: int, num_epochs: int, root: str) -> None:
    import torch

    from link_vs_pyg import OUT, PRESETS, prepared_graph
    from neutronorch import TrainConfig, train
    from neutronorch.nn import sparse_input

    torch.set_num_threads(2)
    split = OUT / f"link-split-{graph_name}-s0.npz"
    if not split.is_file():
        raise SystemExit(f"{split}: run bench/link_vs_pyg.py --datasets {graph_name} once to write the split")
    preset = PRESETS.get(graph_name, {})
    options = types.SimpleNamespace(max_batches=0, eval_edges=0, feature_norm=preset.get("feature_norm", "none"),
                                    batch_size=1024)
    graph = prepared_graph(str(Path(root) / graph_name), split, options)
    config = TrainConfig(dataset=graph.name, task="link", model="sage", fanouts=[10, 10], hidden=128,
                         batch_size=1024, negatives=1, link_head="dot", epochs=num_epochs, lr=0.005, dropout=0.3,
                         weight_decay=0.0, eval_negatives=100, eval_every=0, mode="exact", seed=0, threads=2,
                         progress=False)
    limit = sparse_input.MAX_DENSITY
    runs = {"dense": [], "nonzeros": []}
    mrr = {}
    for r in range(rounds):
        for name in (("dense", "nonzeros") if r % 2 == 0 else ("nonzeros", "dense")):
            sparse_input.MAX_DENSITY = limit if name == "nonzeros" else -1.0
            summary = train(config, graph=graph)
            runs[name].append(statistics.median(e["seconds"] for e in summary["epochs"]))
            mrr[name] = summary["link"]["final"]["test_mrr"]
    sparse_input.MAX_DENSITY = limit
    dense, sparse = (statistics.median(runs[k]) for k in ("dense", "nonzeros"))
    print(f"{graph_name}: median epoch dense {dense:.4f} s, nonzeros {sparse:.4f} s, ratio {sparse / dense:.3f}; "
          f"test MRR {mrr['dense']:.4f} / {mrr['nonzeros']:.4f} ({rounds} runs each, {num_epochs} epochs)")


def main(argv=None) -> int:
    from link_vs_pyg import DATASETS_ROOT

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=2700)
    p.add_argument("--width", type=int, default=1433)
    p.add_argument("--densities", default="0.0085,0.013,0.03,0.05,0.08,0.12")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--graphs", default="cora,citeseer", help="link-split graphs, or none")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--datasets-root", default=str(DATASETS_ROOT))
    args = p.parse_args(argv)
    products(args.rows, args.width, [float(d) for d in args.densities.split(",")], args.repeats)
    if args.graphs != "none":
        for name in args.graphs.split(","):
            epochs(name, args.rounds, args.epochs, args.datasets_root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
