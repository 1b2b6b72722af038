"""Temporal link prediction against a static model trained on the same snapshot, on a temporal graph with a
learnable time signal (docs/temporal.md, "Temporal link prediction").

The graph (``synthetic_temporal``: interactions that close triangles among recent partners, or a native folder
with edge times) is split by time. Every run scores the same validation and test links against the same
negatives (drawn once as of each link's time, stored per positive in the split):

- temporal, ``--temporal-strategy`` uniform and last: `train()` on the graph with times, each link sampled
  strictly before its time;
- static: the same model on the training snapshot (the training links' edges, no times), scored with every
  neighbour of that snapshot, as a static link task is;
- spoiled: temporal (last) on the graph with every test link copied to a time after all links: the topology
  holds the answers, the sampler cannot reach them, so the scores must equal the temporal run's;
- with ``--typed``, the typed engine's temporal task (last) on the same graph as a typed one of one vertex
  type (``TypedGraph.of``), with its features and without them (a learned embedding table per vertex, as on a
  JODIE file, which has none): it splits the same links by time and draws its ``--negatives`` per validation
  and test link by the same rule, as of each link's time, from the run's seed (not the stored ones).

Prints a table of test MRR, AP and ROC-AUC per run (median over ``--seeds``) and the checks.

    NUMBA_NUM_THREADS=2 python bench/temporal_link.py
    NUMBA_NUM_THREADS=2 python bench/temporal_link.py --nodes 20000 --events 400000 --epochs 5 --seeds 0,1,2
    NUMBA_NUM_THREADS=2 python bench/temporal_link.py --typed --seeds 0,1,2 --epochs 10
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np
import torch

from neutronorch import TrainConfig, train
from neutronorch.data.graph import Graph
from neutronorch.data.links import PER_SOURCE, LinkSplit
from neutronorch.data.native import load_native
from neutronorch.data.time_split import Appearance, split_edges_by_time
from neutronorch.data.typed import TypedGraph
from neutronorch.orchestration.link_seeds import negative_generator

METRICS = ("test_mrr", "test_ap", "test_rocauc")


def with_negatives(graph: Graph, count: int, seed: int) -> LinkSplit:
    """``graph.links`` with ``count`` negatives per validation and test link, drawn as of each link's time and
    stored per positive: every run scores the same pairs."""
    appearance, links = Appearance(graph), graph.links
    drawn = {name: appearance.draw(negative_generator(seed + k), torch.from_numpy(getattr(links, f"{name}_time")),
                                   count).numpy() for k, name in enumerate(("val", "test"))}
    return dataclasses.replace(links, val_neg=drawn["val"], test_neg=drawn["test"], negatives=PER_SOURCE)


def static_snapshot(graph: Graph, links: LinkSplit) -> Graph:
    """The training snapshot without times: the training links' edges (both ways for an undirected split),
    with the split (its times dropped) checked as built."""
    src, dst = links.train
    if links.undirected:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    snapshot = Graph.from_arrays(src, dst, graph.features, graph.labels, num_nodes=graph.num_nodes, undirected=False,
                                 name=f"{graph.name}-static-snapshot")
    split = dataclasses.replace(links, train_time=None, val_time=None, test_time=None, issues={})
    split.checked = split.checked_for(snapshot.indices)  # a pair seen before is history, not a leak
    return dataclasses.replace(snapshot, links=split)


def spoiled(graph: Graph) -> Graph:
    """``graph`` with every test link copied to a time after all of them (both ways when undirected)."""
    links = graph.links
    src, dst = links.test
    late = np.full(src.shape[0], links.test_time.max() + 1, dtype=graph.edge_time.dtype)
    if links.undirected:
        src, dst, late = np.concatenate([src, dst]), np.concatenate([dst, src]), np.concatenate([late, late])
    old_dst = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    planted = Graph.from_arrays(np.concatenate([graph.indices, src]), np.concatenate([old_dst, dst]), graph.features,
                                graph.labels, undirected=False, edge_time=np.concatenate([graph.edge_time, late]),
                                name=f"{graph.name}-spoiled")
    return dataclasses.replace(planted, links=links)


def run(config: TrainConfig, graph: Graph) -> dict:
    t0 = time.perf_counter()
    summary = train(config, graph=graph)
    return {**{m: summary[f"final_{m}"] if f"final_{m}" in summary else summary["epochs"][-1].get(m)
               for m in METRICS}, "seconds": time.perf_counter() - t0}


def _median(rows: list[dict], metric: str) -> float | None:
    values = [r[metric] for r in rows if r[metric] is not None]
    return statistics.median(values) if values else None


def _number(value) -> str:
    return "-" if value is None else f"{value:.4f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", help="a native folder whose graph has edge times (default: synthetic_temporal)")
    p.add_argument("--nodes", type=int, default=5000)
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--split", default="edges:0.7,0.15")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--fanouts", default="10,5")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--negatives", type=int, default=20, help="per validation and test link")
    p.add_argument("--seeds", default="0", help="training seeds, the same split and negatives")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--typed", action="store_true", help="add the typed engine's runs (with and without features)")
    args = p.parse_args()

    if args.dataset:
        graph = load_native(args.dataset)
    else:
        from neutronorch.data.synthetic_temporal import synthetic_temporal
        graph = synthetic_temporal(nodes=args.nodes, events=args.events, seed=0)
    train_share, val_share = (float(x) for x in args.split.partition(":")[2].split(","))
    timed = split_edges_by_time(graph, train_share, val_share)
    links = with_negatives(timed, args.negatives, seed=7)
    graphs = {"temporal uniform": (dataclasses.replace(timed, links=links), "uniform"),
              "temporal last": (dataclasses.replace(timed, links=links), "last"),
              "static snapshot": (static_snapshot(timed, links), None),
              "spoiled, last": (spoiled(dataclasses.replace(timed, links=links)), "last")}
    if args.typed:  # split and negatives by the run (a typed graph's link task splits its relation itself)
        typed = TypedGraph.of(graph)
        graphs["typed last"] = (typed, "last")
        graphs["typed featureless last"] = (dataclasses.replace(typed, features={}), "last")
    print(f"{graph.name}: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges; {links.describe()}; "
          f"{args.negatives} negatives per test link as of its time")
    results: dict[str, list[dict]] = {name: [] for name in graphs}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, (g, strategy) in graphs.items():
            config = TrainConfig(task="link", epochs=args.epochs, fanouts=[int(f) for f in args.fanouts.split(",")],
                                 hidden=args.hidden, batch_size=args.batch_size, seed=seed, threads=args.threads,
                                 progress=False, eval_every=args.epochs, **(
                                     {"temporal_strategy": strategy} if strategy else {}), **(
                                     {"split": args.split, "eval_negatives": args.negatives}
                                     if isinstance(g, TypedGraph) else {}))
            results[name].append(run(config, g))
            print(f"  seed {seed}, {name}: " + ", ".join(f"{m} {_number(results[name][-1][m])}" for m in METRICS)
                  + f" ({results[name][-1]['seconds']:.0f} s)", flush=True)
    print("\n| run | " + " | ".join(METRICS) + " |\n|---|" + "---:|" * len(METRICS))
    for name, rows in results.items():
        print(f"| {name} | " + " | ".join(_number(_median(rows, m)) for m in METRICS) + " |")
    static = statistics.median(r["test_mrr"] for r in results["static snapshot"])
    best = max(("temporal uniform", "temporal last"), key=lambda n: statistics.median(r["test_mrr"] for r in results[n]))
    print(f"\nbest temporal ({best}) / static test MRR: "
          f"{statistics.median(r['test_mrr'] for r in results[best]) / static:.2f}x")
    same = all(a[m] == b[m] for a, b in zip(results["temporal last"], results["spoiled, last"]) for m in METRICS)
    print(f"spoilers after every link change the scores: {'no (equal to the bit)' if same else 'YES'}")


if __name__ == "__main__":
    main()
