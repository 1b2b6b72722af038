"""``convert`` and ``generate`` for typed graphs (a typed native folder, OGB's ogbn-mag layout, a synthetic
typed graph): what they write where the homogeneous commands (``app.py``) write the native format. ``info``
for both kinds is ``info.py``."""

from __future__ import annotations

import argparse
import time

from neutronorch.data import TypedGraph, write_typed
from neutronorch.data.dtypes import BFLOAT16, narrowed


def write_typed_folder(graph: TypedGraph, out: str, args: argparse.Namespace, t0: float) -> int:
    """convert's and generate's end for a typed graph: every type's features halved with --float16 or
    --bfloat16, the typed folder written (``write_typed``: the folder was checked before the source was read
    or the graph generated), its first line said."""
    from neutronorch.train.output_guard import check_space

    if args.float16 or args.bfloat16:  # bfloat16: rounded to nearest even, as torch rounds; nothing overflows
        graph.features = {node_type: narrowed(rows, "float16" if args.float16 else BFLOAT16,
                                              f"{getattr(args, 'source', None) or graph.name}: type {node_type}")
                          for node_type, rows in graph.features.items()}
    arrays = [graph.labels, graph.train_idx, graph.val_idx, graph.test_idx, *graph.features.values()]
    for relation in graph.relations.values():
        arrays += [relation.indptr, relation.indices, relation.edge_features]
    # The old folder stays until the new one is complete: the whole graph must fit beside it.
    check_space("out" if args.command == "generate" else "OUT_DIR", out,
                sum(int(array.nbytes) for array in arrays if array is not None))
    write_typed(graph, out, overwrite=args.overwrite)
    print(f"wrote {graph.describe().splitlines()[0]} to {out} in {time.perf_counter() - t0:.1f}s")
    return 0
