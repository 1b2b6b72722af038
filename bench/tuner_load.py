"""``--hot-ratio auto`` under another program's load: the tuner's decisions in quiet runs and in runs beside busy
loops (docs/neutronorch.md, "--hot-ratio auto").

Each run is ``neutronorch train --mode neutronorch --hot-ratio auto`` on the built-in synthetic graph in a fresh
process; a loaded run starts ``--busy`` processes that spin on the CPU first and ends them after. Runs alternate
quiet and loaded. Printed per run: each epoch's ratio, its CPU seconds and the decision for the next epoch; then
whether the loaded runs decided as the quiet ones did (reuse on or off after each epoch).

    NUMBA_NUM_THREADS=1 python bench/tuner_load.py
    NUMBA_NUM_THREADS=1 python bench/tuner_load.py --runs 3 --epochs 10 --busy 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SPIN = "while True:\n    pass\n"


def run(epochs: int, busy: int, threads: int, folder: Path, index: int) -> list[dict]:
    """One training run's tuner history, with ``busy`` spinning processes beside it."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    summary = folder / f"run-{index}.json"
    try:
        subprocess.run([sys.executable, "-m", "neutronorch", "train", "--mode", "neutronorch", "--hot-ratio", "auto",
                        "--epochs", str(epochs), "--threads", str(threads), "--eval-every", "-1", "--no-save",
                        "--no-progress", "--summary-json", str(summary)], check=True, capture_output=True)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    data = json.loads(summary.read_text())
    return data["neutronorch"]["auto_history"]


def reuse_after(history: list[dict]) -> list[str]:
    """After each epoch: whether reuse is on or off by the latest verdict (the epochs of a bracket, which alternate
    with and without hot rows to decide, and those that decide nothing keep the verdict before them)."""
    state, states = "on", []
    for entry in history:
        if entry["decision"] in ("on", "walk", "balance"):
            state = "on"
        elif entry["decision"] == "off":
            state = "off"
        states.append(state)
    return states


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="quiet runs, and as many loaded ones")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--busy", type=int, default=2, help="spinning processes beside a loaded run")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"cores: {os.cpu_count()}; {args.runs} quiet and {args.runs} loaded runs ({args.busy} busy processes), "
          f"{args.epochs} epochs each, --threads {args.threads}\n")
    after: dict[str, list[list[str]]] = {"quiet": [], "loaded": []}
    with tempfile.TemporaryDirectory() as scratch:
        for index in range(2 * args.runs):
            kind = "loaded" if index % 2 else "quiet"
            history = run(args.epochs, args.busy if kind == "loaded" else 0, args.threads, Path(scratch), index)
            after[kind].append(reuse_after(history))
            print(f"{kind} run {index // 2}:")
            for epoch, entry in enumerate(history):
                print(f"  epoch {epoch}: r {entry['ratio']:g}, {entry['epoch_s']:.2f} CPU s -> {entry['decision']}, "
                      f"r {entry['next']:g} ({entry['reason']})")
    print("\nreuse after each epoch, by the latest verdict (on/off):")
    for kind, rows in after.items():
        for row in rows:
            print(f"  {kind:6s} {' '.join(row)}")
    quiet = {tuple(row) for row in after["quiet"]}
    same = all(tuple(row) in quiet for row in after["loaded"])
    print(f"\nevery loaded run decided as a quiet one did: {'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
