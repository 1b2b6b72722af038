"""Converting a CSV-layout OGB directory: time and peak memory of `neutronorch convert` against reading the
same files with pandas (`pandas.read_csv`, the way OGB's own loader reads them), each in a child process.

Builds an ogbn-arxiv-sized directory once (169,343 vertices, 1,166,243 edges, 128 float features, 40
classes, the split in split/time) under bench/out, unless --dir names a real one. Alternates the two
readers (A B B A ...) and reports medians: wall time, peak resident memory (sampled every 20 ms), and the
native output's largest array for scale. pandas is not a dependency: `pip install pandas` to run this.

    python bench/ogb_convert.py --rounds 2
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import alternate_calls, medians, run_child

OUT = Path(__file__).resolve().parent / "out"

CONVERT = r"""
from neutronorch.cli import main
rc = main(["convert", sys.argv[1], sys.argv[2], "--overwrite"])
print("RESULT " + json.dumps({"rc": rc, "seconds": time.perf_counter() - t0, "peak_mb": peak["VmRSS"] / 1024}))
"""

PANDAS = r"""
import pandas as pd
from pathlib import Path
root = Path(sys.argv[1])
raw = root / "raw"
edges = pd.read_csv(raw / "edge.csv.gz", compression="gzip", header=None).values
features = pd.read_csv(raw / "node-feat.csv.gz", compression="gzip", header=None).values.astype("float32")
labels = pd.read_csv(raw / "node-label.csv.gz", compression="gzip", header=None).values
splits = [pd.read_csv(p, compression="gzip", header=None).values[:, 0] for p in sorted((root / "split").glob("*/*.csv.gz"))]
print("RESULT " + json.dumps({"rc": 0, "seconds": time.perf_counter() - t0, "peak_mb": peak["VmRSS"] / 1024}))
"""


def build(root: Path, nodes: int, edges: int, dim: int, classes: int) -> Path:
    if (root / "raw" / "edge.csv.gz").is_file():
        return root
    rng = np.random.default_rng(0)
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)

    def write(name: str, array: np.ndarray, fmt: str) -> None:
        with gzip.open(raw / name, "wt", compresslevel=1) as f:
            np.savetxt(f, array, fmt=fmt, delimiter=",")

    print(f"building {root} ...", file=sys.stderr)
    write("edge.csv.gz", rng.integers(0, nodes, (edges, 2)), "%d")
    write("node-feat.csv.gz", rng.standard_normal((nodes, dim)).astype(np.float32), "%.6f")
    write("node-label.csv.gz", rng.integers(0, classes, (nodes, 1)), "%d")
    write("num-node-list.csv.gz", np.array([[nodes]]), "%d")
    write("num-edge-list.csv.gz", np.array([[edges]]), "%d")
    order = rng.permutation(nodes)
    split = root / "split" / "time"
    split.mkdir(parents=True, exist_ok=True)
    for name, ids in zip(("train", "valid", "test"), np.split(order, [int(0.54 * nodes), int(0.72 * nodes)])):
        with gzip.open(split / f"{name}.csv.gz", "wt") as f:
            np.savetxt(f, ids[:, None], fmt="%d")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="a CSV-layout OGB directory (default: build an arxiv-sized one)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    try:
        import pandas  # noqa: F401 - only checked for here
    except ImportError:
        raise SystemExit("this benchmark compares with pandas: pip install pandas")
    root = Path(args.dir) if args.dir else build(OUT / "ogbn_arxiv_like", 169_343, 1_166_243, 128, 40)
    with tempfile.TemporaryDirectory(dir=OUT) as folder:
        native = Path(folder) / "native"
        results = alternate_calls({"neutronorch convert": lambda: run_child(CONVERT, str(root), str(native)),
                                   "pandas read_csv": lambda: run_child(PANDAS, str(root))}, args.rounds)
        largest = max(p.stat().st_size for p in native.glob("*.npy")) / 2**20
    print(f"\n{root.name}: {args.rounds} rounds (medians); the native output's largest array is {largest:.0f} MB")
    print("| reader | seconds | peak RSS MB | peak RSS / largest array |")
    print("|---|---:|---:|---:|")
    table = medians(results, ("seconds", "peak_mb"))
    for name, m in table.items():
        print(f"| {name} | {m['seconds']:.2f} | {m['peak_mb']:.0f} | {m['peak_mb'] / largest:.1f} |")
    ours, theirs = table["neutronorch convert"], table["pandas read_csv"]
    print(f"\n**convert (parse, clean, write) / pandas (parse only): time {ours['seconds'] / theirs['seconds']:.3f}, "
          f"peak memory {ours['peak_mb'] / theirs['peak_mb']:.3f}**")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
