"""Where a training step's time goes, exact mode against NeutronOrch mode, with producers out of the way.

Mini-batches (and hot rows) are produced first; then each step runs the model's own forward, timed in parts
by forward hooks on its layers: bottom layer, what lies between the bottom and the next layer (ReLU +
dropout, and in NeutronOrch mode the splice fused with them on CPU), upper layers, backward pass. Medians
over the steps after the first two.

    python bench/step_profile.py --hot-ratio 0.4 --super-batch 16
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn import functional as F

from common import add_graph_arguments, ensure_graph
from neutronorch import TrainConfig
from neutronorch.data import load_dataset
from neutronorch.nn.models import GNN
from neutronorch.orchestration.factory import build_mode
from neutronorch.train.memory import keep_freed_memory


class LayerClock:
    """Timestamps where the bottom layer starts and ends and where the next layer starts (forward hooks)."""

    def __init__(self, model: GNN):
        self.marks: dict[str, float] = {}
        model.layers[0].register_forward_pre_hook(lambda *_: self._mark("bottom_start"))
        model.layers[0].register_forward_hook(lambda *_: self._mark("bottom_end"))
        model.layers[1].register_forward_pre_hook(lambda *_: self._mark("upper_start"))

    def _mark(self, name: str) -> None:
        self.marks[name] = time.perf_counter()


def profile(graph, mode_name: str, args) -> dict[str, float]:
    config = TrainConfig(dataset="given", fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                         batch_size=args.batch_size, epochs=1, dropout=0.5, mode=mode_name,
                         hot_ratio=args.hot_ratio, super_batch=args.super_batch, progress=False).validate()
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, args.hidden, graph.num_classes, len(config.fanouts), dropout=0.5)
    device = torch.device("cpu")
    # A prefetch deep enough that the buffer pool holds every batch at once.
    config.prefetch = args.steps + 2
    mode = build_mode(config, graph, device)
    clock = LayerClock(model)
    mode.start(model)
    try:
        with mode.batches(0) as stream:
            batches = [next(stream) for _ in range(args.steps)]
        parts = []
        for batch in batches:
            inputs = mode.step_inputs(batch)
            t0 = time.perf_counter()
            out = model(*inputs)
            t4 = time.perf_counter()
            F.cross_entropy(out, batch.labels).backward()
            t5 = time.perf_counter()
            m = clock.marks
            parts.append({"bottom": m["bottom_end"] - m["bottom_start"], "splice+act": m["upper_start"] - m["bottom_end"],
                          "upper": t4 - m["upper_start"], "backward": t5 - t4, "step": t5 - t0,
                          "input_rows": batch.features.shape[0], "bottom_rows": batch.blocks[0].num_dst})
            model.zero_grad(set_to_none=True)
    finally:
        mode.close()
    steady = parts[2:]
    return {k: statistics.median(p[k] for p in steady) for k in steady[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--super-batch", type=int, default=16)
    parser.add_argument("--hot-ratio", type=float, default=0.4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    args.steps = min(args.steps, args.super_batch)  # one super-batch: its hot rows stay valid throughout
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    graph = load_dataset(str(ensure_graph(args.nodes, args.degree, args.features, args.classes)))
    rows = {name: profile(graph, name, args) for name in ("exact", "neutronorch")}
    print(f"\n{graph.name}: 3-layer SAGE {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, "
          f"{args.threads} threads; neutronorch P={args.super_batch}, r={args.hot_ratio}\n")
    keys = ["bottom", "splice+act", "upper", "backward", "step"]
    print("| mode | " + " | ".join(f"{k} ms" for k in keys) + " | input rows | bottom rows computed |")
    print("|---|" + "---:|" * (len(keys) + 2))
    for name, row in rows.items():
        print(f"| {name} | " + " | ".join(f"{1000 * row[k]:.1f}" for k in keys) +
              f" | {row['input_rows']:.0f} | {row['bottom_rows']:.0f} |")
    print(f"\nstep ratio neutronorch / exact = {rows['neutronorch']['step'] / rows['exact']['step']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
