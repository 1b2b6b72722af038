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
import json
import os
import statistics
import sys
import time

from peer_common import cpu_seconds, parse_args, peak_rss_mb, read_native

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

    epochs = []
    total_sample_s = 0.0
    total_edges = 0
    for epoch in range(args.epochs):
        if model is not None:
            model.train()
        st = {"sample": 0.0, "gather": 0.0, "train": 0.0}
        edges = 0
        input_nodes_sum = 0
        loss_sum = 0.0
        seen = 0
        batches = 0
        t_epoch = time.perf_counter()
        cpu0 = cpu_seconds()
        it = iter(loader)
        while True:
            t = time.perf_counter()
            try:
                input_nodes, output_nodes, blocks = next(it)
            except StopIteration:
                st["sample"] += time.perf_counter() - t
                break
            st["sample"] += time.perf_counter() - t
            edges += sum(int(b.num_edges()) for b in blocks)
            input_nodes_sum += int(input_nodes.shape[0])
            batches += 1
            if model is not None:
                t = time.perf_counter()
                x = feats[input_nodes].float()
                y = labels[output_nodes]
                t2 = time.perf_counter()
                st["gather"] += t2 - t
                logits = model(blocks, x)
                loss = F.cross_entropy(logits, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                st["train"] += time.perf_counter() - t2
                loss_sum += float(loss.item()) * int(y.shape[0])
                seen += int(y.shape[0])
            if args.max_batches and batches >= args.max_batches:
                break
        seconds = time.perf_counter() - t_epoch
        cpu = cpu_seconds() - cpu0
        total_sample_s += st["sample"]
        total_edges += edges
        rec = {
            "epoch": epoch,
            "seconds": seconds,
            "train_loss": (loss_sum / seen) if seen else None,
            "stage_seconds": st,
            # user+sys CPU seconds of this process: well below threads x seconds means the machine was busy
            "cpu_seconds": cpu,
            "batches": batches,
            "sampled_edges": edges,
            "input_nodes_per_batch": input_nodes_sum / max(batches, 1),
        }
        epochs.append(rec)
        loss_txt = f"loss {rec['train_loss']:.4f} " if rec["train_loss"] is not None else ""
        log(f"epoch {epoch}: {seconds:.2f} s {loss_txt}(sample {st['sample']:.2f} gather {st['gather']:.2f} "
            f"train {st['train']:.2f}) {batches} batches, {edges / max(batches, 1):.0f} edges/batch, "
            f"{edges / max(st['sample'], 1e-9) / 1e6:.2f} M sampled edges/s, CPU {cpu:.1f} s, "
            f"peak RSS {peak_rss_mb():.0f} MB")
        if (args.eval == "full" and model is not None and args.eval_every > 0
                and ((epoch + 1) % args.eval_every == 0 or epoch == args.epochs - 1)):
            # Outside the epoch's timing: "seconds" stays training time only, as in ours.
            val_acc, test_acc, eval_s = evaluate(model, g, feats, labels, splits, args.eval_batch_size)
            rec.update(val_acc=val_acc, test_acc=test_acc, eval_seconds=eval_s)
            log(f"epoch {epoch} eval (full-neighbour layer-wise): val_acc {val_acc} test_acc {test_acc} "
                f"in {eval_s:.1f} s")

    val_acc = test_acc = None
    eval_seconds = None
    evaluated = [e for e in epochs if "eval_seconds" in e]
    if evaluated:
        # Top level: the last evaluation's accuracy; eval_seconds: all evaluations together.
        val_acc, test_acc = evaluated[-1]["val_acc"], evaluated[-1]["test_acc"]
        eval_seconds = sum(e["eval_seconds"] for e in evaluated)
    elif args.eval == "full" and model is not None:
        val_acc, test_acc, eval_seconds = evaluate(model, g, feats, labels, splits, args.eval_batch_size)
        log(f"eval (full-neighbour layer-wise): val_acc {val_acc} test_acc {test_acc} in {eval_seconds:.1f} s")

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
        "sampled_edges_per_second": (total_edges / total_sample_s) if total_sample_s > 0 else None,
        "val_acc": val_acc,
        "test_acc": test_acc,
        "eval_seconds": eval_seconds,
        "peak_rss_mb": peak_rss_mb(),
    }
    text = json.dumps(summary, indent=2)
    if args.summary_json:
        d = os.path.dirname(os.path.abspath(args.summary_json))
        os.makedirs(d, exist_ok=True)
        with open(args.summary_json, "w") as f:
            f.write(text + "\n")
        log(f"summary written to {args.summary_json}")
    print(text)
    return summary


if __name__ == "__main__":
    main(ARGS)
