#!/usr/bin/env python
"""NeutronOrch's accuracy on a link task at fixed settings, against exact mode: one training run per call.

    python bench/link_hot_ratio.py --graph amazon_photo --mode neutronorch --hot-ratio 0.28 --super-batch 8
    python bench/link_hot_ratio.py --graph amazon_photo --mode exact

The graph and split are those of ``bench/link_vs_pyg.py`` (``bench/out/link-split-<graph>-s0.npz``, written
there on its first run; features scaled as its preset says), the model and training its defaults: 2-layer
GraphSAGE-mean, hidden 128, dropout 0.3, dot head, one negative per positive, batch 1024, Adam lr 0.005
without weight decay, the preset's epochs. Prints one JSON line: the test and validation MRR, the epoch losses
and the summary's ``hot`` section (the reuse rate and what was hot).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from link_vs_pyg import DATASETS_ROOT, OUT, PRESETS, prepared_graph  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", default="amazon_photo", help="a graph of bench/link_vs_pyg.py (default: %(default)s)")
    p.add_argument("--mode", default="neutronorch", choices=["exact", "device", "neutronorch"])
    p.add_argument("--hot-ratio", default="auto")
    p.add_argument("--super-batch", type=int, default=8)
    p.add_argument("--staleness-bound", type=int, default=None)
    p.add_argument("--hot-grad", default="cpu", choices=["cpu", "stop"])
    p.add_argument("--epochs", type=int, default=0, help="0: the graph's preset (default: %(default)s)")
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--datasets-root", default=str(DATASETS_ROOT))
    args = p.parse_args(argv)

    import torch

    from neutronorch import TrainConfig, train

    torch.set_num_threads(args.threads)
    preset = PRESETS.get(args.graph, {})
    split = OUT / f"link-split-{args.graph}-s0.npz"
    if not split.is_file():
        raise SystemExit(f"{split}: run bench/link_vs_pyg.py --datasets {args.graph} once to write the split")
    root = Path(args.datasets_root) / args.graph
    files = sorted(root.glob("*.npz"))
    spec = str(files[0] if files else root)
    options = types.SimpleNamespace(max_batches=0, eval_edges=0, feature_norm=preset.get("feature_norm", "none"),
                                    batch_size=1024)
    graph = prepared_graph(spec, split, options)
    neutronorch = dict(hot_ratio=args.hot_ratio if args.hot_ratio == "auto" else float(args.hot_ratio),
                       super_batch=args.super_batch, staleness_bound=args.staleness_bound, hot_grad=args.hot_grad)
    config = TrainConfig(dataset=graph.name, task="link", model="sage", fanouts=[10, 10], hidden=128, batch_size=1024,
                         negatives=1, link_head="dot", epochs=args.epochs or preset.get("epochs", 10), lr=args.lr,
                         dropout=0.3, weight_decay=0.0, eval_negatives=100, eval_every=0, mode=args.mode,
                         seed=args.seed, threads=args.threads, progress=False,
                         **(neutronorch if args.mode == "neutronorch" else {}))
    t0 = time.perf_counter()
    summary = train(config, graph=graph)
    final = summary["link"]["final"]
    hot = {k: v for k, v in (summary.get("hot") or {}).items() if not isinstance(v, (list, dict))}
    print(json.dumps({"graph": args.graph, "mode": args.mode, **({k: v for k, v in neutronorch.items()}
                                                                  if args.mode == "neutronorch" else {}),
                      "seed": args.seed, "test_mrr": final.get("test_mrr"), "val_mrr": final.get("val_mrr"),
                      "losses": [round(e["train_loss"], 4) for e in summary["epochs"]], "hot": hot,
                      "seconds": round(time.perf_counter() - t0, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
