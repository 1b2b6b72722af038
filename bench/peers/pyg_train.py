#!/usr/bin/env python
"""Peer benchmark: PyG (torch-geometric 2.8) CPU mini-batch training on a native-format dataset directory.

Runs torch_geometric.loader.NeighborLoader (sampler backend: torch-sparse, or pyg-lib where installed) with a
3-layer SAGEConv / GCNConv / GATConv model whose settings mirror ours and dgl_train.py's, times every epoch
and stage, and writes a JSON summary in dgl_train.py's format ("system": "pyg").

Run it with the peers venv (see bench/peers/README.md, section PyG), never with the project's .venv:

    .venv-peers/bin/python bench/peers/pyg_train.py --dataset DIR --model sage --epochs 3 \
        --summary-json bench/out/pyg_sage.json

Fanouts are given as we give them (seed hop first: 15,10,5 = 15 neighbours of each seed, then 10, then 5),
which is also NeighborLoader's num_neighbors order (its first entry is applied to the seed nodes): passed as is.

The model runs PyG's documented fast path for NeighborLoader mini-batches, "trim to layer"
(torch_geometric.utils.trim_to_layer, as BasicGNN does with num_sampled_nodes_per_hop /
num_sampled_edges_per_hop): layer i only sees the vertices and edges of the hops it still needs, instead of
computing every layer over every sampled vertex (the stock untrimmed model; on our 1M-vertex graph about
500 s/epoch against about 214 s trimmed). The torch-sparse sampler does not return the per-hop counts that
pyg-lib returns; they are recovered from the batch (seeds first, vertices in hop order, edges grouped by
destination hop: see hop_counts) and checked.

Stages per batch: sample = waiting on the loader iterator (NeighborLoader samples and builds the batch's
edge_index in this process, num_workers=0 by default), gather = indexing features/labels for the batch,
train = forward + backward + optimizer step.
"""
import os
import statistics
import sys
import time

from peer_common import parse_args, peak_rss_mb, read_native, train_epochs, write_summary

ARGS = parse_args(__doc__.split("\n\n")[0], "NeighborLoader")
# Thread counts must be fixed before torch starts its OpenMP pool.
os.environ.setdefault("OMP_NUM_THREADS", str(ARGS.threads))
os.environ.setdefault("MKL_NUM_THREADS", str(ARGS.threads))

import warnings  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import torch_geometric  # noqa: E402
    import torch_geometric.typing as pyg_typing  # noqa: E402
    from torch_geometric.data import Data  # noqa: E402
    from torch_geometric.loader import NeighborLoader  # noqa: E402
    from torch_geometric.nn import GATConv, GCNConv, SAGEConv  # noqa: E402
    from torch_geometric.utils import trim_to_layer  # noqa: E402
# NeighborSampler's notice that sampling without pyg-lib (i.e. with torch-sparse) is deprecated.
warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation is deprecated.*")


def log(msg):
    print(f"[pyg_train] {msg}", file=sys.stderr, flush=True)


def sampler_backend():
    if pyg_typing.WITH_PYG_LIB:
        import pyg_lib
        return "pyg-lib", getattr(pyg_lib, "__version__", None)
    if pyg_typing.WITH_TORCH_SPARSE:
        import torch_sparse
        return "torch-sparse", getattr(torch_sparse, "__version__", None)
    raise SystemExit("[pyg_train] NeighborLoader needs pyg-lib or torch-sparse: run bench/peers/install_pyg.sh")


# ----------------------------------------------------------------------------------------------- data


def with_self_loops(indptr, src):
    """CSC with existing self-loops removed and one self-loop per vertex appended to its in-edge list; the
    result stays sorted by destination. Returns (indptr, src)."""
    n = indptr.shape[0] - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    keep = src != dst
    src_k, dst_k = src[keep], dst[keep]
    del dst, keep
    deg = np.bincount(dst_k, minlength=n) + 1
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(deg, out=new_indptr[1:])
    out = np.empty(int(new_indptr[-1]), dtype=np.int64)
    # kept edge j (destination d) moves right by d slots: every vertex before d gained one self-loop
    out[np.arange(src_k.shape[0], dtype=np.int64) + dst_k] = src_k
    out[new_indptr[1:] - 1] = np.arange(n, dtype=np.int64)
    return new_indptr, out


def load_dataset(path, model):
    meta, indptr, src, feats, labels, splits, num_classes = read_native(path)
    n, m = indptr.shape[0] - 1, int(indptr[-1])
    if model == "gcn":
        # Our GCN averages over the sampled neighbours including the vertex itself: give PyG self-loops,
        # sampled like any other in-edge (as dgl_train.py does).
        indptr, src = with_self_loops(indptr, src)
    # edge_index rows: (source, destination), sorted by destination, so NeighborLoader(is_sorted=True) takes
    # the CSC as is (row = edge_index[0], colptr from the destinations) instead of sorting the edges.
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    edge_index = torch.from_numpy(np.stack([src, dst]))
    del src, dst
    data = Data(edge_index=edge_index, num_nodes=n)
    # Features stay in their stored dtype (float32 or float16) in memory; batches are cast to float32.
    return (meta, data, m, torch.from_numpy(feats), torch.from_numpy(labels),
            {k: torch.from_numpy(v) for k, v in splits.items()}, num_classes)


def hop_counts(batch, num_hops):
    """(vertices per hop [seeds, hop 1, ..., hop num_hops], edges per hop [hop 0, ..., hop num_hops-1]) of a
    NeighborLoader batch, as trim_to_layer wants them.

    pyg-lib returns them (batch.num_sampled_nodes / num_sampled_edges). torch-sparse's neighbor_sample does
    not, but its output is ordered so that they can be recovered: the seeds come first and every new vertex
    is appended when first sampled, so each hop's vertices are a contiguous id range; hop k samples the
    in-edges of hop k's vertices in id order, so the destinations (edge_index[1]) never decrease. Hop k's
    edges are those whose destination lies in hop k's range, and the vertices hop k adds end at one past the
    largest source among those edges."""
    nsn = getattr(batch, "num_sampled_nodes", None)
    nse = getattr(batch, "num_sampled_edges", None)
    if nsn is not None and nse is not None:
        return [int(x) for x in nsn], [int(x) for x in nse]
    row, col = batch.edge_index[0], batch.edge_index[1]
    num_edges = int(col.numel())
    num_nodes = int(batch.n_id.numel())
    if num_edges > 1 and not bool((col[1:] >= col[:-1]).all()):
        raise RuntimeError("sampled edges are not grouped by destination hop; cannot trim layers")
    end = int(batch.batch_size)  # hop k's vertices: [start, end)
    nodes, edges = [end], []
    e_lo = 0
    for _ in range(num_hops):
        e_hi = int(torch.searchsorted(col, torch.tensor([end], dtype=col.dtype))[0])
        new_end = max(end, int(row[e_lo:e_hi].max()) + 1) if e_hi > e_lo else end
        edges.append(e_hi - e_lo)
        nodes.append(new_end - end)
        e_lo, end = e_hi, new_end
    if e_lo != num_edges or end != num_nodes:
        raise RuntimeError(f"per-hop counts do not cover the batch: {end}/{num_nodes} vertices, "
                           f"{e_lo}/{num_edges} edges")
    return nodes, edges


# ----------------------------------------------------------------------------------------------- models


class Model(nn.Module):
    """3-layer (len(fanouts)-layer) GNN; ReLU + dropout between layers, none after the last."""

    def __init__(self, kind, in_dim, hidden, out_dim, num_layers, dropout, heads):
        super().__init__()
        self.kind = kind
        self.layers = nn.ModuleList()
        self.out_dims = []
        dims = [in_dim] + [hidden] * (num_layers - 1) + [out_dim]
        for i in range(num_layers):
            last = i == num_layers - 1
            if kind == "sage":
                # lin_l(mean of neighbours) + lin_r(self): DGL's SAGEConv('mean') (fc_neigh + fc_self)
                layer = SAGEConv(dims[i], dims[i + 1], aggr="mean")
            elif kind == "gcn":
                # DGL GraphConv(norm='right') on the graph with self-loops: W . mean(in-neighbours) + b
                layer = GCNConv(dims[i], dims[i + 1], normalize=False, add_self_loops=False, aggr="mean")
            else:
                h = 1 if last else heads
                # DGL GATConv(in, out/h, h): no self-loops added, no attention dropout, heads concatenated
                layer = GATConv(dims[i], dims[i + 1] // h, heads=h, concat=True, add_self_loops=False,
                                dropout=0.0)
            self.layers.append(layer)
            self.out_dims.append(dims[i + 1])
        self.dropout = nn.Dropout(dropout)

    def layer_forward(self, i, x, edge_index):
        out = self.layers[i](x, edge_index)
        if i != len(self.layers) - 1:
            out = self.dropout(F.relu(out))
        return out

    def forward(self, x, edge_index, nodes_per_hop, edges_per_hop):
        """Trimmed forward over a NeighborLoader batch; the first batch_size rows are the seeds'."""
        for i in range(len(self.layers)):
            # layer i needs the vertices of hops 0..L-i and the edges into hops 0..L-1-i
            x, edge_index, _ = trim_to_layer(i, nodes_per_hop, edges_per_hop, x, edge_index)
            x = self.layer_forward(i, x, edge_index)
        return x

    @torch.no_grad()
    def inference(self, loader, feats, num_nodes):
        """PyG's standard layer-wise full-neighbour inference: one NeighborLoader pass per layer over all
        vertices (num_neighbors=[-1]), each batch's seeds first."""
        h_all = feats
        for i in range(len(self.layers)):
            y = torch.empty(num_nodes, self.out_dims[i], dtype=torch.float32)
            for batch in loader:
                bs = int(batch.batch_size)
                h = h_all[batch.n_id].float()
                y[batch.n_id[:bs]] = self.layer_forward(i, h, batch.edge_index)[:bs]
            h_all = y
        return h_all


# ----------------------------------------------------------------------------------------------- main


def evaluate(model, loader, feats, labels, splits, num_nodes):
    """Full-neighbour layer-wise inference over all vertices; (val_acc, test_acc, seconds)."""
    t = time.perf_counter()
    model.eval()
    # Full-neighbour inference runs on the graph as trained (with self-loops for gcn).
    logits = model.inference(loader, feats, num_nodes)
    pred = logits.argmax(1)
    val_acc = float((pred[splits["val"]] == labels[splits["val"]]).float().mean()) if len(splits["val"]) else None
    test_acc = float((pred[splits["test"]] == labels[splits["test"]]).float().mean()) if len(splits["test"]) else None
    return val_acc, test_acc, time.perf_counter() - t


def main(args):
    torch.set_num_threads(args.threads)
    torch_geometric.seed_everything(args.seed)
    backend, backend_version = sampler_backend()

    t0 = time.perf_counter()
    meta, data, num_edges, feats, labels, splits, num_classes = load_dataset(args.dataset, args.model)
    n = int(data.num_nodes)
    # NeighborLoader converts the graph to CSC in its constructor: count that as loading, as dgl_train.py
    # counts building DGL's CSC.
    loader = NeighborLoader(data, num_neighbors=args.fanouts_list, input_nodes=splits["train"],
                            batch_size=args.batch_size, shuffle=True, drop_last=False, is_sorted=True,
                            num_workers=args.num_workers)
    load_seconds = time.perf_counter() - t0
    name = meta.get("name", os.path.basename(os.path.normpath(args.dataset)))
    log(f"dataset {name}: {n} nodes, {num_edges} edges (graph {data.num_edges}), "
        f"features {tuple(feats.shape)} {feats.dtype}, {num_classes} classes, "
        f"train/val/test {len(splits['train'])}/{len(splits['val'])}/{len(splits['test'])}; "
        f"loaded in {load_seconds:.1f} s; sampler {backend} {backend_version}")
    num_hops = len(args.fanouts_list)

    eval_loader = None

    def run_eval():
        nonlocal eval_loader
        if eval_loader is None:
            eval_loader = NeighborLoader(data, num_neighbors=[-1], input_nodes=None,
                                         batch_size=args.eval_batch_size, shuffle=False, drop_last=False,
                                         is_sorted=True, num_workers=0)
        return evaluate(model, eval_loader, feats, labels, splits, n)

    model = None
    opt = None
    if not args.sampler_only:
        model = Model(args.model, feats.shape[1], args.hidden, num_classes, num_hops, args.dropout, args.heads)
        opt = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)

    def measure(batch):
        # per-hop counts for trim_to_layer: sampler metadata (pyg-lib returns it), so sample stage
        hops = hop_counts(batch, num_hops) if model is not None else None
        return int(batch.edge_index.shape[1]), int(batch.n_id.shape[0]), hops

    def gather(batch, hops):
        bs = int(batch.batch_size)
        x, y = feats[batch.n_id].float(), labels[batch.n_id[:bs]]
        return x, y, lambda m, x: m(x, batch.edge_index, *hops)[:bs]

    epochs, edges_per_second, val_acc, test_acc, eval_seconds = train_epochs(
        args, loader, model, opt, measure, gather, run_eval, log)

    cfg = {k: v for k, v in vars(args).items() if k != "fanouts_list"}
    cfg["fanouts"] = args.fanouts_list
    cfg["pyg_num_neighbors"] = list(args.fanouts_list)  # NeighborLoader: seed hop first, same order
    cfg["trim_to_layer"] = True
    summary = {
        "system": "pyg",
        "version": torch_geometric.__version__,
        "torch_version": torch.__version__,
        "sampler_backend": backend,
        "sampler_backend_version": backend_version,
        "config": cfg,
        "dataset": {"name": name, "nodes": n, "edges": int(num_edges),
                    "graph_edges": int(data.num_edges), "feature_dim": int(feats.shape[1]),
                    "feature_dtype": str(feats.dtype).replace("torch.", ""), "num_classes": num_classes,
                    "train": int(len(splits["train"]))},
        "load_seconds": load_seconds,
        "epochs": epochs,
        "epoch_seconds_median": statistics.median(e["seconds"] for e in epochs) if epochs else None,
        # Sampled edges (the batch edge_index's columns) over the time spent waiting on the sampler only.
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
