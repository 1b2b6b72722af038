#!/usr/bin/env python
"""Typed (heterogeneous) node classification: neutronorch's typed training against PyG 2.8's ``HeteroData`` +
``NeighborLoader`` and DGL 2.1's heterograph ``DataLoader`` with the same models, on a MAG-like synthetic graph.

    python bench/typed_vs_pyg.py [--nodes 2000000] [--degree 10.2] [--models sage,rgcn] [--epochs 3] \
        [--max-batches N] [--fanouts 10,10] [--relation-fanouts 'cites=5,5;rev_writes=15,10'] [--hidden 64] \
        [--batch-size 1024] [--lr 0.003] [--dropout 0.5] [--eval-nodes 10000] [--peers pyg,dgl] [--threads 2] \
        [--json OUT]

**The graph.** ``synthetic_typed(nodes, degree, features)`` (``data/synthetic_typed.py``: paper, author,
institution, field; writes, cites, affiliated_with, has_topic; about ``degree x nodes`` edges before the
reverses, a little fewer once repeated edges are dropped), written once under ``bench/out/typed-n..-d..-f..-s0/``
by ``write_typed`` and memory-mapped by every side (``read_typed``). Every side then adds the reverse of
every relation (``with_reverse``: eight relations, twice the edges; the output gives both counts). Papers have
``--features`` features; authors, institutions and fields none.

**The models**, ``--hidden`` wide, one layer per fanout, ReLU and dropout between layers, the last layer's
paper rows the logits; a layer holds only the relations into the types it can have as destinations (the top
layer: those into paper). Featureless types get a learnable ``torch.nn.Embedding(vertices, hidden,
sparse=True)`` on every side (the peers look them up by the batch's vertex ids: PyG ``batch[type].n_id``, DGL
the input nodes), trained by a sparse Adam (ours ``RowAdam``, the update of ``torch.optim.SparseAdam``; the
peers ``torch.optim.SparseAdam``); every other weight by Adam with ``--lr`` and ``--weight-decay``. Each
library initialises its own layers its own way.

- ``sage``: ours ``TypedSAGEConv`` (root per relation); PyG ``HeteroConv({rel: SAGEConv((in_s, in_d),
  out)}, aggr="sum")``, the same function (tests/test_relational.py copies weights between them); DGL
  ``HeteroGraphConv({rel: SAGEConv((in_s, in_d), out, "mean")}, aggregate="sum")``, the same function.
- ``rgcn``: a linear map per featured type to ``hidden`` (papers), then R-GCN layers: ours ``RGCNConv``;
  PyG ``RGCNConv(hidden, out, relations, aggr="mean")`` over each layer's batch made homogeneous (the types'
  rows stacked, ``edge_type`` the relation's index); DGL the layer of its heterogeneous R-GCN example,
  ``HeteroGraphConv({rel: GraphConv(hidden, out, norm="right")}, aggregate="sum")`` (mean times ``W_r``)
  plus a root weight shared by every type and a bias (``RelGraphConv`` needs a homogeneous graph, which a
  heterograph's sampled blocks are not).

**Sampling**: the same fanouts per relation on every side (``--fanouts`` for all, ``--relation-fanouts``
overriding some by name), uniform without replacement, batches of ``--batch-size`` target papers in a
shuffled order. PyG: ``NeighborLoader(data, num_neighbors={rel: fanouts}, input_nodes=("paper", train),
batch_size, shuffle=True)``; where pyg-lib is installed its model trims each layer to the vertices and edges
the layers above need (``trim_to_layer`` with the batch's per-hop counts). Without pyg-lib (as here: none is
built for torch 2.13) PyG's hetero sampler (torch-sparse's) gives no per-hop counts, so each layer computes
the rows of every sampled vertex of the types it outputs, as PyG's hetero examples do. DGL:
``DataLoader(g, {"paper": train}, NeighborSampler([{rel: fanout}, ...]), batch_size, shuffle=True)`` over
``dgl.heterograph`` of the relations (CSC built before timing), fanouts input layer first as DGL lists them;
its blocks hold only what the layers above need. Ours: ``neutronorch.train`` of the typed graph, with ``--threads`` training threads (torch's and numba's) and one producer thread
(sampling, gathering), on the same cores.

**Timing.** One process per side; the sides take turns epoch by epoch, the order reversed every other epoch
(``own_loop.Side``). An epoch's time is training only: ours the summary's epoch seconds less the time the
process waited for its turn after the epoch's last step; a peer's the loop over its loader. Ratios are of
the medians over the epochs. ``--max-batches N``: every side trains on the same fixed random N x batch-size of
the training papers (N batches an epoch, reshuffled every epoch).

**Accuracy**: one protocol on every side: after the last epoch, the model in eval mode scores a fixed random
``--eval-nodes`` of the test papers (``train/evaluate.py``'s ``eval_subset`` with seed ``--seed + 1``, the subset
ours evaluates with ``eval_max_nodes``), each from its own sample with the training fanouts.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from own_loop import PEERS, ROOT, Side

OUT = ROOT / "bench" / "out"
SUBSET_SEED = 0x5459_5045  # the fixed subset of training papers under --max-batches
MODELS = ("sage", "rgcn")
PEERS_NAMES = {"pyg": "PyG", "dgl": "DGL"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=2_000_000, help="synthetic_typed vertices (default: %(default)s)")
    p.add_argument("--degree", type=float, default=10.2,
                   help="edges per vertex before reverses; 10.2 gives 20M edges at 2M vertices once repeats are dropped")
    p.add_argument("--features", type=int, default=64, help="paper feature width (default: %(default)s)")
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated of %(default)s")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-batches", type=int, default=0,
                   help="epochs of N batches over a fixed subset of N x batch-size training papers (0: all)")
    p.add_argument("--fanouts", default="10,10", help="every relation's fanouts, seed hop first")
    p.add_argument("--relation-fanouts", default="",
                   help="per-relation overrides, 'NAME=a,b;NAME=a,b' (names after the reverses are added)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--eval-nodes", type=int, default=10_000, help="test papers scored after training")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers", default="pyg,dgl", help="comma-separated peers of pyg and dgl (default: %(default)s)")
    p.add_argument("--threads", type=int, default=2,
                   help="torch threads per side (ours: also its trainer's numba threads, beside one producer)")
    p.add_argument("--peers-python", default=str(PEERS))
    p.add_argument("--ours-python", default=sys.executable)
    p.add_argument("--json", help="write every record here")
    p.add_argument("--graph", help=argparse.SUPPRESS)  # a worker's: the native folder
    p.add_argument("--worker", choices=("ours", *PEERS_NAMES), help=argparse.SUPPRESS)
    p.add_argument("--loop", choices=MODELS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = sorted(set(args.models.split(",")) - set(MODELS))
    if unknown:
        p.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    args.peer_list = [peer for peer in args.peers.split(",") if peer]
    if not args.peer_list or set(args.peer_list) - set(PEERS_NAMES):
        p.error(f"--peers {args.peers}: choose from {', '.join(PEERS_NAMES)}")
    return args


# ------------------------------------------------------------------------------------------- the graph

def graph_folder(args) -> Path:
    """The native copy of the benchmark graph, generated and written on first use."""
    from neutronorch.data import synthetic_typed, write_typed

    folder = OUT / f"typed-n{args.nodes}-d{args.degree:g}-f{args.features}-s0"
    if (folder / "meta.json").is_file():
        return folder
    t0 = time.perf_counter()
    graph = synthetic_typed(nodes=args.nodes, degree=args.degree, features=args.features, seed=0)
    seconds = time.perf_counter() - t0
    OUT.mkdir(parents=True, exist_ok=True)
    write_typed(graph, folder)
    print(f"[graph] generated {graph.name} in {seconds:.1f} s, written to {folder} "
          f"({time.perf_counter() - t0 - seconds:.1f} s)", flush=True)
    return folder


def load(args):
    """The benchmark graph as every side trains on it: its relations two-way, and under ``--max-batches``
    the fixed subset of training papers."""
    import dataclasses

    import numpy as np

    from neutronorch.data import read_typed

    graph = read_typed(args.graph)
    if args.max_batches:
        count = args.max_batches * args.batch_size
        train = np.asarray(graph.train_idx)
        if train.shape[0] > count:
            keep = np.random.default_rng(SUBSET_SEED).permutation(train.shape[0])[:count]
            graph = dataclasses.replace(graph, train_idx=np.sort(train[keep]))
    return graph.with_reverse()


def fanout_spec(args) -> dict:
    """``typed_fanouts``' dict: ``--fanouts`` as the default, ``--relation-fanouts`` by name."""
    spec = {"default": [int(f) for f in args.fanouts.split(",")]}
    for item in filter(None, args.relation_fanouts.split(";")):
        name, _, value = item.partition("=")
        spec[name.strip()] = [int(f) for f in value.split(",")]
    return spec


def test_subset(graph, args):
    """The test papers every side scores: those ours scores with ``eval_max_nodes``."""
    from neutronorch.train.evaluate import eval_subset

    return eval_subset(graph.test_idx, args.eval_nodes, args.seed + 1)


def _say(record: dict) -> None:
    print(json.dumps(record), flush=True)


# ------------------------------------------------------------------------------------------- ours

def ours_worker(args) -> None:
    """``train`` on the graph (its fanouts per relation as ``TypedOptions``); it waits for its turn in the progress callback after an epoch's last
    step (inside the epoch's timed span: that wait is subtracted from the summary's epoch seconds)."""
    from neutronorch import TrainConfig, TypedOptions, train

    t0 = time.perf_counter()
    graph = load(args)
    config = TrainConfig(model=args.loop, epochs=args.epochs, fanouts=args.fanouts, hidden=args.hidden,
                         batch_size=args.batch_size, lr=args.lr, dropout=args.dropout,
                         weight_decay=args.weight_decay, eval_every=0, eval_max_nodes=args.eval_nodes,
                         threads=args.threads, sampler_threads=1, seed=args.seed, device="cpu")
    _say({"side": "ours", "sampler": "neutronorch TypedNeighborSampler", "setup_seconds": time.perf_counter() - t0,
          "num_batches_per_epoch": -(-len(graph.train_idx) // args.batch_size)})
    waits: list[float] = []
    state = {"released": None}

    def next_command() -> None:
        if sys.stdin.readline().strip() not in ("epoch", "eval"):
            raise SystemExit(0)
        state["released"] = time.perf_counter()

    def progress(epoch: int, done: int, total: int) -> None:
        if done < total:
            return
        now = time.perf_counter()
        _say({"epoch": epoch, "seconds": now - state["released"], "batches": total})
        next_command()
        waits.append(state["released"] - now)

    next_command()
    summary = train(config, graph, progress=progress, options=TypedOptions(fanouts=fanout_spec(args)))
    epochs = summary["epochs"]
    _say({"test_accuracy": summary["final_test_acc"], "epoch_seconds": [e["seconds"] - w for e, w in zip(epochs, waits)],
          "losses": [e["train_loss"] for e in epochs], "stages": [e["stage_seconds"] for e in epochs],
          "input_nodes_per_batch": [e["input_nodes_per_batch"] for e in epochs],
          "sampled_edges": [e["sampled_edges"] for e in epochs], "parameters": summary["model"]["parameters"],
          "threads": summary["threads"], "peak_rss_mb": summary["peak_rss_mb"]})
    sys.stdin.readline()  # quit


# ------------------------------------------------------------------------------------------- PyG

def pyg_model(kind: str, graph, args):
    """PyG's counterpart of ``TypedGNN(kind, ...)``: the same layers, relations per layer and inputs."""
    import torch
    from torch import nn
    from torch.nn import functional as F
    import torch_geometric.typing as pyg_typing
    from torch_geometric.nn import HeteroConv, RGCNConv, SAGEConv
    from torch_geometric.utils import trim_to_layer

    from neutronorch.nn.typed_models import TypedSpec, reachable_types

    spec = TypedSpec.of(graph)
    layers_count = len(args.fanouts.split(","))
    reached = reachable_types(spec, layers_count)
    hidden, classes, target = args.hidden, graph.num_classes, graph.target

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            inputs = reached[layers_count]
            self.embeddings = nn.ModuleDict({t: nn.Embedding(spec.num_nodes[t], hidden, sparse=True)
                                             for t in inputs if not spec.feature_dims[t]})
            self.projections = nn.ModuleDict({t: nn.Linear(spec.feature_dims[t], hidden) for t in inputs
                                              if spec.feature_dims[t]} if kind == "rgcn" else {})
            in_dims = {t: (spec.feature_dims[t] or hidden) if kind == "sage" else hidden for t in inputs}
            self.relations, convs = [], []
            for index in range(layers_count):
                out = classes if index == layers_count - 1 else hidden
                relations = [r for r in spec.relations if r[2] in reached[layers_count - 1 - index]]
                self.relations.append(relations)
                if kind == "sage":
                    convs.append(HeteroConv({r: SAGEConv((in_dims[r[0]], in_dims[r[2]]), out) for r in relations},
                                            aggr="sum"))
                else:
                    convs.append(RGCNConv(hidden, out, len(relations), aggr="mean"))
                in_dims = dict.fromkeys(in_dims, hidden)
            self.convs = nn.ModuleList(convs)

        def forward(self, batch):
            x = {}
            for t in batch.node_types:
                if t in self.embeddings:
                    x[t] = self.embeddings[t](batch[t].n_id)
                elif t in self.projections:
                    x[t] = self.projections[t](batch[t].x)
                else:
                    x[t] = batch[t].x
            edges = batch.edge_index_dict
            hops = getattr(batch, "num_sampled_nodes_dict", None) if pyg_typing.WITH_PYG_LIB else None
            for index, conv in enumerate(self.convs):
                if hops is not None:
                    x, edges = trim_to_layer(index, hops, batch.num_sampled_edges_dict, x, edges)
                relations = [r for r in self.relations[index] if r in edges]
                y = conv(x, {r: edges[r] for r in relations}) if kind == "sage" else \
                    homogeneous(conv, x, edges, self.relations[index])
                if index == layers_count - 1:
                    return y[target][:batch[target].batch_size]
                x = {t: F.dropout(F.relu(v), args.dropout, self.training) for t, v in y.items()}
            raise AssertionError("a model has layers")

    def homogeneous(conv, x, edges, relations):
        """One R-GCN layer over the batch with its types stacked: ``edge_type`` = the relation's index in the
        layer's list; the rows split back per type."""
        offsets, start = {}, 0
        for t, rows in x.items():
            offsets[t], start = start, start + rows.shape[0]
        stacked_edges, types = [], []
        for i, r in enumerate(relations):
            if r in edges and r[0] in x and r[2] in x:
                e = edges[r]
                stacked_edges.append(torch.stack([e[0] + offsets[r[0]], e[1] + offsets[r[2]]]))
                types.append(torch.full((e.shape[1],), i, dtype=torch.long))
        y = conv(torch.cat(list(x.values())), torch.cat(stacked_edges, 1), torch.cat(types))
        destinations = {r[2] for r in relations}
        return {t: y[offsets[t]:offsets[t] + rows.shape[0]] for t, rows in x.items() if t in destinations}

    return Model()


def pyg_worker(args) -> None:
    import warnings

    import torch
    from torch.nn import functional as F

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch_geometric
        import torch_geometric.typing as pyg_typing
        from torch_geometric.loader import NeighborLoader

        from neutronorch.data.interop import to_pyg_hetero
        from neutronorch.sampling.typed_sampler import typed_fanouts
    warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation is deprecated.*")

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    graph = load(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch on read-only (memory-mapped) features: PyG only reads them
        data = to_pyg_hetero(graph)
    fanouts = typed_fanouts(graph, fanout_spec(args))
    target = graph.target
    train = torch.from_numpy(graph.train_idx.astype("int64"))
    test = torch.from_numpy(test_subset(graph, args))
    torch.manual_seed(args.seed)
    loader = NeighborLoader(data, num_neighbors=fanouts, input_nodes=(target, train), batch_size=args.batch_size,
                            shuffle=True)
    test_loader = NeighborLoader(data, num_neighbors=fanouts, input_nodes=(target, test), batch_size=args.batch_size)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HeteroConv: types the top layer leaves alone (only paper is read)
        model = pyg_model(args.loop, graph, args)
    tables = [p for m in model.embeddings.values() for p in m.parameters()]
    table_ids = {id(p) for p in tables}
    adam = torch.optim.Adam([p for p in model.parameters() if id(p) not in table_ids], lr=args.lr,
                            weight_decay=args.weight_decay)
    sparse = torch.optim.SparseAdam(tables, lr=args.lr) if tables else None
    _say({"side": "pyg", "sampler": f"PyG {torch_geometric.__version__} NeighborLoader "
          f"({'pyg-lib' if pyg_typing.WITH_PYG_LIB else 'torch-sparse'})", "setup_seconds": time.perf_counter() - t0,
          "num_batches_per_epoch": len(loader)})
    epochs, losses = [], []
    for line in sys.stdin:
        command = line.strip()
        if command == "epoch":
            model.train()
            start = time.perf_counter()
            total, count = torch.zeros(()), 0
            for batch in loader:
                adam.zero_grad()
                if sparse is not None:
                    sparse.zero_grad()
                loss = F.cross_entropy(model(batch), batch[target].y[:batch[target].batch_size])
                loss.backward()
                adam.step()
                if sparse is not None:
                    sparse.step()
                total += loss.detach()
                count += 1
            seconds = time.perf_counter() - start
            epochs.append(seconds)
            losses.append(float(total) / max(1, count))
            _say({"epoch": len(epochs) - 1, "seconds": seconds, "batches": count})
        elif command == "eval":
            model.eval()
            correct = seen = 0
            with torch.no_grad():
                for batch in test_loader:
                    y = batch[target].y[:batch[target].batch_size]
                    correct += int((model(batch).argmax(-1) == y).sum())
                    seen += int(y.shape[0])
            _say({"test_accuracy": correct / max(1, seen), "epoch_seconds": epochs, "losses": losses})
        else:
            return


# ------------------------------------------------------------------------------------------- DGL

def dgl_model(kind: str, graph, args):
    """DGL's counterpart of ``TypedGNN(kind, ...)``. ``sage``: ``HeteroGraphConv({rel: SAGEConv((in_s, in_d),
    out, "mean")}, aggregate="sum")`` (its own bias and self weight per relation: the function of ours);
    ``rgcn``: DGL's heterogeneous R-GCN example's layer, ``HeteroGraphConv({rel: GraphConv(in, out,
    norm="right")}, aggregate="sum")`` (the mean times ``W_r``) plus a root weight shared by every type and a
    bias. Each layer is given only the destination types ours computes, so its relations are ours'."""
    import torch
    from dgl.nn import GraphConv, HeteroGraphConv, SAGEConv
    from torch import nn
    from torch.nn import functional as F

    from neutronorch.nn.typed_models import TypedSpec, reachable_types

    spec = TypedSpec.of(graph)
    count = len(args.fanouts.split(","))
    reached = reachable_types(spec, count)
    hidden, target = args.hidden, graph.target

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            inputs = reached[count]
            self.embeddings = nn.ModuleDict({t: nn.Embedding(spec.num_nodes[t], hidden, sparse=True)
                                             for t in inputs if not spec.feature_dims[t]})
            self.projections = nn.ModuleDict({t: nn.Linear(spec.feature_dims[t], hidden) for t in inputs
                                              if spec.feature_dims[t]} if kind == "rgcn" else {})
            in_dims = {t: (spec.feature_dims[t] or hidden) if kind == "sage" else hidden for t in inputs}
            self.destinations, convs, roots, biases = [], [], [], []
            for index in range(count):
                out = graph.num_classes if index == count - 1 else hidden
                self.destinations.append(reached[count - 1 - index])
                relations = [r for r in spec.relations if r[2] in self.destinations[-1]]
                if kind == "sage":
                    convs.append(HeteroGraphConv({r: SAGEConv((in_dims[r[0]], in_dims[r[2]]), out, "mean")
                                                  for r in relations}, aggregate="sum"))
                else:
                    convs.append(HeteroGraphConv({r: GraphConv(hidden, out, norm="right", bias=False,
                                                               allow_zero_in_degree=True) for r in relations},
                                                 aggregate="sum"))
                    roots.append(nn.Linear(hidden, out, bias=False))
                    biases.append(nn.Parameter(torch.zeros(out)))
                in_dims = dict.fromkeys(in_dims, hidden)
            self.convs, self.roots, self.biases = nn.ModuleList(convs), nn.ModuleList(roots), nn.ParameterList(biases)

        def forward(self, blocks, input_nodes, feats):
            x = {}
            for t, ids in input_nodes.items():
                if t in self.embeddings:
                    x[t] = self.embeddings[t](ids)
                elif t in self.projections:
                    x[t] = self.projections[t](feats[t][ids])
                elif t in feats:
                    x[t] = feats[t][ids]
            for index, (conv, block) in enumerate(zip(self.convs, blocks)):
                dst = {t: x[t][:block.num_dst_nodes(t)] for t in self.destinations[index] if t in x}
                y = conv(block, (x, dst))
                if kind == "rgcn":
                    y = {t: y[t] + self.roots[index](rows) + self.biases[index] if t in y else
                         self.roots[index](rows) + self.biases[index] for t, rows in dst.items()}
                if index == len(self.convs) - 1:
                    return y[target]
                x = {t: F.dropout(F.relu(v), args.dropout, self.training) for t, v in y.items()}
            raise AssertionError("a model has layers")

    return Model()


def dgl_worker(args) -> None:
    """DGL 2.1: ``dgl.heterograph`` of the relations (both ways), ``NeighborSampler`` with a fanout dict per
    layer (input layer first, as DGL lists them), ``DataLoader(g, {"paper": train}, sampler, batch_size,
    shuffle=True)``."""
    import numpy as np
    import torch
    from torch.nn import functional as F

    from loader_vs_dgl import import_dgl
    from neutronorch.sampling.typed_sampler import typed_fanouts

    dgl = import_dgl()
    from dgl.dataloading import DataLoader, NeighborSampler

    torch.set_num_threads(args.threads)
    dgl.utils.set_num_threads(args.threads)
    t0 = time.perf_counter()
    graph = load(args)
    target = graph.target
    edges = {}
    for key, relation in graph.relations.items():
        src, dst = relation.edges()
        edges[key] = (torch.from_numpy(src.astype("int64")), torch.from_numpy(dst.astype("int64")))
    g = dgl.heterograph(edges, num_nodes_dict=dict(graph.num_nodes), idtype=torch.int64)
    g = g.formats(["csc"])  # the sampler reads in-edges: built now, not in an epoch
    g.create_formats_()
    feats = {t: torch.from_numpy(np.array(f, dtype=np.float32)) for t, f in graph.features.items()}
    labels = torch.from_numpy(np.array(graph.labels, dtype=np.int64))
    fanouts = typed_fanouts(graph, fanout_spec(args))
    layers = len(next(iter(fanouts.values())))
    sampler = NeighborSampler([{r: f[hop] for r, f in fanouts.items()} for hop in reversed(range(layers))])
    dgl.seed(args.seed)
    torch.manual_seed(args.seed)
    train = torch.from_numpy(graph.train_idx.astype("int64"))
    loader = DataLoader(g, {target: train}, sampler, batch_size=args.batch_size, shuffle=True, num_workers=0)
    test_loader = DataLoader(g, {target: torch.from_numpy(test_subset(graph, args))}, sampler,
                             batch_size=args.batch_size, num_workers=0)
    model = dgl_model(args.loop, graph, args)
    tables = [p for m in model.embeddings.values() for p in m.parameters()]
    table_ids = {id(p) for p in tables}
    adam = torch.optim.Adam([p for p in model.parameters() if id(p) not in table_ids], lr=args.lr,
                            weight_decay=args.weight_decay)
    sparse = torch.optim.SparseAdam(tables, lr=args.lr) if tables else None
    _say({"side": "dgl", "sampler": f"DGL {dgl.__version__} NeighborSampler", "setup_seconds": time.perf_counter() - t0,
          "num_batches_per_epoch": len(loader)})
    epochs, losses = [], []
    for line in sys.stdin:
        command = line.strip()
        if command == "epoch":
            model.train()
            start = time.perf_counter()
            total, count = torch.zeros(()), 0
            for input_nodes, output_nodes, blocks in loader:
                adam.zero_grad()
                if sparse is not None:
                    sparse.zero_grad()
                loss = F.cross_entropy(model(blocks, input_nodes, feats), labels[output_nodes[target]])
                loss.backward()
                adam.step()
                if sparse is not None:
                    sparse.step()
                total += loss.detach()
                count += 1
            seconds = time.perf_counter() - start
            epochs.append(seconds)
            losses.append(float(total) / max(1, count))
            _say({"epoch": len(epochs) - 1, "seconds": seconds, "batches": count})
        elif command == "eval":
            model.eval()
            correct = seen = 0
            with torch.no_grad():
                for input_nodes, output_nodes, blocks in test_loader:
                    y = labels[output_nodes[target]]
                    correct += int((model(blocks, input_nodes, feats).argmax(-1) == y).sum())
                    seen += int(y.shape[0])
            _say({"test_accuracy": correct / max(1, seen), "epoch_seconds": epochs, "losses": losses})
        else:
            return


# ------------------------------------------------------------------------------------------- both sides

def run_model(model: str, folder: Path, args) -> dict:
    """Ours and the peers on one model, taking turns epoch by epoch (the order reversed every other epoch);
    their records."""
    forwarded = [*sys.argv[1:], "--graph", str(folder)]
    sides = ["ours", *args.peer_list]
    workers = {}
    try:
        for side in sides:  # every process set up before any is timed; one runs at a time
            workers[side] = Side(__file__, side, args, forwarded, model)
        for epoch in range(args.epochs):
            for side in (sides if epoch % 2 == 0 else sides[::-1]):
                record = workers[side].ask("epoch")
                workers[side].record["epochs"].append(record)
                print(f"  [{model} {side}] epoch {epoch}: {record['seconds']:.2f} s (load "
                      f"{os.getloadavg()[0]:.2f})", flush=True)
        for side in sides:  # one at a time, each process ending after it
            workers[side].record.update(workers[side].ask("eval"))
            workers[side].close()
    finally:
        for worker in workers.values():
            worker.close()
    return {side: worker.record for side, worker in workers.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    workers = {"ours": ours_worker, "pyg": pyg_worker, "dgl": dgl_worker}
    if args.worker:
        workers[args.worker](args)
        return 0
    from neutronorch.data import read_typed

    folder = graph_folder(args)
    graph = read_typed(folder)
    edges, types = graph.num_edges, dict(graph.num_nodes)
    print(f"graph {folder.name}: {sum(types.values()):,} vertices ({', '.join(f'{t} {n:,}' for t, n in types.items())}), "
          f"{edges:,} edges ({2 * edges:,} with the reverses), {len(graph.train_idx):,} training papers"
          + (f" (a fixed {args.max_batches * args.batch_size:,} of them trained on)" if args.max_batches else ""),
          flush=True)
    del graph
    print(f"fanouts {args.fanouts} every relation{'; ' + args.relation_fanouts if args.relation_fanouts else ''}; "
          f"hidden {args.hidden}, batch {args.batch_size}, {args.epochs} epochs, lr {args.lr}, dropout {args.dropout}, "
          f"weight decay {args.weight_decay}; {args.threads} cores a side; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    results = {}
    for model in args.models.split(","):
        records = run_model(model, folder, args)
        medians = {side: statistics.median(record["epoch_seconds"]) for side, record in records.items()}
        results[model] = {"records": records, "median_seconds": medians,
                          "ratios": {peer: medians["ours"] / medians[peer] for peer in args.peer_list}}
        for side, record in records.items():
            print(f"  [{model} {side}] epoch s {', '.join(f'{s:.2f}' for s in record['epoch_seconds'])} (median "
                  f"{medians[side]:.2f}); test accuracy {record['test_accuracy']:.4f}; "
                  f"final loss {record['losses'][-1]:.4f}", flush=True)
    names = [PEERS_NAMES[peer] for peer in args.peer_list]
    print("\n| model | side | batches/epoch | epoch s (median) | " + "".join(f"ours / {n} | " for n in names)
          + "test accuracy | last epoch loss |")
    print("|---|---|---:|---:|" + "---:|" * len(names) + "---:|---:|")
    for model, result in results.items():
        for side, record in result["records"].items():
            cells = "".join((f"**{result['ratios'][peer]:.3f}** | " if side == "ours" else "| ")
                            for peer in args.peer_list)
            print(f"| {model} | {side} | {record['num_batches_per_epoch']} | {result['median_seconds'][side]:.3f} | "
                  f"{cells}{record['test_accuracy']:.4f} | {record['losses'][-1]:.4f} |")
    print()
    for model, result in results.items():
        for peer, ratio in result["ratios"].items():
            met = "met" if ratio <= 0.25 else "not met"
            print(f"{model}: ours / {PEERS_NAMES[peer]} {ratio:.3f}: the 0.25x target is {met}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
