"""``partition_bytes.py``'s typed graphs: a typed partition folder's run against the model of
``neutronorch.orchestration.partition_cost_typed`` (every rank's bytes per lane of the run's summary, and rank
0's evaluation), or in NeutronOrch mode of ``partition_cost_typed_hot`` (every rank's bytes per lane), and
IGBH-full's predictions as a typed graph."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from common import verdict_lines

from neutronorch.orchestration.partition_cost import rank_batches
from neutronorch.orchestration.partition_cost_typed import (TypedCostInputs, batch_bytes, evaluation_bytes,
                                                            of_typed_partition, training_bytes)
from neutronorch.orchestration.partition_cost_typed_hot import LANES, neutronorch_bytes

LANE_KEYS = {"sampling": "lane_sampling", "tables": "lane_tables"}  # the summary's lane: the model's key


def is_typed(parts: Path) -> bool:
    return json.loads((Path(parts) / "partition.json").read_text()).get("kind") == "typed"


def ratios(got: dict, model: float) -> tuple[float, float]:
    """(sent / model, received / model); an absent lane of the model 1 when nothing was measured either."""
    return tuple(got[d] / model if model else float(got[d] == 0) for d in ("sent_bytes", "received_bytes"))


def compare_typed(parts: Path, summary: dict, target: float) -> list[str]:
    """A typed run's training bytes per rank and lane (``sampling``: the sampler's and the rows' exchange;
    ``tables``: the embedding tables') and rank 0's evaluation bytes (one evaluation's: the summary's divided
    by the evaluations the run made) against the model's, and the model with one class a type."""
    config = summary["config"]
    fanouts = tuple(int(f) for f in config["fanouts"])
    if config["mode"] == "neutronorch":
        return compare_typed_lanes(parts, summary, fanouts, target)
    eval_fanouts = tuple(int(f) for f in config["eval_fanouts"]) if config.get("eval_fanouts") else None
    inputs = of_typed_partition(parts, fanouts, int(config["batch_size"]), hidden=int(config["hidden"]),
                                eval_batch_size=int(config["eval_batch_size"]), eval_fanouts=eval_fanouts)
    one = replace(inputs, classes=None)
    cuts = ", ".join(f"{r[1]} {c:.1%}" for r, c in inputs.cut.items())
    lines = [f"{parts}: {inputs.ranks} ranks, dealt by owner, fanouts {inputs.fanouts}, batch {inputs.batch_size} "
             f"per rank; cut per relation: {cuts}", "",
             "| what | rank | sent | received | model | sent / model | received / model "
             "| one class: received / model |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    worst, worst_lane = 0.0, {}
    for rank, measured in enumerate(summary["epochs"][0]["exchange"]):
        model, flat = training_bytes(inputs, rank), training_bytes(one, rank)
        for lane in (*LANE_KEYS, "total"):
            got = measured if lane == "total" else measured["lanes"].get(lane, {"sent_bytes": 0, "received_bytes": 0})
            key = LANE_KEYS.get(lane, "total")
            sent, received = ratios(got, model[key])
            worst_lane[lane] = max(worst_lane.get(lane, 0.0), abs(sent - 1), abs(received - 1))
            lines.append(f"| training, {lane} | {rank} | {got['sent_bytes']:,} | {got['received_bytes']:,} | "
                         f"{model[key]:,.0f} | {sent:.3f} | {received:.3f} | {ratios(got, flat[key])[1]:.3f} |")
    evaluations = sum(1 for e in summary["epochs"] if "val_accuracy" in e or "val_acc" in e)
    measured = summary.get("exchange", {}).get("evaluation")
    if evaluations and measured:
        got = {d: measured[d] / evaluations for d in ("sent_bytes", "received_bytes")}
        model, flat = evaluation_bytes(inputs, 0)["total"], evaluation_bytes(one, 0)["total"]
        sent, received = ratios(got, model)
        worst_lane["evaluation"] = max(abs(sent - 1), abs(received - 1))
        lines.append(f"| evaluation ({evaluations}) | 0 | {got['sent_bytes']:,.0f} | {got['received_bytes']:,.0f} | "
                     f"{model:,.0f} | {sent:.3f} | {received:.3f} | {ratios(got, flat)[1]:.3f} |")
    worst = max(worst_lane.values())
    rows = {"model": input_rows(inputs), "one class": input_rows(one)}
    measured_rows = summary["epochs"][0]["input_nodes_per_batch"]
    lines += ["", f"input rows per batch (every type), rank 0: measured {measured_rows:,.0f}, model "
                  f"{rows['model']:,.0f} ({measured_rows / rows['model']:.3f}), one class {rows['one class']:,.0f} "
                  f"({measured_rows / rows['one class']:.3f})",
              *verdict_lines(worst, target, worst_lane)]
    return lines


def compare_typed_lanes(parts: Path, summary: dict, fanouts: tuple, target: float) -> list[str]:
    """A typed run's NeutronOrch training bytes per rank and lane against ``partition_cost_typed_hot``'s."""
    config = summary["config"]
    inputs = of_typed_partition(parts, fanouts, int(config["batch_size"]), hidden=int(config["hidden"]),
                                hot_ratio=float(config["hot_ratio"]), super_batch=int(config["super_batch"]))
    lanes = LANES if inputs.table_types else LANES[:-1]  # the run has a tables lane where a type has a table
    cuts = ", ".join(f"{r[1]} {c:.1%}" for r, c in inputs.cut.items())
    header = (f"{parts}: {inputs.ranks} ranks, dealt by owner, fanouts {inputs.fanouts}, batch {inputs.batch_size} "
              f"per rank, hot ratio {inputs.hot_ratio:g}, super-batch {inputs.super_batch}; cut per relation: {cuts}")
    return lane_lines(header, summary, lambda rank: neutronorch_bytes(inputs, rank), lanes, target)


def lane_lines(header: str, summary: dict, model_of, lanes: tuple, target: float) -> list[str]:
    """A NeutronOrch run's training bytes per rank and lane (of ``lanes``, and the total) against the model's
    (``model_of(rank)``: ``neutronorch_bytes``'), the total within ``target``, and rank 0's plan statistics
    against the model's."""
    lines = [header, "", "| rank | lane | sent | received | model | sent / model | received / model |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    worst, worst_lane, models = 0.0, {}, {}
    for rank, measured in enumerate(summary["epochs"][0]["exchange"]):
        model = models[rank] = model_of(rank)
        for lane in (*lanes, "total"):
            got = measured if lane == "total" else measured["lanes"][lane]
            sent, received = ratios(got, model[lane])
            off = max(abs(sent - 1), abs(received - 1))
            worst_lane[lane] = max(worst_lane.get(lane, 0.0), off)
            worst = max(worst, off) if lane == "total" else worst
            lines.append(f"| {rank} | {lane} | {got['sent_bytes']:,} | {got['received_bytes']:,} | "
                         f"{model[lane]:,.0f} | {sent:.3f} | {received:.3f} |")
    hot, model = summary["hot"], models[0]
    return lines + ["", f"rank 0 per super-batch, measured / model: hot {hot['mean_hot_per_super_batch']:,.0f} / "
                        f"{model['hot']:,.0f}, computed {hot['mean_computed_per_super_batch']:,.0f} / "
                        f"{model['computed']:,.0f}, reached {hot['mean_reached_per_super_batch']:,.0f} / "
                        f"{model['reached']:,.0f}; reuse rate {hot['reuse_rate']:.3f} / {model['reuse_rate']:.3f}",
                    *verdict_lines(worst, target, worst_lane, "of a rank's total from the model")]


def input_rows(inputs: TypedCostInputs) -> float:
    """Rank 0's mean input rows per batch (every type's) over the epoch's batches (empty ones included)."""
    batches = rank_batches(inputs, 0)
    total = sum(sum(batch_bytes(inputs, 0, seeds)["input_rows"].values()) * count
                for seeds, count in batches if seeds > 0 and count > 0)
    return total / max(1, sum(count for _, count in batches))


# IGBH-full as a typed graph: the four vertex types and relations, and their counts, as DGL's GraphBolt R-GCN
# example lists them (dmlc/dgl, examples/graphbolt/rgcn/download.py: ``num_nodes`` and ``num_edges`` of
# "full"), which leaves out IGBH's journal and conference vertices (no count of their edges was found to cite);
# 1,024 float32 features on every type; the target's split as IGB-full's. Training adds every reverse.
IGBH_TYPES = {"paper": 269_346_174, "author": 277_220_883, "institute": 26_918, "fos": 712_960}
IGBH_EDGES = {("paper", "cites", "paper"): 3_996_442_004, ("paper", "written_by", "author"): 716_761_549,
              ("author", "affiliated_to", "institute"): 48_521_486, ("paper", "topic", "fos"): 1_050_280_600}
IGBH_SPLIT = dict(train=136_278_514, eval_nodes=227_130_858 - 136_278_514)


def igbh_inputs(machines: int, cut: float, fanouts: tuple, batch_size: int, hidden: int) -> TypedCostInputs:
    relations = dict(IGBH_EDGES)
    relations.update({(d, "rev_" + n, s): e for (s, n, d), e in IGBH_EDGES.items()})
    return TypedCostInputs(num_nodes=IGBH_TYPES, relations=relations, target="paper", ranks=machines,
                           fanouts=fanouts, batch_size=batch_size, feature_dims={t: 1024 for t in IGBH_TYPES},
                           cut={r: cut for r in relations}, hidden=hidden, **IGBH_SPLIT)


def predict_typed(args, cuts: dict) -> list[str]:
    """IGBH-full's rows: per machine count its training and evaluation bytes per machine and their seconds."""
    fanouts = tuple(int(f) for f in args.fanouts.split(","))
    lines = ["", f"IGBH-full as a typed graph ({len(IGBH_TYPES)} types, {2 * len(IGBH_EDGES)} relations with the "
                 f"reverses, 1,024 float32 features on every type, one class a type, dealt by owner, sampled "
                 f"evaluation at the same fanouts); GB received (= sent) per machine", "",
             "| graph | machines | input rows a batch | training GB | of which sampling / rows | evaluation GB | "
             + " | ".join(f"train s, {g:g} Gbit/s" for g in args.network) + " | "
             + " | ".join(f"eval s, {g:g} Gbit/s" for g in args.network) + " |",
             "|---|---:|---:|---:|---|---:|" + "---:|" * (2 * len(args.network))]
    for machines, cut in cuts.items():
        inputs = igbh_inputs(machines, cut, fanouts, args.batch_size, args.hidden)
        train, evaluation = training_bytes(inputs, 0), evaluation_bytes(inputs, 0)
        rate = [g * 1e9 / 8 for g in args.network]
        rows = sum(batch_bytes(inputs, 0, float(args.batch_size))["input_rows"].values())
        lines.append(f"| IGBH-full | {machines} | {rows:,.0f} | {train['total'] / 1e9:,.1f} | "
                     f"{train['sampling'] / 1e9:,.1f} / "
                     f"{train['rows'] / 1e9:,.1f} | {evaluation['total'] / 1e9:,.1f} | "
                     + " | ".join(f"{train['total'] / r:,.1f}" for r in rate) + " | "
                     + " | ".join(f"{evaluation['total'] / r:,.1f}" for r in rate) + " |")
    return lines + predict_typed_hot(args, cuts, fanouts) if args.hot_ratio else lines


def predict_typed_hot(args, cuts: dict, fanouts: tuple) -> list[str]:
    """IGBH-full's training rows in NeutronOrch mode at each ``--hot-ratio``, beside exact mode's: GB per machine by
    lane and their seconds."""
    lines = ["", f"IGBH-full in NeutronOrch mode (super-batch {args.super_batch}, the same assumptions): training GB "
                 f"received (= sent) per machine", "",
             "| graph | machines | mode | training GB | of which plan / cold / host / gradient | "
             + " | ".join(f"train s, {g:g} Gbit/s" for g in args.network) + " |",
             "|---|---:|---|---:|---|" + "---:|" * len(args.network)]
    for machines, cut in cuts.items():
        exact = igbh_inputs(machines, cut, fanouts, args.batch_size, args.hidden)
        for ratio in (None, *args.hot_ratio):
            if ratio is None:
                train, split = training_bytes(exact, 0)["total"], "-"
            else:
                got = neutronorch_bytes(replace(exact, hot_ratio=ratio, super_batch=args.super_batch), 0)
                train, split = got["total"], " / ".join(f"{got[lane] / 1e9:,.1f}" for lane in LANES[:-1])
            lines.append(f"| IGBH-full | {machines} | {'exact' if ratio is None else f'hot ratio {ratio:g}'} | "
                         f"{train / 1e9:,.1f} | {split} | "
                         + " | ".join(f"{train / (g * 1e9 / 8):,.1f}" for g in args.network) + " |")
    return lines
