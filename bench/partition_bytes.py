"""The cost model of partitioned training's bytes between ranks (``neutronorch.orchestration.partition_cost``)
against the bytes a run measured, per rank: training (sampling and rows) in the first epoch, and evaluation.

    python bench/partition_bytes.py --partitions PARTS                 # runs K ranks (torchrun), one epoch
    python bench/partition_bytes.py --partitions PARTS --hot-ratio 0.2    # NeutronOrch mode, bytes per lane
    python bench/partition_bytes.py --partitions PARTS --summary run.json   # reads a run's summary instead
    python bench/partition_bytes.py --predict                          # ogbn-papers100M, IGB-full, IGBH-full

A run is ``torchrun --standalone --nproc-per-node K -m neutronorch train --partitions PARTS`` with one epoch,
``--threads 1 --sampler-threads 1``; its summary's epoch record holds every rank's bytes, its ``exchange`` rank
0's evaluation bytes. The model is read with the run's fanouts, batch size, hidden width and evaluation chunk,
once with the degree classes of the parts' in-edges and once with every vertex at the mean degree (``one
class``), and the table gives measured / model. With ``--hot-ratio R`` the run is NeutronOrch mode at that ratio
(``--mode neutronorch``, no evaluation) and the table gives each rank's bytes per lane (plan, cold, host,
gradient) against ``partition_cost_hot.py``'s, with the plan's hot, computed and reached vertices and reuse.
A typed graph's folder (dealt by owner) is checked per lane of its run (exact mode: sampling and rows, the
embedding tables') against ``partition_cost_typed.py``'s, and with ``--hot-ratio R`` per lane of NeutronOrch mode
(plan, cold, host, gradient, tables) against ``partition_cost_typed_hot.py``'s (``partition_bytes_typed.py``).
``--predict`` prints the model's bytes, seconds and memory per machine for the two large graphs at 4, 16 and 64
machines, and IGBH-full's bytes and seconds as a typed graph (with ``--hot-ratio``, in NeutronOrch mode too),
under the assumptions in docs/distributed.md ("Cost model")."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from common import OUT, verdict_lines
from partition_bytes_typed import compare_typed, is_typed, lane_lines, predict_typed

from neutronorch.orchestration.partition_cost import (DEALINGS, CostInputs, Degrees, epoch_seconds,
                                                      evaluation_bytes, frontier, machine_memory, of_partition,
                                                      rank_batches, training_bytes)
from neutronorch.orchestration.partition_cost_hot import LANES, neutronorch_bytes

TARGET = 0.15  # measured within 15% of the model


def run(parts: Path, ranks: int, args, summary: Path) -> dict:
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               "-m", "neutronorch", "train", "--partitions", str(parts), "--fanouts", args.fanouts,
               "--batch-size", str(args.batch_size), "--hidden", str(args.hidden), "--epochs", "1",
               "--threads", "1", "--sampler-threads", "1", "--no-progress", "--no-stage-table", "--device", "cpu",
               "--no-save", "--summary-json", str(summary), "--overwrite"]  # the bench's own output, run again
    if args.hot_ratio is not None:
        command += ["--mode", "neutronorch", "--hot-ratio", str(args.hot_ratio), "--super-batch",
                    str(args.super_batch), "--eval-every", "-1"]
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    summary.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(command, check=True, env=env)
    return json.loads(summary.read_text())


def compare(parts: Path, summary: dict, dealing: str) -> list[str]:
    config = summary["config"]
    if is_typed(parts):
        return compare_typed(parts, summary, TARGET)
    if config["mode"] == "neutronorch":
        return compare_lanes(parts, summary, dealing)
    inputs = of_partition(parts, [int(f) for f in config["fanouts"]], int(config["batch_size"]),
                          hidden=int(config["hidden"]), eval_batch_size=int(config["eval_batch_size"]),
                          dealing=dealing)
    one = replace(inputs, degrees=Degrees.uniform(inputs.nodes, inputs.edges, inputs.train))
    record = summary["epochs"][0]
    lines = [f"{parts}: {inputs.ranks} ranks, {dealing} dealing, cut {inputs.cut:.2%}, fanouts {inputs.fanouts}, "
             f"batch {inputs.batch_size} per rank", "",
             "| what | rank | sent | received | model | received / model | sent / model "
             "| one class: received / model |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    worst = 0.0
    for rank, measured in enumerate(record["exchange"]):
        model, flat = training_bytes(inputs, rank)["total"], training_bytes(one, rank)["total"]
        worst = max(worst, abs(measured["received_bytes"] / model - 1), abs(measured["sent_bytes"] / model - 1))
        lines.append(f"| training | {rank} | {measured['sent_bytes']:,} | {measured['received_bytes']:,} | "
                     f"{model:,.0f} | {measured['received_bytes'] / model:.3f} | "
                     f"{measured['sent_bytes'] / model:.3f} | {measured['received_bytes'] / flat:.3f} |")
    measured = summary["exchange"]["evaluation"]
    model, flat = evaluation_bytes(inputs, 0)["total"], evaluation_bytes(one, 0)["total"]
    worst = max(worst, abs(measured["received_bytes"] / model - 1), abs(measured["sent_bytes"] / model - 1))
    lines.append(f"| evaluation | 0 | {measured['sent_bytes']:,} | {measured['received_bytes']:,} | {model:,.0f} | "
                 f"{measured['received_bytes'] / model:.3f} | {measured['sent_bytes'] / model:.3f} | "
                 f"{measured['received_bytes'] / flat:.3f} |")
    rows = {"model": one_rank_rows(inputs), "one class": one_rank_rows(one)}
    lines += ["", f"input rows per batch, rank 0: measured {record['input_nodes_per_batch']:,.0f}, model "
                  f"{rows['model']:,.0f} ({record['input_nodes_per_batch'] / rows['model']:.3f}), one class "
                  f"{rows['one class']:,.0f} ({record['input_nodes_per_batch'] / rows['one class']:.3f})",
              *verdict_lines(worst, TARGET)]
    return lines


def compare_lanes(parts: Path, summary: dict, dealing: str) -> list[str]:
    """A NeutronOrch run's training bytes per rank and lane against the model's (every lane and the total
    within the target), and its rank 0's plan statistics against the model's."""
    config = summary["config"]
    row_bytes = 2 if "bf16" in str(summary.get("precision", {}).get("name", "")) else 4
    inputs = of_partition(parts, [int(f) for f in config["fanouts"]], int(config["batch_size"]),
                          hidden=int(config["hidden"]), dealing=dealing, hot_ratio=float(config["hot_ratio"]),
                          super_batch=int(config["super_batch"]), hot_row_bytes=row_bytes)
    header = (f"{parts}: {inputs.ranks} ranks, {dealing} dealing, cut {inputs.cut:.2%}, fanouts {inputs.fanouts}, "
              f"batch {inputs.batch_size} per rank, hot ratio {inputs.hot_ratio:g}, super-batch {inputs.super_batch}")
    return lane_lines(header, summary, lambda rank: neutronorch_bytes(inputs, rank), LANES, TARGET)


def one_rank_rows(inputs: CostInputs) -> float:
    """Rank 0's mean input rows per batch over the epoch's batches (empty ones included)."""
    batches = rank_batches(inputs, 0)
    total = sum(sum(h["own"] + h["remote"] for h in frontier(inputs, 0, seeds)[-1:]) * count
                for seeds, count in batches if seeds > 0 and count > 0)
    return total / max(1, sum(count for _, count in batches))


# The large graphs: vertices, in-edges as the CSC holds them (made undirected), features, training and
# evaluated (validation and test) vertices; and the METIS edge cut assumed per machine count.
GRAPHS = {
    "ogbn-papers100M": dict(nodes=111_059_956, edges=3_228_124_712, feature_dim=128, train=1_207_179,
                            eval_nodes=125_265 + 214_338),
    "IGB-full": dict(nodes=269_346_174, edges=3_995_777_033, feature_dim=1024, train=136_278_514,
                     eval_nodes=227_130_858 - 136_278_514),
}
ASSUMED_CUT = {4: 0.2, 16: 0.3, 64: 0.4}


def predict(args) -> list[str]:
    """The large graphs' rows: per graph, machines and dealing exact mode, and by owner (as a partitioned run
    deals) NeutronOrch mode at each ``--hot-ratio``."""
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    lines = [f"fanouts {args.fanouts}, batch {args.batch_size} per machine, hidden {args.hidden}, float32 "
             f"features; network {args.network} Gbit/s, disk {args.disk} GB/s; METIS cut assumed {ASSUMED_CUT}; "
             f"NeutronOrch super-batch {args.super_batch}; GB received (= sent) per machine", "",
             "| graph | machines | dealing | mode | training GB | evaluation GB | memory GB | "
             + " | ".join(f"train s, {g:g} Gbit/s" for g in args.network) + " | "
             + " | ".join(f"eval s, {g:g} Gbit/s" for g in args.network) + " | train s, disk |",
             "|---|---:|---|---|---:|---:|---:|" + "---:|" * (2 * len(args.network) + 1)]
    modes = [("exact", None, DEALINGS)] + [(f"hot ratio {r:g}", r, ("owner",)) for r in args.hot_ratio or ()]
    for name, graph in GRAPHS.items():
        for machines, cut in ASSUMED_CUT.items():
            for mode, ratio, dealings in modes:
                for dealing in dealings:
                    inputs = CostInputs(**graph, ranks=machines, fanouts=fanouts, batch_size=args.batch_size,
                                        hidden=args.hidden, cut=cut, dealing=dealing, hot_ratio=ratio,
                                        super_batch=args.super_batch)
                    train = neutronorch_bytes(inputs, 0) if ratio is not None else training_bytes(inputs, 0)
                    evaluation = evaluation_bytes(inputs, 0)["total"]
                    times = [epoch_seconds(inputs, g, train=train) for g in args.network]
                    disk = epoch_seconds(inputs, args.network[0], args.disk, train=train)["train_disk"]
                    lines.append(f"| {name} | {machines} | {dealing} | {mode} | {train['total'] / 1e9:,.1f} | "
                                 f"{evaluation / 1e9:,.1f} | {machine_memory(inputs)['total'] / 1e9:,.1f} | "
                                 + " | ".join(f"{t['train_network']:,.1f}" for t in times) + " | "
                                 + " | ".join(f"{t['eval_network']:,.1f}" for t in times) + f" | {disk:,.0f} |")
    return lines + predict_typed(args, ASSUMED_CUT)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=Path, help="a partition folder (`neutronorch partition`)")
    parser.add_argument("--summary", type=Path, help="read this run's summary JSON instead of running")
    parser.add_argument("--dealing", choices=DEALINGS, default="owner",
                        help="how the run dealt its seeds (a partitioned run: by owner)")
    parser.add_argument("--fanouts", default="10,10")
    parser.add_argument("--batch-size", type=int, default=512, help="seeds per rank and batch")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--predict", action="store_true", help="the large graphs' predictions instead")
    parser.add_argument("--network", type=float, nargs="+", default=[10.0, 100.0], help="Gbit/s (--predict)")
    parser.add_argument("--disk", type=float, default=2.0, help="GB/s of the disk (--predict)")
    parser.add_argument("--hot-ratio", type=float, nargs="+",
                        help="NeutronOrch mode at this hot ratio (--predict: each, beside exact mode)")
    parser.add_argument("--super-batch", type=int, default=8, help="mini-batches a super-batch (NeutronOrch)")
    args = parser.parse_args()
    if args.predict:
        print("\n".join(predict(args)))
        return 0
    if args.partitions is None:
        parser.error("give --partitions (and --summary to read a run), or --predict")
    if args.hot_ratio is not None and len(args.hot_ratio) != 1:
        parser.error(f"--hot-ratio {args.hot_ratio}: a run takes one ratio; give one value")
    args.hot_ratio = None if args.hot_ratio is None else args.hot_ratio[0]
    if not (args.partitions / "partition.json").is_file():
        parser.error(f"--partitions {args.partitions}: no partition.json there; give a folder `neutronorch "
                     f"partition` wrote")
    if is_typed(args.partitions) and args.dealing != "owner":
        parser.error(f"{args.partitions}: a typed graph's parts are dealt by owner; leave out --dealing")
    if args.summary is not None:
        summary = json.loads(args.summary.read_text())
    else:
        ranks = json.loads((args.partitions / "partition.json").read_text())["parts"]
        summary = run(args.partitions, ranks, args, OUT / f"partition-bytes-{args.partitions.name}.json")
    print("\n".join(compare(args.partitions, summary, args.dealing)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
