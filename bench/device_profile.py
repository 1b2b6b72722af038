"""Where device mode's time goes on a GPU: its sampler, its gather, and one training step, each alone.

The first GPU check found device mode bound by its sampler thread (busy 99% of the epoch, the trainer
82%). This script times, on a graph folder, per mini-batch (median over ``--batches`` after two warm-up
batches): the torch sampler alone (each hop: the sampled edges' count and the new frontier are the
host synchronisations), sampling + gathering the input rows, and a training step on a produced batch;
then profiles a few sampled batches with ``torch.profiler`` and prints the operators taking the most
device time and the most host time.

    python bench/device_profile.py --dataset /path/to/graph --batches 20
    python bench/device_profile.py --dataset synthetic:nodes=20000 --device cpu   # a rehearsal
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from neutronorch import TrainConfig
from neutronorch.data import load_dataset
from neutronorch.nn.models import GNN
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key
from neutronorch.train.optim import Adam
from neutronorch.train.step import train_step


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--rows", type=int, default=15, help="operators listed per table (default: %(default)s)")
    args = p.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    device = torch.device(args.device)
    graph = load_dataset(args.dataset)
    cfg = TrainConfig(dataset="given", mode="device", device=args.device, fanouts=fanouts, hidden=args.hidden,
                      batch_size=args.batch_size, epochs=1).validate()
    mode = build_mode(cfg, graph, device)
    reader = mode.reader
    sampler = TorchNeighborSampler(reader.indptr, reader.indices, fanouts)
    order = epoch_order(mode.train_idx, cfg.sampling.seed, 0)
    seeds = list(torch.split(order, args.batch_size))[:args.batches + 2]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def timed(fn) -> list[float]:
        out = []
        for i, s in enumerate(seeds):
            sync()
            t = time.perf_counter()
            fn(i, s)
            sync()
            out.append(time.perf_counter() - t)
        return out[2:]

    def sample(i, s):
        return sampler.sample(s.to(device), batch_key(0, 0, i))

    batches = []

    def sample_and_gather(i, s):
        batches.append(reader.load(0, i, sample(i, s)))

    t_sample = timed(sample)
    t_load = timed(sample_and_gather)
    model = GNN("sage", graph.feature_dim, args.hidden, graph.num_classes, len(fanouts), dropout=0.5).to(device)
    opt = Adam(model.parameters(), lr=0.003)  # the trainer's optimizer
    t_step = timed(lambda i, s: train_step(model, opt, mode, batches[i]))
    rows = statistics.mean(b.subgraph.input_nodes.shape[0] for b in batches)
    print(f"device {device}; {graph.num_nodes:,} vertices; fanouts {fanouts}, batch {args.batch_size}, "
          f"{rows:,.0f} input rows per batch; medians over {len(t_sample)} batches:")
    for name, t in (("sample", t_sample), ("sample + gather", t_load), ("training step", t_step)):
        print(f"  {name:<16} {1e3 * statistics.median(t):8.2f} ms")

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for i, s in enumerate(seeds[:6]):
            reader.load(0, i, sample(i, s))
        sync()
    averages = prof.key_averages()
    if device.type == "cuda":
        print(averages.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=48))
    print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=48))
    mode.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
