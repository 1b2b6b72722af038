#!/usr/bin/env python
"""Your own model's accuracy: PyG's GraphSAGE trained through ``train(model=...)`` against the same model
trained by PyG, on real graphs, several seeds, in one run.

    .venv/bin/python bench/own_model_accuracy.py                       # cora and amazon_computers, seeds 0-2
    .venv/bin/python bench/own_model_accuracy.py --datasets cora --seeds 0,1,2,3,4 --out bench/out/own.json

neutronorch's side: exact mode with the package's defaults (fanouts 10,10, hidden 256, Adam lr 0.003,
weight decay 5e-3, 50 epochs, batch size by the package's rule; dropout 0.7 inside the PyG model); the test
accuracy of a run is the one at its best-validation epoch. PyG's side: the same model class and width
trained full-batch by PyG's standard recipe (200 epochs, Adam lr 0.01, weight decay 5e-4, dropout 0.5),
also scored at the best-validation epoch; full-batch because PyG's sampled loader needs extensions that do
not install from the package registry. Both train on the same graph and split. Datasets are read from
--datasets-root (default ../shared/datasets next to the repository).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

from neutronorch import TrainConfig, load_dataset, train

REPO = Path(__file__).resolve().parents[1]
DATASETS = {"cora": ("cora", None), "citeseer": ("citeseer", None),
            "amazon_computers": ("amazon_computers/amazon_cs.npz", "ratio:0.6,0.2")}


def pyg_full_batch(graph, seed: int, hidden: int, epochs: int) -> float:
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(seed)
    x = torch.from_numpy(np.asarray(graph.features, dtype=np.float32))
    y = torch.from_numpy(np.asarray(graph.labels)).long()
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    edge_index = torch.from_numpy(np.stack([np.asarray(graph.indices, dtype=np.int64), dst]))
    train_idx, val_idx, test_idx = (torch.from_numpy(np.asarray(i, dtype=np.int64))
                                    for i in (graph.train_idx, graph.val_idx, graph.test_idx))
    model = GraphSAGE(graph.feature_dim, hidden, 2, graph.num_classes, dropout=0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, best_test = -1.0, 0.0
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x, edge_index)[train_idx], y[train_idx])
        loss.backward()
        optimizer.step()
        model.eval()
        with torch.no_grad():
            predicted = model(x, edge_index).argmax(1)
        val = float((predicted[val_idx] == y[val_idx]).float().mean())
        if val > best_val:
            best_val, best_test = val, float((predicted[test_idx] == y[test_idx]).float().mean())
    return best_test


def ours(graph, seed: int, hidden: int) -> tuple[float, float]:
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(seed)
    defaults = TrainConfig().validate()  # a node task's
    model = GraphSAGE(graph.feature_dim, hidden, 2, graph.num_classes, dropout=defaults.dropout)
    with contextlib.redirect_stderr(io.StringIO()):
        summary = train(TrainConfig(seed=seed, hidden=hidden, progress=False), graph=graph, model=model)
    return summary["test_acc"], summary["epoch_seconds_median"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="cora,amazon_computers", help=f"comma-separated, of {', '.join(DATASETS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--pyg-epochs", type=int, default=200)
    p.add_argument("--datasets-root", default=str(REPO / ".." / "shared" / "datasets"))
    p.add_argument("--out", default=None, help="write every run's result here (JSON)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows, results = [], {}
    for name in args.datasets.split(","):
        relative, split = DATASETS[name]
        path = Path(args.datasets_root) / relative
        if not path.exists():
            print(f"{name}: {path} not found, skipped", file=sys.stderr)
            continue
        mine, theirs, seconds = [], [], []
        for seed in seeds:
            graph = load_dataset(str(path), split, seed)
            t0 = time.perf_counter()
            acc, epoch_s = ours(graph, seed, args.hidden)
            mine.append(acc)
            seconds.append(epoch_s)
            theirs.append(pyg_full_batch(graph, seed, args.hidden, args.pyg_epochs))
            print(f"  {name} seed {seed}: train(model=GraphSAGE) {mine[-1]:.4f}, PyG full-batch {theirs[-1]:.4f} "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        results[name] = {"ours": mine, "pyg": theirs, "epoch_seconds": seconds}
        diff = 100 * (statistics.mean(mine) - statistics.mean(theirs))
        rows.append(f"| {name} | {100 * statistics.mean(mine):.1f} ± {100 * statistics.pstdev(mine):.1f} | "
                    f"{100 * statistics.mean(theirs):.1f} ± {100 * statistics.pstdev(theirs):.1f} | {diff:+.1f} | "
                    f"{'pass' if diff >= -1.0 else 'FAIL'} | {statistics.median(seconds):.2f} s |")
    print("| dataset | train(model=GraphSAGE) test acc % | PyG full-batch % | difference | within 1 point | "
          "our epoch |")
    print("|---|---:|---:|---:|---|---:|")
    print("\n".join(rows))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
