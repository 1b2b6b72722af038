#!/usr/bin/env python
"""Peer benchmark: DGL 2.1 classic CPU mini-batch training on a native-format dataset directory.

Runs dgl.dataloading.NeighborSampler + dgl.dataloading.DataLoader with a 3-layer SAGE / GCN / GAT
model whose settings mirror ours, times every epoch and stage, and writes a JSON summary.

Run it with the peers venv (see bench/peers/README.md), never with the project's .venv:

    .venv-peers/bin/python bench/peers/dgl_train.py --dataset DIR --model sage --epochs 3 \
        --summary-json bench/out/dgl_sage.json

Fanouts are given as we give them (seed hop first: 15,10,5 = 15 neighbours of each seed, then 10, then 5)
and reversed for DGL, which lists the input layer first.

Stages per batch: sample = waiting on the dataloader iterator (DGL samples in this process,
num_workers=0 by default), gather = indexing features/labels for the batch, train = forward + backward +
optimizer step.
"""
import os
import statistics
import sys
import time

from peer_common import dgl_measure, parse_args, peak_rss_mb, read_native, train_epochs, write_summary

ARGS = parse_args(__doc__.split("\n\n")[0], "DGL DataLoader")
# Thread counts must be fixed before torch / DGL start their OpenMP pools.
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))
os.environ.setdefault("MKL_NUM_THREADS", str(ARGS.threads))
os.environ.setdefault("DGLBACKEND", "pytorch")

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

with warnings.catch_warnings():
    # torchdata's datapipes deprecation banner and the (patched) GraphBolt load warning.
    warnings.simplefilter("ignore")
    import dgl  # noqa: E402
    import dgl.nn as dglnn  # noqa: E402
    from dgl.dataloading import DataLoader, MultiLayerFullNeighborSampler, NeighborSampler  # noqa: E402
# DGL's advice to pin dataloader workers to cores; we run the sampler in-process (num_workers=0).
warnings.filterwarnings("ignore", message=".*CPU affinity.*")


def log(msg):
    print(f"[dgl_train] {msg}", file=sys.stderr, flush=True)


def load_dataset(path, model):
    meta, indptr, src, feats, labels, splits, num_classes = read_native(path)
    n, m = indptr.shape[0] - 1, int(indptr[-1])
    dst = torch.from_numpy(np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr)))
    g = dgl.graph((torch.from_numpy(src), dst), num_nodes=n, idtype=torch.int64)
    del src, dst
    if model == "gcn":
        # Our GCN averages over the sampled neighbours including the vertex itself: give DGL self-loops.
        g = dgl.add_self_loop(dgl.remove_self_loop(g))
    # The sampler samples in-edges: build the CSC once here, not inside the first epoch.
    g = g.formats("csc")
    g.create_formats_()
    # Features stay in their stored dtype (float32 or float16) in memory; batches are cast to float32.
    return (meta, g, m, torch.from_numpy(feats), torch.from_numpy(labels),
            {k: torch.from_numpy(v) for k, v in splits.items()}, num_classes)


# ----------------------------------------------------------------------------------------------- models


class Model(nn.Module):
    """3-layer (len(fanouts)-layer) GNN; ReLU + dropout between layers, none after the last."""

    def __init__(self, kind, in_dim, hidden, out_dim, num_layers, dropout, heads):
        super().__init__()
        self.kind = kind
        self.layers = nn.ModuleList()
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        for i in range(num_layers):
            last = i == num_layers - 1
            if kind == "sage":
                layer = dglnn.SAGEConv(dims[i], dims[i + 1], "mean")
            elif kind == "gcn":
                layer = dglnn.GraphConv(dims[i], dims[i + 1], norm="right", allow_zero_in_degree=True)
            else:
                h = 1 if last else heads
                layer = dglnn.GATConv(dims[i], dims[i + 1] // h, h, allow_zero_in_degree=True)
            self.layers.append(layer)
        self.dropout = nn.Dropout(dropout)

    def layer_forward(self, i, block, h):
        out = self.layers[i](block, h)
        if self.kind == "gat":
            out = out.flatten(1)  # concat heads; the last layer has one head
        if i != len(self.layers) - 1:
            out = self.dropout(F.relu(out))
        return out

    def forward(self, blocks, x):
        h = x
        for i, block in enumerate(blocks):
            h = self.layer_forward(i, block, h)
        return h

    @torch.no_grad()
    def inference(self, g, feats, batch_size):
        """Standard DGL layer-wise full-neighbour inference over all nodes."""
        sampler = MultiLayerFullNeighborSampler(1)
        nodes = torch.arange(g.num_nodes(), dtype=g.idtype)
        loader = DataLoader(g, nodes, sampler, batch_size=batch_size, shuffle=False, drop_last=False,
                            num_workers=0)
        h_all = feats
        for i, layer in enumerate(self.layers):
            out_dim = layer._out_feats * (getattr(layer, "_num_heads", 1) if self.kind == "gat" else 1)
            y = torch.empty(g.num_nodes(), out_dim, dtype=torch.float32)
            for input_nodes, output_nodes, blocks in loader:
                h = h_all[input_nodes].float()
                y[output_nodes] = self.layer_forward(i, blocks[0], h)
            h_all = y
        return h_all


# ----------------------------------------------------------------------------------------------- main


def evaluate(model, g, feats, labels, splits, batch_size):
    """Full-neighbour layer-wise inference over all vertices; (val_acc, test_acc, seconds)."""
    t = time.perf_counter()
    model.eval()
    # Full-neighbour inference runs on the graph as trained (with self-loops for gcn).
    logits = model.inference(g, feats, batch_size)
    pred = logits.argmax(1)
    val_acc = float((pred[splits["val"]] == labels[splits["val"]]).float().mean()) if len(splits["val"]) else None
    test_acc = float((pred[splits["test"]] == labels[splits["test"]]).float().mean()) if len(splits["test"]) else None
    return val_acc, test_acc, time.perf_counter() - t


def main(args):
    torch.set_num_threads(args.threads)
    dgl.utils.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    dgl.seed(args.seed)

    t0 = time.perf_counter()
    meta, g, num_edges, feats, labels, splits, num_classes = load_dataset(args.dataset, args.model)
    load_seconds = time.perf_counter() - t0
    name = meta.get("name", os.path.basename(os.path.normpath(args.dataset)))
    log(f"dataset {name}: {g.num_nodes()} nodes, {num_edges} edges (graph {g.num_edges()}), "
        f"features {tuple(feats.shape)} {feats.dtype}, {num_classes} classes, "
        f"train/val/test {len(splits['train'])}/{len(splits['val'])}/{len(splits['test'])}; "
        f"loaded in {load_seconds:.1f} s")

    dgl_fanouts = list(reversed(args.fanouts_list))  # DGL: input layer first
    sampler = NeighborSampler(dgl_fanouts)
    loader = DataLoader(g, splits["train"], sampler, batch_size=args.batch_size, shuffle=True,
                        drop_last=False, num_workers=args.num_workers)

    model = None
    opt = None
    if not args.sampler_only:
        model = Model(args.model, feats.shape[1], args.hidden, num_classes, len(dgl_fanouts), args.dropout,
                      args.heads)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def gather(item, _):
        input_nodes, output_nodes, blocks = item
        return feats[input_nodes].float(), labels[output_nodes], lambda m, x: m(blocks, x)

    epochs, edges_per_second, val_acc, test_acc, eval_seconds = train_epochs(
        args, loader, model, opt, dgl_measure, gather,
        lambda: evaluate(model, g, feats, labels, splits, args.eval_batch_size), log)

    cfg = {k: v for k, v in vars(args).items() if k != "fanouts_list"}
    cfg["fanouts"] = args.fanouts_list
    cfg["dgl_fanouts"] = dgl_fanouts
    summary = {
        "system": "dgl",
        "version": dgl.__version__,
        "torch_version": torch.__version__,
        "config": cfg,
        "dataset": {"name": name, "nodes": int(g.num_nodes()), "edges": int(num_edges),
                    "graph_edges": int(g.num_edges()), "feature_dim": int(feats.shape[1]),
                    "feature_dtype": str(feats.dtype).replace("torch.", ""), "num_classes": num_classes,
                    "train": int(len(splits["train"]))},
        "load_seconds": load_seconds,
        "epochs": epochs,
        "epoch_seconds_median": statistics.median(e["seconds"] for e in epochs) if epochs else None,
        # Sampled edges (sum of block num_edges) over the time spent waiting on the sampler only.
        "sampled_edges_per_second": edges_per_second,
        "val_acc": val_acc,
        "test_acc": test_acc,
        "eval_seconds": eval_seconds,
        "peak_rss_mb": peak_rss_mb(),
    }
    write_summary(summary, args, log)
    return summary


if __name__ == "__main__":
    main(ARGS)
