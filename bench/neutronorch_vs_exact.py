"""NeutronOrch mode against exact mode: epoch time, reuse and accuracy, side by side in one run.

Every configuration trains the same model on the same native-format graph in its own process; the runs
are interleaved (A B C ... A B C ...) so that a noisy machine affects all alike. Epoch times are medians
without each run's first epoch (JIT compilation, cold caches). Ratios are to exact mode in the same run.

    python bench/neutronorch_vs_exact.py                        # exact vs neutronorch at its defaults
    python bench/neutronorch_vs_exact.py --hot-ratio auto,0.01,0.05,0.1,0.2,0.4 --super-batch 8
    python bench/neutronorch_vs_exact.py --super-batch 4,8,16 --hot-ratio 0.1,0.4 --no-eval

Each value list makes a grid (super-batch x hot ratio x hot grad). With --no-eval no accuracy is measured
(no evaluation pass: timing only).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys

from common import OUT, add_graph_arguments, add_model_arguments, alternate, ensure_graph, steady_median


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_model_arguments(parser)
    parser.add_argument("--super-batch", default="default", help="comma-separated P values (default: package)")
    parser.add_argument("--hot-ratio", default="default", help="comma-separated ratios or auto (default: package)")
    parser.add_argument("--hot-grad", default="default", help="comma-separated stop/cpu (default: package)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is excluded)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the interleaved runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-eval", action="store_true", help="timing only: no evaluation pass")
    parser.add_argument("--out", default=None, help="write the table rows here (JSON)")
    args = parser.parse_args()

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    common = [sys.executable, "-m", "neutronorch", "train", "--dataset", str(data), "--model", args.model,
              "--fanouts", args.fanouts, "--hidden", str(args.hidden), "--batch-size", str(args.batch_size),
              "--epochs", str(args.epochs), "--lr", str(args.lr), "--dropout", str(args.dropout), "--seed", "0",
              "--device", "cpu", "--threads", str(args.threads), "--eval-every", "-1" if args.no_eval else "0",
              "--no-progress", "--overwrite"]
    systems = {"exact": lambda out: common + ["--mode", "exact", "--summary-json", str(out)]}
    grid = itertools.product(args.super_batch.split(","), args.hot_ratio.split(","), args.hot_grad.split(","))
    for p, ratio, grad in grid:
        options = []
        for flag, value in (("--super-batch", p), ("--hot-ratio", ratio), ("--hot-grad", grad)):
            if value != "default":
                options += [flag, value]
        name = "neutronorch" + "".join(f" {v}" for v in (f"P={p}", f"r={ratio}", grad) if "default" not in v)
        systems[name] = lambda out, options=options: common + ["--mode", "neutronorch", "--summary-json",
                                                               str(out)] + options

    results = alternate(systems, args.rounds, "neutronorch_vs_exact", args.threads)
    rows = []
    for name, runs in results.items():
        steady = [s for run in runs for s in [e["seconds"] for e in run["epochs"]][1:]]
        row = {"system": name, "epoch_s": statistics.median(steady),
               "per_run": [round(steady_median([e["seconds"] for e in r["epochs"]]), 2) for r in runs],
               "test_acc": (statistics.mean(r["test_acc"] for r in runs) if runs[0]["test_acc"] is not None
                            else None),
               "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
               "stages": _stage_groups([e for run in runs for e in run["epochs"][1:]])}
        if "hot" in runs[0]:
            last = runs[-1]
            row.update(super_batch=last["neutronorch"]["super_batch"], hot_grad=last["neutronorch"]["hot_grad"],
                       ratio=last["hot"]["ratio"], reuse_rate=last["hot"]["reuse_rate"],
                       uses=last["hot"]["uses_per_hot_embedding"], hot=last["hot"]["mean_hot_per_super_batch"],
                       staleness=last["staleness"], ratios=[e.get("hot_ratio") for e in last["epochs"]],
                       input_nodes=statistics.median(e["input_nodes_per_batch"] for e in last["epochs"]))
        else:
            row["input_nodes"] = statistics.median(e["input_nodes_per_batch"] for e in runs[-1]["epochs"])
        rows.append(row)
    exact = rows[0]["epoch_s"]

    print(f"\n{data.name}: model {args.model}, fanouts {args.fanouts}, hidden {args.hidden}, batch "
          f"{args.batch_size}, dropout {args.dropout}, {args.threads} threads, {args.epochs} epochs x "
          f"{args.rounds} rounds\n")
    print("| system | epoch s (median) | / exact | hot ratio (per epoch) | reuse rate | uses per hot row | "
          "hot per super-batch | input rows per batch | max staleness / bound | test acc | peak RSS MB | "
          "stages s/epoch |")
    print("|---|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---|")
    for r in rows:
        acc = "—" if r["test_acc"] is None else f"{r['test_acc']:.4f}"
        if "ratio" in r:
            hot = (f"{r['ratios']} | {r['reuse_rate']:.3f} | {r['uses']:.2f} | {r['hot']:.0f} | "
                   f"{r['input_nodes']:.0f} | {r['staleness']['max_observed']} / {r['staleness']['bound']}")
        else:
            hot = f"— | — | — | — | {r['input_nodes']:.0f} | —"
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stages"].items() if v >= 0.05)
        print(f"| {r['system']} | {r['epoch_s']:.2f} | {r['epoch_s'] / exact:.3f} | {hot} | {acc} | "
              f"{r['peak_rss_mb']:.0f} | {stages} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"graph": data.name, "args": vars(args), "rows": rows}, f, indent=2)
    print(f"\n(summaries under {OUT})", file=sys.stderr)
    return 0


def _stage_groups(epochs: list[dict]) -> dict[str, float]:
    """Median seconds per epoch of: training (trainer busy, without the hot gradient), device sampler
    (sample + gather + copy), host producer (hot selection, host sample / gather / compute), the hot
    gradient, and the trainer's wait for hot rows."""
    groups = {"train": ("forward", "backward", "step", "publish"), "sampler": ("sample", "gather", "copy"),
              "host": ("hot_select", "host_sample", "host_gather", "host_aggregate", "host_matmul", "host_compute",
                       "host_copy"),
              "wait_hot": ("wait_hot",), "hot_grad": ("hot_grad",)}
    if not epochs:
        return {}
    return {name: statistics.median(sum(e["stage_seconds"].get(k, 0.0) for k in keys) for e in epochs)
            for name, keys in groups.items()}


if __name__ == "__main__":
    sys.exit(main())
