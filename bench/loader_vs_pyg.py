#!/usr/bin/env python
"""PyG's own GraphSAGE training loop with neutronorch's NeighborLoader against PyG 2.8's NeighborLoader.

    python bench/loader_vs_pyg.py [--dataset DIR|SPEC] [--fanouts 15,10,5] [--epochs 3] [--max-batches N] \
        [--loops example,trim,loader] [--pyg-workers 0] [--threads 2] [--json OUT]

One loop, the same on both sides but for the loader: the PyG example's (``for batch in loader: out =
model(batch.x, batch.edge_index)[:batch.batch_size]; loss = cross_entropy(out, batch.y[:batch.batch_size]);
...``), with the same model (``torch_geometric.nn.GraphSAGE``, hidden 256, dropout 0.5, Adam), fanouts, batch
size, epochs, torch threads and initial weights. Each side runs in its own process; both are set up first,
then they take turns epoch by epoch (ABBA order), so that load from other work on a shared machine weighs on
both (``own_loop.py``, shared with ``loader_vs_dgl.py``): PyG's loader under ``.venv-peers/bin/python`` (it
needs torch-sparse or pyg-lib: ``bash bench/peers/install_pyg.sh``), ours under this interpreter
(``--ours-python``; neutronorch and torch-geometric must import there).

Loops (``--loops``, each run on both sides): ``example``, the loop above; ``trim``, the same loop passing the
per-hop counts (``GraphSAGE(..., num_sampled_nodes_per_hop=, num_sampled_edges_per_hop=)``) so that each layer
computes only the vertices the layers above need: ours yields them; PyG's loader yields them only with
pyg-lib, so with torch-sparse they are recovered from the batch (seeds first, hops in order), as
``bench/peers/pyg_train.py`` does, and both sides trim; ``loader``, the loaders alone (each batch built as a
PyG ``Data`` and read, no model; ``--loader-batches`` per epoch, 32 by default).

Epoch times are medians over the epochs (the first included: neither side compiles anything in it once
numba's cache is warm; ``--skip-first`` drops it). ``--max-batches N`` times the first N batches of each
epoch (the output says so). Test accuracy: after training, each side's own loader over the first
``--eval-nodes`` test vertices (same fanouts, in order).

Default dataset: the 1M-vertex synthetic graph under ``bench/out`` (generated there with ``neutronorch generate
synthetic`` when missing).
"""

from __future__ import annotations

import sys

from own_loop import Loop, compare, median_seconds, parser, serve

LOOPS = ("example", "trim", "loader")


def parse_args(argv=None):
    p = parser(__doc__.split("\n\n")[0], "pyg", LOOPS,
               "comma-separated: example (PyG's loop), trim (the loop passing the per-hop counts, both sides "
               "trimming), loader (the loaders alone: each batch built as PyG Data, no model)")
    p.add_argument("--pyg-workers", type=int, default=0, help="NeighborLoader(num_workers=) of PyG's loader")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------- one side

def hop_counts(data, hops: int):
    """(vertices per hop, edges per hop) of a PyG batch: its own when it has them (pyg-lib, ours); else
    recovered, since PyG's samplers put the seeds first and each hop's vertices after the last hop's, and
    hop k's edges lead into hop k-1's vertices in ascending order."""
    import torch

    nodes, edges = getattr(data, "num_sampled_nodes", None), getattr(data, "num_sampled_edges", None)
    if nodes is not None and edges is not None:
        return [int(n) for n in nodes], [int(e) for e in edges]
    src, dst = data.edge_index
    end, lo, nodes, edges = int(data.batch_size), 0, [int(data.batch_size)], []
    for _ in range(hops):
        hi = int(torch.searchsorted(dst, torch.tensor([end], dtype=dst.dtype))[0])
        new_end = max(end, int(src[lo:hi].max()) + 1) if hi > lo else end
        nodes.append(new_end - end)
        edges.append(hi - lo)
        lo, end = hi, new_end
    if lo != dst.numel() or end != data.num_nodes:
        raise RuntimeError("a PyG batch whose hops cannot be told apart; run without --trim")
    return nodes, edges


def make_loaders(side: str, graph, args, fanouts):
    """(training loader, test loader, batch -> PyG Data)."""
    import numpy as np
    import torch

    test_ids = torch.from_numpy(np.array(graph.test_idx[:args.eval_nodes], dtype=np.int64))
    if side == "ours":
        from neutronorch.loader import NeighborLoader

        train = NeighborLoader(graph, fanouts, args.batch_size, seeds="train", shuffle=True, seed=args.seed)
        test = NeighborLoader(graph, fanouts, args.batch_size, seeds=test_ids, shuffle=False) \
            if args.eval_nodes else None
        return train, test, lambda batch: batch.to_pyg()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.loader import NeighborLoader

        from neutronorch.data import to_pyg
    warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation is deprecated.*")
    data = to_pyg(graph)  # x, y, edge_index (source, destination) sorted by destination, masks
    train_idx = torch.from_numpy(np.asarray(graph.train_idx, dtype=np.int64))
    common = dict(num_neighbors=fanouts, batch_size=args.batch_size, num_workers=args.pyg_workers,
                  is_sorted=True, persistent_workers=args.pyg_workers > 0)
    train = NeighborLoader(data, input_nodes=train_idx, shuffle=True, **common)
    test = NeighborLoader(data, input_nodes=test_ids, shuffle=False, **common) if args.eval_nodes else None
    return train, test, lambda batch: batch


def setup(side: str, graph, args, fanouts) -> Loop:
    from torch_geometric.nn import GraphSAGE

    train, test, as_pyg = make_loaders(side, graph, args, fanouts)
    trim = args.loop == "trim"

    def prepare(batch):
        batch = as_pyg(batch)
        return batch, batch.y[:batch.batch_size]

    def forward(model, batch):
        if trim:
            nodes, edges = hop_counts(batch, len(fanouts))  # ours: the batch's own; PyG: see hop_counts
            out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=nodes, num_sampled_edges_per_hop=edges)
        else:
            out = model(batch.x, batch.edge_index)
        return out[:batch.batch_size]

    def touch(batch, y):  # every tensor of the batch read once
        return float(batch.x.sum()) + float(batch.edge_index.sum()) + float(batch.y.sum())

    backend = "neutronorch"
    if side == "pyg":
        import torch_geometric.typing as pyg_typing
        backend = "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse"
    return Loop(train, test, lambda: GraphSAGE(graph.feature_dim, args.hidden, len(fanouts), graph.num_classes,
                                               dropout=args.dropout), prepare, forward, touch, backend)


# ------------------------------------------------------------------------------------------- both sides

def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        serve(args.worker, args, setup)
        return 0
    records = compare(__file__, args, argv, "pyg", "PyG", f"PyG workers {args.pyg_workers}")
    if records is None:
        return 1
    if "trim/ours" in records and "example/pyg" in records and records["example/pyg"]["sampler"] != "pyg-lib":
        ratio = (median_seconds(records["trim/ours"], args.skip_first)
                 / median_seconds(records["example/pyg"], args.skip_first))
        print(f"  the loop passing batch.num_sampled_nodes/edges as written (PyG's loader with torch-sparse yields "
              f"None there, so its model runs untrimmed): ratio {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
