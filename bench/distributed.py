"""Data parallel against one process: N gloo ranks (torchrun) with batch B against one process with N x B.

Both train the same graph with the same settings and seed; the ranks split every global batch, so the
per-step losses must agree up to the order of floating-point sums. Printed side by side: the largest
relative difference of the step losses, test scores at the best validation epoch (the issue's target:
within 0.5 point), median
steady epoch time, and peak resident memory of the process and of each rank (target: each rank at most
1.2x the single process). Every run is its own process; each launcher run's ranks share the machine's cores.

    python bench/distributed.py                                  # 1M vertices / 20M edges, 3-layer SAGE
    python bench/distributed.py --dataset ../data/amazon_cs.npz --split ratio:0.6,0.2 --fanouts 10,10 \\
        --batch-size 256 --epochs 50 --eval-every 1
    python bench/distributed.py --mode neutronorch --hot-sets node,rank --epochs 3 --eval-every -1
    python bench/distributed.py --dataset TYPED_FOLDER --fanouts 10,10 --hidden 64 --batch-size 256  # typed SAGE

With ``--hot-sets``, NeutronOrch mode's ranks run once per ``--hot-set`` (rows hot on several ranks of a
node computed by each, or once), side by side, with the hot rows each rank computed and its host lane.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys

from common import OUT, add_graph_arguments, add_model_arguments, ensure_graph, steady_median

TARGET_POINTS = 0.5  # test score: the ranks at most this many points from the single process
TARGET_RSS = 1.2  # peak resident memory per rank at most this multiple of the single process's


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    add_model_arguments(parser)
    parser.add_argument("--dataset", default=None, help="train on this instead of the synthetic graph")
    parser.add_argument("--split", default=None)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--mode", default="exact")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0,
                        help="training threads of the single process (the ranks get it divided by --ranks); "
                             "0 = all cores")
    parser.add_argument("--hot-sets", default="node",
                        help="neutronorch: comma-separated --hot-set values, one ranks run each (default: node)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the ranks this many times, interleaved, and report each run's epoch time and "
                             "their median (the tables' other columns are the first run's)")
    parser.add_argument("--train-args", default="", help="more `neutronorch train` options for every run")
    parser.add_argument("--tag", default="distributed")
    parser.add_argument("--report-only", action="store_true",
                        help="print the table of the runs already under bench/out with this --tag")
    args = parser.parse_args()
    dataset = args.dataset or str(ensure_graph(args.nodes, args.degree, args.features, args.classes))
    cores = len(os.sched_getaffinity(0))
    threads = args.threads or cores
    per_rank = max(1, threads // args.ranks)
    common = ["--dataset", dataset, "--model", args.model, "--fanouts", args.fanouts, "--hidden", str(args.hidden),
              "--lr", str(args.lr), "--dropout", str(args.dropout), "--epochs", str(args.epochs), "--mode", args.mode,
              "--eval-every", str(args.eval_every), "--seed", str(args.seed), "--device", "cpu", "--no-progress",
              "--no-stage-table", "--log-every", "1"] + (["--split", args.split] if args.split else []) + shlex.split(
                  args.train_args)
    OUT.mkdir(parents=True, exist_ok=True)
    runs = {}
    launchers = [("one process", [sys.executable, "-m", "neutronorch", "train"], args.batch_size * args.ranks,
                  threads, [], "one")]
    hot_sets = args.hot_sets.split(",") if args.mode == "neutronorch" else [None]
    for hot_set in hot_sets:
        name = f"{args.ranks} ranks" + (f", --hot-set {hot_set}" if len(hot_sets) > 1 else "")
        launchers.append((name, [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 str(args.ranks), "-m", "neutronorch", "train"], args.batch_size, per_rank,
                          ["--hot-set", hot_set] if hot_set else [], "ranks" + (f"-{hot_set}" if hot_set else "")))
    def run(launcher, batch, thr, extra, stem):
        host = ["--host-threads", str(max(1, thr // 2))] if args.mode == "neutronorch" else []  # its mode's only
        command = launcher + common + extra + host + ["--batch-size", str(batch), "--threads", str(thr),
                                                      "--sampler-threads", str(max(1, thr // 2)), "--overwrite",
                                                      "--summary-json", f"{stem}.json", "--log-jsonl", f"{stem}.jsonl"]
        if not args.report_only:
            print("$ " + " ".join(command), file=sys.stderr, flush=True)
            env = {**os.environ, "OMP_NUM_THREADS": str(thr), "NUMBA_NUM_THREADS": str(max(1, thr))}
            subprocess.run(command, check=True, env=env)
        summary = json.loads(open(f"{stem}.json").read())
        losses = [r["loss"] for r in map(json.loads, open(f"{stem}.jsonl")) if r["kind"] == "step"]
        return {"summary": summary, "losses": losses, "batch": batch,
                "epoch_s": [steady_median([e["seconds"] for e in summary["epochs"]])]}

    name, *one = launchers[0]
    runs[name] = run(*one[:-1], OUT / f"{args.tag}-{one[-1]}")
    for repeat in range(args.repeats):  # the ranks' runs interleaved, their order turned round each time
        for name, *launch in (launchers[1:] if repeat % 2 == 0 else launchers[:0:-1]):
            done = run(*launch[:-1], OUT / (f"{args.tag}-{launch[-1]}" + (f"-{repeat}" if repeat else "")))
            if name in runs:
                runs[name]["epoch_s"] += done["epoch_s"]
            else:
                runs[name] = done
    if args.mode == "neutronorch":
        print_hot_sets(runs)
    one, many = runs["one process"], runs[launchers[1][0]]
    differences = [abs(a - b) / max(abs(a), 1e-12) for a, b in zip(one["losses"], many["losses"])]
    per_epoch = len(one["summary"]["epochs"]) and len(differences) // len(one["summary"]["epochs"])
    apart = next((k for k, d in enumerate(differences) if d > 1e-3), None)
    metric = one["summary"]["metric"]
    print(f"\n{args.mode} mode, {dataset}, {args.model} {args.fanouts}, {args.epochs} epochs, {cores} cores\n")
    print(f"| run | batch per process | epoch s (median, steady) | final loss | test {metric} | peak RSS MB "
          f"| at the end: own (anon) MB | mapped files MB |")  # test: at the best validation epoch
    print("|---|---:|---:|---:|---:|---|---|---|")
    for name, run in runs.items():
        s = run["summary"]
        memory = s["distributed"]["resident_mb_per_rank"] if s["distributed"] else [
            {"peak_rss": s["peak_rss_mb"], **s.get("resident_mb", {})}]  # a typed run's summary has none
        test = s["test_acc"]
        column = lambda key: ", ".join(f"{m.get(key, float('nan')):.0f}" for m in memory)  # noqa: E731
        print(f"| {name} | {run['batch']} | {_epoch(run)} | "
              f"{s['epochs'][-1]['train_loss']:.4f} | {'-' if test is None else f'{100 * test:.2f}'} | "
              f"{column('peak_rss')} | {column('anon')} | {column('file')} |")
    print(f"\nstep losses: {len(differences)} compared; largest relative difference in the first epoch "
          f"{max(differences[:per_epoch], default=float('nan')):.2e}, over all {max(differences, default=float('nan')):.2e}"
          f"; first step more than 1e-3 apart: {apart}")
    ok = True
    if one["summary"]["test_acc"] is not None:
        points = 100 * abs(one["summary"]["test_acc"] - many["summary"]["test_acc"])
        ok &= points <= TARGET_POINTS
        print(f"test score difference: {points:.2f} points (target <= {TARGET_POINTS}): "
              f"{'PASS' if points <= TARGET_POINTS else 'FAIL'}")
    rss_ratio = max(many["summary"]["distributed"]["peak_rss_mb_per_rank"]) / one["summary"]["peak_rss_mb"]
    ok &= rss_ratio <= TARGET_RSS
    print(f"peak RSS per rank / one process: {rss_ratio:.2f} (target <= {TARGET_RSS}): "
          f"{'PASS' if rss_ratio <= TARGET_RSS else 'FAIL'}")
    return 0 if ok else 1


def _epoch(run: dict) -> str:
    """The median steady epoch time over a run's repeats (each repeat's in brackets when there are several)."""
    times = run["epoch_s"]
    text = f"{statistics.median(times):.2f}"
    return text + (f" ({', '.join(f'{t:.2f}' for t in times)})" if len(times) > 1 else "")


def print_hot_sets(runs: dict) -> None:
    """NeutronOrch mode: what each run's hot sets cost its host (rank 0's numbers; ranks are alike)."""
    print("\n| run | hot rows per super-batch | computed by the process | host bottom-layer edges | "
          "host lane busy | trainer lane busy | epoch s (median, steady) | staleness max / mean |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for name, run in runs.items():
        s = run["summary"]
        hot, steady = s["hot"], s["epochs"][1:] or s["epochs"]
        busy = lambda lane: sum(e["lane_busy"].get(lane, 0.0) for e in steady) / len(steady)  # noqa: E731
        print(f"| {name} | {hot['mean_hot_per_super_batch']:,.0f} | {hot['mean_computed_per_super_batch']:,.0f} | "
              f"{hot['host_bottom_edges']:,} | {100 * busy('host'):.0f}% | {100 * busy('trainer'):.0f}% | "
              f"{_epoch(run)} | {s['staleness']['max_observed']} / "
              f"{s['staleness']['mean_observed']:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
