#!/usr/bin/env python
"""Typed accuracy: relational models against the same GraphSAGE with the types ignored, on synthetic_typed.

``synthetic_typed`` labels a paper by the ordered pair (its fields' topic, its authors' institutions'
topic), and its features show both topics but not which is which, so only the relation a signal comes
through tells them apart (docs/heterogeneous.md). Each seed generates a graph with that seed and trains, with
that seed and the same settings:

- ``sage``, ``rgcn``, ``rgat``: ``neutronorch.train`` on the typed graph (exact mode, relations made two-way,
  learnable embeddings for the featureless author, institution and field types);
- with ``--modes exact,neutronorch``, each typed model also in NeutronOrch mode (``sage@neutronorch``: hot rows
  per type, ``--super-batch`` and ``--hot-ratio``), reported against the same model in exact mode with the
  share of bottom-layer rows it served hot and the largest staleness it used;
- ``blind-sage``: ``neutronorch.train`` with ``model="sage"`` on ``collapse(graph.with_reverse())``: the same
  vertices, edges and features as one homogeneous graph, one relation, featureless types as zero rows.

A run's accuracy is its test accuracy at its best-validation evaluation. Prints a markdown table of every
run and the medians over the seeds, then each typed model's median minus the type-blind one's:

    NUMBA_NUM_THREADS=1 .venv/bin/python bench/typed_accuracy.py --threads 1 --out bench/out/typed-accuracy.json
    NUMBA_NUM_THREADS=1 .venv/bin/python bench/typed_accuracy.py --threads 1 --models sage,rgcn,rgat \
        --modes exact,neutronorch
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path

from neutronorch import TrainConfig, train
from neutronorch.data import synthetic_typed
from neutronorch.data.typed import collapse

MODELS = ("sage", "rgcn", "rgat", "blind-sage")
BLIND = "blind-"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated subset of %(default)s")
    p.add_argument("--modes", default="exact", help="comma-separated: exact, neutronorch (default: %(default)s)")
    p.add_argument("--super-batch", type=int, default=8, help="NeutronOrch's P (default: %(default)s)")
    p.add_argument("--hot-ratio", default="auto", help="NeutronOrch's hot ratio (default: %(default)s)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=100_000, help="synthetic_typed vertices (default: %(default)s)")
    p.add_argument("--train", type=float, default=0.3, help="share of papers for training (default: %(default)s)")
    p.add_argument("--val", type=float, default=0.1, help="share of papers for validation (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=20, help="(default: %(default)s)")
    p.add_argument("--fanouts", default="10,10", help="every relation's, seed hop first (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--heads", type=int, default=4, help="R-GAT's heads (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=256, help="(default: %(default)s)")
    p.add_argument("--lr", type=float, default=0.003, help="(default: %(default)s)")
    p.add_argument("--dropout", type=float, default=0.5, help="(default: %(default)s)")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="(default: %(default)s)")
    p.add_argument("--eval-every", type=int, default=5, help="(default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="training threads; 0 = all cores")
    p.add_argument("--out", default=None, help="write every run's result here as JSON")
    args = p.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        p.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    if set(args.modes.split(",")) - {"exact", "neutronorch"}:
        p.error("--modes: exact and/or neutronorch")
    return args


def run(args, model: str, seed: int, graph) -> dict:
    name, _, mode = model.partition("@")
    orch = dict(super_batch=args.super_batch, hot_ratio=args.hot_ratio) if mode == "neutronorch" else {}
    config = TrainConfig(model=name.removeprefix(BLIND), mode=mode or "exact", **orch, epochs=args.epochs, fanouts=args.fanouts,
                         hidden=args.hidden, heads=args.heads, batch_size=args.batch_size, lr=args.lr,
                         dropout=args.dropout, weight_decay=args.weight_decay, eval_every=args.eval_every,
                         threads=args.threads, seed=seed, device="cpu")
    t0 = time.perf_counter()
    summary = train(config, graph=graph)
    return {"model": model, "seed": seed, "test_acc": summary["test_acc"], "val_acc": summary["val_acc"],
            "best_epoch": summary["best_epoch"], "seconds": round(time.perf_counter() - t0, 1),
            "epoch_seconds_median": summary["epoch_seconds_median"], "graph": summary["dataset"]["name"],
            "hot_share": summary.get("hot", {}).get("reuse_rate"),
            "staleness_max": summary.get("staleness", {}).get("max_observed")}


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.getLogger("neutronorch").setLevel(logging.ERROR)  # the graph's note and the epoch lines
    seeds = [int(s) for s in args.seeds.split(",")]
    models = [f"{m}@neutronorch" if mode == "neutronorch" else m for m in args.models.split(",")
              for mode in args.modes.split(",") if mode == "exact" or not m.startswith(BLIND)]
    results = []
    for seed in seeds:
        typed = synthetic_typed(nodes=args.nodes, train=args.train, val=args.val, seed=seed)
        blind = collapse(typed.with_reverse()) if any(m.startswith(BLIND) for m in models) else None
        for model in models:
            result = run(args, model, seed, blind if model.startswith(BLIND) else typed)
            print(f"  {model:<10} seed {seed}: test {result['test_acc']:.4f} (best epoch {result['best_epoch']}), "
                  f"{result['seconds']:.1f}s", flush=True)
            results.append(result)
    print(f"\nsynthetic_typed nodes={args.nodes} train={args.train} val={args.val}; epochs {args.epochs}, fanouts "
          f"{args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, lr {args.lr}, dropout {args.dropout}, "
          f"weight decay {args.weight_decay}\n")
    print("| model | " + " | ".join(f"seed {s}" for s in seeds) + " | median | seconds (median) |")
    print("|---|" + "---|" * (len(seeds) + 2))
    medians = {}
    for model in models:
        mine = [r for r in results if r["model"] == model]
        medians[model] = statistics.median(r["test_acc"] for r in mine)
        print(f"| {model} | " + " | ".join(f"{r['test_acc']:.4f}" for r in mine)
              + f" | {medians[model]:.4f} | {statistics.median(r['seconds'] for r in mine):.1f} |")
    blind_models = [m for m in models if m.startswith(BLIND)]
    print()
    for model in (m for m in models if m.endswith("@neutronorch") and m.split("@")[0] in medians):
        mine = [r for r in results if r["model"] == model]
        print(f"{model} - {model.split('@')[0]}: {100 * (medians[model] - medians[model.split('@')[0]]):+.2f} points "
              f"(rows served hot: {statistics.median(r['hot_share'] or 0 for r in mine):.3f}, largest staleness "
              f"{max(r['staleness_max'] or 0 for r in mine)} steps)")
    if blind_models:
        print()
        for model in (m for m in models if not m.startswith(BLIND)):
            reference = BLIND + "sage" if BLIND + "sage" in medians else blind_models[0]
            print(f"{model} - {reference}: {100 * (medians[model] - medians[reference]):+.1f} points")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results, "medians": medians}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
