#!/usr/bin/env python
"""Every rank's own epoch records of a data-parallel or partitioned `neutronorch train`, for the side-by-side
with DistDGL, whose summary gives every trainer's CPU seconds.

The run summary's epoch records are rank 0's (their `cpu_seconds` are its process's, every thread of it); the
`exchange` entry alone holds every rank's. Started by torchrun in place of `-m neutronorch`, this runs the
same command in each rank and, when it ends, writes OUT/rank-R.json: that rank's epoch records (seconds,
cpu_seconds, stage seconds, batches, sampled edges) and its process's CPU seconds and peak RSS over its life.

    torchrun --standalone --nproc-per-node 2 bench/peers/ours_ranks.py OUT train --partitions DIR ...
"""
import importlib
import json
import os
import resource
import sys

from neutronorch.cli import main

train_run = importlib.import_module("neutronorch.train.run")  # the package's `train` is also a function

KEPT = ("epoch", "seconds", "cpu_seconds", "stage_seconds", "batches", "sampled_edges", "input_nodes_per_batch",
        "peak_rss_mb")


def peak_rss_mb():
    with open("/proc/self/status") as f:
        return next(float(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))


def run(out, argv):
    records = []
    train_epoch = train_run.train_epoch

    def recorded(*args, **kwargs):
        record = train_epoch(*args, **kwargs)
        records.append(record)  # the same dict: what the run adds to it later (exchange, scores) is kept too
        return record

    train_run.train_epoch = recorded
    try:
        return main(argv)
    finally:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        rank = int(os.environ.get("RANK", "0"))
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
            json.dump({"rank": rank, "cpu_seconds": usage.ru_utime + usage.ru_stime, "peak_rss_mb": peak_rss_mb(),
                       "epochs": [{k: r[k] for k in KEPT if k in r} for r in records]}, f, indent=1)


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit("usage: ours_ranks.py OUT_DIR train [OPTION ...]  (under torchrun)")
    sys.exit(run(sys.argv[1], sys.argv[2:]))
