"""Epoch losses at fixed seeds, this working tree against an earlier revision, case by case.

A refactor that must not change what is trained (the same neighbours drawn, the same rows gathered, the same
steps taken) shows it here: every (graph kind, mode, task) case trains a small graph for a few epochs with one
seed, once with the earlier revision's package (checked out by ``harness.py``'s ``--baseline`` mechanism into
bench/out/baseline-<short-hash>) and once with this working tree's, each in its own process, and the table gives
both sides' epoch losses and whether they agree to the bit (compared as ``float.hex``).

    python bench/same_losses.py --baseline e7cad6a
    python bench/same_losses.py --baseline HEAD~2 --cases exact-node,typed-exact --epochs 2

Cases (``--cases``, default all): ``MODE-node`` and ``MODE-link`` on a synthetic homogeneous graph,
``typed-MODE`` on a synthetic typed graph (``generate synthetic --typed``), for MODE in exact, device and
neutronorch (NeutronOrch at a fixed hot ratio 0.3, super-batches of 4 and snapshot lead 2: with ``auto`` the
ratio and the lead follow measured times, which differ from run to run); ``exact-resume`` trains half the
epochs, stops, and resumes to the end. Each side generates its own graphs with its own code (so a change to a
generator shows too), under bench/out/same-losses/<side>/. The runs use one trainer thread and
``NUMBA_NUM_THREADS=1``, so that nothing but the code differs. Exit status 1 when a case
differs or fails on one side only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from common import OUT
from harness import check_imports, child_env, materialise_baseline

MODES = ("exact", "device", "neutronorch")
COMMON = ["--threads", "1", "--sampler-threads", "1", "--eval-every", "0", "--seed", "3"]
NODE = ["--fanouts", "5,5", "--hidden", "32", "--batch-size", "128"]
TYPED = ["--fanouts", "4,4", "--hidden", "32", "--batch-size", "128", "--model", "rgcn"]
# NeutronOrch with reuse on and nothing measured deciding: with `auto` the hot ratio and the snapshot lead follow
# measured times, which differ from run to run (and on graphs this small auto may make nothing hot).
FIXED = {"neutronorch": ["--hot-ratio", "0.3", "--super-batch", "4", "--snapshot-lead", "2", "--host-threads", "1"]}
CASES = {f"{m}-node": ("homogeneous", [*NODE, "--mode", m, *FIXED.get(m, [])]) for m in MODES}
CASES.update({f"{m}-link": ("homogeneous", [*NODE, "--mode", m, "--task", "link", *FIXED.get(m, [])]) for m in MODES})
CASES.update({f"typed-{m}": ("typed", [*TYPED, "--mode", m, *FIXED.get(m, [])]) for m in MODES})
CASES["exact-resume"] = ("homogeneous", [*NODE, "--mode", "exact"])


def graphs(side: Path, env: dict, nodes: int) -> dict[str, Path]:
    """The side's two graphs, generated with its own code on first use."""
    made = {"homogeneous": side / "graph", "typed": side / "typed"}
    for kind, folder in made.items():
        if not folder.exists():
            command = [sys.executable, "-m", "neutronorch", "generate", "synthetic", "--nodes", str(nodes),
                       "--out", str(folder)] + (["--typed"] if kind == "typed" else [])
            subprocess.run(command, check=True, env=env, capture_output=True)
    return made


def run_case(name: str, side: Path, env: dict, graph: Path, flags: list[str], epochs: int) -> list[float] | str:
    """The case's epoch losses on one side, or the last line of its error."""
    run = side / "runs" / name
    shutil.rmtree(run, ignore_errors=True)
    base = [sys.executable, "-m", "neutronorch", "train", "--dataset", str(graph), *COMMON, *flags,
            "--checkpoint-dir", str(run)]
    if name == "exact-resume":  # half the epochs, then the rest from the checkpoint
        steps = [base + ["--epochs", str(epochs // 2), "--summary-json", str(run / "first.json")],
                 base + ["--epochs", str(epochs), "--resume", "--summary-json", str(run / "summary.json")]]
    else:
        steps = [base + ["--epochs", str(epochs), "--summary-json", str(run / "summary.json")]]
    for command in steps:
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            return (done.stderr.strip().splitlines() or ["(no output)"])[-1][:160]
    summary = json.loads((run / "summary.json").read_text())
    return [epoch["train_loss"] for epoch in summary["epochs"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="the earlier revision (a commit, tag or HEAD~N)")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma list of {', '.join(CASES)}")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=3000, help="vertices of each synthetic graph")
    args = parser.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {', '.join(unknown)}; choose from {', '.join(CASES)}")
    baseline = materialise_baseline(args.baseline)
    check_imports(baseline)
    os.environ["NUMBA_NUM_THREADS"] = "1"
    sides = {baseline.short: child_env(str(baseline.src)), "current": child_env(None)}
    root = OUT / "same-losses"
    results = {}
    for label, env in sides.items():
        folder = root / label
        folder.mkdir(parents=True, exist_ok=True)
        made = graphs(folder, env, args.nodes)
        for name in args.cases.split(","):
            kind, flags = CASES[name]
            print(f"{label}: {name} ...", file=sys.stderr, flush=True)
            results[label, name] = run_case(name, folder, env, made[kind], flags, args.epochs)
    print(f"| case | {baseline.short} | current | same to the bit |\n|---|---|---|---|")
    failed = False
    for name in args.cases.split(","):
        before, after = results[baseline.short, name], results["current", name]
        same = (isinstance(before, list) and isinstance(after, list)
                and [float.hex(x) for x in before] == [float.hex(x) for x in after])
        both_failed = isinstance(before, str) and isinstance(after, str)
        failed |= not (same or both_failed)
        show = lambda v: v if isinstance(v, str) else ", ".join(f"{x:.6f}" for x in v)  # noqa: E731
        print(f"| {name} | {show(before)} | {show(after)} | {'yes' if same else 'both fail' if both_failed else 'NO'} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
