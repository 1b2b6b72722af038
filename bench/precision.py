"""Training precision: float32 against bfloat16 (``--precision bf16``), side by side.

For every mode in --modes, the same model trains on the same native-format graph in fp32 and in bf16, each
run in its own process, interleaved (fp32 bf16, bf16 fp32, ...) so that a noisy machine affects both alike.
The first epoch of every run is excluded from its median (JIT compilation, cold caches). The table gives per
mode and precision the median steady epoch time, each run's, the stage seconds of the median run, feature
bytes gathered per epoch, test accuracy and peak RSS; then bf16 / fp32 epoch time and the accuracy
difference per mode, with the issue's targets for exact mode (bf16 at most 0.6x the fp32 epoch time,
accuracy within 0.5 point).

    python bench/precision.py                          # 1M vertices / 20M edges, 3-layer SAGE 15,10,5
    python bench/precision.py --nodes 50000 --degree 10 --epochs 2 --rounds 1 --modes exact,neutronorch

Accuracy on the real graphs, fp32 against bf16 over seeds: bench/accuracy.py --precisions fp32,bf16.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from common import add_graph_arguments, add_model_arguments, alternate, ensure_graph, steady_median

PRECISIONS = ("fp32", "bf16")
TARGET_RATIO = 0.6  # exact mode: bf16 epoch time at most this fraction of fp32's
TARGET_POINTS = 0.5  # test accuracy: bf16 at most this many points below fp32


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_model_arguments(parser)
    parser.add_argument("--modes", default="exact", help="comma-separated modes (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per run (the first is excluded)")
    parser.add_argument("--rounds", type=int, default=2, help="fp32 / bf16 rounds")
    parser.add_argument("--threads", type=int, default=0, help="training threads; 0 = all cores")
    parser.add_argument("--sampler-threads", type=int, default=0, help="sampler threads; 0 = half the cores")
    parser.add_argument("--device", default="cpu", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args()
    modes = args.modes.split(",")

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    common = ["--dataset", str(data), "--model", args.model, "--fanouts", args.fanouts, "--hidden",
              str(args.hidden), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--lr",
              str(args.lr), "--dropout", str(args.dropout), "--seed", "0", "--device", args.device,
              "--threads", str(args.threads), "--sampler-threads", str(args.sampler_threads),
              "--eval-every", "0", "--no-progress", "--overwrite"]

    def command(mode: str, precision: str):
        return lambda out: ([sys.executable, "-m", "neutronorch", "train", "--mode", mode, "--precision",
                             precision, "--summary-json", str(out)] + common)

    rows = {}
    for mode in modes:
        systems = {precision: command(mode, precision) for precision in PRECISIONS}
        results = alternate(systems, args.rounds, f"precision-{mode}", args.threads)
        for precision, runs in results.items():
            per_run = [steady_median([e["seconds"] for e in r["epochs"]]) for r in runs]
            median = statistics.median(per_run)
            middle = runs[min(range(len(runs)), key=lambda i: abs(per_run[i] - median))]
            steady = middle["epochs"][1:] or middle["epochs"]
            stage_names = list(dict.fromkeys(k for e in steady for k in e["stage_seconds"]))
            rows[mode, precision] = {
                "resolved": {r["precision"]["name"] for r in runs},
                "reason": runs[0]["precision"]["reason"],
                "median": median,
                "per_run": [round(s, 2) for s in per_run],
                "stages": {k: statistics.median(e["stage_seconds"].get(k, 0.0) for e in steady)
                           for k in stage_names},
                "feature_mib": statistics.median(e["moved"]["feature_bytes"] for r in runs
                                                 for e in r["epochs"]) / 2**20,
                "test_acc": statistics.mean(r["test_acc"] for r in runs),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
            }

    print(f"\n{data.name}: model {args.model}, fanouts {args.fanouts}, hidden {args.hidden}, batch "
          f"{args.batch_size}, dropout {args.dropout}, device {args.device}, {args.threads or 'all'} threads, "
          f"{args.epochs} epochs x {args.rounds} rounds\n")
    for (mode, precision), row in rows.items():
        if precision == "bf16":
            print(f"{mode} bf16: {row['reason']}")
    print()
    print("| mode | precision | epoch s (median) | per run | stages of the median run (median s per epoch) | "
          "feature MiB / epoch | test acc | peak RSS MB |")
    print("|---|---|---:|---|---|---:|---:|---:|")
    for (mode, precision), row in rows.items():
        stages = ", ".join(f"{k} {v:.2f}" for k, v in row["stages"].items() if v)
        name = precision if row["resolved"] == {precision} else f"{precision} (ran {'/'.join(row['resolved'])})"
        print(f"| {mode} | {name} | {row['median']:.2f} | {row['per_run']} | {stages} | {row['feature_mib']:,.0f} | "
              f"{row['test_acc']:.4f} | {row['peak_rss_mb']:.0f} |")

    print("\n| mode | epoch time bf16 / fp32 | feature bytes bf16 / fp32 | test acc bf16 - fp32 (points) |")
    print("|---|---:|---:|---:|")
    verdicts = []
    for mode in modes:
        a, b = rows[mode, "fp32"], rows[mode, "bf16"]
        ratio = b["median"] / a["median"]
        points = 100 * (b["test_acc"] - a["test_acc"])
        byte_ratio = b["feature_mib"] / a["feature_mib"] if a["feature_mib"] else float("nan")
        print(f"| {mode} | {ratio:.3f} | {byte_ratio:.3f} | {points:+.2f} |")
        if mode == "exact":
            verdicts += [(f"exact bf16 / fp32 epoch time {ratio:.3f} <= {TARGET_RATIO}", ratio <= TARGET_RATIO),
                         (f"exact bf16 test accuracy {points:+.2f} points from fp32 (at most {TARGET_POINTS} below)",
                          points >= -TARGET_POINTS)]
    if verdicts:
        print()
        for text, ok in verdicts:
            print(f"{'PASS' if ok else 'FAIL'}: {text}")
    return 0 if all(ok for _, ok in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
