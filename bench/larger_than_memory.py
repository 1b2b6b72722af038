"""Training on features larger than the memory left for them: one configuration unconstrained and inside a
memory cap, side by side.

First the run without a cap (features in the page cache after the first pass); then, for each order in
--orders, the same run inside a memory cgroup (v1 or v2, created here; this needs the right to create one,
as root usually has) whose limit leaves the graph's arrays (features and topology) about half the memory
they need: the unconstrained run's peak anonymous memory plus half their bytes (--shares: other shares, a set
of capped runs for each; or --cap-gb). Every run is its own process; the
page cache is dropped before each capped run where that is allowed, so it starts cold. For each run: epoch
time (median of the epochs after the first, or the only one), wall time, bytes read from and written to
disk (start-up included: the host feature cache's copy reads the features once and writes the rows it does
not hold), major page faults, the ratio of disk bytes read per epoch to the feature bytes its epochs
gathered (the topology's reads are not in that denominator), and the host cache's size, build time and hit
rate. A run that has not finished within --timeout seconds is stopped and reported as such; one that
failed is reported with its exit status (-9 inside a cap: killed for memory).

    python bench/larger_than_memory.py                        # 1M vertices / 20M edges, 400 features (1.6 GB)
    python bench/larger_than_memory.py --orders file,batch --timeout 600
    python bench/larger_than_memory.py --host-cache auto,0     # with and without the host feature cache
    python bench/larger_than_memory.py --shares 0.25,0.5,0.75,1  # how much memory for which speed
    python bench/larger_than_memory.py --dataset DIR --shares 0.5   # your own graph (native format)
    python bench/larger_than_memory.py --degree 100 --features 16   # topology larger than features

Targets (issue): capped epoch at most 2x the unconstrained one; disk bytes per epoch at most 3x the feature
bytes it gathers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, add_graph_arguments, add_model_arguments, ensure_graph, steady_median

CGROUP = Path("/sys/fs/cgroup")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    parser.set_defaults(features=400)
    add_model_arguments(parser)
    parser.add_argument("--dataset", default=None,
                        help="a native-format graph directory (default: the synthetic graph of --nodes etc.)")
    parser.add_argument("--mode", default="exact")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--orders", default="file", help="--read-order of the capped runs, comma-separated")
    parser.add_argument("--host-cache", default="auto",
                        help="--host-cache-gb of the capped runs, comma-separated (each with each order); "
                             "the unconstrained run keeps its default (auto: none while the features fit)")
    parser.add_argument("--shares", default="0.5",
                        help="comma-separated shares of the arrays' bytes that each cap leaves them beside the "
                             "run's own memory (one set of capped runs per share; default: %(default)s)")
    parser.add_argument("--cap-gb", type=float, default=None,
                        help="the memory limit (default: the unconstrained run's peak anonymous memory + half the "
                             "feature bytes)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before a run is stopped")
    args = parser.parse_args()

    cgroup = memory_cgroup_kind()
    if cgroup is None:
        print("error: no writable memory cgroup (v1 /sys/fs/cgroup/memory or v2 /sys/fs/cgroup with the memory "
              "controller): run as a user allowed to create one (root usually is)", file=sys.stderr)
        return 2
    graph = Path(args.dataset) if args.dataset else ensure_graph(args.nodes, args.degree, args.features, args.classes)
    if not (graph / "features.npy").is_file():
        print(f"error: {graph} is not a native-format graph directory (no features.npy); write one with "
              f"`neutronorch convert`", file=sys.stderr)
        return 2
    feature_bytes = (graph / "features.npy").stat().st_size
    topology_bytes = (graph / "indices.npy").stat().st_size + (graph / "indptr.npy").stat().st_size
    out = Path(tempfile.mkdtemp(prefix="ltm-", dir=ROOT / "bench" / "out"))
    base = [sys.executable, "-m", "neutronorch", "train", "--dataset", str(graph), "--mode", args.mode,
            "--model", args.model, "--fanouts", args.fanouts, "--hidden", str(args.hidden), "--batch-size",
            str(args.batch_size), "--lr", str(args.lr), "--dropout", str(args.dropout), "--epochs",
            str(args.epochs), "--eval-every", "-1", "--threads", str(args.threads), "--no-progress"]

    rows = [run("unconstrained", base + ["--summary-json", str(out / "free.json")], out / "free.json", None,
                cgroup, args.timeout)]
    # The peak, polled while it ran (NeutronOrch mode's is 0.5-0.7 GiB above its memory at the end), else the end's.
    anon = rows[0].get("peak_anon_mb") or rows[0].get("anon_mb")
    if args.cap_gb is None and anon is None:
        print("error: the unconstrained run reported no anonymous memory; give --cap-gb", file=sys.stderr)
        return 2
    shares = [float(share) for share in args.shares.split(",")]
    caps = ([int(args.cap_gb * 2**30)] if args.cap_gb else
            [int(anon * 2**20 + share * (feature_bytes + topology_bytes)) for share in shares])
    for cap in caps:
        for order in args.orders.split(","):
            for cache in args.host_cache.split(","):
                summary = out / f"capped-{cap >> 20}-{order}-{cache}.json"
                rows.append(run(f"cap {cap / 2**30:.2f} GiB, {order} order, host cache {cache}",
                                base + ["--read-order", order, "--host-cache-gb", cache, "--summary-json",
                                        str(summary)], summary, cap, cgroup, args.timeout))

    print(f"\n{graph.name}: {args.mode} mode, {args.model} {args.fanouts}, batch {args.batch_size}, "
          f"features {feature_bytes / 2**30:.2f} GiB, topology {topology_bytes / 2**30:.2f} GiB, caps "
          f"{', '.join(f'{cap / 2**30:.2f}' for cap in caps)} GiB (leaving "
          f"{', '.join(f'{(cap - (anon or 0) * 2**20) / 2**30:.2f}' for cap in caps)} GiB beside the "
          f"unconstrained run's peak anonymous memory of {(anon or 0) / 1024:.2f} GiB), {args.threads} threads\n")
    print("| run | epoch s | / unconstrained | wall s | disk read GiB | per epoch / gathered | disk written GiB "
          "| major faults | host cache GiB (built in s) | host cache hit rate |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    free = rows[0].get("epoch_s")
    for row in rows:
        epoch = row.get("epoch_s")
        ratio = f"{epoch / free:.2f}" if epoch and free else "-"
        gathered = row.get("gathered_bytes")
        traffic = (f"{row['read_bytes'] / max(1, row['epochs']) / gathered:.2f}" if gathered and row.get("epochs")
                   else "-")
        if epoch:
            shown = f"{epoch:.1f}"
        elif row["returncode"] is None:
            shown = f"not finished in {args.timeout:.0f} s"
        else:  # -9 inside a cap: the cgroup's out-of-memory killer
            shown = (f"failed (exit {row['returncode']}"
                     + (", killed: out of memory under the cap" if row["returncode"] == -9 else "") + ")")
        cache = row.get("host_cache")
        built = f"{cache['gib']:.2f} ({cache['build_seconds']:.1f})" if cache else "-"
        hits = f"{100 * cache['hit_rate']:.0f}%" if cache and cache["hit_rate"] is not None else "-"
        print(f"| {row['name']} | {shown} | {ratio} | {row['wall_s']:.0f} | {row['read_bytes'] / 2**30:.2f} | "
              f"{traffic} | {row['write_bytes'] / 2**30:.2f} | {row['major_faults']:,} | {built} | {hits} |")
    (out / "table.json").write_text(json.dumps(rows, indent=1))
    print(f"\nsummaries in {out}")
    return 0


def memory_cgroup_kind() -> str | None:
    if os.access(CGROUP / "memory", os.W_OK):
        return "v1"
    controllers = CGROUP / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split() and os.access(CGROUP, os.W_OK):
        return "v2"
    return None


def run(name: str, command: list[str], summary: Path, cap: int | None, cgroup: str, timeout: float) -> dict:
    """Run ``command`` (inside a fresh memory cgroup limited to ``cap`` bytes, when given); poll its disk
    reads and major faults until it ends or ``timeout`` passes."""
    group = None
    if cap is not None:
        group = make_group(cgroup, cap)
        drop_page_cache()
    print(f"$ {' '.join(command)}" + (f"   # cap {cap / 2**30:.2f} GiB" if cap else ""), file=sys.stderr, flush=True)
    start = time.perf_counter()
    env = dict(os.environ, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "2"))
    preexec = (lambda: (group / "cgroup.procs").write_text(str(os.getpid()))) if group else None
    process = subprocess.Popen(command, env=env, preexec_fn=preexec)
    read_bytes = write_bytes = faults = peak_anon = 0
    finished = True
    while process.poll() is None:
        read_bytes, write_bytes, faults = io_counters(process.pid, read_bytes, write_bytes, faults)
        peak_anon = max(peak_anon, anonymous_bytes(process.pid))
        if time.perf_counter() - start > timeout:
            process.kill()
            finished = False
            break
        time.sleep(0.5)
    process.wait()
    row = {"name": name, "wall_s": time.perf_counter() - start, "read_bytes": read_bytes, "write_bytes": write_bytes,
           "major_faults": faults, "returncode": process.returncode if finished else None,
           "peak_anon_mb": peak_anon / 2**20 or None}
    if group:
        group.rmdir()
    if finished and process.returncode == 0:
        data = json.loads(summary.read_text())
        epochs = data["epochs"]
        row.update(epoch_s=steady_median([e["seconds"] for e in epochs]), epochs=len(epochs),
                   anon_mb=data.get("resident_mb", {}).get("anon"), host_cache=data.get("host_cache"),
                   gathered_bytes=sum(e["moved"]["feature_bytes"] for e in epochs) / len(epochs))
    return row


def make_group(kind: str, cap: int) -> Path:
    if kind == "v1":
        group = CGROUP / "memory" / f"neutronorch-bench-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(cap))
    else:
        group = CGROUP / f"neutronorch-bench-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "memory.max").write_text(str(cap))
    return group


def drop_page_cache() -> None:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1")
    except OSError:
        print("note: could not drop the page cache; the capped run starts with what is cached", file=sys.stderr)


def anonymous_bytes(pid: int) -> int:
    """The process's anonymous resident memory now (0 once it has ended)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0


def io_counters(pid: int, read_bytes: int, write_bytes: int, faults: int) -> tuple[int, int, int]:
    """The process's bytes read from and written to storage, and its major faults, so far (the last values
    once it has ended)."""
    try:
        for line in Path(f"/proc/{pid}/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                read_bytes = int(line.split()[1])
            elif line.startswith("write_bytes:"):
                write_bytes = int(line.split()[1])
        faults = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[9])
    except (OSError, IndexError, ValueError):
        pass
    return read_bytes, write_bytes, faults


if __name__ == "__main__":
    raise SystemExit(main())
