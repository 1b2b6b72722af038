"""``neutronorch convert SOURCE OUT_DIR``: any dataset, or your own tables, written in the native format; and
the end convert and ``generate`` share (the output folder checked before anything is read, the graph written)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from neutronorch.cli.progress import ProgressBar
from neutronorch.data import (TypedGraph, dataset_paths, is_native_dir, is_typed_dataset, load_dataset,
                              load_typed_dataset, save_native, write_typed)
from neutronorch.data.dtypes import BFLOAT16, narrowed
from neutronorch.errors import ConfigError


def cmd_convert(args: argparse.Namespace) -> int:
    from neutronorch.data.jodie import is_jodie, load_jodie
    from neutronorch.data.tabular import LIKE_IDS, SNAP_SUFFIXES, is_table, load_tables, only_a_table

    t0 = time.perf_counter()
    given = args.features is not None or args.labels is not None
    jodie = not given and is_table(args.source) and is_jodie(args.source)  # interactions with times
    # Your own tables: an edge table, alone (a link task's graph) or with --features and --labels, each optional.
    tables = given or (not jodie and only_a_table(args.source))
    if not tables and (args.directed or args.header != "auto" or args.label_column):
        raise ConfigError("--directed, --header and --label-column read your own tables: give SOURCE as your edge "
                          "table (.csv, .json or .npy, or a .txt or .tsv whose first line is a header or names; a "
                          "SNAP edge list of numbers with --features or --labels).")
    if tables and args.labels is None and args.seed:
        raise ConfigError(f"--seed {args.seed}: draws the split of the labelled vertices, and no --labels are given, "
                          f"so none is drawn; leave --seed out (train --task link --seed S seeds the edge split), or "
                          f"give --labels.")
    if jodie and (args.split is not None or args.seed):
        raise ConfigError(f"{args.source}: a JODIE/TGN interaction file has no vertex labels to split; leave --split "
                          f"and --seed out (docs/temporal.md).")
    if args.times and (tables or jodie):
        what = "your edge table" if tables else "a JODIE/TGN file, whose times are always kept"
        raise ConfigError(f"--times: {args.source} is {what}; --times reads the years of an OGB node dataset folder "
                          f"(docs/temporal.md).")
    typed = jodie or (args.features is None if tables else is_typed_dataset(args.source))  # featureless: typed
    reads = [Path(p) for p in (args.source, args.features, args.labels, args.split) if p and is_table(p)] if tables \
        else [Path(args.source)] if jodie else dataset_paths(args.source)
    check_native_out("OUT_DIR", args.out_dir, reads, args.overwrite, typed)
    kept, bar = {}, ProgressBar("reading", "B")
    try:
        if tables:
            graph, kept = load_tables(args.source, args.features, args.labels, args.split, args.seed, args.directed,
                                      args.header, args.name or Path(args.out_dir).resolve().name, bar,
                                      args.label_column)
        elif jodie:
            graph = load_jodie(args.source)
        else:
            graph = (load_typed_dataset(args.source, args.split, progress=bar) if typed and not args.times
                     else load_dataset(args.source, args.split, args.seed, progress=bar, times=args.times))
    finally:
        bar.close()
    if args.name is not None:  # your tables' are named as they are read; any other source's here
        graph.name = args.name
    if tables or Path(args.source).name.lower().endswith(SNAP_SUFFIXES):  # what was read, and how
        for note in graph.notes:
            print(f"warning: {note}" if note.startswith(LIKE_IDS) else note,
                  file=sys.stderr if note.startswith(LIKE_IDS) else sys.stdout)
    return write_dataset(graph, args.out_dir, args, t0, kept)


def write_dataset(graph, out: str, args: argparse.Namespace, t0: float, kept: dict | None = None) -> int:
    """convert's and generate's end, for either kind of graph: the features halved with --float16 or
    --bfloat16, the native or typed folder written, its first line said."""
    from neutronorch.train.output_guard import check_space

    typed, source = isinstance(graph, TypedGraph), getattr(args, "source", None) or graph.name
    if args.float16 or args.bfloat16:  # bfloat16: rounded to nearest even, as torch rounds; nothing overflows
        dtype = "float16" if args.float16 else BFLOAT16
        graph.features = ({node_type: narrowed(rows, dtype, f"{source}: type {node_type}")
                           for node_type, rows in graph.features.items()} if typed
                          else narrowed(graph.features, dtype, source))
    # The old folder stays until the new one is complete: the whole dataset must fit beside it.
    check_space("out" if args.command == "generate" else "OUT_DIR", out,
                sum(int(array.nbytes) for array in graph.arrays() if array is not None))
    if typed:
        write_typed(graph, out, overwrite=args.overwrite, kept=kept)
    else:
        save_native(graph, out, overwrite=args.overwrite, kept=kept)
    print(f"wrote {graph.describe().splitlines()[0]} to {out} in {time.perf_counter() - t0:.1f}s")
    return 0


def check_native_out(field: str, out: str, sources: list[Path], overwrite: bool, typed: bool = False) -> None:
    """Before anything is read: the dataset folder ``out`` (``typed``: for a typed graph) can be written
    and holds none of the inputs. A dataset rewritten in place (``--overwrite``, to halve its features)
    reads its old files until the new ones replace them whole, so that one input may be ``out`` itself."""
    from neutronorch.data.native import check_dataset_folder
    from neutronorch.train.output_guard import check_creatable, check_distinct, check_name_lengths

    check_name_lengths(field, out, temporary=True)  # the folder is written under a temporary name beside it
    target = Path(out).expanduser().resolve()
    check_dataset_folder(target, overwrite, typed)  # a folder with meta.json is then a dataset of the kind
    if not any(source.expanduser().resolve() == target and is_native_dir(target) for source in sources):
        check_distinct({"SOURCE": sources}, {field: [target]}, replaces={field: target})
    check_creatable(field, target / "meta.json")
