"""Attention's scores and per-edge softmax on CPU: the numba kernels (``nn/edge_softmax.py``) against the torch
ops they replaced (still what other devices run), inside whole training steps, side by side in one process.

Two models, each on mini-batches sampled once before timing (the same batches for every path):

- R-GAT (``TypedGNN("rgat")``) on ``synthetic_typed(nodes).with_reverse()``, ``--fanouts`` per relation;
- GAT (``GNN("gat")``, plain layers) on a homogeneous synthetic graph (``neutronorch.data.generate``).

A step is forward, cross-entropy and backward (no optimizer step: every step of any path does the same
work). The paths take turns (``--rounds`` turns each, the order reversed every other round; one warm-up
step, then ``--steps`` timed steps per turn). Prints the median step time of each, the ratios, and how far
the paths' losses and gradients lie apart on one batch.

``--attention-before FILE`` adds a path ``before``: the torch ops, and the weighted sum of an earlier
``nn/attention.py`` (``attention_aggregate`` loaded from FILE), e.g. the code before these kernels:

    git show 5d1f4c4~2:src/neutronorch/nn/attention.py > /tmp/attention_before.py
    python bench/edge_softmax.py --attention-before /tmp/attention_before.py
    python bench/edge_softmax.py --models rgat --rounds 6 --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import sys
import time

import numba
import numpy as np
import torch
from torch.nn import functional as F

from neutronorch.data import SyntheticSpec, generate, synthetic_typed
from neutronorch.nn import attention, edge_softmax, layers, relational
from neutronorch.nn.models import GNN
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.resources import keep_freed_memory
from neutronorch.features.store import TypedInputs

# path -> (the kernels of nn/edge_softmax.py?, the weighted sum)
PATHS = {"kernels": (True, attention.attention_aggregate), "torch ops": (False, attention.attention_aggregate)}


@contextlib.contextmanager
def using(path: str):
    kernels, aggregate = PATHS[path]
    edge_softmax.kernels = kernels
    layers.attention_aggregate = relational.attention_aggregate = aggregate
    try:
        yield
    finally:
        edge_softmax.kernels = True
        layers.attention_aggregate = relational.attention_aggregate = attention.attention_aggregate


def load_before(path: str) -> None:
    spec = importlib.util.spec_from_file_location("attention_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    PATHS["before"] = (False, module.attention_aggregate)


def rgat_case(args) -> tuple[str, torch.nn.Module, list]:
    graph = synthetic_typed(nodes=args.nodes).with_reverse()
    sampler = TypedNeighborSampler(graph, args.fanouts)
    torch.manual_seed(0)
    model = TypedGNN("rgat", TypedSpec.of(graph), args.hidden, graph.num_classes, len(args.fanouts),
                     heads=args.heads)
    labels = torch.from_numpy(np.asarray(graph.labels)).long()
    batches = []
    for i in range(args.batches):
        seeds = np.asarray(graph.train_idx)[i * args.batch_size:(i + 1) * args.batch_size]
        subgraph = sampler.sample(seeds, batch_key(0, 0, i))
        features, ids = TypedInputs(graph)(subgraph.input_nodes, torch.device("cpu"))
        batches.append(((subgraph.blocks, features, ids), labels[torch.from_numpy(seeds)]))
    edges = sum(b.num_edges for b in batches[0][0][0][0].blocks.values())
    title = (f"R-GAT on synthetic_typed({args.nodes:,}).with_reverse(): {len(args.fanouts)} layers, fanouts "
             f"{args.fanouts}, hidden {args.hidden}, {args.heads} heads, batch {args.batch_size} "
             f"({edges:,} bottom-block edges)")
    return title, model, batches


def gat_case(args) -> tuple[str, torch.nn.Module, list]:
    spec = SyntheticSpec(nodes=args.gat_nodes, degree=args.gat_degree, features=100, classes=16)
    graph = generate(spec)
    sampler = NeighborSampler(graph.indptr, graph.indices, args.gat_fanouts)
    torch.manual_seed(0)
    model = GNN("gat", graph.feature_dim, args.gat_hidden, graph.num_classes, len(args.gat_fanouts), dropout=0.5,
                heads=args.heads)
    batches = []
    for i in range(args.batches):
        seeds = np.asarray(graph.train_idx)[i * args.gat_batch_size:(i + 1) * args.gat_batch_size]
        subgraph = sampler.sample(seeds, batch_key(0, 0, i))
        x = torch.from_numpy(np.asarray(graph.features)[subgraph.input_nodes.numpy()]).float()
        batches.append(((subgraph.blocks, x), torch.from_numpy(np.asarray(graph.labels)[seeds]).long()))
    title = (f"GAT on {spec.name}: {len(args.gat_fanouts)} layers, fanouts {args.gat_fanouts}, hidden "
             f"{args.gat_hidden}, {args.heads} heads, attention dropout 0.5, batch {args.gat_batch_size} "
             f"({batches[0][0][0][0].num_edges:,} bottom-block edges)")
    return title, model, batches


def step(model: torch.nn.Module, batch) -> torch.Tensor:
    inputs, labels = batch
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(*inputs).float(), labels)
    loss.backward()
    return loss.detach()


def agreement(model: torch.nn.Module, batch) -> dict[str, tuple[float, float]]:
    """Each path's loss and gradients on ``batch`` in eval mode (no dropout) against the kernels': the
    relative difference of the losses and the largest of any gradient's, relative to its largest value."""
    model.eval()
    results = {}
    for path in PATHS:
        with using(path):
            loss = step(model, batch)
        results[path] = (loss, [p.grad.clone().to_dense() for p in model.parameters() if p.grad is not None])
    model.train()
    loss_k, grads_k = results["kernels"]
    return {path: (float((loss - loss_k).abs() / loss_k.abs()),
                   max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(grads, grads_k)))
            for path, (loss, grads) in results.items()}


def measure(model: torch.nn.Module, batches: list, rounds: int, steps: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {path: [] for path in PATHS}
    position = 0
    for r in range(rounds):
        for path in (list(PATHS) if r % 2 == 0 else list(reversed(PATHS))):
            with using(path):
                for i in range(steps + 1):  # the first step of a turn is its warm-up
                    batch = batches[(position + i) % len(batches)]
                    start = time.perf_counter()
                    step(model, batch)
                    if i:
                        times[path].append(time.perf_counter() - start)
        position += steps + 1  # every path of a round takes the same batches
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="rgat,gat", help="comma-separated: rgat, gat (default: %(default)s)")
    parser.add_argument("--nodes", type=int, default=100_000, help="R-GAT's synthetic_typed vertices")
    parser.add_argument("--fanouts", default="10,10", help="R-GAT's, every relation's (default: %(default)s)")
    parser.add_argument("--hidden", type=int, default=64, help="R-GAT's (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=256, help="R-GAT's (default: %(default)s)")
    parser.add_argument("--heads", type=int, default=4, help="both models' (default: %(default)s)")
    parser.add_argument("--gat-nodes", type=int, default=100_000)
    parser.add_argument("--gat-degree", type=float, default=10.0)
    parser.add_argument("--gat-fanouts", default="10,10")
    parser.add_argument("--gat-hidden", type=int, default=256)
    parser.add_argument("--gat-batch-size", type=int, default=512)
    parser.add_argument("--batches", type=int, default=8, help="mini-batches sampled before timing")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per turn (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=8, help="turns of each path (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch's and numba's (default: %(default)s)")
    parser.add_argument("--attention-before", default=None, metavar="FILE",
                        help="an earlier nn/attention.py: adds the path 'before' (torch ops and its weighted sum)")
    args = parser.parse_args()
    args.fanouts = [int(f) for f in args.fanouts.split(",")]
    args.gat_fanouts = [int(f) for f in args.gat_fanouts.split(",")]
    cases = {"rgat": rgat_case, "gat": gat_case}
    models = args.models.split(",")
    if set(models) - set(cases):
        parser.error(f"--models: choose from {', '.join(cases)}")
    keep_freed_memory()  # as training does: freed blocks are reused, not returned and faulted in again
    if args.attention_before:
        load_before(args.attention_before)
    built = [cases[name](args) for name in models]
    # numba's first set_num_threads starts its OpenMP pool, which resets the thread count torch reads: numba first.
    numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
    torch.set_num_threads(args.threads)
    paths = [p for p in ("before", "torch ops", "kernels") if p in PATHS]
    rows = []
    for title, model, batches in built:
        print(title, flush=True)
        model.train()
        agree = agreement(model, batches[0])
        times = measure(model, batches, args.rounds, args.steps)
        rows.append((title.split(" on ")[0], {p: statistics.median(times[p]) for p in paths}, agree))
    print(f"\n{args.threads} thread(s); median step (forward + backward) of {args.rounds} turns x {args.steps} "
          "steps per path; a path's loss and largest gradient difference from the kernels' (relative)")
    head = " | ".join(f"{p} s" for p in paths)
    ratios = [p for p in paths if p != "kernels"]
    print(f"| model | {head} | " + " | ".join(f"kernels / {p}" for p in ratios) + " | loss, grad diff |")
    print("|---|" + "---:|" * (len(paths) + len(ratios)) + "---|")
    for name, medians, agree in rows:
        diffs = "; ".join(f"{p}: {agree[p][0]:.1e}, {agree[p][1]:.1e}" for p in ratios)
        print(f"| {name} | " + " | ".join(f"{medians[p]:.4f}" for p in paths) + " | "
              + " | ".join(f"{medians['kernels'] / medians[p]:.2f}" for p in ratios) + f" | {diffs} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
