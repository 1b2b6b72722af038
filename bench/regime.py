"""The regime NeutronOrch was built for: features that do not fit the GPU, every mode on the same graph.

What it measures. A synthetic power-law graph whose float32 features are at least twice the GPU memory
budget (default: 8,000,000 vertices, average degree 20, 512 features, 47 classes: 16 GB of features
against `--gpu-memory-gb 8`), and a products-sized control whose features fit (2,400,000 vertices, degree
26, 100 features, 47 classes: the graph of bench/gpu_check.sh). Every mode (`--modes`; default exact,
device, neutronorch, and auto when `neutronorch train --help` lists it) trains 3-layer SAGE (hidden 256,
batch 1024, dropout 0.5) with the same flags (`--gpu-memory-gb`, the default cache policy `presample` and
`--gpu-cache-gb auto`), each run in its own process, with fanouts 15,10,5 and a bottom-heavy variant,
5,10,15 (fanouts are listed seed hop first, so the bottom hop, the one NeutronOrch serves from hot rows,
samples 15: it holds 93% of the sampled edges against 82% for 15,10,5, each bottom-layer destination
gathers three times as many rows, and a batch's input rows stay about as many, so both fit the same
time budget). The control runs 15,10,5. Accuracy is evaluated once, after the last epoch, by sampled
inference with the run's fanouts on at most 20,000 validation and test vertices each.

Per run, from its summary JSON: the median epoch time without the first epoch, bytes copied to the
device per epoch, the device feature cache's hit rate and what it holds, each lane's busy share, GPU
utilisation (NVML), test accuracy and, where NeutronOrch ran, the hot share (the mean share of a
super-batch's bottom-layer vertices made hot) and the reuse rate (bottom-layer destination rows served
from hot rows). Then neutronorch's, auto's and exact's epoch time over device mode's, per graph and
fanouts. It prints progress lines with timestamps and writes `regime.md`, `regime.json`, `log.txt`, and
each run's summary and output to `--out` (bench/out/regime by default; a folder that already holds files
gets a fresh subfolder named by the time, so nothing is overwritten). The graphs are inputs: reused when
a folder of the same parameters is there, never written over.

    python bench/regime.py                          # on a GPU: the default sizes, 480 s budget
    DEVICE=cpu python bench/regime.py --nodes 20000 --features 64 --control-nodes 20000 --batch-size 256
                                                    # rehearsal on the CPU (12 runs, 1.5 minutes on 2 cores)

`bash bench/gpu_check.sh` runs it as its last step (REGIME=0 skips it, REGIME_BUDGET sets --budget-s), with
the check's products-like graph as the control and its results under the check's folder, `regime/`.

Placement. With 512 features and `--gpu-memory-gb 8` the placement's estimate of the training workspace
(printed at the start on a GPU) is 7.7 GiB at 15,10,5 and 5.8 GiB at 5,10,15, so the device feature cache
holds only about 1-2% of the rows at 15,10,5 (and device mode's topology is read from pinned host memory
too) and 9-14% at 5,10,15: the two fanouts differ in their cache as well as in their shape.

Time. `--budget-s` (default 480) bounds the whole script, graph generation included. Runs go in order
of importance: the regime graph's device, neutronorch and auto runs at 15,10,5, then at 5,10,15, then
its exact runs, then the control. Each (graph, fanouts) group trains `--epochs` epochs (default 3), or
fewer (not below 2) when the times measured so far say the group and the runs after it would not fit;
a run estimated not to fit is skipped, and a run still going when the budget ends is stopped (SIGTERM:
it finishes its step and writes its summary, marked interrupted). The regime graph has 100,000 training
seeds (`--train-seeds`, 98 mini-batches of 1024 per epoch, as the 1M benchmark graph), so that an epoch
is short enough for three per mode. Its features are drawn by all cores in parallel (the model of
`neutronorch generate`, class centroid plus noise, in random streams of its own), its topology, labels and
split are the package generator's (the same graph as `neutronorch generate`, with the generator's binary
searches spread over the cores), and `save_native` writes the folder. Measured on this project's 2-core
machine, 1M vertices at degree 20 with 512 features, on 2 threads: topology 4.8 s, features 4.1 s, the
write of 2 GB 3.6 s (12.4 s in all; the package's generator on one thread took 34 s for the same graph on
the machine shared with other work). Extrapolated to 8M on the GPU machine (16 cores, 128 GiB): topology
15-25 s (its shuffles and CSC build stay on one thread), features 5-10 s, the write of 17 GB about 30 s:
about a minute of the 8, the rest for the runs. A second call finds the folder and skips generation.
It needs the features' size in free memory and disk. Not yet run on a GPU: these are estimates until it is.

On the CPU `--gpu-memory-gb` has no effect (the "device" is host memory), so there each run gets
`--gpu-cache-gb` equal to the budget, a partial cache in host memory driven by the same code as a GPU's;
the budget then defaults to the regime graph's features / 2.5.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

GiB = 2 ** 30
BASE_MODES = ("exact", "device", "neutronorch")
RESERVE_S = 25.0  # kept back at the end: a stopped run's grace to write its summary, then the report
GRACE_S = 20.0  # after SIGTERM, before SIGKILL
LANES = ("planner", "host", "sampler", "copy", "trainer")

T0 = time.monotonic()
LOG: list[Path] = []


def say(message: str) -> None:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
    line = f"[regime {stamp} +{time.monotonic() - T0:4.0f}s] {message}"
    print(line, file=sys.stderr, flush=True)
    for path in LOG:
        with open(path, "a") as log:
            log.write(line + "\n")


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


# ------------------------------------------------------------------------------------------------ graphs


def regime_dir(args) -> Path:
    from neutronorch.data import SyntheticSpec

    spec = SyntheticSpec(nodes=args.nodes, degree=args.degree, features=args.features, classes=args.classes)
    return Path(args.graph_root) / f"neutronorch-regime-{spec.name}-t{train_seeds(args)}"


def train_seeds(args) -> int:
    return min(args.train_seeds, args.nodes // 10)


def read_meta(path: Path) -> dict:
    meta = json.loads((path / "meta.json").read_text())
    meta["train"] = int(np.load(path / "train_idx.npy", mmap_mode="r").shape[0])
    return meta


def ensure_regime_graph(args) -> tuple[Path, float]:
    """The regime graph's folder, generated when absent; and the seconds generating took (0 when reused)."""
    from neutronorch.data import SyntheticSpec, generate, save_native

    target = regime_dir(args)
    if (target / "meta.json").is_file():
        meta = read_meta(target)
        if meta["name"] != target.name or meta["feature_dim"] != args.features or meta["num_nodes"] != args.nodes:
            sys.exit(f"regime: {target} holds another graph ({meta['name']}); move it away or choose --graph-root")
        say(f"regime graph already at {target}")
        return target, 0.0
    if target.exists() and any(target.iterdir()):
        sys.exit(f"regime: {target} exists without meta.json; it is not written over: move it away")
    n, f = args.nodes, args.features
    feature_bytes = n * f * 4
    topology_bytes = 8 * (n + 1) + 8 * int(n * args.degree)  # int64 at worst
    need_disk = feature_bytes + topology_bytes + 32 * n
    target.parent.mkdir(parents=True, exist_ok=True)
    free_disk = shutil.disk_usage(target.parent).free
    if free_disk < 1.05 * need_disk:
        sys.exit(f"regime: generating needs about {need_disk / GiB:.1f} GiB in {target.parent}, "
                 f"{free_disk / GiB:.1f} GiB free; choose --graph-root or smaller sizes")
    need_memory = feature_bytes + 64 * int(n * args.degree / 2) + 64 * n  # features, edge arrays, CSC build
    available = memory_available()
    if available is not None and available < need_memory:
        sys.exit(f"regime: generating needs about {need_memory / GiB:.1f} GiB of memory, {available / GiB:.1f} "
                 f"GiB available; choose smaller sizes")
    threads = len(os.sched_getaffinity(0))
    say(f"generating the regime graph into {target}: {n:,} vertices, degree {args.degree:g}, {f} features "
        f"({feature_bytes / GiB:.2f} GiB), {args.classes} classes, {train_seeds(args):,} training seeds; "
        f"features drawn on {threads} threads")
    t0 = time.perf_counter()
    spec = SyntheticSpec(nodes=n, degree=args.degree, features=1, classes=args.classes,
                         train=train_seeds(args) / n, val=0.05)
    with threaded_draws(threads) as threaded:
        graph = generate(spec)
    t1 = time.perf_counter()
    say(f"topology, labels and split: {t1 - t0:.1f} s ({graph.num_edges:,} edges; the generator's weighted draws "
        f"{'searched on ' + str(threads) + ' threads' if threaded else 'as they are'})")
    graph.features = draw_features(graph.labels, f, args.classes, spec.noise, spec.seed, threads)
    graph.name = target.name
    t2 = time.perf_counter()
    say(f"features: {t2 - t1:.1f} s")
    save_native(graph, target)
    del graph
    t3 = time.perf_counter()
    say(f"written in {t3 - t2:.1f} s; generation took {t3 - t0:.1f} s")
    return target, t3 - t0


@contextlib.contextmanager
def threaded_draws(threads: int):
    """The package generator's weighted draws (``synthetic._draw``: uniform numbers, then a binary search
    for each) with the searches spread over ``threads`` threads: the same numbers drawn in the same order,
    so the same graph as `neutronorch generate`. Checked against the original on a small input first and
    left alone (yielding False) if the two differ."""
    from neutronorch.data import synthetic

    original = getattr(synthetic, "_draw", None)

    def draw(rng, cumulative, lo, hi):
        u = lo + rng.random(lo.shape[0]) * (hi - lo)
        found = np.empty(u.shape[0], dtype=np.intp)
        step = max(1 << 16, math.ceil(u.shape[0] / threads))

        def search(start: int) -> None:
            found[start:start + step] = np.searchsorted(cumulative, u[start:start + step], side="right")

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(search, range(0, u.shape[0], step)))
        return np.minimum(found, cumulative.shape[0] - 1)

    same = False
    if original is not None:
        cumulative = np.cumsum(np.random.default_rng(1).random(1000))
        lo = np.random.default_rng(3).random(200_000) * cumulative[-1] / 2
        hi = lo + cumulative[-1] / 2
        try:
            same = np.array_equal(original(np.random.default_rng(2), cumulative, lo, hi),
                                  draw(np.random.default_rng(2), cumulative, lo, hi))
        except Exception:  # a generator that changed: use it as it is
            same = False
    if same:
        synthetic._draw = draw
    try:
        yield same
    finally:
        if same:
            synthetic._draw = original


def draw_features(labels: np.ndarray, dim: int, classes: int, noise: float, seed: int, threads: int) -> np.ndarray:
    """Class centroid (unit norm in expectation) plus Gaussian noise, as the package's generator draws them,
    in blocks of rows on ``threads`` threads (each block its own seeded stream: the same array whatever the
    thread count)."""
    n = labels.shape[0]
    centroids = np.random.default_rng([seed, 1]).standard_normal((classes, dim), dtype=np.float32)
    centroids /= np.float32(np.sqrt(dim))
    out = np.empty((n, dim), dtype=np.float32)
    step = max(1, (32 << 20) // (4 * dim))

    def fill(block: int) -> None:
        lo, hi = block * step, min(n, (block + 1) * step)
        rows = out[lo:hi]
        np.random.default_rng([seed, 2, block]).standard_normal(dtype=np.float32, out=rows)
        rows *= np.float32(noise)
        rows += centroids[labels[lo:hi]]

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(fill, range(math.ceil(n / step))))
    return out


def memory_available() -> int | None:
    """The memory this process may still take (``MemAvailable``, under a memory cgroup its limit)."""
    from neutronorch.features.memory import available_memory_bytes

    return available_memory_bytes()


def ensure_control_graph(args) -> tuple[Path | None, float]:
    if args.control_nodes <= 0:
        return None, 0.0
    target = Path(args.control_graph or f"/tmp/neutronorch-products-like-{args.control_nodes}")
    if (target / "meta.json").is_file():
        say(f"control graph already at {target}")
        return target, 0.0
    say(f"generating the control graph into {target}: {args.control_nodes:,} vertices, degree "
        f"{args.control_degree:g}, {args.control_features} features, {args.control_classes} classes")
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "neutronorch", "generate", "synthetic", "--nodes",
                           str(args.control_nodes), "--degree", str(args.control_degree), "--features",
                           str(args.control_features), "--classes", str(args.control_classes), "--out", str(target)],
                          env=child_env(), cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"regime: generating the control graph failed:\n{done.stdout}{done.stderr}")
    say(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "control graph written")
    return target, time.perf_counter() - t0


# ------------------------------------------------------------------------------------------------ runs


class Run:
    def __init__(self, group: str, graph: Path, fanouts: str, mode: str):
        self.group, self.graph, self.fanouts, self.mode = group, graph, fanouts, mode
        self.name = f"{group}-{fanouts.replace(',', '-')}-{mode}"
        self.epochs = 0
        self.status = "not run"
        self.wall = None
        self.returncode = None
        self.summary = None
        self.command: list[str] = []

    @property
    def key(self) -> tuple[str, str]:
        return self.group, self.fanouts


def available_modes() -> list[str]:
    """The modes `neutronorch train --help` lists (`--mode {a,b,c}`)."""
    done = subprocess.run([sys.executable, "-m", "neutronorch", "train", "--help"], env=child_env(), cwd=ROOT,
                          capture_output=True, text=True)
    found = re.search(r"--mode \{([a-z_,]+)\}", done.stdout)
    if done.returncode != 0 or not found:
        sys.exit(f"regime: `neutronorch train --help` did not list the modes:\n{done.stdout}{done.stderr}")
    return found.group(1).split(",")


def command(run: Run, args, out: Path) -> list[str]:
    cmd = [sys.executable, "-m", "neutronorch", "train", "--dataset", str(run.graph), "--device", args.device,
           "--mode", run.mode, "--model", "sage", "--fanouts", run.fanouts, "--hidden", str(args.hidden),
           "--batch-size", str(args.batch_size), "--dropout", "0.5", "--epochs", str(run.epochs),
           "--eval-every", "0", "--eval-fanouts", run.fanouts, "--eval-max-nodes", str(args.eval_max_nodes),
           "--gpu-memory-gb", f"{args.gpu_memory_gb:g}", "--cache-policy", "presample"]
    if args.device == "cpu":  # the budget has no effect there: a cache of its size in host memory instead
        cmd += ["--gpu-cache-gb", f"{args.gpu_memory_gb:g}"]
    return cmd + ["--summary-json", str(out / f"{run.name}.json"), "--overwrite", "--no-progress"]


def train(run: Run, args, out: Path, deadline_s: float) -> None:
    """Run one training in its own process; its output goes to <name>.log, its epoch lines to the progress.
    Stopped with SIGTERM at ``deadline_s`` (it then writes its summary), killed after GRACE_S more."""
    run.command = command(run, args, out)
    log_path = out / f"{run.name}.log"
    say(f"run {run.name}: {run.epochs} epochs, at most {deadline_s:.0f} s")
    with open(out / "log.txt", "a") as log:
        log.write("$ " + " ".join(run.command) + "\n")
    t0 = time.monotonic()
    proc = subprocess.Popen(run.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            env=child_env(), cwd=ROOT, start_new_session=True)
    tail: list[str] = []

    def pump() -> None:
        with open(log_path, "w") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                tail.append(line.rstrip())
                del tail[:-15]
                text = line.strip()
                if (text.startswith(("epoch ", "placement:", "mode ")) or "epoch time median" in text
                        or "warning" in text.lower()):
                    say(f"  {run.mode}: {text}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    stopped = False
    try:
        proc.wait(timeout=max(1.0, deadline_s))
    except subprocess.TimeoutExpired:
        stopped = True
        say(f"run {run.name}: the budget is spent; stopping it (SIGTERM)")
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
        raise
    reader.join(timeout=10)
    run.wall = time.monotonic() - t0
    run.returncode = proc.returncode
    summary = out / f"{run.name}.json"
    if summary.is_file():
        run.summary = json.loads(summary.read_text())
    status = (run.summary or {}).get("status")
    if proc.returncode == 0 and status == "completed":
        run.status = "completed"
    elif stopped:
        run.status = f"stopped at the budget ({status or 'no summary'})"
    else:
        run.status = f"failed (returned {proc.returncode}, {status or 'no summary'})"
        say(f"run {run.name} failed; its last lines:\n" + "\n".join(tail))
    say(f"run {run.name}: {run.status} in {run.wall:.1f} s")


# ------------------------------------------------------------------------------------------------ budget


def run_costs(run: Run) -> dict | None:
    """What a finished run took: overhead (start, data, cache, evaluation), first and steady epoch."""
    if not run.summary or not run.summary.get("epochs"):
        return None
    seconds = [e["seconds"] for e in run.summary["epochs"]]
    return {"overhead": max(0.0, run.wall - sum(seconds)), "first": seconds[0],
            "steady": statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]}


def estimate(run: Run, epochs: int, done: list[Run], work: dict) -> float | None:
    """Seconds ``run`` is expected to take with ``epochs`` epochs, from the runs measured so far: the same
    graph and mode at other fanouts, else the slowest mode on the same graph, else the slowest run on another
    graph scaled by the work of an epoch (mini-batches x feature width); None before any measurement."""
    def cost(c: dict) -> float:
        return c["overhead"] + c["first"] + (epochs - 1) * c["steady"]

    measured = [(r, run_costs(r)) for r in done]
    measured = [(r, c) for r, c in measured if c]
    same = [cost(c) for r, c in measured if r.group == run.group and r.mode == run.mode]
    if same:
        return max(same)
    same = [cost(c) for r, c in measured if r.group == run.group]
    if same:
        return max(same)
    other = [cost(c) * min(4.0, max(0.25, work[run.group] / work[r.group])) for r, c in measured]
    return max(other) if other else None


def choose_epochs(group_runs: list[Run], later: list[Run], args, left: float, done: list[Run], work: dict) -> int:
    """The most epochs, at most --epochs and at least 2, with which this group, and the runs after it at the
    least, fit what is left of the budget (as estimated; --epochs before any measurement)."""
    least = min(2, args.epochs)
    for epochs in range(args.epochs, least - 1, -1):
        need = sum(estimate(r, epochs, done, work) or 0.0 for r in group_runs)
        need += sum(estimate(r, least, done, work) or 0.0 for r in later)
        if need <= left:
            return epochs
    return least


# ------------------------------------------------------------------------------------------------ report


def measures(run: Run) -> dict | None:
    s = run.summary
    if not s or not s.get("epochs"):
        return None
    epochs = s["epochs"][1:] or s["epochs"]
    rows = sum(e["moved"].get("feature_rows", 0) for e in epochs)
    hits = sum(e["moved"].get("cache_hits", 0) for e in epochs)
    util = [e.get("utilisation", {}).get("gpu_percent") for e in epochs]
    util = [u for u in util if u is not None]
    lanes = {lane: statistics.median(e.get("lane_busy", {}).get(lane, 0.0) for e in epochs)
             for lane in LANES if any(lane in e.get("lane_busy", {}) for e in epochs)}
    placement = s.get("placement") or {}
    out = {
        "epochs_run": len(s["epochs"]),
        "epoch_s": statistics.median(e["seconds"] for e in epochs),
        "epoch_s_each": [round(e["seconds"], 3) for e in s["epochs"]],
        "device_bytes_per_epoch": statistics.median(e["moved"].get("device_bytes", 0) for e in epochs),
        "cache_hit_rate": hits / rows if rows else None,
        "cached_share": (placement["cache_bytes"] / placement["feature_bytes"]
                         if placement.get("feature_bytes") else None),
        "topology": placement.get("topology"),
        "lane_busy": lanes,
        "gpu_percent": statistics.mean(util) if util else None,
        "test_acc": s.get("final_test_acc", s.get("test_acc")),
        "mode_ran": s.get("mode"),
        "mode_choice": s.get("mode_choice"),  # --mode auto: what it chose and why
        "input_rows_per_batch": statistics.median(e.get("input_nodes_per_batch", 0) for e in epochs),
        "run_s": run.wall,  # the whole process: start, data, cache, epochs, evaluation
        "startup": s.get("startup"),
    }
    if "hot" in s:
        ratios = [e["hot_ratio"] for e in epochs if e.get("hot_ratio") is not None]
        out["hot_share"] = statistics.median(ratios) if ratios else s["hot"].get("ratio")
        out["reuse_rate"] = s["hot"].get("reuse_rate")
        out["uses_per_hot_row"] = s["hot"].get("uses_per_hot_embedding")
    return out


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def table(runs: list[Run]) -> list[str]:
    lines = ["| graph | fanouts | mode | epochs | run s | epoch s | / device | MiB to device / epoch | cache hits "
             "(cached rows, topology) | lanes busy | GPU util % | test acc | hot share / reuse | status |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|---|"]
    device = {r.key: measures(r) for r in runs if r.mode == "device"}
    order = {m: i for i, m in enumerate(("device", "neutronorch", "auto", "exact"))}
    for run in sorted(runs, key=lambda r: (r.group != "regime", r.fanouts != runs[0].fanouts,
                                           order.get(r.mode, 9))):
        m = measures(run)
        mode = run.mode if not m or m["mode_ran"] in (None, run.mode) else f"{run.mode} (ran {m['mode_ran']})"
        if not m:
            wall = f"{run.wall:.0f}" if run.wall else "-"
            lines.append(f"| {run.group} | {run.fanouts} | {mode} | - | {wall} | - | - | - | - | - | - | - | - | "
                         f"{run.status} |")
            continue
        ref = device.get(run.key)
        ratio = f"{m['epoch_s'] / ref['epoch_s']:.3f}" if ref else "-"
        lanes = ", ".join(f"{lane} {100 * v:.0f}%" for lane, v in m["lane_busy"].items())
        hot = f"{pct(m['hot_share'])} / {pct(m['reuse_rate'])}" if "hot_share" in m else "-"
        acc = f"{m['test_acc']:.4f}" if m["test_acc"] is not None else "-"
        gpu = f"{m['gpu_percent']:.0f}" if m["gpu_percent"] is not None else "n/a"
        lines.append(f"| {run.group} | {run.fanouts} | {mode} | {m['epochs_run']} | {run.wall:.0f} | "
                     f"{m['epoch_s']:.3f} | {ratio} | "
                     f"{m['device_bytes_per_epoch'] / 2 ** 20:,.0f} | {pct(m['cache_hit_rate'])} "
                     f"({pct(m['cached_share'])}, {m['topology']}) | {lanes} | {gpu} | {acc} | {hot} | "
                     f"{run.status} |")
    return lines


def ratios(runs: list[Run]) -> tuple[list[str], dict]:
    lines, data = [], {}
    device = {r.key: measures(r) for r in runs if r.mode == "device"}
    for mode in ("neutronorch", "auto", "exact"):
        parts = []
        for run in runs:
            m, ref = measures(run), device.get(run.key)
            if run.mode == mode and m and ref:
                value = m["epoch_s"] / ref["epoch_s"]
                data[f"{mode}/device {run.group} {run.fanouts}"] = round(value, 4)
                parts.append(f"{run.group} {run.fanouts}: {value:.3f}x")
        if parts:
            lines.append(f"- {mode} / device epoch time: " + "; ".join(parts))
    for run in runs:
        choice = (measures(run) or {}).get("mode_choice")
        if isinstance(choice, dict) and choice.get("chosen"):
            lines.append(f"- {run.mode} on {run.group} {run.fanouts} chose {choice['chosen']}: "
                         f"{choice.get('reason', '')}")
    return lines, data


def fresh_out(path: Path, inputs: list[Path]) -> Path:
    path = path.resolve()
    for graph in inputs:
        g = graph.resolve()
        if path == g or g in path.parents or path in g.parents:
            sys.exit(f"regime: --out {path} overlaps the input graph {g}; choose another folder")
    if path.exists() and any(path.iterdir()):
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        candidate, k = path / stamp, 2
        while candidate.exists():
            candidate, k = path / f"{stamp}-{k}", k + 1
        path = candidate
    path.mkdir(parents=True, exist_ok=True)
    return path


def environment(args) -> str:
    code = ("import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, '|', "
            "torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env())
    return done.stdout.strip() or done.stderr.strip()[-200:]


# ------------------------------------------------------------------------------------------------ main


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default=os.environ.get("DEVICE", "cuda"), choices=["cuda", "cpu"],
                   help="training device (default from $DEVICE)")
    p.add_argument("--nodes", type=int, default=8_000_000)
    p.add_argument("--degree", type=float, default=20)
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--classes", type=int, default=47)
    p.add_argument("--train-seeds", type=int, default=100_000, help="training seeds (at most 10%% of --nodes)")
    p.add_argument("--gpu-memory-gb", type=float, default=None,
                   help="the budget of every run (default 8; on the CPU the regime features / 2.5)")
    p.add_argument("--graph-root", default="/tmp", help="where the regime graph is generated or found")
    p.add_argument("--control-nodes", type=int, default=2_400_000, help="0: no control graph")
    p.add_argument("--control-degree", type=float, default=26)
    p.add_argument("--control-features", type=int, default=100)
    p.add_argument("--control-classes", type=int, default=47)
    p.add_argument("--control-graph", default=None,
                   help="the control's folder (default /tmp/neutronorch-products-like-<nodes>, gpu_check's)")
    p.add_argument("--modes", default=None, help="default exact,device,neutronorch, and auto when listed")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--bottom-heavy", default="5,10,15", help="the second fanouts of the regime graph; '' for none")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=480.0)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--eval-max-nodes", type=int, default=20_000)
    p.add_argument("--out", default=str(ROOT / "bench" / "out" / "regime"))
    args = p.parse_args(argv)
    if args.epochs < 1 or args.nodes < 100 or args.features < 1:
        p.error("--epochs, --nodes and --features must be positive (--nodes at least 100)")
    if args.gpu_memory_gb is None:
        args.gpu_memory_gb = 8.0 if args.device == "cuda" else round(args.nodes * args.features * 4 / 2.5 / GiB, 6)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    listed = available_modes()
    modes = args.modes.split(",") if args.modes else [*BASE_MODES, *(["auto"] if "auto" in listed else [])]
    unknown = [m for m in modes if m not in listed]
    if unknown:
        sys.exit(f"regime: --modes {','.join(unknown)}: `neutronorch train --help` lists {','.join(listed)}")
    out = fresh_out(Path(args.out), [regime_dir(args)] + ([Path(args.control_graph)] if args.control_graph else []))
    LOG.append(out / "log.txt")
    env = environment(args)
    feature_gib = args.nodes * args.features * 4 / GiB
    say(f"{env}; device {args.device}; modes {','.join(modes)} (listed: {','.join(listed)}); budget "
        f"{args.budget_s:.0f} s; results in {out}")
    say(f"regime features {feature_gib:.2f} GiB = {feature_gib / args.gpu_memory_gb:.2f}x the "
        f"{args.gpu_memory_gb:g} GiB budget")
    if feature_gib < 2 * args.gpu_memory_gb:
        say("warning: the features are less than twice the budget: not the regime this benchmark is for")

    regime, regime_s = ensure_regime_graph(args)
    control, control_s = ensure_control_graph(args)
    graphs = {"regime": regime, **({"control": control} if control else {})}
    metas = {name: read_meta(path) for name, path in graphs.items()}
    work = {name: math.ceil(m["train"] / args.batch_size) * m["feature_dim"] for name, m in metas.items()}
    from neutronorch.features.placement import workspace_bytes

    for fan in filter(None, (args.fanouts, args.bottom_heavy) if args.device == "cuda" else ()):
        w = workspace_bytes(args.nodes, args.features, args.hidden, args.classes, [int(x) for x in fan.split(",")],
                            args.batch_size)
        say(f"regime, fanouts {fan}: the placement's workspace estimate is {w / GiB:.2f} GiB of the "
            f"{args.gpu_memory_gb:g} GiB budget")

    # Order of importance: the modes that do not gather on the host first, exact after, the control last.
    fast = [m for m in modes if m != "exact"]
    slow = [m for m in modes if m == "exact"]
    fanouts = [f for f in (args.fanouts, args.bottom_heavy) if f]
    runs = [Run("regime", regime, f, m) for f in fanouts for m in fast]
    runs += [Run("regime", regime, f, m) for f in fanouts for m in slow]
    if control:
        runs += [Run("control", control, args.fanouts, m) for m in fast + slow]

    epochs: dict[tuple[str, str], int] = {}
    done: list[Run] = []
    try:
        for i, run in enumerate(runs):
            left = args.budget_s - (time.monotonic() - T0) - RESERVE_S
            if run.key not in epochs:
                group = [r for r in runs[i:] if r.key == run.key]
                later = [r for r in runs[i:] if r.key != run.key]
                epochs[run.key] = choose_epochs(group, later, args, left, done, work)
                say(f"group {run.group} {run.fanouts}: {epochs[run.key]} epochs per run ({left:.0f} s left)")
            run.epochs = epochs[run.key]
            guess = estimate(run, run.epochs, done, work)
            if left < 5 or (guess is not None and guess > left):
                need = f"needs about {guess:.0f} s, " if guess is not None else ""
                run.status = f"skipped: the budget ({need}{max(0, left):.0f} s left)"
                say(f"run {run.name}: {run.status}")
                continue
            train(run, args, out, left)
            done.append(run)
    except KeyboardInterrupt:
        say("interrupted; writing what was measured")

    total = time.monotonic() - T0
    lines, ratio_data = ratios(runs)
    today = datetime.date.today().isoformat()
    md = [f"# The regime benchmark, {today}", "",
          "`" + shlex.join(["python", "bench/regime.py", *(argv if argv is not None else sys.argv[1:])]) + "`", "",
          f"{env}; device {args.device}; budget {args.gpu_memory_gb:g} GiB (`--gpu-memory-gb`).", "",
          f"- regime: {regime.name}: {metas['regime']['num_nodes']:,} vertices, {metas['regime']['num_edges']:,} "
          f"edges, {args.features} features ({feature_gib:.2f} GiB, {feature_gib / args.gpu_memory_gb:.2f}x the "
          f"budget), {metas['regime']['train']:,} training seeds"
          + (f"; generated in {regime_s:.1f} s" if regime_s else "; reused")]
    if control:
        cm = metas["control"]
        cgib = cm["num_nodes"] * cm["feature_dim"] * 4 / GiB
        md.append(f"- control: {control.name}: {cm['num_nodes']:,} vertices, {cm['num_edges']:,} edges, "
                  f"{cm['feature_dim']} features ({cgib:.2f} GiB), {cm['train']:,} training seeds"
                  + (f"; generated in {control_s:.1f} s" if control_s else "; reused"))
    md += [f"- 3-layer SAGE, hidden {args.hidden}, batch {args.batch_size}, dropout 0.5; accuracy by sampled "
           f"inference with the run's fanouts on at most {args.eval_max_nodes:,} validation and test vertices; "
           f"epoch s: median without the first epoch; whole script {total:.0f} s", "",
           *table(runs), "", *lines, ""]
    (out / "regime.md").write_text("\n".join(md))
    record = {"date": today, "environment": env, "args": vars(args), "total_seconds": round(total, 1),
              "graphs": {name: {"path": str(path), **metas[name]} for name, path in graphs.items()},
              "generate_seconds": {"regime": round(regime_s, 1), "control": round(control_s, 1)},
              "ratios": ratio_data,
              "runs": [{"name": r.name, "group": r.group, "fanouts": r.fanouts, "mode": r.mode, "epochs": r.epochs,
                        "status": r.status, "wall_s": r.wall and round(r.wall, 1), "returncode": r.returncode,
                        "command": r.command, "summary": str(out / f"{r.name}.json") if r.summary else None,
                        "measures": measures(r)} for r in runs]}
    (out / "regime.json").write_text(json.dumps(record, indent=2) + "\n")
    print("\n".join(md))
    say(f"done in {total:.0f} s; results in {out}")
    return 1 if any(r.status.startswith("failed") for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
