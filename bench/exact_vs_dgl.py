"""Exact-mode epoch time and accuracy against DGL 2.1's classic CPU pipeline, side by side.

Both systems train the same model (same layers, widths, dropout, optimizer, fanouts, batch size) on the
same native-format graph, each in its own process, interleaved A B A B so that a noisy machine affects
both alike. The first epoch of every run is excluded from the medians (JIT compilation, cold caches).

    python bench/exact_vs_dgl.py                      # 1M vertices / 20M edges, 3-layer SAGE 15,10,5
    python bench/exact_vs_dgl.py --nodes 200000 --rounds 1 --epochs 2
    python bench/exact_vs_dgl.py --precisions fp32,bf16    # also neutronorch in bfloat16 (--precision bf16)

Without DGL (see bench/peers/README.md) only neutronorch runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import (PEER_PYTHON, ROOT, add_graph_arguments, add_model_arguments, alternate, dgl_available,
                    ensure_graph, steady_median)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_model_arguments(parser)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is excluded)")
    parser.add_argument("--rounds", type=int, default=2, help="A B rounds")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-dgl", action="store_true")
    parser.add_argument("--precisions", default="fp32",
                        help="neutronorch's precisions, comma-separated (fp32, bf16); one system each "
                             "(default: %(default)s)")
    args = parser.parse_args()

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    common = ["--model", args.model, "--fanouts", args.fanouts, "--hidden", str(args.hidden),
              "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--lr", str(args.lr),
              "--dropout", str(args.dropout), "--seed", "0"]
    def ours(precision: str):
        return lambda out: ([sys.executable, "-m", "neutronorch", "train", "--dataset", str(data), "--mode", "exact",
                             "--device", "cpu", "--threads", str(args.threads), "--eval-every", "0", "--no-progress",
                             "--precision", precision, "--overwrite", "--summary-json", str(out)] + common)

    systems = {"neutronorch-exact" + ("" if p == "fp32" else f"-{p}"): ours(p) for p in args.precisions.split(",")}
    if not args.no_dgl and dgl_available():
        systems["dgl-2.1"] = lambda out: (
            [str(PEER_PYTHON), str(ROOT / "bench" / "peers" / "dgl_train.py"), "--dataset", str(data),
             "--threads", str(args.threads), "--eval", "full", "--summary-json", str(out)] + common)
    else:
        print("DGL not available: running neutronorch only", file=sys.stderr)

    results = alternate(systems, args.rounds, "exact_vs_dgl", args.threads)

    rows = {}
    for name, runs in results.items():
        epochs = [e for run in runs for e in run["epochs"]]
        steady = [s for run in runs for s in [e["seconds"] for e in run["epochs"]][1:]] or \
            [e["seconds"] for e in epochs]
        stage_names = sorted({k for e in epochs for k in e["stage_seconds"]})
        rows[name] = {
            "median": statistics.median(steady),
            "per_run": [round(steady_median([e["seconds"] for e in r["epochs"]]), 2) for r in runs],
            "stages": {k: statistics.median(e["stage_seconds"].get(k, 0.0) for e in epochs) for k in stage_names},
            "test_acc": statistics.mean(r["test_acc"] for r in runs),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        }

    print(f"\n{data.name}: model {args.model}, fanouts {args.fanouts}, hidden {args.hidden}, batch "
          f"{args.batch_size}, dropout {args.dropout}, {args.threads} threads, {args.epochs} epochs x "
          f"{args.rounds} rounds\n")
    print("| system | epoch s (median) | per run | stages (median s per epoch) | test acc | peak RSS MB |")
    print("|---|---:|---|---|---:|---:|")
    for name, row in rows.items():
        stages = ", ".join(f"{k} {v:.1f}" for k, v in row["stages"].items() if v)
        print(f"| {name} | {row['median']:.2f} | {row['per_run']} | {stages} | {row['test_acc']:.4f} | "
              f"{row['peak_rss_mb']:.0f} |")
    ours_names = [name for name in rows if name.startswith("neutronorch")]
    print()
    if "dgl-2.1" in rows:
        for name in ours_names:
            print(f"epoch time ratio {name} / dgl-2.1 = {rows[name]['median'] / rows['dgl-2.1']['median']:.3f}")
    if "neutronorch-exact" in rows:
        for name in ours_names[1:]:
            print(f"epoch time ratio {name} / neutronorch-exact = "
                  f"{rows[name]['median'] / rows['neutronorch-exact']['median']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
