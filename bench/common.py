"""Helpers shared by the benchmark scripts: the benchmark graph, running one system in its own process."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"


def ensure_graph(nodes: int, degree: float, features: int, classes: int, seed: int = 0) -> Path:
    """The native-format synthetic graph of these parameters, generated on first use."""
    from neutronorch.data import SyntheticSpec

    directory = OUT / SyntheticSpec(nodes=nodes, degree=degree, features=features, classes=classes, seed=seed).name
    if not (directory / "meta.json").is_file():
        print(f"generating {directory.name} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "neutronorch", "generate", "synthetic", "--nodes", str(nodes),
                        "--degree", str(degree), "--features", str(features), "--classes", str(classes),
                        "--seed", str(seed), "--out", str(directory)], check=True)
    return directory


def dgl_available() -> bool:
    if not PEER_PYTHON.exists():
        return False
    return subprocess.run([str(PEER_PYTHON), "-c", "import dgl"], capture_output=True).returncode == 0


def run_json(command: list[str], summary: Path, env_threads: int | None = None) -> dict:
    """Run one benchmark process that writes ``summary``; return the parsed JSON."""
    env = dict(os.environ)
    if env_threads:
        env["OMP_NUM_THREADS"] = str(env_threads)
    summary.parent.mkdir(parents=True, exist_ok=True)
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True, env=env)
    return json.loads(summary.read_text())


def verdict_lines(worst: float, target: float, worst_lane: dict | None = None,
                  what: str = "from the model") -> list[str]:
    """A model check's closing lines: the largest difference per lane (where given), and the largest of all
    against ``target``, PASS or FAIL."""
    lanes = [] if worst_lane is None else [
        "largest difference per lane: " + ", ".join(f"{lane} {off:.1%}" for lane, off in worst_lane.items())]
    return lanes + [f"largest difference {what}: {worst:.1%} ({'PASS' if worst <= target else 'FAIL'}: "
                    f"target {target:.0%})"]


def steady_median(epoch_seconds: list[float]) -> float:
    """Median epoch time without the first epoch (JIT compilation, cold page cache) when there are more."""
    steady = epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds
    return statistics.median(steady)


def alternate(systems: dict, rounds: int, prefix: str, threads: int) -> dict[str, list[dict]]:
    """Run every system once per round, in turn, the order reversed every other round (A B C, C B A, ...):
    a noisy machine affects all alike, and no system always runs first (after a large process has just
    exited) or last.

    ``systems`` maps a name to a function of the summary path returning the command line.
    """
    results: dict[str, list[dict]] = {name: [] for name in systems}
    for round_index in range(rounds):
        order = list(systems.items())
        for name, command in (order if round_index % 2 == 0 else order[::-1]):
            out = OUT / f"{prefix}-{name}-{round_index}.json"
            results[name].append(run_json(command(out), out, threads))
    return results


# Child-side prelude of ``run_child``: samples the peak of /proc/self/status fields (kB) into ``peak``
# every 20 ms and starts the clock ``t0``; the child ends by printing ``RESULT <json>``.
PEAK_SAMPLER = r"""
import json, sys, threading, time
peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
def _sample():
    while True:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in peak:
                    peak[key] = max(peak[key], int(line.split()[1]))
        time.sleep(0.02)
threading.Thread(target=_sample, daemon=True).start()
t0 = time.perf_counter()
"""


def run_child(code: str, *args: str) -> dict:
    """Run ``PEAK_SAMPLER + code`` in a fresh Python with ``args``; return the JSON of its RESULT line
    (which must hold ``"rc": 0``)."""
    done = subprocess.run([sys.executable, "-c", PEAK_SAMPLER + code, *args], capture_output=True, text=True,
                          check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None or json.loads(line[7:]).get("rc") != 0:
        raise SystemExit(f"child run failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(line[7:])


def alternate_calls(calls: dict, rounds: int) -> dict[str, list[dict]]:
    """``alternate`` for in-process callables: each returns one result dict; order reversed every round."""
    results: dict[str, list[dict]] = {name: [] for name in calls}
    for round_index in range(rounds):
        order = list(calls) if round_index % 2 == 0 else list(calls)[::-1]
        for name in order:
            results[name].append(calls[name]())
    return results


def medians(results: dict[str, list[dict]], keys: tuple[str, ...]) -> dict[str, dict[str, float]]:
    return {name: {k: statistics.median(r[k] for r in rows) for k in keys} for name, rows in results.items()}


def add_graph_arguments(parser) -> None:
    """The synthetic benchmark graph's size options (default: 1M vertices, 20M edges, 100 features)."""
    parser.add_argument("--nodes", type=int, default=1_000_000)
    parser.add_argument("--degree", type=float, default=20)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--classes", type=int, default=16)


def add_sampler_arguments(parser) -> None:
    """The sampler benchmarks' workload: fanouts, batch size, thread counts, timed and untimed batches."""
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--batches", type=int, default=40, help="timed batches (per thread count)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed batches first")


def add_model_arguments(parser) -> None:
    """The benchmark model: 3-layer SAGE, fanouts 15,10,5, hidden 256, batch 1024, as in the issue targets."""
    parser.add_argument("--model", default="sage", choices=["sage", "gcn", "gat"])
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--dropout", type=float, default=0.5)
