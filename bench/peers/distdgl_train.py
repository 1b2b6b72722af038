#!/usr/bin/env python
"""Peer benchmark: DistDGL (DGL 2.1) partitioned training on one machine, on a native-format dataset directory.

Partitions the graph with ``dgl.distributed.partition_graph`` (METIS, random, or a given vertex -> part
assignment such as ``neutronorch partition``'s part_of.npy), then starts one DistDGL graph server and one
trainer per part on this machine, as DGL's ``tools/launch.py`` would on one machine per part (without ssh),
trains GraphSAGE (mean) with DistNodeDataLoader + DistributedDataParallel over gloo, and prints the epoch
times, each process's peak RSS and the test accuracy.

Run it with the peers venv (see bench/peers/README.md), never with the project's .venv:

    .venv-peers/bin/python bench/peers/distdgl_train.py --dataset DIR --parts 2 --fanouts 10,10 \
        --epochs 3 --threads 1 --eval full --summary-json bench/out/distdgl.json

An epoch's time is the slowest trainer's (the trainers step together: DDP all-reduces every step).
"""
import contextlib
import ctypes
import gc
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from peer_common import parse_args, peak_rss_mb, read_native, write_summary

HERE = os.path.dirname(os.path.abspath(__file__))
MEMORY = ("cpu_seconds", "peak_rss_mb", "anon_mb", "shmem_mb", "file_mb")


def extra_options(p):
    p.add_argument("--parts", type=int, default=None,
                   help="parts = simulated machines, one server and one trainer each (default: 2, or the "
                        "assignment's part count with --part-of)")
    p.add_argument("--method", choices=["metis", "random"], default="metis",
                   help="DGL's partitioning: metis (balancing vertices, training vertices and in-edges) or random")
    p.add_argument("--part-of", default=None,
                   help="a given vertex -> part assignment instead of --method: an integer .npy (one part a "
                        "vertex) or a `neutronorch partition` folder (its part_of.npy)")
    p.add_argument("--work-dir", default=None,
                   help="keep DGL's partitions and the processes' logs here (default: a temporary folder, removed)")
    p.add_argument("--timeout", type=float, default=3600.0, help="stop every process after this many seconds")


ARGS = parse_args(__doc__.split("\n\n")[0], "DistNodeDataLoader", extra=extra_options)
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))
os.environ.setdefault("DGLBACKEND", "pytorch")

import warnings  # noqa: E402

import torch  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # torchdata's banner and the (patched) GraphBolt load warning
    import dgl  # noqa: E402
    import dgl.distributed.partition as dgl_partition  # noqa: E402


def log(msg):
    print(f"[distdgl_train] {msg}", file=sys.stderr, flush=True)


def fail(msg):
    sys.exit(f"distdgl_train.py: error: {msg}")


def check_args(args, n):
    """Refuse what this runner cannot honour; return the given assignment (or None) and the part count."""
    if args.model != "sage":
        fail(f"--model {args.model}: this runner trains GraphSAGE only (DistDGL's example model); use --model sage")
    if args.num_workers:
        fail("--num-workers: DistDGL's sampler processes are not started by this runner; each trainer samples "
             "in its own process (DGL_NUM_SAMPLER=0); use --num-workers 0")
    if args.eval_every:
        fail("--eval-every: this runner evaluates once, after training; use --eval full without --eval-every")
    part_of = None
    if args.part_of:
        path = args.part_of
        if os.path.isdir(path):
            path = os.path.join(path, "part_of.npy")
        if not os.path.isfile(path):
            fail(f"--part-of {args.part_of}: no such file; give part_of.npy or the folder holding it")
        part_of = np.load(path)
        if part_of.ndim != 1 or part_of.shape[0] != n or part_of.dtype.kind not in "iu":
            fail(f"--part-of {path}: {part_of.dtype} array of shape {part_of.shape}; expected one integer part "
                 f"a vertex ({n} vertices): is it this dataset's assignment?")
        k = int(part_of.max()) + 1
        if int(part_of.min()) < 0 or np.bincount(part_of, minlength=k).min() == 0:
            fail(f"--part-of {path}: parts must be numbered 0..K-1, each owning a vertex")
        if args.parts is not None and args.parts != k:
            fail(f"--parts {args.parts}, but --part-of {path} assigns {k} parts; give --parts {k} or leave it out")
        return part_of.astype(np.int64), k
    parts = 2 if args.parts is None else args.parts
    if parts < 2:
        fail(f"--parts {parts}: partitioned training needs at least 2 parts")
    return None, parts


def build_graph(dataset):
    meta, indptr, src, feats, labels, splits, num_classes = read_native(dataset)
    n = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n, idtype=torch.int64)
    g.ndata["features"] = torch.from_numpy(feats)
    g.ndata["labels"] = torch.from_numpy(labels)
    for k in ("train", "val", "test"):
        mask = torch.zeros(n, dtype=torch.bool)
        mask[torch.from_numpy(splits[k])] = True
        g.ndata[f"{k}_mask"] = mask
    return meta, g, indptr, src, num_classes


def partition(g, name, parts, method, part_of, out):
    """DGL's partition_graph; a given assignment goes in through its random path, whose draw
    (``partition.random_choice``) returns the assignment instead. Returns (orig ids by new id, seconds)."""
    kwargs = {}
    if part_of is not None:
        drawn = dgl_partition.random_choice
        dgl_partition.random_choice = lambda k, n: torch.from_numpy(part_of)
        method = "random"
    else:
        kwargs = {"balance_ntypes": g.ndata["train_mask"].int(), "balance_edges": True} if method == "metis" else {}
    dgl.seed(ARGS.seed)  # the random draw
    t = time.perf_counter()
    try:
        with contextlib.redirect_stdout(sys.stderr):  # DGL prints its progress; stdout is the summary's
            orig_nids, _ = dgl.distributed.partition_graph(g, name, parts, out, num_hops=1, part_method=method,
                                                           return_mapping=True, **kwargs)
    finally:
        if part_of is not None:
            dgl_partition.random_choice = drawn
    return orig_nids.numpy(), time.perf_counter() - t


def part_stats(part_config, orig_nids, indptr, src, part_of):
    """Each vertex's part by its dataset id, the edge cut, per-part counts; checks a given assignment held."""
    gpb = dgl.distributed.load_partition_book(part_config, 0)[0]
    n = orig_nids.shape[0]
    got = np.empty(n, dtype=np.int64)
    got[orig_nids] = gpb.nid2partid(torch.arange(n)).numpy()
    if part_of is not None and not np.array_equal(got, part_of):
        fail(f"DGL's parts differ from --part-of at {int((got != part_of).sum())} vertices")
    dst_part = np.repeat(got, np.diff(indptr))
    cut = int((got[src] != dst_part).sum())
    k = int(got.max()) + 1
    return got, {"vertices": np.bincount(got, minlength=k).tolist(),
                 "in_edges": np.bincount(dst_part, minlength=k).tolist(),
                 "edge_cut": cut, "edge_cut_fraction": cut / max(len(src), 1)}


def release_memory():
    """Hand what partitioning allocated back to the system before the processes start: the launcher then holds
    about what torch and DGL take, not the graph and DGL's partitioning buffers (glibc keeps freed memory)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def free_ports(count):
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def start(role, machine, env, work_dir):
    out = open(os.path.join(work_dir, f"{role}-{machine}.log"), "w")
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "distdgl_roles.py")], env=env, stdout=out,
                            stderr=subprocess.STDOUT)
    out.close()
    return {"role": role, "part": machine, "proc": proc, "log": out.name}


def run_processes(args, parts, run, work_dir, part_config, ip_config):
    """One server then one trainer per part; waits for all, collecting each one's exit and peak RSS."""
    master_port = free_ports(1)[0]
    common = {**os.environ, "DISTDGL_RUN": json.dumps(run), "OMP_NUM_THREADS": str(args.threads),
              "DGL_IP_CONFIG": ip_config, "DGL_CONF_PATH": part_config, "DGL_NUM_SERVER": "1",
              "DGL_NUM_CLIENT": str(parts), "DGL_NUM_SAMPLER": "0", "DGL_GRAPH_FORMAT": "csc"}
    procs = []
    try:
        for m in range(parts):
            procs.append(start("server", m, {**common, "DGL_ROLE": "server", "DGL_SERVER_ID": str(m),
                                             "DISTDGL_MACHINE": str(m)}, work_dir))
        for m in range(parts):
            procs.append(start("trainer", m, {**common, "DGL_ROLE": "client", "DGL_DIST_MODE": "distributed",
                                              "DGL_GROUP_ID": "0", "DISTDGL_MACHINE": str(m),
                                              "DISTDGL_SERVER_PID": str(procs[m]["proc"].pid),
                                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
                                              "RANK": str(m), "LOCAL_RANK": "0", "WORLD_SIZE": str(parts)},
                               work_dir))
        deadline = time.monotonic() + args.timeout
        waiting = list(procs)
        while waiting:
            for p in list(waiting):
                if p["proc"].poll() is not None:
                    waiting.remove(p)
                    if p["proc"].returncode:
                        raise RuntimeError(f"{p['role']} {p['part']} exited with {p['proc'].returncode}")
            if waiting and time.monotonic() > deadline:
                raise RuntimeError(f"still running after --timeout {args.timeout:.0f} s")
            time.sleep(0.2)
    except (RuntimeError, KeyboardInterrupt) as err:
        for p in procs:
            if p["proc"].returncode is None:
                p["proc"].kill()
                p["proc"].wait()
        tails = "".join(f"\n--- {p['log']} (last lines)\n" + "".join(open(p["log"]).readlines()[-15:])
                        for p in procs)
        fail(f"{err}; every process stopped. The processes' logs:{tails}")
    finally:
        # DGL unlinks its segments when a process exits normally, not when it is killed.
        for path in glob.glob(f"/dev/shm/{run['shm_prefix']}m*"):
            os.unlink(path)
    # Each process's memory, as it measured it at its end (ru_maxrss of a child would include the launcher's).
    return [{"role": p["role"], "part": p["part"], "exit": p["proc"].returncode,
             **{k: v for k, v in read_report(work_dir, f"{p['role']}-{p['part']}").items() if k in MEMORY}}
            for p in procs]


def read_report(work_dir, name):
    with open(os.path.join(work_dir, f"{name}.json")) as f:
        return json.load(f)


def main(args):
    t0 = time.perf_counter()
    meta, g, indptr, src, num_classes = build_graph(args.dataset)
    load_seconds = time.perf_counter() - t0
    n = g.num_nodes()
    part_of, parts = check_args(args, n)
    name = meta.get("name", os.path.basename(os.path.normpath(args.dataset)))
    method = "given" if part_of is not None else args.method
    log(f"dataset {name}: {n} nodes, {g.num_edges()} edges, loaded in {load_seconds:.1f} s; "
        f"partitioning into {parts} parts ({method})")
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="distdgl-")
    os.makedirs(work_dir, exist_ok=True)
    try:
        orig_nids, part_seconds = partition(g, "graph", parts, args.method, part_of,
                                            os.path.join(work_dir, "parts"))
        del g
        part_config = os.path.join(work_dir, "parts", "graph.json")
        np.save(os.path.join(work_dir, "orig_nids.npy"), orig_nids)
        assignment, stats = part_stats(part_config, orig_nids, indptr, src, part_of)
        num_edges = int(indptr[-1])
        del indptr, src
        release_memory()
        np.save(os.path.join(work_dir, "part_of.npy"), assignment.astype(np.int32))
        log(f"partitioned in {part_seconds:.1f} s: vertices {stats['vertices']}, in-edges {stats['in_edges']}, "
            f"edge cut {stats['edge_cut']} ({100 * stats['edge_cut_fraction']:.2f}%)")
        ip_config = os.path.join(work_dir, "ip_config.txt")
        with open(ip_config, "w") as f:
            f.writelines(f"127.0.0.1 {port}\n" for port in free_ports(parts))
        run = {"shm_prefix": f"distdgl{os.getpid()}", "threads": args.threads,
               "dataset": os.path.abspath(args.dataset),
               "part_config": part_config, "graph_name": "graph", "num_classes": num_classes,
               "orig_nids": os.path.join(work_dir, "orig_nids.npy"), "work_dir": work_dir,
               "args": {k: v for k, v in vars(args).items()}}
        t = time.perf_counter()
        processes = run_processes(args, parts, run, work_dir, part_config, ip_config)
        run_seconds = time.perf_counter() - t
        trainers = [read_report(work_dir, f"trainer-{r}") for r in range(parts)]
    finally:
        if not args.work_dir:
            shutil.rmtree(work_dir, ignore_errors=True)
    summary = summarise(args, meta, name, n, num_edges, num_classes, load_seconds, method, parts, part_seconds,
                        stats, processes, run_seconds, trainers)
    write_summary(summary, args, log)
    return summary


def mean_loss(records):
    losses = [r["train_loss"] for r in records if r["train_loss"] is not None]
    return sum(losses) / len(losses) if losses else None


def summarise(args, meta, name, n, num_edges, num_classes, load_seconds, method, parts, part_seconds, stats,
              processes, run_seconds, trainers):
    epochs = []
    for e in range(len(trainers[0]["epochs"])):
        per = [t["epochs"][e] for t in trainers]
        epochs.append({"epoch": e, "seconds": max(r["seconds"] for r in per),
                       "trainer_seconds": [r["seconds"] for r in per],
                       "trainer_cpu_seconds": [r["cpu_seconds"] for r in per],
                       # each machine's server over its trainer's epoch: it samples for every trainer
                       "server_cpu_seconds": [r["server_cpu_seconds"] for r in per],
                       "stage_seconds": {k: max(r["stage_seconds"][k] for r in per) for k in per[0]["stage_seconds"]},
                       "train_loss": mean_loss(per), "batches": [r["batches"] for r in per],
                       "sampled_edges": sum(r["sampled_edges"] for r in per),
                       "input_nodes_per_batch": [r["input_nodes_per_batch"] for r in per]})
        log(f"epoch {e}: {epochs[-1]['seconds']:.2f} s (trainers: "
            + ", ".join(f"{s:.2f}" for s in epochs[-1]["trainer_seconds"]) + ")")
    for p in processes:
        log(f"{p['role']} {p['part']}: CPU {p['cpu_seconds']:.1f} s, peak RSS {p['peak_rss_mb']:.0f} MB; at its "
            f"end anonymous {p['anon_mb']:.0f} MB, shared memory {p['shmem_mb']:.0f} MB, files {p['file_mb']:.0f} MB")
    cfg = {k: v for k, v in vars(args).items() if k != "fanouts_list"}
    cfg.update(fanouts=args.fanouts_list, dgl_fanouts=list(reversed(args.fanouts_list)))
    return {
        "system": "distdgl", "version": dgl.__version__, "torch_version": torch.__version__, "config": cfg,
        "dataset": {"name": name, "nodes": int(n), "edges": num_edges, "num_classes": num_classes,
                    "train": sum(t["train"] for t in trainers)},
        "load_seconds": load_seconds,
        "partition": {"method": method, "parts": parts, "seconds": part_seconds, **stats,
                      "train_per_trainer": [t["train"] for t in trainers],
                      "train_in_own_part": [t["train_in_part"] for t in trainers]},
        "run_seconds": run_seconds,
        "trainer_startup_seconds": [t["startup_seconds"] for t in trainers],
        "epochs": epochs,
        "epoch_seconds_median": statistics.median(e["seconds"] for e in epochs) if epochs else None,
        # Each trainer's sampled edges over its time waiting on DistNodeDataLoader, summed over the trainers.
        "sampled_edges_per_second": sum(t["sampled_edges_per_second"] or 0.0 for t in trainers),
        "val_acc": trainers[0]["val_acc"], "test_acc": trainers[0]["test_acc"],
        "eval_seconds": trainers[0]["eval_seconds"],
        "processes": processes,
        "peak_rss_mb": peak_rss_mb(),
    }


if __name__ == "__main__":
    main(ARGS)
