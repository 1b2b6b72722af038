"""GAT's attention-weighted sum on CPU: the numba kernels (``nn/attention.py``) against the torch ops that
other devices run, inside whole training steps, side by side in one process.

The model trains on one stream of mini-batches; its GAT layers switch between the two implementations of
the weighted sum in turns (one warm-up step, then ``--steps`` timed steps per turn, ``--rounds`` turns
each). Both compute the same values, so the comparison is only of time. Prints the median step time of each
and their ratio.

    python bench/attention_kernel.py --dataset PATH/minesweeper.npz --layers 4 --batch-size 156
    python bench/attention_kernel.py                 # a 50k-vertex synthetic graph
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import ensure_graph
from neutronorch import TrainConfig
from neutronorch.data import load_dataset
from neutronorch.nn import attention, layers
from neutronorch.nn.models import GNN
from neutronorch.nn.precision import resolve_precision
from neutronorch.orchestration.factory import build_mode
from neutronorch.train.step import train_step


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=None, help="a dataset path (default: synthetic, 50k vertices)")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--fanout", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=183)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--architecture", default="blocks", choices=["plain", "blocks"])
    parser.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per turn")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each implementation")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    path = args.dataset or str(ensure_graph(50_000, 10, 100, 16))
    graph = load_dataset(path)
    config = TrainConfig(dataset="given", model="gat", fanouts=[args.fanout] * args.layers, hidden=args.hidden,
                         heads=args.heads, batch_size=args.batch_size, epochs=1, lr=0.001, dropout=0.2,
                         weight_decay=0, progress=False, architecture=args.architecture, norm="layer",
                         threads=args.threads, sampler_threads=1, precision=args.precision).validate()
    device = torch.device("cpu")
    precision = resolve_precision(args.precision, device)
    mode = build_mode(config, graph, device)
    torch.manual_seed(0)
    model = GNN("gat", graph.feature_dim, args.hidden, graph.num_classes, args.layers, dropout=0.2,
                heads=args.heads, norm="layer", architecture=args.architecture)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    paths = {"kernels": attention.attention_aggregate, "torch ops": attention.attention_aggregate_torch}
    times: dict[str, list[float]] = {name: [] for name in paths}
    needed = args.rounds * len(paths) * (args.steps + 1)
    epoch, done = 0, 0
    try:
        while done < needed:
            with mode.batches(epoch) as stream:
                for batch in stream:
                    name = list(paths)[(done // (args.steps + 1)) % len(paths)]
                    layers.attention_aggregate = paths[name]
                    start = time.perf_counter()
                    train_step(model, optimizer, mode, batch, precision=precision)
                    if done % (args.steps + 1):  # the first step of a turn is its warm-up
                        times[name].append(time.perf_counter() - start)
                    done += 1
                    if done == needed:
                        break
            epoch += 1
    finally:
        layers.attention_aggregate = attention.attention_aggregate
        mode.close()
    medians = {name: statistics.median(values) for name, values in times.items()}
    print(f"{graph.name}: GAT ({args.architecture}), {args.layers} layers, fanout {args.fanout}, batch "
          f"{args.batch_size}, hidden {args.hidden}, {args.heads} heads, {precision.name}, {args.threads} thread(s)")
    print("| weighted sum | median step s | steps |")
    print("|---|---:|---:|")
    for name, value in medians.items():
        print(f"| {name} | {value:.3f} | {len(times[name])} |")
    print(f"kernels / torch ops: {medians['kernels'] / medians['torch ops']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
