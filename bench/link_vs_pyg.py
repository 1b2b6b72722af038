#!/usr/bin/env python
"""Link prediction: neutronorch's ``--task link`` against PyG 2.8's and DGL 2.1's link loaders, same model and split.

    python bench/link_vs_pyg.py [--datasets cora,citeseer,amazon_photo,synthetic1m] \
        [--modes exact,neutronorch,exact:bf16] [--peers pyg,dgl] [--seeds 0,1,2] [--epochs N] [--max-batches N] \
        [--eval-edges N] [--fanouts 10,10] [--hidden 128] [--batch-size 1024] [--lr 0.005] [--dropout 0.3] \
        [--pyg-negatives binary|triplet] [--pyg-exclude] [--no-pyg-trim] [--curve] [--json OUT]

**The peers** (``--peers``, default both where their package imports under ``--peers-python``, the
``.venv-peers`` interpreter: ``bench/peers/README.md``; ``--peers none``: our sides alone): PyG and DGL, each a
side of the turns like each of our modes.

**The split.** One per graph: our ``link_graph`` (``edges:0.85,0.05``, seed ``--split-seed``) splits it once
and the result is written to ``bench/out/link-split-<graph>-s<seed>.npz`` (training message-passing topology,
training, validation and test edges), which every side reads: they train on the same supervision edges over
the same message-passing graph (the training edges, both directions; no validation or test edge).

**The model.** GraphSAGE-mean with one layer per fanout (``--fanouts``), ``--hidden`` wide at every layer (the
last outputs the embeddings), ReLU and dropout between layers, dot-product head, binary cross-entropy (mean over
positives plus mean over negatives), Adam with ``--lr`` and ``--weight-decay``, one negative per positive,
the same epochs. Ours: the built-in ``sage`` through ``train(TrainConfig(task="link", ...), graph=...)`` in
each mode of ``--modes`` (``MODE:bf16`` trains in bfloat16; neutronorch mode at its defaults, super-batch 8 and
hot ratio auto, its reuse rate the summary's ``hot.reuse_rate``). PyG: ``torch_geometric.nn.GraphSAGE``
(``SAGEConv`` mean layers: the same function, its own initial weights) over ``LinkNeighborLoader(data,
num_neighbors=fanouts, edge_label_index=training edges, batch_size, shuffle=True, is_sorted=True)`` with
``neg_sampling_ratio=1.0`` and ``edge_label=ones`` (``--pyg-negatives binary``, the default: a random pair per
positive) or triplet negatives (``--pyg-negatives triplet``: a random destination for each positive's source,
as ours draws them). PyG's model computes only what the layers above need (the per-hop counts recovered from
the batch as ``loader_vs_pyg.hop_counts`` does; ``--no-pyg-trim``: every layer over every sampled vertex).
DGL: ``dgl.nn.SAGEConv`` mean layers (``loader_vs_dgl.sage``: the same function, its own initial weights), the
two ends' embeddings scored by ``u_dot_v`` on the batch's positive and negative pair graphs, over
``dgl.dataloading.DataLoader(graph, training edge ids, as_edge_prediction_sampler(NeighborSampler(fanouts
reversed: DGL lists the input layer first), exclude="reverse_id", reverse_eids=..., negative_sampler=
Uniform(1)), batch_size, shuffle=True)``: the graph is the message-passing topology, one directed edge per CSC
entry (edge id = CSC position), each training edge ``u - v`` seeded as the id of ``u -> v``; ``Uniform(1)``
draws a random destination for each positive's source, as ours does. DGL's ``SAGEConv`` starts from
Xavier-uniform weights with ReLU gain, on Cora's 1,433 inputs about 3x the bound of torch's default that PyG's
layers use: on Cora (40 epochs, seeds 0 and 1) DGL's side reached test MRR 0.490 and 0.495 with its own
weights and 0.438 and 0.430 with every ``Linear`` reset to torch's default.

**Seed edges.** Ours removes each batch's positive edges (both directions, every hop) from the batch's sampled
graph (``sampling/exclude.py``). PyG's ``LinkNeighborLoader`` does not (its documentation says so; its
remedy is a split whose supervision edges are disjoint from the message-passing edges,
``RandomLinkSplit(disjoint_train_ratio=...)``, a different training set). ``--pyg-exclude`` removes them from
PyG's batches in the loop (torch ops on ``batch.edge_index``, timed with the epoch), so that with
``--pyg-negatives triplet`` both sides train the same way. DGL removes them by itself: ``exclude="reverse_id"``
with the map from each directed edge's id to its reverse's (built from the message-passing topology) keeps the
batch's seed edges and their reverses out of every hop's sampling. It leaves them out before drawing a
vertex's neighbours (up to the fanout among the others), where ours draws first and then drops them.

**Features.** Both sides read the same rows, scaled as ``--feature-norm`` says (``l1``: PyG's
``NormalizeFeatures``, each row divided by its sum; ``l2``: unit rows; ``none``). Raw bag-of-words rows of a few
hundred ones (Amazon Photo) make the first dot products huge and every ReLU dies at this lr on both sides.

**Evaluation: one protocol and one code for every side.** After the last epoch, the embeddings of every
vertex from its full neighbourhood over the training graph (ours: ``train()``'s own evaluation, layer by layer;
PyG: its model full-batch over a ``SparseTensor`` of the training graph, the same function; DGL: its model
full-graph, every layer over the whole training graph), then each validation and test positive against
``--eval-negatives`` destinations per positive drawn by our ``draw_negatives`` from the run's seed as
``evaluate_links`` draws them, scored by our ``train/link_metrics.py`` (``score_links``: MRR, Hits@10/50,
ROC-AUC). ``--eval-edges N`` scores a fixed random N of the validation and of the test edges on every side
(all of them stay out of message passing). ``--curve`` evaluates after every epoch (not timed).

**Timing.** Each (graph, seed) starts one process per side and the sides take turns epoch by epoch, the order
reversed every other epoch (A B C, C B A; ``own_loop.Side``, shared with ``loader_vs_pyg.py`` and
``loader_vs_dgl.py``); after training each side evaluates and ends in turn. An epoch's time is training only:
ours the summary's ``epochs[i]["seconds"]`` less the time the process waited for its turn at the epoch's end
(it waits in ``train()``'s progress callback after the epoch's last step); PyG's and DGL's the loop over
their loader. Ratios are of medians over every epoch of every seed (``--skip-first`` drops each run's first);
against each peer the JSON also holds the paired ratio (``paired_to_<peer>``: the median of the per-epoch
ratios, epoch i of a seed against the peer's epoch i of that seed), which the table shows in brackets in DGL's
column. ``--max-batches N`` makes an epoch N batches on a graph with more: every side then trains on the same
fixed random N x batch-size of the training edges (``prepared_graph``; every epoch over them, reshuffled),
message passing still over the whole training graph; the output says so.

**Graphs** (``--datasets``, comma-separated ``NAME[:EPOCHS]``): a folder under ``../shared/datasets`` (``cora``,
``citeseer``, ``amazon_photo``, ``amazon_computers``, ...), ``synthetic1m`` (the 1M-vertex benchmark graph
under ``bench/out``, generated there when missing) or a dataset path. A graph in ``PRESETS`` brings its own
epochs, feature scaling, seeds, ``--max-batches`` and ``--eval-edges`` (chosen from ``--curve`` runs; the
options override them for every graph).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

from own_loop import DEFAULT, PEERS, ROOT, Side

OUT = ROOT / "bench" / "out"
DATASETS_ROOT = ROOT.parent / "shared" / "datasets"
SUBSET_SEED = 0x5355_4253  # the fixed subset of training edges under --max-batches
# Per graph, from --curve runs of our side (docs/results/link-vs-pyg-2026-12-03.md): the feature scaling that
# trains best at the common lr, and epochs that bring MRR near its plateau (Cora, CiteSeer) or as near as the
# time allows (Amazon Photo: still about a point an epoch at 12; the 1M-vertex graph: 3 epochs of 50 batches).
# Options override them.
PRESETS = {
    "cora": {"epochs": 40, "feature_norm": "l2"},
    "citeseer": {"epochs": 40, "feature_norm": "l2"},
    "amazon_photo": {"epochs": 12, "feature_norm": "l1", "seeds": "0,1"},
    "synthetic1m": {"epochs": 3, "feature_norm": "none", "max_batches": 50, "eval_edges": 100_000, "seeds": "0"},
}
FALLBACK = {"epochs": 20, "feature_norm": "auto", "max_batches": 0, "eval_edges": 0, "seeds": "0,1,2"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="cora,citeseer,amazon_photo,synthetic1m",
                   help="comma-separated NAME[:EPOCHS] (EPOCHS: this graph's, instead of --epochs)")
    p.add_argument("--datasets-root", default=str(DATASETS_ROOT))
    p.add_argument("--modes", default="exact,neutronorch,exact:bf16",
                   help="our modes, each a side of the turns; MODE:bf16 trains in bfloat16 (default fp32)")
    p.add_argument("--fanouts", default="10,10")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=1024, help="positive edges per mini-batch")
    p.add_argument("--epochs", type=int, help="every graph's epochs (default: the graph's preset, else 20)")
    p.add_argument("--seeds", help="comma-separated training seeds (weights, order, negatives, evaluation negatives); "
                                   "default: the graph's preset, else 0,1,2")
    p.add_argument("--split-seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.005)
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--eval-negatives", type=int, default=100)
    p.add_argument("--feature-norm", choices=("auto", "l1", "l2", "none"),
                   help="l1: each vertex's features divided by their absolute sum where above 1 (PyG's "
                        "NormalizeFeatures on bag-of-words); l2: scaled to unit norm; auto: l1 where no feature is "
                        "negative (bag-of-words), else none (default: the graph's preset, else auto)")
    p.add_argument("--max-batches", type=int,
                   help="epochs of N batches over a fixed subset of N x batch-size training edges (0: all; default: "
                        "the graph's preset, else 0)")
    p.add_argument("--eval-edges", type=int,
                   help="score a fixed random N of the validation and of the test edges (0: all; default: the "
                        "graph's preset, else 0); they stay out of message passing all the same")
    p.add_argument("--peers", help="comma-separated peers to run, of pyg and dgl; none (or empty): our sides "
                                   "alone (default: both, each where its package imports under --peers-python)")
    p.add_argument("--pyg-negatives", choices=("binary", "triplet"), default="binary")
    p.add_argument("--pyg-trim", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--pyg-exclude", action="store_true", help="remove each batch's seed edges from PyG's batches")
    p.add_argument("--curve", action="store_true", help="evaluate after every epoch (not timed)")
    p.add_argument("--skip-first", action="store_true", help="leave each run's first epoch out of the medians")
    p.add_argument("--threads", type=int, default=2, help="torch threads on every side")
    p.add_argument("--peers-python", default=str(PEERS))
    p.add_argument("--ours-python", default=sys.executable)
    p.add_argument("--json", help="write every record here")
    # a worker's own: Side appends --worker and --loop (here: ours' mode, or pyg)
    p.add_argument("--one", help=argparse.SUPPRESS)  # graph label|spec|split file|seed
    p.add_argument("--worker", choices=("ours", "pyg", "dgl"), help=argparse.SUPPRESS)
    p.add_argument("--loop", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------- the split

def resolve(name: str, root: str) -> tuple[str, str]:
    """(label, dataset spec) of a ``--datasets`` entry."""
    if name in ("synthetic1m", str(DEFAULT)):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import ensure_graph

        return "synthetic1m", str(ensure_graph(1_000_000, 20, 100, 16))
    path = Path(name) if Path(name).exists() else Path(root) / name
    if path.is_dir():
        npz = sorted(path.glob("*.npz"))
        if len(npz) == 1 and not (path / "meta.json").exists():
            return name, str(npz[0])
    if not path.exists():
        raise SystemExit(f"{name}: neither a dataset path nor a folder under {root}")
    return Path(name).name if not path.is_dir() else path.name, str(path)


def split_file(label: str, spec: str, seed: int) -> Path:
    """Our link split of the graph, written once: the message-passing topology and the three edge sets."""
    import numpy as np

    from neutronorch import TrainConfig, load_dataset
    from neutronorch.train.link_task import link_graph

    path = OUT / f"link-split-{label}-s{seed}.npz"
    if path.is_file():
        return path
    t0 = time.perf_counter()
    graph = link_graph(load_dataset(spec), TrainConfig(dataset=spec, task="link", split="edges:0.85,0.05", seed=seed))
    links = graph.links
    OUT.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, indptr=np.asarray(graph.indptr), indices=np.asarray(graph.indices), train=links.train,
             val=links.val, test=links.test, undirected=np.array(links.undirected), num_nodes=graph.num_nodes)
    tmp.rename(path)
    print(f"[split] {label}: {links.describe()}, message passing over {len(graph.indices):,} directed edges "
          f"(seed {seed}, {time.perf_counter() - t0:.1f} s) -> {path}", flush=True)
    return path


def prepared_graph(spec: str, split: Path, args):
    """The dataset with the split's topology and links; under ``--max-batches`` the supervision edges are the
    fixed subset (the same on every side)."""
    import numpy as np

    from neutronorch import load_dataset
    from neutronorch.data.links import LinkSplit

    graph = load_dataset(spec)
    arrays = np.load(split)
    if int(arrays["num_nodes"]) != graph.num_nodes:
        raise SystemExit(f"{split}: made for {int(arrays['num_nodes'])} vertices, {spec} has {graph.num_nodes}")
    train = arrays["train"]
    if args.max_batches:
        train = _subset(train, args.max_batches * args.batch_size, SUBSET_SEED)
    val, test = arrays["val"], arrays["test"]
    if args.eval_edges:
        val, test = (_subset(edges, args.eval_edges, SUBSET_SEED + k) for k, edges in enumerate((val, test), 1))
    links = LinkSplit(train=train, val=val, test=test, undirected=bool(arrays["undirected"]))
    features, norm = graph.features, args.feature_norm
    if norm == "auto":  # bag-of-words rows (never negative): l1
        norm = "l1" if np.asarray(features).min() >= 0 else "none"
    if norm == "l1":
        features = np.asarray(features, dtype=np.float32)
        features = features / np.maximum(np.abs(features).sum(1, keepdims=True), 1.0)
    elif norm == "l2":
        features = np.asarray(features, dtype=np.float32)
        features = features / np.maximum(np.sqrt(np.square(features).sum(1, keepdims=True)), 1e-12)
    return dataclasses.replace(graph, indptr=arrays["indptr"], indices=arrays["indices"], links=links,
                               features=features, notes=[])


def _subset(edges, count: int, seed: int):
    """A fixed random ``count`` of the (2, E) ``edges`` (all of them when there are no more), in their order."""
    import numpy as np

    if edges.shape[1] <= count:
        return edges
    keep = np.sort(np.random.default_rng(seed).permutation(edges.shape[1])[:count])
    return np.ascontiguousarray(edges[:, keep])


# ------------------------------------------------------------------------------------------- evaluation

def link_loss(positive, negative):
    """Both peers' loss, as ours: binary cross-entropy, the mean over positives plus the mean over negatives."""
    import torch
    from torch.nn import functional as F

    return (F.binary_cross_entropy_with_logits(positive, torch.ones_like(positive))
            + F.binary_cross_entropy_with_logits(negative, torch.zeros_like(negative)))


def score_links(embeddings, links, num_nodes: int, seed: int, eval_negatives: int, chunk: int = 1 << 16) -> dict:
    """The protocol of our ``evaluate_links`` for a dot head over embeddings of every vertex: each validation and
    test positive against ``draw_negatives(mix_key(seed, EVAL + offset))``, our link metrics."""
    import numpy as np
    import torch

    from neutronorch.orchestration.link_seeds import draw_negatives
    from neutronorch.sampling.neighbor_sampler import mix_key
    from neutronorch.train.link_metrics import link_scores

    out = {}
    for offset, name in enumerate(("val", "test")):
        pairs = torch.from_numpy(np.array(getattr(links, name), dtype=np.int64))
        negatives = draw_negatives(mix_key(seed, 0x4556_414C + offset), pairs.shape[1], eval_negatives, num_nodes)
        positive = torch.cat([(embeddings[pairs[0, s]] * embeddings[pairs[1, s]]).sum(-1)
                              for s in _slices(pairs.shape[1], chunk)])
        per = max(1, chunk // eval_negatives)
        negative = torch.cat([(embeddings[pairs[0, s]].unsqueeze(1) * embeddings[negatives[s]]).sum(-1)
                              for s in _slices(pairs.shape[1], per)])
        scores = link_scores(positive, negative)
        out[f"{name}_mrr"] = scores.mrr()
        for k in (10, 50, 100):
            if k < eval_negatives:
                out[f"{name}_hits_{k}"] = scores.hits_at_k(k)
        out[f"{name}_rocauc"] = scores.roc_auc()
    return out


def _slices(count: int, chunk: int):
    return [slice(start, start + chunk) for start in range(0, count, chunk)]


# ------------------------------------------------------------------------------------------- one side

def worker(args) -> None:
    """One side, driven over stdin (``own_loop.Side``): a JSON line when ready, then one per ``epoch``, one
    for ``eval`` (the final metrics and the epochs' times), then ``quit``."""
    import torch

    torch.set_num_threads(args.threads)
    label, spec, split, seed = args.one.split("|")
    t0 = time.perf_counter()
    graph = prepared_graph(spec, Path(split), args)
    if args.worker == "ours":
        ours_worker(graph, args, int(seed), t0)
    elif args.worker == "dgl":
        dgl_worker(graph, args, int(seed), t0)
    else:
        pyg_worker(graph, args, int(seed), t0)


def _say(record: dict) -> None:
    print(json.dumps(record), flush=True)


def ours_worker(graph, args, seed: int, t0: float) -> None:
    """Our ``train()`` in ``args.loop`` mode; it waits for its turn in the progress callback after an epoch's
    last step (inside the epoch's timed span: that wait is subtracted from the summary's epoch seconds)."""
    from neutronorch import TrainConfig, train

    mode, _, precision = args.loop.partition(":")
    config = TrainConfig(dataset=graph.name, task="link", model="sage", fanouts=fanouts(args), hidden=args.hidden,
                         batch_size=args.batch_size, negatives=1, link_head="dot", epochs=args.epochs, lr=args.lr,
                         dropout=args.dropout, weight_decay=args.weight_decay, eval_negatives=args.eval_negatives,
                         eval_every=1 if args.curve else 0, mode=mode, precision=precision or "fp32", seed=seed,
                         threads=args.threads)
    batches = -(-graph.links.train.shape[1] // args.batch_size)
    _say({"side": f"ours-{args.loop}", "sampler": "neutronorch", "setup_seconds": time.perf_counter() - t0,
          "num_batches_per_epoch": batches, "train_edges": int(graph.links.train.shape[1])})
    waits: list[float] = []
    state = {"released": None}

    def next_command() -> str:
        command = sys.stdin.readline().strip()
        if command not in ("epoch", "eval"):
            raise SystemExit(0)
        state["released"] = time.perf_counter()
        return command

    def progress(epoch: int, done: int, total: int) -> None:
        if done < total:
            return
        now = time.perf_counter()
        _say({"epoch": epoch, "seconds": now - state["released"], "batches": total})
        next_command()
        waits.append(state["released"] - now)

    next_command()  # the first epoch
    summary = train(config, graph=graph, progress=progress)
    epochs = summary["epochs"]
    final = summary["link"]["final"]
    record = {"final": final, "epoch_seconds": [e["seconds"] - w for e, w in zip(epochs, waits)],
              "waits": waits, "stages": [e["stage_seconds"] for e in epochs],
              "losses": [e["train_loss"] for e in epochs], "hot": summary.get("hot"),
              "batches": [e["batches"] for e in epochs]}
    if args.curve:
        record["curve"] = [{k: e.get(k) for k in ("val_mrr", "test_mrr", "val_hits_50", "test_hits_50")}
                           for e in epochs]
    _say(record)
    sys.stdin.readline()  # quit


def fanouts(args) -> list[int]:
    return [int(f) for f in args.fanouts.split(",")]


def pyg_worker(graph, args, seed: int, t0: float) -> None:
    import warnings

    import numpy as np
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch_geometric.typing as pyg_typing
        from torch_geometric.loader import LinkNeighborLoader
        from torch_geometric.nn import GraphSAGE
        from torch_geometric.sampler import NegativeSampling
        from torch_sparse import SparseTensor

        from neutronorch.data import to_pyg
    warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation is deprecated.*")
    from loader_vs_pyg import hop_counts

    hops = len(fanouts(args))
    data = to_pyg(graph)  # x, edge_index (source, destination) sorted by destination: the training graph
    data = type(data)(x=data.x, edge_index=data.edge_index, num_nodes=graph.num_nodes)
    positives = torch.from_numpy(np.ascontiguousarray(graph.links.train))
    negatives = NegativeSampling("binary", 1.0) if args.pyg_negatives == "binary" else NegativeSampling("triplet", 1)
    torch.manual_seed(seed)
    loader = LinkNeighborLoader(data, num_neighbors=fanouts(args), edge_label_index=positives,
                                edge_label=torch.ones(positives.shape[1]) if args.pyg_negatives == "binary" else None,
                                neg_sampling=negatives, batch_size=args.batch_size, shuffle=True, is_sorted=True)
    model = GraphSAGE(graph.feature_dim, args.hidden, hops, args.hidden, dropout=args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    backend = "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse"
    _say({"side": "pyg", "sampler": backend, "setup_seconds": time.perf_counter() - t0,
          "num_batches_per_epoch": len(loader), "train_edges": int(positives.shape[1])})

    def pairs(batch):
        """(sources, destinations, labels) of the batch's pairs, as rows of the model's output."""
        if args.pyg_negatives == "binary":
            return batch.edge_label_index[0], batch.edge_label_index[1], batch.edge_label
        count = batch.src_index.shape[0]
        negative = batch.dst_neg_index.view(count, -1)
        src = torch.cat([batch.src_index, batch.src_index.repeat_interleave(negative.shape[1])])
        dst = torch.cat([batch.dst_pos_index, negative.reshape(-1)])
        return src, dst, torch.cat([torch.ones(count), torch.zeros(negative.numel())])

    def forward(batch, src, dst, label):
        edge_index = batch.edge_index
        counts = None
        if args.pyg_trim:
            batch.batch_size = int(torch.cat([src, dst]).max()) + 1  # the seeds lead, in PyG's samplers
            counts = hop_counts(batch, hops)
        if args.pyg_exclude:
            edge_index, counts = exclude(batch, edge_index, src[label == 1], dst[label == 1], counts)
        if counts is None:
            return model(batch.x, edge_index)
        return model(batch.x, edge_index, num_sampled_nodes_per_hop=counts[0], num_sampled_edges_per_hop=counts[1])

    def exclude(batch, edge_index, u, v, counts):
        """The batch's edges without those joining the two ends of a positive (either way round)."""
        n = batch.num_nodes
        keys = torch.cat([u * n + v, v * n + u])
        keep = ~torch.isin(edge_index[0] * n + edge_index[1], keys)
        if counts is not None:
            bounds = np.cumsum([0] + counts[1])
            counts = (counts[0], [int(keep[a:b].sum()) for a, b in zip(bounds[:-1], bounds[1:])])
        return edge_index[:, keep], counts

    def epoch(number: int) -> dict:
        model.train()
        start = time.perf_counter()
        total, count = 0.0, 0
        for batch in loader:
            src, dst, label = pairs(batch)
            optimizer.zero_grad()
            h = forward(batch, src, dst, label)
            score = (h[src] * h[dst]).sum(-1)
            positive, negative = score[label == 1], score[label == 0]
            loss = link_loss(positive, negative)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            count += 1
        return {"epoch": number, "seconds": time.perf_counter() - start, "batches": count,
                "loss": total / max(1, count)}

    adj = None

    @torch.no_grad()
    def evaluate() -> dict:
        nonlocal adj
        if adj is None:
            adj = SparseTensor(row=data.edge_index[1], col=data.edge_index[0],
                               sparse_sizes=(graph.num_nodes, graph.num_nodes))
        model.eval()
        embeddings = model(data.x, adj)
        return score_links(embeddings, graph.links, graph.num_nodes, seed, args.eval_negatives)

    _serve(epoch, evaluate, args)


def _serve(epoch, evaluate, args) -> None:
    """A peer's commands over stdin: ``epoch`` trains one (``epoch(number)``: its record, ``seconds`` the loop
    over the loader), ``eval`` scores the final embeddings (``evaluate()``), anything else ends."""
    epochs, curve = [], []
    for line in sys.stdin:
        command = line.strip()
        if command == "epoch":
            record = epoch(len(epochs))
            epochs.append(record)
            _say(record)
            if args.curve:
                curve.append(evaluate())
        elif command == "eval":
            t = time.perf_counter()
            final = curve[-1] if args.curve and curve else evaluate()
            _say({"final": final, "epoch_seconds": [e["seconds"] for e in epochs],
                  "losses": [e["loss"] for e in epochs], "eval_seconds": time.perf_counter() - t,
                  **({"curve": curve} if args.curve else {})})
        else:
            return


def dgl_worker(graph, args, seed: int, t0: float) -> None:
    """DGL 2.1's link prediction: ``as_edge_prediction_sampler`` over ``NeighborSampler`` (input layer first),
    each batch's seed edges and their reverses excluded from its sampled graph (``exclude="reverse_id"``), a
    ``Uniform(1)`` negative per positive (a random destination for its source), ``dgl.nn.SAGEConv`` mean
    layers (``loader_vs_dgl.sage``), ``u_dot_v`` on the pair graphs."""
    import numpy as np
    import torch

    from loader_vs_dgl import import_dgl, sage

    dgl = import_dgl()
    from dgl import function as fn
    from dgl.dataloading import DataLoader, NeighborSampler, as_edge_prediction_sampler
    from dgl.dataloading.negative_sampler import Uniform

    dgl.utils.set_num_threads(args.threads)
    n = graph.num_nodes
    indptr, indices = np.asarray(graph.indptr, dtype=np.int64), np.asarray(graph.indices, dtype=np.int64)
    src, dst = indices, np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))  # edge id = CSC position
    reverse = edge_ids(src, dst, dst, src, n)
    if (reverse < 0).any():
        raise SystemExit(f"{int((reverse < 0).sum())} message-passing edges have no reverse: not an undirected graph")
    positives = np.asarray(graph.links.train, dtype=np.int64)
    train_eids = edge_ids(src, dst, positives[0], positives[1], n)  # each positive u - v as the edge u -> v
    if (train_eids < 0).any():
        raise SystemExit(f"{int((train_eids < 0).sum())} training edges are not in the message-passing graph")
    g = dgl.graph((torch.from_numpy(src), torch.from_numpy(dst)), num_nodes=n, idtype=torch.int64)
    g = g.formats(["csc", "coo"])  # the sampler reads in-edges, find_edges the COO: built now, not in an epoch
    g.create_formats_()
    feats = torch.from_numpy(np.array(graph.features, dtype=np.float32))  # a copy: a memory map is read-only
    dgl.seed(seed)
    torch.manual_seed(seed)
    sampler = as_edge_prediction_sampler(NeighborSampler(list(reversed(fanouts(args)))), exclude="reverse_id",
                                         reverse_eids=torch.from_numpy(reverse), negative_sampler=Uniform(1))
    loader = DataLoader(g, torch.from_numpy(train_eids), sampler, batch_size=args.batch_size, shuffle=True,
                        drop_last=False, num_workers=0)
    model = sage(dgl, graph.feature_dim, args.hidden, args.hidden, len(fanouts(args)), args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    _say({"side": "dgl", "sampler": f"DGL {dgl.__version__} NeighborSampler", "setup_seconds": time.perf_counter() - t0,
          "num_batches_per_epoch": len(loader), "train_edges": int(train_eids.shape[0])})

    def scores(pair_graph, h):
        with pair_graph.local_scope():
            pair_graph.ndata["h"] = h
            pair_graph.apply_edges(fn.u_dot_v("h", "h", "score"))
            return pair_graph.edata["score"].view(-1)

    def epoch(number: int) -> dict:
        model.train()
        start = time.perf_counter()
        total, count = 0.0, 0
        for input_nodes, pair_graph, negative_graph, blocks in loader:
            optimizer.zero_grad()
            h = model(blocks, feats[input_nodes])
            positive, negative = scores(pair_graph, h), scores(negative_graph, h)
            loss = link_loss(positive, negative)
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
            count += 1
        return {"epoch": number, "seconds": time.perf_counter() - start, "batches": count,
                "loss": total / max(1, count)}

    @torch.no_grad()
    def evaluate() -> dict:
        model.eval()
        embeddings = model([g] * len(fanouts(args)), feats)  # every layer over the whole training graph
        return score_links(embeddings, graph.links, n, seed, args.eval_negatives)

    _serve(epoch, evaluate, args)


def edge_ids(src, dst, u, v, num_nodes: int):
    """The id (position in ``src``/``dst``) of the edge ``u[i] -> v[i]`` for each i; -1 where there is none
    (with parallel edges, one of them)."""
    import numpy as np

    keys = src * num_nodes + dst
    order = np.argsort(keys, kind="stable")
    wanted = np.asarray(u, dtype=np.int64) * num_nodes + np.asarray(v, dtype=np.int64)
    at = np.minimum(np.searchsorted(keys[order], wanted), len(order) - 1)
    found = order[at]
    return np.where(keys[found] == wanted, found, -1)


# ------------------------------------------------------------------------------------------- both sides

def run_one(label: str, spec: str, split: Path, seed: int, sides: list[tuple[str, str]], args) -> dict:
    """Every side on one graph and seed, taking turns epoch by epoch (ABBA); their records."""
    forwarded = [*sys.argv[1:], "--epochs", str(args.epochs), "--feature-norm", args.feature_norm, "--max-batches",
                 str(args.max_batches), "--eval-edges", str(args.eval_edges), "--one", f"{label}|{spec}|{split}|{seed}"]
    workers = {}
    try:
        for name, (side, loop) in sides:  # every process set up before any is timed; one runs at a time
            workers[name] = Side(__file__, side, args, forwarded, loop)
        order = [name for name, _ in sides]
        if seed % 2:
            order = order[::-1]  # the seeds alternate which side goes first too
        for epoch in range(args.epochs):
            for name in (order if epoch % 2 == 0 else order[::-1]):
                workers[name].record["epochs"].append(workers[name].ask("epoch"))
        for name in order:  # one at a time, each process ending after it (an evaluation holds gigabytes)
            workers[name].record.update(workers[name].ask("eval"))
            workers[name].close()
    finally:
        for worker_ in workers.values():
            worker_.close()
    return {name: worker_.record for name, worker_ in workers.items()}


PEER_NAMES = {"pyg": "PyG", "dgl": "DGL"}
PEER_MODULES = {"pyg": "torch_geometric", "dgl": "dgl"}


def choose_peers(args) -> list[str]:
    """``--peers`` (``none`` or empty: no peer), else every peer whose package is installed for
    ``--peers-python``."""
    import subprocess

    if args.peers is not None:
        peers = [p for p in args.peers.split(",") if p and p != "none"]
        unknown = [p for p in peers if p not in PEER_NAMES]
        if unknown:
            raise SystemExit(f"--peers: {', '.join(unknown)}; choose from {', '.join(PEER_NAMES)}, or none")
        return peers
    found = []
    for peer, module in PEER_MODULES.items():
        check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
        if Path(args.peers_python).exists() and subprocess.run([args.peers_python, "-c", check]).returncode == 0:
            found.append(peer)
        else:
            print(f"[peers] {module} not found under {args.peers_python}: no {PEER_NAMES[peer]} side", flush=True)
    if not found:
        raise SystemExit(f"no peer installed under {args.peers_python} (bench/peers/README.md)")
    return found


def times(record: dict, skip_first: bool) -> list[float]:
    seconds = record["epoch_seconds"]
    return seconds[1:] if skip_first and len(seconds) > 1 else seconds


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    modes = [m for m in args.modes.split(",") if m]
    peers = choose_peers(args)
    sides = [(f"ours-{m}", ("ours", m)) for m in modes] + [(peer, (peer, peer)) for peer in peers]
    how = []
    if "pyg" in peers:
        how.append(f"PyG: {args.pyg_negatives}{', seed edges excluded' if args.pyg_exclude else ''}; "
                   f"{'trimmed' if args.pyg_trim else 'untrimmed'}")
    if "dgl" in peers:
        how.append("DGL: uniform destinations, seed edges and reverses excluded")
    print(f"link prediction; SAGE fanouts {args.fanouts}, hidden "
          f"{args.hidden}, dropout {args.dropout}, batch {args.batch_size} positives, 1 negative each ("
          f"{'; '.join(how)}), dot head, Adam lr {args.lr} wd {args.weight_decay}, "
          f"{args.eval_negatives} eval negatives per positive; torch threads {args.threads}; load average "
          f"{os.getloadavg()[0]:.1f}", flush=True)
    results = {}
    given = {key: getattr(args, key) for key in FALLBACK}
    for entry in [d for d in args.datasets.split(",") if d]:
        name, _, epochs = entry.partition(":")
        label, spec = resolve(name, args.datasets_root)
        for key, fallback in FALLBACK.items():
            value = given[key] if given[key] is not None else PRESETS.get(label, {}).get(key, fallback)
            setattr(args, key, value)
        if epochs:
            args.epochs = int(epochs)
        seeds = [int(s) for s in args.seeds.split(",")]
        print(f"{label}: seeds {seeds}, {args.epochs} epochs, features {args.feature_norm}"
              + (f", epochs of at most {args.max_batches} batches (a fixed {args.max_batches * args.batch_size:,} of the "
                 f"training edges)" if args.max_batches else "")
              + (f", a fixed {args.eval_edges:,} of the validation and test edges scored" if args.eval_edges else ""),
              flush=True)
        split = split_file(label, spec, args.split_seed)
        runs = {side: [] for side, _ in sides}
        t0 = time.perf_counter()
        for seed in seeds:
            records = run_one(label, spec, split, seed, sides, args)
            for side, record in records.items():
                runs[side].append(record)
                print(f"  [{label} seed {seed}] {side:>16}: epoch s "
                      f"{', '.join(f'{s:.2f}' for s in record['epoch_seconds'])}; test mrr "
                      f"{record['final']['test_mrr']:.4f} hits@50 {record['final'].get('test_hits_50', float('nan')):.4f}",
                      flush=True)
        results[label] = summarise(label, runs, args, time.perf_counter() - t0, peers)
        results[label].update({key: getattr(args, key) for key in FALLBACK})
    print_table(results, modes, peers)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {k: v for k, v in vars(args).items()}, "results": results},
                                              indent=1))
    return 0


METRICS = ("val_mrr", "test_mrr", "val_hits_50", "test_hits_50", "val_rocauc", "test_rocauc", "test_hits_10")


def summarise(label: str, runs: dict, args, wall: float, peers: list[str]) -> dict:
    out = {"wall_seconds": wall, "sides": {}}
    for side, records in runs.items():
        seconds = [s for r in records for s in times(r, args.skip_first)]
        finals = [r["final"] for r in records]
        entry = {"epoch_seconds_median": statistics.median(seconds), "epoch_seconds": [r["epoch_seconds"] for r in records],
                 "batches_per_epoch": records[0]["num_batches_per_epoch"], "train_edges": records[0]["train_edges"],
                 "setup_seconds": [r["setup_seconds"] for r in records],
                 **{m: statistics.median(f[m] for f in finals) for m in METRICS if m in finals[0]},
                 "per_seed": finals, "losses": [r["losses"] for r in records]}
        if "stages" in records[0]:
            entry["stages"] = [r["stages"] for r in records]
        if records[0].get("hot"):
            entry["reuse_rate"] = statistics.median(r["hot"]["reuse_rate"] for r in records)
            entry["hot"] = [r["hot"] for r in records]
        if "curve" in records[0]:
            entry["curve"] = [r["curve"] for r in records]
        out["sides"][side] = entry
    for peer in peers:  # every other side against each peer: medians' ratio, paired ratio, metric differences
        base = out["sides"][peer]
        for side, entry in out["sides"].items():
            if side != peer:
                entry[f"ratio_to_{peer}"] = entry["epoch_seconds_median"] / base["epoch_seconds_median"]
                entry[f"paired_to_{peer}"] = statistics.median(
                    a / b for mine, theirs in zip(runs[side], runs[peer])
                    for a, b in zip(times(mine, args.skip_first), times(theirs, args.skip_first)))
                entry[f"mrr_minus_{peer}"] = entry["test_mrr"] - base["test_mrr"]
                entry[f"hits_50_minus_{peer}"] = entry["test_hits_50"] - base["test_hits_50"]
    if "ours-exact" in out["sides"] and "ours-neutronorch" in out["sides"]:
        exact, orch = out["sides"]["ours-exact"], out["sides"]["ours-neutronorch"]
        out["neutronorch_mrr_minus_exact"] = orch["test_mrr"] - exact["test_mrr"]
        out["neutronorch_per_seed_mrr_minus_exact"] = [o["test_mrr"] - e["test_mrr"]
                                                       for o, e in zip(orch["per_seed"], exact["per_seed"])]
    return out


def print_table(results: dict, modes: list[str], peers: list[str]) -> None:
    """One row per graph and side; a ratio column per peer (PyG's: the medians' ratio; DGL's: the medians'
    ratio and, in brackets, the paired one, the median of per-epoch ratios)."""
    ratios = "".join(f" / {PEER_NAMES[peer]} |" for peer in peers)
    print(f"\n| graph | side | batches/epoch | epoch s (median) |{ratios} test MRR | test Hits@50 | test ROC-AUC | "
          "val MRR | reuse rate |")
    print("|---|---|---:|---:|" + "---:|" * len(peers) + "---:|---:|---:|---:|---:|")
    for label, result in results.items():
        for side, e in result["sides"].items():
            cells = []
            for peer in peers:
                if f"ratio_to_{peer}" not in e:
                    cells.append("1.000")
                elif peer == "pyg":
                    cells.append(f"**{e['ratio_to_pyg']:.3f}**")
                else:
                    cells.append(f"**{e[f'ratio_to_{peer}']:.3f}** ({e[f'paired_to_{peer}']:.3f})")
            reuse = f"{e['reuse_rate']:.3f}" if "reuse_rate" in e else "-"
            print(f"| {label} | {side} | {e['batches_per_epoch']} | {e['epoch_seconds_median']:.3f} | "
                  f"{''.join(c + ' | ' for c in cells)}"
                  f"{e['test_mrr']:.4f} | {e['test_hits_50']:.4f} | {e['test_rocauc']:.4f} | {e['val_mrr']:.4f} | "
                  f"{reuse} |")
    print()
    for label, result in results.items():
        sides = result["sides"]
        for peer in peers:
            name = PEER_NAMES[peer]
            for side, e in sides.items():
                if side == peer:
                    continue
                paired = "" if peer == "pyg" else f" (paired {e[f'paired_to_{peer}']:.3f})"
                print(f"{label}: {side} / {name} epoch {e[f'ratio_to_{peer}']:.3f}{paired}; test MRR "
                      f"{e[f'mrr_minus_{peer}'] * 100:+.2f} points, Hits@50 {e[f'hits_50_minus_{peer}'] * 100:+.2f} "
                      f"points against {name} (medians over seeds)")
        if "neutronorch_mrr_minus_exact" in result:
            print(f"{label}: neutronorch - exact test MRR {result['neutronorch_mrr_minus_exact'] * 100:+.2f} points "
                  f"(per seed {', '.join(f'{d * 100:+.2f}' for d in result['neutronorch_per_seed_mrr_minus_exact'])}); "
                  f"reuse rate {sides['ours-neutronorch'].get('reuse_rate', float('nan')):.3f}")
        print(f"{label}: {result['wall_seconds']:.0f} s wall")


if __name__ == "__main__":
    sys.exit(main())
