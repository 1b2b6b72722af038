#!/usr/bin/env python
"""DGL's own GraphSAGE training loop with neutronorch's NeighborLoader against DGL 2.1's DataLoader.

    python bench/loader_vs_dgl.py [--dataset DIR|SPEC] [--fanouts 15,10,5] [--epochs 3] [--max-batches N] \
        [--loops example,loader] [--dgl-workers 0] [--threads 2] [--json OUT]

One loop, the same on both sides but for the loader: DGL's example loop (``for input_nodes, output_nodes,
blocks in dataloader: x = feats[input_nodes]; y = labels[output_nodes]; out = model(blocks, x); loss =
cross_entropy(out, y); ...``) with the same model (``dgl.nn.SAGEConv`` mean layers, hidden 256, ReLU and
dropout 0.5 between them, Adam), fanouts, batch size, epochs, torch threads and initial weights. DGL's side:
``dgl.dataloading.DataLoader`` with ``NeighborSampler`` (fanouts reversed: DGL lists the input layer first),
``num_workers=0`` (``--dgl-workers``), the graph's CSC built before timing. Ours: ``for batch in loader:
blocks = batch.to_dgl_blocks(); x = blocks[0].srcdata["feat"]; y = blocks[-1].dstdata["label"]`` and the
same three model lines: our loader gathers the rows (in its producer thread), so the loop reads them from the
blocks instead of indexing ``feats``. What the loop does with a batch before the model (DGL's two gathers,
our ``to_dgl_blocks()``) counts as waiting on the loader.

Each side runs in its own process; both are set up first, then they take turns epoch by epoch (ABBA order),
so that load from other work on a shared machine weighs on both (``own_loop.py``, shared with
``loader_vs_pyg.py``). DGL's side runs under ``.venv-peers/bin/python`` (``bash bench/peers/install_dgl.sh``);
ours needs DGL too (``to_dgl_blocks()``, the model), so it runs under this interpreter where DGL imports and
otherwise under the same ``.venv-peers`` interpreter with neutronorch from ``src/`` on ``PYTHONPATH``
(``--ours-python``).

Loops (``--loops``, each run on both sides): ``example``, the loop above; ``loader``, the loaders alone (each
batch as the loop takes it: blocks, input rows, labels; every tensor read, no model; ``--loader-batches`` per
epoch, 32 by default).

Epoch times are medians over the epochs (the first included; ``--skip-first`` drops it). ``--max-batches N``
times the first N batches of each epoch. Test accuracy: after training, each side's own loader over the first
``--eval-nodes`` test vertices (same fanouts, in order). Default dataset: the 1M-vertex synthetic graph under
``bench/out`` (generated there when missing).
"""

from __future__ import annotations

import importlib.util
import os
import sys

from own_loop import PEERS, Loop, compare, parser, serve

LOOPS = ("example", "loader")


def parse_args(argv=None):
    ours = sys.executable if importlib.util.find_spec("dgl") else str(PEERS)
    p = parser(__doc__.split("\n\n")[0], "dgl", LOOPS,
               "comma-separated: example (DGL's loop), loader (the loaders alone: each batch's blocks, rows and "
               "labels read, no model)", ours_python=ours)
    p.add_argument("--dgl-workers", type=int, default=0, help="DataLoader(num_workers=) of DGL's loader")
    return p.parse_args(argv)


def import_dgl():
    import warnings

    os.environ.setdefault("DGLBACKEND", "pytorch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchdata's deprecation banner, GraphBolt's missing library
        import dgl
    warnings.filterwarnings("ignore", message=".*CPU affinity.*")  # DGL's advice for dataloader workers
    return dgl


def sage(dgl, in_dim: int, hidden: int, out_dim: int, layers: int, dropout: float):
    """DGL's example GraphSAGE: SAGEConv 'mean' layers, ReLU and dropout between them."""
    import torch.nn as nn
    import torch.nn.functional as F
    from dgl.nn import SAGEConv

    class SAGE(nn.Module):
        def __init__(self):
            super().__init__()
            dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
            self.layers = nn.ModuleList(SAGEConv(dims[i], dims[i + 1], "mean") for i in range(layers))
            self.dropout = nn.Dropout(dropout)

        def forward(self, blocks, x):
            h = x
            for i, (layer, block) in enumerate(zip(self.layers, blocks)):
                h = layer(block, h)
                if i != len(self.layers) - 1:
                    h = self.dropout(F.relu(h))
            return h

    return SAGE()


def setup(side: str, graph, args, fanouts) -> Loop:
    import warnings

    import numpy as np
    import torch

    dgl = import_dgl()
    dgl.utils.set_num_threads(args.threads)
    dgl.seed(args.seed)
    test_ids = torch.from_numpy(np.array(graph.test_idx[:args.eval_nodes], dtype=np.int64))
    if side == "ours":
        from neutronorch.loader import NeighborLoader

        train = NeighborLoader(graph, fanouts, args.batch_size, seeds="train", shuffle=True, seed=args.seed)
        test = NeighborLoader(graph, fanouts, args.batch_size, seeds=test_ids, shuffle=False) \
            if args.eval_nodes else None

        def prepare(batch):
            blocks = batch.to_dgl_blocks()
            return (blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"]
        backend = "neutronorch"
    else:
        from dgl.dataloading import DataLoader, NeighborSampler

        from neutronorch.data import to_dgl

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch on a read-only memory-mapped feature array: DGL only reads it
            g = to_dgl(graph)
        feats, labels = g.ndata.pop("feat"), g.ndata.pop("label").long()  # the loop indexes them itself
        g = g.formats("csc")  # the sampler reads in-edges: build the CSC now, not inside the first epoch
        g.create_formats_()
        sampler = NeighborSampler(list(reversed(fanouts)))  # DGL: input layer first
        train_idx = torch.from_numpy(np.asarray(graph.train_idx, dtype=np.int64))
        common = dict(batch_size=args.batch_size, drop_last=False, num_workers=args.dgl_workers)
        train = DataLoader(g, train_idx, sampler, shuffle=True, **common)
        test = DataLoader(g, test_ids, sampler, shuffle=False, **common) if args.eval_nodes else None

        def prepare(item):
            input_nodes, output_nodes, blocks = item
            return (blocks, feats[input_nodes]), labels[output_nodes]
        backend = f"DGL {dgl.__version__} NeighborSampler"

    def touch(inputs, y):  # every tensor of the batch read once
        blocks, x = inputs
        return float(x.sum()) + float(y.sum()) + sum(float(b.edges()[0].sum()) for b in blocks)

    return Loop(train, test, lambda: sage(dgl, graph.feature_dim, args.hidden, graph.num_classes, len(fanouts),
                                          args.dropout),
                prepare, lambda model, inputs: model(*inputs), touch, backend)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        serve(args.worker, args, setup)
        return 0
    records = compare(__file__, args, argv, "dgl", "DGL", f"DGL workers {args.dgl_workers}; ours under "
                      f"{args.ours_python}")
    return 1 if records is None else 0


if __name__ == "__main__":
    sys.exit(main())
