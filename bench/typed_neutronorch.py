#!/usr/bin/env python
"""Typed NeutronOrch against exact mode: epoch time side by side, on one machine, in one run.

Both modes train the same model on the same ``synthetic_typed`` graph with the same settings; they take
turns, round after round (``--rounds``), so that a busy spell of a shared machine falls on both. Each run's
first epoch (numba compiling, caches warming) is dropped; the table gives the median of the other epochs,
NeutronOrch's over exact's, the share of bottom-layer rows NeutronOrch served hot and the stage seconds of
its last epoch (``host_compute``: the host's rows, on a thread of its own).

    NUMBA_NUM_THREADS=1 .venv/bin/python bench/typed_neutronorch.py --models sage,rgcn,rgat
"""
from __future__ import annotations

import argparse
import logging
import statistics

from neutronorch import TrainConfig, train
from neutronorch.data import synthetic_typed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="sage,rgcn", help="comma-separated: sage, rgcn, rgat (default: %(default)s)")
    p.add_argument("--nodes", type=int, default=100_000, help="synthetic_typed vertices (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=4, help="per run, the first dropped (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each mode, taking turns (default: %(default)s)")
    p.add_argument("--fanouts", default="10,10", help="every relation's, seed hop first (default: %(default)s)")
    p.add_argument("--hidden", type=int, default=64, help="(default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=256, help="(default: %(default)s)")
    p.add_argument("--super-batch", type=int, default=8, help="NeutronOrch's P (default: %(default)s)")
    p.add_argument("--hot-ratio", default="auto", help="NeutronOrch's hot ratio (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="the trainer's threads (default: %(default)s)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.getLogger("neutronorch").setLevel(logging.ERROR)
    graph = synthetic_typed(nodes=args.nodes, train=0.3, val=0.1, seed=0)
    print(f"synthetic_typed nodes={args.nodes}; fanouts {args.fanouts}, hidden {args.hidden}, batch "
          f"{args.batch_size}, {args.epochs} epochs a run (first dropped), {args.rounds} rounds, trainer threads "
          f"{args.threads}; NeutronOrch super-batch {args.super_batch}, hot ratio {args.hot_ratio}\n")
    print("| model | exact epoch s | neutronorch epoch s | neutronorch / exact | rows served hot | "
          "neutronorch stages (last epoch, s) |")
    print("|---|---:|---:|---:|---:|---|")
    for model in args.models.split(","):
        seconds = {"exact": [], "neutronorch": []}
        last = None
        for _ in range(args.rounds):
            for mode in seconds:
                orch = dict(super_batch=args.super_batch, hot_ratio=args.hot_ratio) if mode == "neutronorch" else {}
                summary = train(TrainConfig(model=model, mode=mode, **orch, epochs=args.epochs, fanouts=args.fanouts,
                                            hidden=args.hidden, batch_size=args.batch_size, lr=0.003,
                                            threads=args.threads, device="cpu", eval_every=0, seed=0,
                                            progress=False), graph=graph)
                seconds[mode] += [e["seconds"] for e in summary["epochs"][1:]]
                if mode == "neutronorch":
                    last = summary
        exact, orch = statistics.median(seconds["exact"]), statistics.median(seconds["neutronorch"])
        stages = ", ".join(f"{k} {v:.2f}" for k, v in last["epochs"][-1]["stage_seconds"].items() if v >= 0.005)
        print(f"| {model} | {exact:.3f} | {orch:.3f} | **{orch / exact:.3f}** | "
              f"{last['hot']['reuse_rate']:.3f} | {stages} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
