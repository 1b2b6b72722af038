"""What the stage instrumentation costs: epoch time with it on against off, side by side in one run.

"Off" runs the same command in a process where the span recorder and the utilisation sampler are replaced
by no-ops (nothing else changes). Runs alternate on/off (A B B A ...); epoch times are medians without
each run's first epoch.

    python bench/telemetry_overhead.py                      # exact mode on the 300k-vertex graph, 3 rounds
    python bench/telemetry_overhead.py --mode neutronorch --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, add_graph_arguments, add_model_arguments, alternate, ensure_graph, steady_median  # noqa: E402


def _child(argv: list[str]) -> int:
    """Run the CLI with the instrumentation replaced by no-ops."""
    from neutronorch.observe import Spans
    from neutronorch.train import trainer

    class _NoSpans(Spans):
        def add(self, stage, start, end, step=-1):
            pass

        def count(self, name, value):
            pass

    class _NoUtilisation:
        samples: list = []

        def __init__(self, device=None, interval=0.25):
            pass

        def take(self):
            return {"process_cores": 0.0, "process_share": 0.0, "machine_share": None, "gpu_percent": None}

        def close(self):
            pass

    trainer.Spans = _NoSpans
    trainer.Utilisation = _NoUtilisation
    from neutronorch.cli import main

    return main(argv)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_model_arguments(parser)
    parser.set_defaults(nodes=300_000)
    parser.add_argument("--mode", default="exact", choices=["exact", "neutronorch"])
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is excluded)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    data = ensure_graph(args.nodes, args.degree, args.features, args.classes)
    common = ["train", "--dataset", str(data), "--model", args.model, "--fanouts", args.fanouts,
              "--hidden", str(args.hidden), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
              "--lr", str(args.lr), "--dropout", str(args.dropout), "--device", "cpu", "--threads",
              str(args.threads), "--eval-every", "-1", "--no-progress", "--mode", args.mode]
    script = str(Path(__file__).resolve())
    systems = {
        "on": lambda out: [sys.executable, "-m", "neutronorch"] + common + ["--summary-json", str(out)],
        "off": lambda out: [sys.executable, script, "--child"] + common + ["--summary-json", str(out)],
    }
    results = alternate(systems, args.rounds, f"telemetry_overhead-{args.mode}", args.threads)
    medians = {name: [steady_median([e["seconds"] for e in run["epochs"]]) for run in runs]
               for name, runs in results.items()}
    on, off = statistics.median(medians["on"]), statistics.median(medians["off"])
    print(f"\n{data.name}: mode {args.mode}, {args.rounds} rounds of {args.epochs} epochs")
    print("| instrumentation | epoch s (median) | per run |")
    print("|---|---:|---|")
    for name in ("on", "off"):
        print(f"| {name} | {statistics.median(medians[name]):.3f} | "
              f"{', '.join(f'{x:.2f}' for x in medians[name])} |")
    print(f"\n**Overhead: on / off = {on / off:.4f}** ({100 * (on / off - 1):+.2f}%)")
    print(f"(summaries under {OUT})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2:]))
    sys.exit(main())
