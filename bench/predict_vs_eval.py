"""Prediction over every vertex against the run's evaluation, on one checkpoint, in one process.

Evaluation (exact layer-wise inference of the validation and test vertices) and `predict --nodes all` run
the same inference; this measures that predicting every vertex costs no more than an evaluation.
Alternates the two (A B B A ...) and reports medians.

    python bench/predict_vs_eval.py --checkpoint DIR/last.pt --dataset bench/out/<1M graph> --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from neutronorch import load_checkpoint, load_dataset, predict
from neutronorch.features.store import FeatureStore
from neutronorch.train.evaluate import evaluate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    checkpoint, graph = load_checkpoint(args.checkpoint), load_dataset(args.dataset)
    store, cpu = FeatureStore(graph.features, graph.labels), torch.device("cpu")
    times: dict[str, list[float]] = {"evaluate (val + test)": [], "predict all": []}
    for round_index in range(args.rounds):
        order = list(times) if round_index % 2 == 0 else list(times)[::-1]
        for name in order:
            t0 = time.perf_counter()
            if name == "predict all":
                predict(checkpoint, graph, "all")
            else:
                evaluate(checkpoint.model, graph, store, cpu, None, 4096, 0)
            times[name].append(time.perf_counter() - t0)
    print(f"\n{graph.name}: {args.rounds} rounds, {args.threads} threads")
    print("| run | seconds (median) | per round |")
    print("|---|---:|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    ratio = statistics.median(times["predict all"]) / statistics.median(times["evaluate (val + test)"])
    print(f"\n**predict all / evaluate = {ratio:.3f}**")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
