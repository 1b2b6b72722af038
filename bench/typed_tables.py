#!/usr/bin/env python
"""Embedding tables in memory against memory-mapped (``embedding_storage`` memory, mmap): the cost of mmap
where everything still fits, side by side.

Each storage trains in a process of its own, one after the other (``--order``), on the same
``synthetic_typed`` graph (``--nodes``; its author, institution and field types have no features, so tables),
in exact mode with the same settings and seed, writing checkpoints into a temporary folder. The mapped
tables' files are new, so their pages are in the page cache from the start (warm): this measures what the
mapping costs while memory suffices, not a table larger than memory. Prints a markdown table: each epoch's
seconds and the median of those after the first, the seconds each checkpoint took (last.pt, and best.pt at a
better score), the seconds the tables were drawn in, peak RSS, the resident anonymous and file-backed memory
at the end, and whether the losses agree to the bit:

    NUMBA_NUM_THREADS=2 .venv/bin/python bench/typed_tables.py --nodes 200000 --epochs 4 --threads 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=200_000, help="synthetic_typed vertices (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=4, help="(default: %(default)s)")
    p.add_argument("--fanouts", default="10,10", help="every relation's, seed hop first (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=64, help="also the tables' width (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=1024, help="(default: %(default)s)")
    p.add_argument("--model", default="sage", help="sage, rgcn or rgat (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="training threads; 0 = all cores")
    p.add_argument("--order", default="memory,mmap", help="storages, in the order they run (default: %(default)s)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(args) -> dict:
    """One storage's run, in this process: what the table reports."""
    from neutronorch import TrainConfig, train
    from neutronorch.data import synthetic_typed
    from neutronorch.train.resources import resident_mb

    graph = synthetic_typed(nodes=args.nodes, seed=0)
    with tempfile.TemporaryDirectory(prefix="typed-tables-") as folder:
        config = TrainConfig(model=args.model, epochs=args.epochs, fanouts=args.fanouts, hidden=args.hidden,
                             batch_size=args.batch_size, threads=args.threads, device="cpu", progress=False,
                             eval_every=args.epochs, embedding_storage=args.worker, checkpoint_dir=folder,
                             embedding_dir=folder)
        summary = train(config, graph=graph)
        resident = resident_mb()
    epochs = summary["epochs"]
    return {"storage": args.worker, "epoch_seconds": [round(e["seconds"], 3) for e in epochs],
            "checkpoint_seconds": [e.get("checkpoint_seconds") for e in epochs],
            "losses": [e["train_loss"] for e in epochs], "peak_rss_mb": summary["peak_rss_mb"],
            "resident_mb": resident, "tables": summary["embedding_tables"], "test_acc": summary["test_acc"]}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    for storage in args.order.split(","):
        command = [sys.executable, __file__, "--worker", storage] + [
            f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items() if k not in ("worker", "order")]
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    first = rows[0]
    tables = first["tables"]
    print(f"synthetic_typed(nodes={args.nodes}), {args.model}, fanouts {args.fanouts}, hidden {args.hidden}, batch "
          f"{args.batch_size}, threads {args.threads or 'all'}; tables {tables['tables']}, "
          f"{tables['gib'] * 1024:.1f} MiB with both moments\n")
    print("| storage | epoch s (each) | median after the first | checkpoint s (each) | tables drawn s | peak RSS MB "
          "| resident anon / file MB at the end | losses as the first row's |")
    print("|---|---|---:|---|---:|---:|---|---|")
    for row in rows:
        steady = statistics.median(row["epoch_seconds"][1:] or row["epoch_seconds"])
        resident = row["resident_mb"]
        print(f"| {row['storage']} | {', '.join(map(str, row['epoch_seconds']))} | {steady:.3f} | "
              f"{', '.join(str(s) for s in row['checkpoint_seconds'])} | {row['tables']['draw_seconds']} | "
              f"{row['peak_rss_mb']:,.0f} | {resident.get('anon', 0):,.0f} / {resident.get('file', 0):,.0f} | "
              f"{'the same' if row['losses'] == first['losses'] else 'DIFFER'} |")


if __name__ == "__main__":
    main()
