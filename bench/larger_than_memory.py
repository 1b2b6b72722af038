"""Training on features larger than the memory left for them: one configuration unconstrained and inside a
memory cap, side by side.

First the run without a cap, inside a memory cgroup without a limit (v1 or v2, created here; this needs the
right to create one, as root usually has), the page cache dropped and the graph's arrays read into it from
within the group first, so that it starts warm. Its peak memory is its peak resident set (the summary's
``peak_rss_mb``): its anonymous memory and the resident pages of the files it maps, the features, the
topology and its libraries. Then, for each order in --orders, the same run inside a memory cgroup whose
limit is that peak minus half the feature bytes, which leaves the features about half the memory they need
(--shares: other shares, a set of capped runs for each; or --cap-gb); the page cache is dropped before each
capped run, so it starts cold. (The group's own peak, which also counts files read without being mapped, is
reported too.) --repeat runs the
whole set again, in the reverse order every other round, with the same caps, and reports the medians. Every
run is its own process. For each run: epoch
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
import statistics
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
                        help="comma-separated shares of the feature bytes that each cap leaves them: the "
                             "unconstrained run's peak resident set minus the rest (one set of capped runs per "
                             "share; default: %(default)s)")
    parser.add_argument("--cap-gb", type=float, default=None,
                        help="the memory limit (default: the unconstrained run's peak resident set minus half the "
                             "feature bytes)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of the whole set (the unconstrained run and the capped ones), alternating "
                             "their order; medians reported")
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

    arrays = [graph / name for name in ("features.npy", "indptr.npy", "indices.npy")]
    free = run("unconstrained", base + ["--summary-json", str(out / "free-0.json")], out / "free-0.json", None,
               cgroup, args.timeout, preread=arrays)
    rows = [free]
    # Its peak resident set: anonymous memory and the mapped files' resident pages (features, topology,
    # libraries). Where the summary does not say, the group's peak (page cache included).
    anon = free.get("peak_anon_mb") or free.get("anon_mb")
    peak = free["peak_rss_mb"] * 2**20 if free.get("peak_rss_mb") else free.get("peak_group_bytes")
    if args.cap_gb is None and peak is None:
        print("error: the unconstrained run reported no peak memory; give --cap-gb", file=sys.stderr)
        return 2
    shares = [float(share) for share in args.shares.split(",")]
    caps = ([int(args.cap_gb * 2**30)] if args.cap_gb else
            [int(peak - (1 - share) * feature_bytes) for share in shares])
    capped = [(cap, order, cache) for cap in caps for order in args.orders.split(",")
              for cache in args.host_cache.split(",")]
    for round_index in range(args.repeat):
        runs = [None] + capped if round_index else capped  # round 0's unconstrained run set the caps
        for item in (runs if round_index % 2 == 0 else runs[::-1]):
            if item is None:
                summary = out / f"free-{round_index}.json"
                rows.append(run("unconstrained", base + ["--summary-json", str(summary)], summary, None, cgroup,
                                args.timeout, preread=arrays))
                continue
            cap, order, cache = item
            summary = out / f"capped-{cap >> 20}-{order}-{cache}-{round_index}.json"
            rows.append(run(f"cap {cap / 2**30:.2f} GiB, {order} order, host cache {cache}",
                            base + ["--read-order", order, "--host-cache-gb", cache, "--summary-json",
                                    str(summary)], summary, cap, cgroup, args.timeout))

    print(f"\n{graph.name}: {args.mode} mode, {args.model} {args.fanouts}, batch {args.batch_size}, "
          f"features {feature_bytes / 2**30:.2f} GiB, topology {topology_bytes / 2**30:.2f} GiB, caps "
          f"{', '.join(f'{cap / 2**30:.2f}' for cap in caps)} GiB (the unconstrained run's peak resident set of "
          f"{(peak or 0) / 2**30:.2f} GiB minus "
          f"{', '.join(f'{((peak or 0) - cap) / 2**30:.2f}' for cap in caps)} GiB; its peak anonymous memory "
          f"{(anon or 0) / 1024:.2f} GiB, its group's peak {(free.get('peak_group_bytes') or 0) / 2**30:.2f} GiB), "
          f"{args.threads} threads, {args.repeat} round(s)\n")
    print("| run | epoch s | / unconstrained | wall s | disk read GiB | per epoch / gathered | disk written GiB "
          "| major faults | peak anon GiB | host cache GiB (built in s) | host cache hit rate | last loss |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    free = statistics.median([row["epoch_s"] for row in rows if row["name"] == "unconstrained" and row.get("epoch_s")]
                             or [0]) or None
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
              f"{traffic} | {row['write_bytes'] / 2**30:.2f} | {row['major_faults']:,} | "
              f"{(row['peak_anon_mb'] or 0) / 1024:.2f} | {built} | {hits} | "
              f"{row['losses'][-1] if row.get('losses') else '-'} |")
    if args.repeat > 1:
        print("\nMedians over the rounds (a run that did not finish counts as slower than any that did):\n")
        print("| run | runs | epoch s (each) | median epoch s | / unconstrained median | host cache GiB (median) |")
        print("|---|---:|---|---:|---:|---:|")
        for name in dict.fromkeys(row["name"] for row in rows):
            same = [row for row in rows if row["name"] == name]
            times = [row.get("epoch_s") or float("inf") for row in same]
            median = statistics.median(times)
            sizes = [row["host_cache"]["gib"] for row in same if row.get("host_cache")]
            print(f"| {name} | {len(same)} | {', '.join(f'{t:.1f}' for t in times)} | {median:.1f} | "
                  f"{median / free:.2f} | {statistics.median(sizes) if sizes else '-'} |" if free else "")
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


def run(name: str, command: list[str], summary: Path, cap: int | None, cgroup: str, timeout: float,
        preread: list[Path] = ()) -> dict:
    """Run ``command`` inside a fresh memory cgroup limited to ``cap`` bytes (None: no limit), the page cache
    dropped first and ``preread`` read into it from within the group; poll its disk reads and major faults
    until it ends or ``timeout`` passes. ``peak_group_bytes``: the group's peak memory, page cache included."""
    group = make_group(cgroup, cap)
    drop_page_cache()
    join = lambda: (group / "cgroup.procs").write_text(str(os.getpid()))  # noqa: E731
    if preread:
        subprocess.run(["cat", *map(str, preread)], stdout=subprocess.DEVNULL, check=True, preexec_fn=join)
    print(f"$ {' '.join(command)}" + (f"   # cap {cap / 2**30:.2f} GiB" if cap else ""), file=sys.stderr, flush=True)
    start = time.perf_counter()
    env = dict(os.environ, NUMBA_NUM_THREADS=os.environ.get("NUMBA_NUM_THREADS", "2"))
    process = subprocess.Popen(command, env=env, preexec_fn=join)
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
           "peak_anon_mb": peak_anon / 2**20 or None, "peak_group_bytes": group_peak(cgroup, group)}
    group.rmdir()
    if finished and process.returncode == 0:
        data = json.loads(summary.read_text())
        epochs = data["epochs"]
        row.update(epoch_s=steady_median([e["seconds"] for e in epochs]), epochs=len(epochs),
                   peak_rss_mb=data.get("peak_rss_mb"),
                   anon_mb=data.get("resident_mb", {}).get("anon"), host_cache=data.get("host_cache"),
                   losses=[e["train_loss"] for e in epochs],
                   gathered_bytes=sum(e["moved"]["feature_bytes"] for e in epochs) / len(epochs))
    return row


def make_group(kind: str, cap: int | None) -> Path:
    """A fresh memory cgroup limited to ``cap`` bytes (None: no limit)."""
    if kind == "v1":
        group = CGROUP / "memory" / f"neutronorch-bench-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(cap) if cap is not None else "-1")
    else:
        group = CGROUP / f"neutronorch-bench-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "memory.max").write_text(str(cap) if cap is not None else "max")
    return group


def group_peak(kind: str, group: Path) -> int | None:
    """The group's peak memory, anonymous and page cache together (v1 ``memory.max_usage_in_bytes``, v2
    ``memory.peak``); None where the kernel does not say."""
    try:
        return int((group / ("memory.max_usage_in_bytes" if kind == "v1" else "memory.peak")).read_text())
    except (OSError, ValueError):
        return None


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
