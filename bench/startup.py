"""Time to the first training step of the default demo, from the run's own summary.

Runs ``python -m neutronorch train --epochs 1 --eval-every -1 --no-progress --summary-json F`` (the
default synthetic graph, exact mode) ``--runs`` times in fresh processes, and ``python -c "import torch"``
once (after the first run) for reference: what a process pays before neutronorch's code runs at all.
From each summary's ``startup``: ``first_step_seconds`` (from entering ``train()`` to the end of the first
optimizer step) and ``data_seconds`` (the dataset loading within it); first step minus data is the set-up
that the target (under 1 s on a second run) is about. The first run is shown alone: it may compile numba
kernels (after a change to their source) and read files that are not yet in the page cache.

    python bench/startup.py              # 3 runs
    python bench/startup.py --runs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT  # noqa: E402

IMPORT_TORCH = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"


def _timed(command: list[str]) -> tuple[float, str]:
    """Wall seconds of ``command`` and its stdout; exits with its output if it fails."""
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return wall, done.stdout


def demo_run(index: int) -> dict:
    summary = OUT / f"startup-{index}.json"
    OUT.mkdir(parents=True, exist_ok=True)
    wall, _ = _timed([sys.executable, "-m", "neutronorch", "train", "--epochs", "1", "--eval-every", "-1",
                      "--no-progress", "--overwrite", "--summary-json", str(summary)])
    startup = json.loads(summary.read_text())["startup"]
    return {"wall": wall, "data": startup["data_seconds"], "first_step": startup["first_step_seconds"],
            "setup": startup["first_step_seconds"] - startup["data_seconds"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs of the demo (the first is shown alone)")
    args = parser.parse_args()

    runs = [demo_run(0)]
    wall, out = _timed([sys.executable, "-c", IMPORT_TORCH])
    reference = {"wall": wall, "import": float(out.split()[-1])}
    runs += [demo_run(i) for i in range(1, args.runs)]

    keys = ("data", "first_step", "setup")
    rows = [("1 (cold)", runs[0])]
    if len(runs) > 1:
        rows.append(("2" if len(runs) == 2 else f"2-{len(runs)} (median)",
                     {k: statistics.median(r[k] for r in runs[1:]) for k in ("wall",) + keys}))
    print(f"\ndefault demo (`neutronorch train --epochs 1 --eval-every -1`), {args.runs} runs; seconds")
    print("| run | wall (whole command) | import torch | data | first step | first step - data |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, row in rows:
        print(f"| {label} | {row['wall']:.2f} | - | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")
    print(f'| `python -c "import torch"` | {reference["wall"]:.2f} | {reference["import"]:.2f} | - | - | - |')
    print("\nper run (wall / first step - data): " + ", ".join(f"{r['wall']:.2f} / {r['setup']:.2f}" for r in runs))
    print(f"(summaries under {OUT})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
