"""Prediction over every vertex with the intermediate layers in memory against memory-mapped ones.

Runs `neutronorch predict --nodes all` in child processes, alternating `--scratch-dir memory` and
`--scratch-dir DIR` (A B B A ...), and reports each child's wall time and its peak anonymous and
file-backed resident memory (sampled every 20 ms from /proc/self/status): memory-mapped layers move the
layers' rows from anonymous memory, which must fit, to the page cache, which the kernel may evict. The
output is a memory-mapped .npy file in both.

    python bench/inference_memory.py --checkpoint DIR/last.pt --dataset bench/out/<1M graph> --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, sys, threading, time
peak = {"RssAnon": 0, "RssFile": 0}
def sample():
    while True:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":")[0]
                if key in peak:
                    peak[key] = max(peak[key], int(line.split()[1]))
        time.sleep(0.02)
threading.Thread(target=sample, daemon=True).start()
from neutronorch.cli import main
t0 = time.perf_counter()
rc = main(sys.argv[1:])
seconds = time.perf_counter() - t0
time.sleep(0.05)
print("RESULT " + json.dumps({"rc": rc, "seconds": seconds, "anon_mb": peak["RssAnon"] / 1024,
                              "file_mb": peak["RssFile"] / 1024}))
"""


def run(args: argparse.Namespace, scratch: str, out: Path) -> dict:
    command = [sys.executable, "-c", CHILD, "predict", "--checkpoint", args.checkpoint, "--dataset", args.dataset,
               "--nodes", "all", "--out", str(out), "--device", "cpu", "--no-progress", "--scratch-dir", scratch]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None or json.loads(line[7:])["rc"] != 0:
        raise SystemExit(f"predict failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(line[7:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path(args.checkpoint).resolve().parent) as folder:
        names = {"memory": "memory", "memory-mapped": folder}
        results: dict[str, list[dict]] = {name: [] for name in names}
        for round_index in range(args.rounds):
            order = list(names) if round_index % 2 == 0 else list(names)[::-1]
            for name in order:
                results[name].append(run(args, names[name], Path(folder) / f"{name}.npy"))
    print(f"\n{args.dataset}: predict --nodes all, {args.rounds} rounds (medians)")
    print("| intermediate layers | seconds | peak anonymous MB | peak file-backed MB |")
    print("|---|---:|---:|---:|")
    medians = {}
    for name, rows in results.items():
        medians[name] = {k: statistics.median(r[k] for r in rows) for k in ("seconds", "anon_mb", "file_mb")}
        m = medians[name]
        print(f"| {name} | {m['seconds']:.2f} | {m['anon_mb']:.0f} | {m['file_mb']:.0f} |")
    mapped, memory = medians["memory-mapped"], medians["memory"]
    print(f"\n**memory-mapped / memory: time {mapped['seconds'] / memory['seconds']:.3f}, peak anonymous memory "
          f"{mapped['anon_mb'] / memory['anon_mb']:.3f}**")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
