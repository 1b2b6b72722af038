"""This machine's measured ceilings for the operations a GNN training step is made of.

Each operation is timed alone, as the median of ``--repeats`` timings after one warm-up (an operation
faster than 20 ms is run several times per timing):

1. the matrix products of one step of the benchmark model (3-layer SAGE, hidden 256, batch 1024, 100
   features, 16 classes; default row counts are a typical sampled batch on the 1M-vertex graph with
   fanouts 15,10,5), float32 and bfloat16, laid out as the fused CPU layer computes them;
2. the feature gather (``FeatureStore.gather_into`` into a reused buffer) of random and of sorted rows,
   float32 and float16 storage into float32 and bfloat16 rows;
3. memory bandwidth references: one large contiguous copy, and numpy's own row gather;
4. the mean aggregation kernel (``mean_aggregate`` forward) of a bottom-layer block;

then a per-step floor: the sum of a step's matrix products, and the gather of a step's input rows and
the bottom layer's aggregation at the measured rates, to set beside a measured step time.

    python bench/roofline.py                         # full size (a few GB of memory; run on a quiet machine)
    python bench/roofline.py --scale 0.05 --repeats 2   # quick check
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time

import numba
import numpy as np
import torch

from neutronorch.features.store import FeatureStore
from neutronorch.nn.aggregation import mean_aggregate
from neutronorch.nn.precision import cpu_bf16_units
from neutronorch.sampling.block import Block
from neutronorch.train.resources import keep_freed_memory

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MIN_TIMING_S = 0.02


def timed(fn, repeats: int) -> float:
    """Median seconds of one call of ``fn`` over ``repeats`` timings, after one warm-up call."""
    t0 = time.perf_counter()
    fn()
    warm = time.perf_counter() - t0
    inner = max(1, math.ceil(MIN_TIMING_S / max(warm, 1e-9))) if warm < MIN_TIMING_S else 1
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def matmul_ops(a) -> list[tuple[str, str, tuple[int, int, int], callable]]:
    """(layer, pass, (m, k, n) of [m x k] @ [k x n], make(dtype) -> the call) for one training step.

    As the fused layer computes them: h = [x_dst | mean | 1] (width 2*in + 1), weight [out x (2*in + 1)];
    forward h @ weight.T, weight gradient grad_y.T @ h, input gradient grad_y @ weight[:, :2*in]."""
    f, hid, c = a.features, a.hidden, a.classes
    layers = [("bottom", a.bottom_rows, f, hid, False), ("second", a.middle_rows, hid, hid, True),
              ("output", a.batch_size, hid, c, True)]
    ops = []
    for name, rows, width, out, input_grad in layers:
        k = 2 * width + 1

        def forward(dtype, rows=rows, k=k, out=out):
            h, w = torch.randn(rows, k, dtype=dtype), torch.randn(out, k, dtype=dtype)
            return lambda: h @ w.t()

        def weight_grad(dtype, rows=rows, k=k, out=out):
            g, h = torch.randn(rows, out, dtype=dtype), torch.randn(rows, k, dtype=dtype)
            return lambda: g.t() @ h

        def input_grad_fn(dtype, rows=rows, k=k, out=out):
            g, w = torch.randn(rows, out, dtype=dtype), torch.randn(out, k, dtype=dtype)
            ws = w[:, :k - 1]
            return lambda: g @ ws

        ops.append((name, "forward", (rows, k, out), forward))
        ops.append((name, "weight grad", (out, rows, k), weight_grad))
        if input_grad:
            ops.append((name, "input grad", (rows, out, k - 1), input_grad_fn))
    return ops


def measure_matmuls(a) -> list[dict]:
    results = []
    for layer, kind, (m, k, n), make in matmul_ops(a):
        row = {"layer": layer, "pass": kind, "shape": f"[{m} x {k}] @ [{k} x {n}]", "flop": 2.0 * m * k * n}
        for name, dtype in DTYPES.items():
            row[name] = timed(make(dtype), a.repeats)
        results.append(row)
    return results


def time_copy(elements: int, repeats: int) -> float:
    src, dst = torch.randn(elements), torch.empty(elements)
    return timed(lambda: dst.copy_(src), repeats)


def measure_gathers(a, rng) -> tuple[list[dict], list[dict]]:
    n_table, n_rows, width = a.table_rows, a.gather_rows, a.features
    base = rng.standard_normal((n_table, width), dtype=np.float32)
    labels = np.zeros(n_table, dtype=np.int64)
    random_rows = rng.permutation(n_table)[:n_rows].astype(np.int64)
    orders = {"random": random_rows, "sorted": np.sort(random_rows)}
    gathers = []
    storages = {"fp32": base, "fp16": base.astype(np.float16)}
    for storage, features in storages.items():
        for buffer_name, dtype in DTYPES.items():
            store = FeatureStore(features, labels, dtype)
            buffer = torch.empty((n_rows, width), dtype=dtype)
            for order, ids in orders.items():
                rows = torch.from_numpy(ids)
                seconds = timed(lambda: store.gather_into(rows, buffer), a.repeats)
                gathers.append({"what": f"gather_into {storage} -> {buffer_name}", "order": order, "seconds": seconds,
                                "bytes": n_rows * width * features.itemsize, "rows": n_rows})
    references = []
    copy_elems = a.copy_mb * 2**20 // 4
    references.append({"what": f"torch contiguous copy {a.copy_mb} MB fp32", "order": "-",
                       "seconds": time_copy(copy_elems, a.repeats), "bytes": copy_elems * 4, "rows": None})
    out = np.empty((n_rows, width), dtype=np.float32)
    for order, ids in orders.items():
        seconds = timed(lambda: base[ids], a.repeats)
        references.append({"what": "numpy features[rows] fp32", "order": order, "seconds": seconds,
                           "bytes": n_rows * width * 4, "rows": n_rows})
        seconds = timed(lambda: np.take(base, ids, axis=0, out=out), a.repeats)
        references.append({"what": "numpy take(..., out=buffer) fp32", "order": order, "seconds": seconds,
                           "bytes": n_rows * width * 4, "rows": n_rows})
    return gathers, references


def measure_aggregation(a, rng) -> list[dict]:
    num_dst, fanout, num_src, width = a.bottom_rows, a.agg_fanout, a.input_rows, a.features
    indptr = torch.arange(0, (num_dst + 1) * fanout, fanout, dtype=torch.int64)
    indices = torch.from_numpy(rng.integers(0, num_src, num_dst * fanout, dtype=np.int64))
    block = Block(num_dst, num_src, indptr, indices, 0)
    x32 = torch.randn(num_src, width)
    results = []
    with torch.no_grad():
        for name, dtype in DTYPES.items():
            x = x32.to(dtype)
            seconds = timed(lambda: mean_aggregate(block, x), a.repeats)
            results.append({"dtype": name, "seconds": seconds, "edges": block.num_edges,
                            "bytes": block.num_edges * width * x.element_size()})
    return results


def gbs(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every row count (0.1: quick check)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch and numba threads; 0 = all cores")
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=1024, help="output layer rows (seeds)")
    parser.add_argument("--middle-rows", type=int, default=10_000, help="second layer's destination rows")
    parser.add_argument("--bottom-rows", type=int, default=102_000, help="bottom layer's destination rows")
    parser.add_argument("--input-rows", type=int, default=600_000,
                        help="a step's input (feature) rows: the aggregation's sources and the per-step gather")
    parser.add_argument("--agg-fanout", type=int, default=5, help="sampled sources per bottom destination")
    parser.add_argument("--table-rows", type=int, default=1_000_000, help="rows of the feature matrix")
    parser.add_argument("--gather-rows", type=int, default=100_000, help="rows per timed gather")
    parser.add_argument("--copy-mb", type=int, default=256, help="contiguous copy size (not scaled)")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args()
    for key in ("batch_size", "middle_rows", "bottom_rows", "input_rows", "table_rows", "gather_rows"):
        setattr(a, key, max(1, int(round(getattr(a, key) * a.scale))))
    a.gather_rows = min(a.gather_rows, a.table_rows)
    threads = a.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    keep_freed_memory()  # as training does: large buffers are reused, not page-faulted in again
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)

    units = cpu_bf16_units()
    print(f"\nroofline: {threads} threads (torch {torch.__version__}, numba {numba.__version__}), "
          f"median of {a.repeats} after one warm-up, scale {a.scale:g}")
    print(f"CPU bfloat16 units: {', '.join(units) if units else 'none (bfloat16 products are emulated)'}\n")

    matmuls = measure_matmuls(a)
    print(f"## Matrix products of one step (SAGE, {a.features} features, hidden {a.hidden}, {a.classes} classes; "
          f"rows {a.bottom_rows} / {a.middle_rows} / {a.batch_size})\n")
    print("| layer | pass | shape | fp32 ms | fp32 GFLOP/s | bf16 ms | bf16 GFLOP/s | bf16 speed-up |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for r in matmuls:
        print(f"| {r['layer']} | {r['pass']} | {r['shape']} | {1e3 * r['fp32']:.2f} | {r['flop'] / r['fp32'] / 1e9:.1f} "
              f"| {1e3 * r['bf16']:.2f} | {r['flop'] / r['bf16'] / 1e9:.1f} | {r['fp32'] / r['bf16']:.2f}x |")

    gathers, references = measure_gathers(a, rng)
    print(f"\n## Feature gather: {a.gather_rows} of {a.table_rows} rows x {a.features} (GB/s of source bytes read)\n")
    print("| operation | row order | ms | GB/s | M rows/s |")
    print("|---|---|---:|---:|---:|")
    for r in gathers + references:
        rate = "-" if r["rows"] is None else f"{r['rows'] / r['seconds'] / 1e6:.1f}"
        print(f"| {r['what']} | {r['order']} | {1e3 * r['seconds']:.2f} | {gbs(r['bytes'], r['seconds'])} | {rate} |")
    print("\n(the contiguous copy moves as many bytes again in writes; numpy's gather runs on one thread)")

    aggregation = measure_aggregation(a, rng)
    print(f"\n## Mean aggregation forward: {a.bottom_rows} destinations x {a.agg_fanout} sources of {a.input_rows} "
          f"rows x {a.features} (GB/s of rows read)\n")
    print("| x dtype | ms | GB/s | M edges/s |")
    print("|---|---:|---:|---:|")
    for r in aggregation:
        print(f"| {r['dtype']} | {1e3 * r['seconds']:.2f} | {gbs(r['bytes'], r['seconds'])} "
              f"| {r['edges'] / r['seconds'] / 1e6:.1f} |")

    def gather_rate(what: str) -> float:  # random-order rows per second
        return next(r["rows"] / r["seconds"] for r in gathers if r["what"] == what and r["order"] == "random")

    agg = {r["dtype"]: r["seconds"] for r in aggregation}
    print(f"\n## Per step floor ({a.input_rows} input rows, random order)\n")
    print("| part | fp32 ms | bf16 ms |")
    print("|---|---:|---:|")
    print(f"| matrix products (all of the table above) | {1e3 * sum(r['fp32'] for r in matmuls):.1f} "
          f"| {1e3 * sum(r['bf16'] for r in matmuls):.1f} |")
    print(f"| gather, fp32 storage | {1e3 * a.input_rows / gather_rate('gather_into fp32 -> fp32'):.1f} "
          f"| {1e3 * a.input_rows / gather_rate('gather_into fp32 -> bf16'):.1f} |")
    print(f"| gather, fp16 storage | {1e3 * a.input_rows / gather_rate('gather_into fp16 -> fp32'):.1f} "
          f"| {1e3 * a.input_rows / gather_rate('gather_into fp16 -> bf16'):.1f} |")
    print(f"| bottom-layer aggregation forward | {1e3 * agg['fp32']:.1f} | {1e3 * agg['bf16']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
