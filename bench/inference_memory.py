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
import tempfile
from pathlib import Path

from common import alternate_calls, medians, run_child

CHILD = r"""
from neutronorch.cli import main
rc = main(sys.argv[1:])
seconds = time.perf_counter() - t0
time.sleep(0.05)
print("RESULT " + json.dumps({"rc": rc, "seconds": seconds, "anon_mb": peak["RssAnon"] / 1024,
                              "file_mb": peak["RssFile"] / 1024}))
"""


def run(args: argparse.Namespace, scratch: str, out: Path) -> dict:
    return run_child(CHILD, "predict", "--checkpoint", args.checkpoint, "--dataset", args.dataset, "--nodes", "all",
                     "--out", str(out), "--device", "cpu", "--no-progress", "--scratch-dir", scratch)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path(args.checkpoint).resolve().parent) as folder:
        names = {"memory": "memory", "memory-mapped": folder}
        results = alternate_calls({name: (lambda n=name: run(args, names[n], Path(folder) / f"{n}.npy"))
                                   for name in names}, args.rounds)
    print(f"\n{args.dataset}: predict --nodes all, {args.rounds} rounds (medians)")
    print("| intermediate layers | seconds | peak anonymous MB | peak file-backed MB |")
    print("|---|---:|---:|---:|")
    table = medians(results, ("seconds", "anon_mb", "file_mb"))
    for name, m in table.items():
        print(f"| {name} | {m['seconds']:.2f} | {m['anon_mb']:.0f} | {m['file_mb']:.0f} |")
    mapped, memory = table["memory-mapped"], table["memory"]
    print(f"\n**memory-mapped / memory: time {mapped['seconds'] / memory['seconds']:.3f}, peak anonymous memory "
          f"{mapped['anon_mb'] / memory['anon_mb']:.3f}**")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
