"""Time and peak memory of ``neutronorch convert EDGES OUT --features F --labels L`` on generated CSV tables.

Writes an edge table (``src,dst`` header), a feature table (``id,x1..xd`` lines, no header) and a label table
(``id,label`` lines) for ``--nodes`` vertices and ``--edges`` edges, ids ``3k + 11`` (whole numbers that are
not 0..n-1, so they are renumbered as a user's would be), then runs the command ``--runs`` times in fresh
processes and prints each run's wall time and peak resident memory (of the converting process), and the
median:

    python bench/convert_tables.py                                       # 500,000 vertices, 5,000,000 edges, 32
    python bench/convert_tables.py --nodes 100000 --edges 1000000 --features 16 --runs 1
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT  # noqa: E402


def write_tables(folder: Path, nodes: int, edges: int, features: int) -> list[Path]:
    rng = np.random.default_rng(0)
    ids = rng.permutation(nodes) * 3 + 11
    src, dst = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
    paths = [folder / "edges.csv", folder / "features.csv", folder / "labels.csv"]
    np.savetxt(paths[0], np.stack([ids[src], ids[dst]], 1), fmt="%d", delimiter=",", header="src,dst", comments="")
    rows = np.concatenate([ids[:, None], rng.standard_normal((nodes, features))], 1)
    np.savetxt(paths[1], rows, fmt=["%d"] + ["%.4f"] * features, delimiter=",")
    np.savetxt(paths[2], np.stack([ids, rng.integers(0, 10, nodes)], 1), fmt="%d", delimiter=",")
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500_000)
    parser.add_argument("--edges", type=int, default=5_000_000)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    folder = OUT / f"tables-n{args.nodes}-e{args.edges}-d{args.features}"
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / "edges.csv", folder / "features.csv", folder / "labels.csv"]
    if not all(p.is_file() for p in paths):
        paths = write_tables(folder, args.nodes, args.edges, args.features)
    size = sum(p.stat().st_size for p in paths)
    print(f"{args.nodes:,} vertices, {args.edges:,} edges, {args.features} features: {size / 1e6:.0f} MB of CSV")
    times, peaks = [], []
    for run in range(args.runs):
        out = folder / "out"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "neutronorch", "convert", str(paths[0]), str(out), "--features",
                        str(paths[1]), "--labels", str(paths[2])], check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
        peaks.append(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2)  # the largest so far
        print(f"run {run}: {times[-1]:.1f} s, peak RSS {peaks[-1]:.2f} GB")
        shutil.rmtree(out, ignore_errors=True)
    print(f"median {statistics.median(times):.1f} s, peak RSS {max(peaks):.2f} GB")


if __name__ == "__main__":
    main()
