"""``neutronorch partition SPEC --parts K --out DIR``: split a dataset into K parts for partitioned training
(``data/partition.py`` does the work; docs/distributed.md, "Partitioned training", gives the layout)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from neutronorch.data import dataset_paths, is_typed_dataset, load_dataset, load_typed_dataset
from neutronorch.data.partition_meta import METHODS
from neutronorch.errors import ConfigError, OutputError


def add_partition_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dataset", metavar="SPEC",
                        help="the dataset, as train's --dataset takes it (docs/datasets.md), homogeneous or typed")
    parser.add_argument("--parts", type=int, required=True, metavar="K", help="how many parts (one per rank)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="the partition folder to write; it must not exist or be empty")
    parser.add_argument("--method", choices=METHODS, default="metis",
                        help="metis: few cut edges, balanced on vertices (per type), training vertices and "
                             "in-edges (needs pymetis: pip install 'neutronorch[partition]'); random: vertices dealt "
                             "out at random (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of METIS or of the random order (default: 0)")
    parser.add_argument("--split", metavar="edges:T,V",
                        help="for `train --task link`: split the edges as `train --split edges:T,V --seed S` does "
                             "(a dataset's own link split is kept without it)")
    parser.add_argument("--link-relation", metavar="REL",
                        help="a typed graph's: the relation whose edges --split splits, as train's --link-relation")


def cmd_partition(args: argparse.Namespace) -> int:
    from neutronorch.data.partition import assign, check_graph, check_request, write_partition
    from neutronorch.data.partition_links import split_for_partition
    from neutronorch.train.output_guard import check_creatable, check_distinct, check_name_lengths, check_space

    t0 = time.perf_counter()

    def say(line: str) -> None:
        print(f"[{time.perf_counter() - t0:6.1f}s] {line}", file=sys.stderr, flush=True)

    check_request(args.parts, args.method, args.seed)
    check_name_lengths("out", args.out, temporary=True)
    target = Path(args.out).expanduser().resolve()
    _check_new(target)
    check_distinct({"SPEC": dataset_paths(args.dataset)}, {"out": [target]}, replaces={"out": target})
    check_creatable("out", target / "partition.json")
    if is_typed_dataset(args.dataset):
        graph, manifest = _typed(args, target, say)
    else:
        if args.link_relation is not None:
            raise ConfigError(f"`link_relation` {args.link_relation}: names a typed graph's relation, and "
                              f"{args.dataset} is homogeneous; leave it out.")
        say(f"reading {args.dataset}")
        graph = load_dataset(args.dataset)
        check_graph(graph, args.dataset, args.parts)
        if args.split is not None:
            say(f"splitting the edges ({args.split}, seed {args.seed})")
        graph = split_for_partition(graph, args.split, args.seed, args.dataset)
        check_space("out", target, sum(int(a.nbytes) for a in graph.arrays() if a is not None) + graph.num_nodes * 24)
        say(f"assigning {graph.num_nodes:,} vertices to {args.parts} parts ({args.method})")
        assigned = assign(graph, args.parts, args.method, args.seed, say)
        manifest = write_partition(graph, assigned, args.parts, target, args.method, args.seed, args.dataset, say)
    cut = manifest["edge_cut"]
    print(f"wrote {args.parts} parts of {graph.name} ({args.method}) to {args.out} in "
          f"{time.perf_counter() - t0:.1f}s; edge cut {cut['edges']:,} of {graph.num_edges:,} edges "
          f"({100 * cut['fraction']:.2f}%)")
    return 0


def _typed(args: argparse.Namespace, target: Path, say):
    """A typed graph written in parts, with the reverse of every relation (a typed run trains with them; a link
    task's graph as its run makes it, without the held-out edges); the graph written and the manifest."""
    from neutronorch.data.partition_typed import assign_typed, check_typed_graph, write_typed_partition
    from neutronorch.train.link_task import split_typed_relation
    from neutronorch.train.output_guard import check_space

    say(f"reading {args.dataset}")
    graph = load_typed_dataset(args.dataset)
    check_typed_graph(graph, args.dataset, args.parts)
    if args.split is not None or args.link_relation is not None:  # a link task's, as `train --task link` splits it
        say(f"splitting the edges of {args.link_relation or 'its relation'} ({args.split or 'the default'}, seed "
            f"{args.seed})")
        graph = split_typed_relation(graph, args.link_relation, args.split, args.seed)  # no times: checked
    else:
        graph = graph.with_reverse()
    nodes = sum(graph.num_nodes.values())
    check_space("out", target, sum(int(a.nbytes) for a in graph.arrays() if a is not None) + nodes * 24)
    say(f"assigning {nodes:,} vertices of {len(graph.num_nodes)} types to {args.parts} parts ({args.method})")
    assigned = assign_typed(graph, args.parts, args.method, args.seed, say)
    return graph, write_typed_partition(graph, assigned, args.parts, target, args.method, args.seed, args.dataset,
                                        say)


def _check_new(target: Path) -> None:
    """A partition is written to a new or empty folder only, never over anything."""
    if target.exists() and not target.is_dir():
        raise OutputError(f"`out` {target}: exists and is a file; a partition is a folder. Choose another path.")
    if target.is_dir() and any(target.iterdir()):
        raise OutputError(f"`out` {target}: exists and is not empty; a partition is never written over a folder. "
                          f"Choose a new folder, or remove this one first.")
