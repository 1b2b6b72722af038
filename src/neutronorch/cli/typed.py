"""``info`` and ``convert`` for typed graphs (a typed native folder, OGB's ogbn-mag layout): what they print
and write where the homogeneous commands (``app.py``) print JSON and write the native format."""

from __future__ import annotations

import argparse
import time

import numpy as np

from neutronorch.data import TypedGraph, load_typed_dataset, write_typed
from neutronorch.data.dtypes import bfloat16


def info_typed(spec: str) -> int:
    """info for a typed graph: ``TypedGraph.describe()``, then per relation its in-degrees and repeated edges
    (and self loops, between vertices of one type), what placing it on a GPU takes, and the notes."""
    graph = load_typed_dataset(spec)
    lines = [graph.describe(), "in-degrees per relation (max, mean), repeated edges:"]
    for key, relation in graph.relations.items():
        degrees = relation.in_degrees()
        src, dst = relation.edges()
        pairs = np.sort(dst * graph.num_nodes[key[0]] + src)  # one key per (src, dst): repeats sit side by side
        loops = f", {int((src == dst).sum()):,} self loops" if key[0] == key[2] else ""
        lines.append(f"  {key[0]} -{key[1]}-> {key[2]}: max {int(degrees.max()) if degrees.size else 0:,}, mean "
                     f"{float(degrees.mean()) if degrees.size else 0.0:.2f}, "
                     f"{int((pairs[1:] == pairs[:-1]).sum()):,} repeated{loops}")
    topology = sum(r.indptr.nbytes + r.indices.nbytes for r in graph.relations.values())
    features = sum(graph.num_nodes[t] * graph.feature_dim(t) * 4 for t in graph.features)
    lines.append(f"on a GPU: topology {topology / 2**30:.4f} GiB, features {features / 2**30:.4f} GiB (float32); "
                 f"metric {graph.metric or 'by labels'}")
    lines += [f"note: {note}" for note in graph.notes]
    print("\n".join(lines))
    return 0


def write_typed_folder(graph: TypedGraph, out: str, args: argparse.Namespace, t0: float) -> int:
    """convert's end for a typed graph: every type's features halved with --float16 or --bfloat16, the typed
    folder written (``write_typed``: OUT_DIR was checked before the source was read), its first line said."""
    from neutronorch.train.output_guard import check_space

    if args.float16 or args.bfloat16:
        dtype = np.float16 if args.float16 else bfloat16()  # bfloat16: rounded to nearest even, as torch rounds
        graph.features = {node_type: rows.astype(dtype) for node_type, rows in graph.features.items()}
    arrays = [graph.labels, graph.train_idx, graph.val_idx, graph.test_idx, *graph.features.values()]
    for relation in graph.relations.values():
        arrays += [relation.indptr, relation.indices, relation.edge_features]
    # The old folder stays until the new one is complete: the whole graph must fit beside it.
    check_space("OUT_DIR", out, sum(int(array.nbytes) for array in arrays if array is not None))
    write_typed(graph, out, overwrite=args.overwrite)
    print(f"wrote {graph.describe().splitlines()[0]} to {out} in {time.perf_counter() - t0:.1f}s")
    return 0
