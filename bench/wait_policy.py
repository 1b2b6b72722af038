"""How OpenMP's idle threads wait, quiet and beside other programs: training epoch time (and CPU seconds) of
``neutronorch train`` under each setting of ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` (torch's and numba's
OpenMP runtime, libgomp, reads them when it loads).

Each run is ``neutronorch train`` (default: the built-in synthetic graph, as ``make demo`` trains it) in a fresh
process with one setting; the settings take turns, round by round. ``--busy N`` starts N processes that spin on
the CPU before each run and ends them after it (a machine that other programs share). Printed: every run's
median epoch time and CPU seconds per epoch (epoch 0, which compiles, left out), then per setting the median
over the rounds and its ratio to the first setting.

    python bench/wait_policy.py --rounds 5                 # quiet
    python bench/wait_policy.py --rounds 5 --busy 2        # beside two busy programs
    python bench/wait_policy.py --settings libgomp,PASSIVE,neutronorch --busy 1
    python bench/wait_policy.py --settings libgomp,PASSIVE,spin=10000 -- --epochs 6 --model gat
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

SPIN = "while True:\n    pass\n"
VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def environment(setting: str) -> dict[str, str]:
    """The process environment of one setting: neutronorch (neither variable set: the command line sets PASSIVE
    where other programs keep half a core busy, environment.choose_wait_policy), libgomp (what libgomp does with neither variable set: spin 300,000
    times, about 3 ms, then sleep; given as GOMP_SPINCOUNT, so that neutronorch's own default does not apply),
    PASSIVE or ACTIVE (the policy), spin=N (GOMP_SPINCOUNT)."""
    env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
    if setting == "neutronorch":  # neither set: the command line chooses by the machine's load
        pass
    elif setting == "libgomp":
        env["GOMP_SPINCOUNT"] = "300000"
    elif setting in ("PASSIVE", "ACTIVE"):
        env["OMP_WAIT_POLICY"] = setting
    elif setting.startswith("spin="):
        env["GOMP_SPINCOUNT"] = setting.split("=", 1)[1]
    else:
        raise SystemExit(f"setting {setting!r}: give neutronorch, libgomp, PASSIVE, ACTIVE or spin=N")
    return env


def run(setting: str, busy: int, train_args: list[str], summary: Path) -> tuple[float, float]:
    """One run's median epoch seconds and CPU seconds, epoch 0 left out."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(busy)]
    try:
        subprocess.run([sys.executable, "-m", "neutronorch", "train", "--eval-every", "-1", "--no-save",
                        "--no-progress", "--summary-json", str(summary), *train_args], check=True,
                       capture_output=True, env=environment(setting))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    epochs = json.loads(summary.read_text())["epochs"][1:]
    return (statistics.median(e["seconds"] for e in epochs), statistics.median(e["cpu_seconds"] for e in epochs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="libgomp,PASSIVE,neutronorch", help="comma-separated: neutronorch (its own "
                        "choice by the machine's load), libgomp, PASSIVE, ACTIVE, spin=N (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside each run")
    parser.add_argument("train_args", nargs="*", help="after --: train's options (default: --epochs 5)")
    args = parser.parse_args()
    settings, train_args = args.settings.split(","), args.train_args or ["--epochs", "5"]
    print(f"cores: {os.cpu_count()}; {args.busy} busy processes; train {' '.join(train_args)}; "
          f"load before: {os.getloadavg()[0]:.2f}")
    times: dict[str, list[tuple[float, float]]] = {s: [] for s in settings}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(args.rounds):
            for setting in settings:
                times[setting].append(run(setting, args.busy, train_args, Path(scratch) / f"{setting}-{r}.json"))
                seconds, cpu = times[setting][-1]
                print(f"round {r} {setting:12s} epoch {seconds:.3f} s, {cpu:.3f} CPU s  (load {os.getloadavg()[0]:.2f})",
                      flush=True)
    first = statistics.median(t for t, _ in times[settings[0]])
    print(f"\n| setting | epoch s, median of {args.rounds} (range) | CPU s per epoch | / {settings[0]} |")
    print("|---|---:|---:|---:|")
    for setting in settings:
        wall = [t for t, _ in times[setting]]
        cpu = statistics.median(c for _, c in times[setting])
        print(f"| {setting} | {statistics.median(wall):.3f} ({min(wall):.3f}-{max(wall):.3f}) | {cpu:.3f} | "
              f"{statistics.median(wall) / first:.2f}x |")


if __name__ == "__main__":
    main()
