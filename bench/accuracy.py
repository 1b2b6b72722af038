#!/usr/bin/env python
"""Accuracy benchmark: test accuracy of GCN / GraphSAGE / GAT on real graphs against published targets.

Runs every (dataset, model) pair that has a target, for several seeds, through ``neutronorch.train``
(exact mode, full-neighbour evaluation every epoch; the accuracy of a run is its test accuracy at the
best-validation epoch), and prints a markdown table:

    .venv/bin/python bench/accuracy.py --threads 1 --sampler-threads 1 --out bench/out/accuracy.json

--modes exact,neutronorch compares two modes (the second within 1 point of the first), --precisions fp32,bf16
two precisions (bf16 within 0.5 point of fp32), each on every dataset x model x seed.

Datasets are read from --datasets-root (default ../shared/datasets next to the repository); missing ones
are skipped with a message. Every run uses the package's defaults (``TrainConfig``; docs/accuracy.md says
how they were chosen) except where a flag overrides one; --batch-size 0 is the package's rule
min(1024, max(32, training seeds // 32)).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from neutronorch import TrainConfig, load_dataset, train

REPO = Path(__file__).resolve().parents[1]

# name: (path under the datasets root, split for data without one, {model: target test score})
DATASETS = {
    "cora": ("cora", None, {"gcn": 0.79, "sage": 0.795, "gat": 0.81}),
    "citeseer": ("citeseer", None, {"gcn": 0.68, "sage": 0.683, "gat": 0.705}),
    "amazon_computers": ("amazon_computers/amazon_cs.npz", "ratio:0.6,0.2", {"sage": 0.88}),
    # 1 point below Shchur et al. (2018): GraphSAGE-mean 91.4, GCN 91.2 (their split: 20 labels per class).
    "amazon_photo": ("amazon_photo/amazon_photo.npz", "ratio:0.6,0.2", {"sage": 0.904, "gcn": 0.902}),
    # ROC-AUC, 1 point below Platonov et al. (ICLR 2023): GCN 83.64, SAGE 82.43, GAT 83.70 / 89.75, 93.51, 92.01.
    "tolokers": ("tolokers/tolokers.npz", None, {"gcn": 0.8264, "sage": 0.8143, "gat": 0.8270}),
    "minesweeper": ("minesweeper/minesweeper.npz", None, {"gcn": 0.8875, "sage": 0.9251, "gat": 0.9101}),
}
# Datasets that store their splits: each "seed" s runs on stored split s (with seed s), as their papers
# report the mean over the stored splits.
STORED_SPLITS = {"tolokers", "minesweeper"}
MODELS = ("gcn", "sage", "gat")

# The settings a run takes from the package defaults unless a flag overrides them.
DEFAULTS = TrainConfig(task="node").validate()  # the settings a node task resolves to
SETTINGS = {key: getattr(DEFAULTS, key) for key in
            ("fanouts", "hidden", "heads", "gcn_norm", "batch_size", "epochs", "lr", "weight_decay", "dropout")}
SETTINGS["fanouts"] = ",".join(map(str, SETTINGS["fanouts"]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated subset of %(default)s")
    p.add_argument("--models", default=None,
                   help="comma-separated models (default: each dataset's models that have a target); "
                        "given explicitly, every listed model runs on every dataset")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default: %(default)s)")
    p.add_argument("--datasets-root", default=str(REPO / ".." / "shared" / "datasets"))
    for key, value in SETTINGS.items():
        p.add_argument("--" + key.replace("_", "-"), default=value, type=type(value), help=f"(default: {value})")
    p.add_argument("--residual", action="store_true", help="skip connections (the package's --residual)")
    p.add_argument("--norm", default="none", help="normalisation between layers (default: %(default)s)")
    p.add_argument("--layers", type=int, default=0, help="layers; 0 = one per fanout (default: %(default)s)")
    p.add_argument("--architecture", default="plain", help="plain or blocks (default: %(default)s)")
    p.add_argument("--modes", default="exact",
                   help="comma-separated modes; with two, the table shows both and their difference "
                        "(default: %(default)s)")
    p.add_argument("--precisions", default="fp32",
                   help="comma-separated precisions (fp32, bf16, auto); with two, the table shows both and their "
                        "difference (default: %(default)s)")
    for key in ("super_batch", "hot_ratio", "staleness_bound", "hot_grad", "device_sampling"):
        p.add_argument("--" + key.replace("_", "-"), default=None,
                       help=f"neutronorch mode's {key} (default: the package's, {getattr(DEFAULTS, key)})")
    p.add_argument("--threads", type=int, default=0, help="training threads; 0 = all cores")
    p.add_argument("--sampler-threads", type=int, default=0, help="sampler threads; 0 = half the cores")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--out", default=None, help="write every run's result and the table rows here (JSON)")
    p.add_argument("--verbose", action="store_true", help="show the trainer's per-epoch lines")
    return p.parse_args(argv)


def run_pair(args, graphs, model: str, seeds: list[int], mode: str = "exact", precision: str = "fp32") -> list[dict]:
    """``graphs(seed)``: the graph a seed's run trains on (one per stored split, or the same one)."""
    runs = []
    extra = {}
    if mode == "neutronorch":
        for key, cast in (("super_batch", int), ("hot_ratio", str), ("staleness_bound", int), ("hot_grad", str),
                          ("device_sampling", str)):
            if getattr(args, key) is not None:
                extra[key] = cast(getattr(args, key))
    for seed in seeds:
        graph = graphs(seed)
        config = TrainConfig(model=model, fanouts=args.fanouts, hidden=args.hidden, heads=args.heads,
                             gcn_norm=args.gcn_norm, residual=args.residual, norm=args.norm, layers=args.layers,
                             architecture=args.architecture, batch_size=args.batch_size, epochs=args.epochs, lr=args.lr,
                             weight_decay=args.weight_decay, dropout=args.dropout, seed=seed, device=args.device,
                             threads=args.threads, sampler_threads=args.sampler_threads, progress=False,
                             mode=mode, precision=precision, **extra)
        quiet = contextlib.nullcontext() if args.verbose else contextlib.redirect_stderr(io.StringIO())
        t0 = time.perf_counter()
        with quiet:
            summary = train(config, graph=graph)
        batch = summary["config"]["batch_size"]  # resolved by the package when 0
        runs.append({"seed": seed, "batch_size": batch, "test_acc": summary["test_acc"],
                     "val_acc": summary["val_acc"], "best_epoch": summary["best_epoch"],
                     "final_test_acc": summary["final_test_acc"],
                     "epoch_seconds_median": summary["epoch_seconds_median"],
                     "wall_seconds": round(time.perf_counter() - t0, 2)})
        if mode == "neutronorch":
            runs[-1].update(hot=summary["hot"], staleness=summary["staleness"])
        if args.precisions != "fp32":
            runs[-1]["precision"] = summary["precision"]
        label = mode if args.precisions == "fp32" else f"{mode} {precision}"
        print(f"  {graph.name} {label} {model} seed {seed}: test {summary['test_acc']:.4f} (best epoch "
              f"{summary['best_epoch']}, batch {batch})", file=sys.stderr, flush=True)
    return runs


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.verbose:  # the trainer logs its per-epoch lines at INFO; nothing shows them without a handler
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger("neutronorch").addHandler(handler)
        logging.getLogger("neutronorch").setLevel(logging.INFO)
    root = Path(args.datasets_root)
    seeds = [int(s) for s in args.seeds.split(",")]
    names = args.datasets.split(",")
    modes = args.modes.split(",")
    precisions = args.precisions.split(",")
    if not 1 <= len(modes) <= 2:
        sys.exit("--modes: give one mode, or two to compare")
    if not 1 <= len(precisions) <= 2:
        sys.exit("--precisions: give one precision, or two to compare")
    if len(modes) == 2 and len(precisions) == 2:
        sys.exit("compare two modes or two precisions, not both at once")
    for precision in precisions:
        if precision not in ("fp32", "bf16", "auto"):
            sys.exit(f"unknown precision {precision!r}; choose from fp32, bf16, auto")
    for name in names:
        if name not in DATASETS:
            sys.exit(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
    rows = []
    for name in names:
        rel, split, targets = DATASETS[name]
        path = root / rel
        if not path.exists():
            print(f"skipping {name}: {path} not found", file=sys.stderr)
            continue
        if name in STORED_SPLITS:
            by_split = {s: load_dataset(str(path), split, 0, split_index=s) for s in seeds}
            graphs = by_split.__getitem__
        else:
            # One load per dataset: a ratio split is drawn once (seed 0); seeds vary init, order and sampling.
            graph = load_dataset(str(path), split, 0)
            graphs = lambda seed, graph=graph: graph  # noqa: E731
        models = args.models.split(",") if args.models else [m for m in MODELS if m in targets]
        for model in models:
            for mode in modes:
                for precision in precisions:
                    runs = run_pair(args, graphs, model, seeds, mode, precision)
                    accs = [r["test_acc"] for r in runs]
                    mean = statistics.mean(accs)
                    target = targets.get(model)
                    row = {"dataset": name, "model": model, "mode": mode, "mean": mean,
                           "std": statistics.stdev(accs) if len(accs) > 1 else 0.0, "target": target,
                           "pass": None if target is None else mean >= target,
                           "epoch_seconds": statistics.median(r["epoch_seconds_median"] for r in runs),
                           "runs": runs}
                    if args.precisions != "fp32":
                        row["precision"] = precision
                    rows.append(row)

    if not rows:
        print("no dataset found; nothing to report", file=sys.stderr)
        return 1
    if len(modes) == 2:
        return _compare(args, rows, "mode", modes, seeds, 1.0)
    if len(precisions) == 2:
        return _compare(args, rows, "precision", precisions, seeds, 0.5)
    print(f"| dataset | model | test score % (mean ± std over {len(seeds)} seeds or stored splits; accuracy, "
          f"ROC-AUC for tolokers and minesweeper) | target | pass | median epoch time |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        target = "—" if r["target"] is None else f"{100 * r['target']:.1f}"
        verdict = "—" if r["pass"] is None else ("pass" if r["pass"] else "FAIL")
        print(f"| {r['dataset']} | {r['model']} | {100 * r['mean']:.1f} ± {100 * r['std']:.1f} | {target} | "
              f"{verdict} | {r['epoch_seconds']:.3f} s |")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        settings = {k: getattr(args, k) for k in (*SETTINGS, "residual", "norm", "layers", "architecture", "seeds",
                                                  "threads", "sampler_threads", "device")}
        out.write_text(json.dumps({"settings": settings, "rows": rows}, indent=2) + "\n")
    return 0 if all(r["pass"] is not False for r in rows) else 1


def _compare(args, rows, key, values, seeds, points) -> int:
    """Two modes (``key`` "mode") or precisions ("precision") side by side; a pair passes when the second's
    mean is at most ``points`` below the first's."""
    first, second = values
    by_key = {(r["dataset"], r["model"], r[key]): r for r in rows}
    pairs = []
    print(f"| dataset | model | {first} % | {second} % | difference (points) | within {points:g} point | "
          f"epoch time {first} / {second} |")
    print("|---|---|---|---|---|---|---|")
    for (dataset, model, value), a in by_key.items():
        if value != first:
            continue
        b = by_key[(dataset, model, second)]
        diff = 100 * (b["mean"] - a["mean"])
        ok = diff >= -points
        pairs.append(ok)
        print(f"| {dataset} | {model} | {100 * a['mean']:.1f} ± {100 * a['std']:.1f} | "
              f"{100 * b['mean']:.1f} ± {100 * b['std']:.1f} | {diff:+.1f} | {'pass' if ok else 'FAIL'} | "
              f"{a['epoch_seconds']:.3f} / {b['epoch_seconds']:.3f} s |")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({key + "s": values, "seeds": seeds, "rows": rows}, indent=2) + "\n")
    return 0 if all(pairs) else 1


if __name__ == "__main__":
    sys.exit(main())
