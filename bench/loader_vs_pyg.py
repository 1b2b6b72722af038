#!/usr/bin/env python
"""PyG's own GraphSAGE training loop with neutronorch's NeighborLoader against PyG 2.8's NeighborLoader.

    python bench/loader_vs_pyg.py [--dataset DIR|SPEC] [--fanouts 15,10,5] [--epochs 3] [--max-batches N] \
        [--loops example,trim,loader] [--pyg-workers 0] [--threads 2] [--json OUT]

One loop, the same on both sides but for the loader: the PyG example's (``for batch in loader: out =
model(batch.x, batch.edge_index)[:batch.batch_size]; loss = cross_entropy(out, batch.y[:batch.batch_size]);
...``), with the same model (``torch_geometric.nn.GraphSAGE``, hidden 256, dropout 0.5, Adam), fanouts, batch
size, epochs, torch threads and initial weights. Each side runs in its own process; both are set up first, then they take turns epoch by epoch (ABBA order),
so that load from other work on a shared machine weighs on both:
PyG's loader under ``.venv-peers/bin/python`` (it needs torch-sparse or pyg-lib: ``bash
bench/peers/install_pyg.sh``), ours under this interpreter (``--ours-python``; neutronorch and
torch-geometric must import there).

Loops (``--loops``, each run on both sides): ``example``, the loop above; ``trim``, the same loop passing the
per-hop counts (``GraphSAGE(..., num_sampled_nodes_per_hop=, num_sampled_edges_per_hop=)``) so that each layer
computes only the vertices the layers above need: ours yields them; PyG's loader yields them only with
pyg-lib, so with torch-sparse they are recovered from the batch (seeds first, hops in order), as
``bench/peers/pyg_train.py`` does, and both sides trim; ``loader``, the loaders alone (each batch built as a
PyG ``Data`` and read, no model; ``--loader-batches`` per epoch, 32 by default).

Epoch times are medians over the epochs (the first included: neither side compiles anything in it once
numba's cache is warm; ``--skip-first`` drops it). ``--max-batches N`` times the first N batches of each
epoch (the output says so). Test accuracy: after training, each side's own loader over the first
``--eval-nodes`` test vertices (same fanouts, in order).

Default dataset: the 1M-vertex synthetic graph under ``bench/out`` (generated there with ``neutronorch generate
synthetic`` when missing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "bench" / "out" / "synthetic-n1000000-d20-f100-c16-p0.6-h0.7-x0.5-s0"
PEERS = ROOT / ".venv-peers" / "bin" / "python"
LOOPS = ("example", "trim", "loader")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default=str(DEFAULT), help="a native dataset directory or a dataset spec")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-batches", type=int, default=0, help="time the first N batches of each epoch (0: all)")
    p.add_argument("--loader-batches", type=int, default=32,
                   help="batches per epoch of the loader loop, which has no model step to hide a pipeline's start")
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loops", default="example",
                   help="comma-separated: example (PyG's loop), trim (the loop passing the per-hop counts, both sides "
                        "trimming), loader (the loaders alone: each batch built as PyG Data, no model)")
    p.add_argument("--pyg-workers", type=int, default=0, help="NeighborLoader(num_workers=) of PyG's loader")
    p.add_argument("--eval-nodes", type=int, default=8192, help="test vertices scored after training (0: none)")
    p.add_argument("--skip-first", action="store_true", help="leave the first epoch out of the medians")
    p.add_argument("--sides", default="ours,pyg", help="which loaders to run, in order")
    p.add_argument("--peers-python", default=str(PEERS))
    p.add_argument("--ours-python", default=sys.executable)
    p.add_argument("--json", help="write both sides' records here")
    p.add_argument("--worker", choices=("ours", "pyg"), help=argparse.SUPPRESS)
    p.add_argument("--loop", choices=LOOPS, default="example", help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------- one side

def hop_counts(data, hops: int):
    """(vertices per hop, edges per hop) of a PyG batch: its own when it has them (pyg-lib, ours); else
    recovered, since PyG's samplers put the seeds first and each hop's vertices after the last hop's, and
    hop k's edges lead into hop k-1's vertices in ascending order."""
    import torch

    nodes, edges = getattr(data, "num_sampled_nodes", None), getattr(data, "num_sampled_edges", None)
    if nodes is not None and edges is not None:
        return [int(n) for n in nodes], [int(e) for e in edges]
    src, dst = data.edge_index
    end, lo, nodes, edges = int(data.batch_size), 0, [int(data.batch_size)], []
    for _ in range(hops):
        hi = int(torch.searchsorted(dst, torch.tensor([end], dtype=dst.dtype))[0])
        new_end = max(end, int(src[lo:hi].max()) + 1) if hi > lo else end
        nodes.append(new_end - end)
        edges.append(hi - lo)
        lo, end = hi, new_end
    if lo != dst.numel() or end != data.num_nodes:
        raise RuntimeError("a PyG batch whose hops cannot be told apart; run without --trim")
    return nodes, edges


def load_graph(spec: str):
    from neutronorch.data import load_dataset

    return load_dataset(spec)


def make_loaders(side: str, graph, args, fanouts):
    """(training loader, test loader, batch -> PyG Data)."""
    import numpy as np
    import torch

    test_ids = torch.from_numpy(np.array(graph.test_idx[:args.eval_nodes], dtype=np.int64))
    if side == "ours":
        from neutronorch.loader import NeighborLoader

        train = NeighborLoader(graph, fanouts, args.batch_size, seeds="train", shuffle=True, seed=args.seed)
        test = NeighborLoader(graph, fanouts, args.batch_size, seeds=test_ids, shuffle=False) \
            if args.eval_nodes else None
        return train, test, lambda batch: batch.to_pyg()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch_geometric.loader import NeighborLoader

        from neutronorch.data import to_pyg
    warnings.filterwarnings("ignore", message=".*without a 'pyg-lib' installation is deprecated.*")
    data = to_pyg(graph)  # x, y, edge_index (source, destination) sorted by destination, masks
    train_idx = torch.from_numpy(np.asarray(graph.train_idx, dtype=np.int64))
    common = dict(num_neighbors=fanouts, batch_size=args.batch_size, num_workers=args.pyg_workers,
                  is_sorted=True, persistent_workers=args.pyg_workers > 0)
    train = NeighborLoader(data, input_nodes=train_idx, shuffle=True, **common)
    test = NeighborLoader(data, input_nodes=test_ids, shuffle=False, **common) if args.eval_nodes else None
    return train, test, lambda batch: batch


def serve(side: str, args) -> None:
    """One side, driven over stdin by the orchestrator: a JSON line when ready, then one per command
    (``epoch``: train one epoch; ``eval``: test accuracy; ``quit``)."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GraphSAGE

    torch.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    t0 = time.perf_counter()
    graph = load_graph(args.dataset)
    train_loader, test_loader, as_pyg = make_loaders(side, graph, args, fanouts)
    setup = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    model = GraphSAGE(graph.feature_dim, args.hidden, len(fanouts), graph.num_classes, dropout=args.dropout)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    trim, train_model = args.loop == "trim", args.loop != "loader"

    def forward(batch):
        if trim:
            nodes, edges = hop_counts(batch, len(fanouts))  # ours: the batch's own; PyG: see hop_counts
            return model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=nodes, num_sampled_edges_per_hop=edges)
        return model(batch.x, batch.edge_index)

    def epoch(number: int) -> dict:
        model.train()
        waited = stepped = loss_sum = 0.0
        count = 0
        start = time.perf_counter()
        it = iter(train_loader)
        while True:
            t = time.perf_counter()
            batch = next(it, None)
            if batch is None:
                break
            batch = as_pyg(batch)
            t1 = time.perf_counter()
            if train_model:
                optimizer.zero_grad()
                out = forward(batch)[:batch.batch_size]
                loss = F.cross_entropy(out, batch.y[:batch.batch_size])
                loss.backward()
                optimizer.step()
                loss_sum += loss.item()
            else:  # the loaders alone: every tensor of the batch read once
                loss_sum += float(batch.x.sum()) * 0 + float(batch.edge_index.sum()) * 0 + float(batch.y.sum()) * 0
            t2 = time.perf_counter()
            waited, stepped, count = waited + (t1 - t), stepped + (t2 - t1), count + 1
            if count == (args.loader_batches if args.loop == "loader" else args.max_batches):
                break
        del it  # ours: closes the epoch's producer thread (PyG's: drops its iterator)
        seconds = time.perf_counter() - start
        print(f"[{side} {args.loop}] epoch {number}: {seconds:.2f} s, {count} batches (waiting on the loader "
              f"{waited:.2f} s, steps {stepped:.2f} s), loss {loss_sum / max(1, count):.4f}", file=sys.stderr,
              flush=True)
        return {"epoch": number, "seconds": seconds, "batches": count, "loader_wait": waited, "step": stepped,
                "loss": loss_sum / max(1, count), "load_average": os.getloadavg()[0]}

    @torch.no_grad()
    def evaluate() -> dict:
        if test_loader is None or not train_model:
            return {"test_accuracy": None}
        model.eval()
        correct = total = 0
        for batch in test_loader:
            batch = as_pyg(batch)
            pred = forward(batch)[:batch.batch_size].argmax(-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
        return {"test_accuracy": correct / max(1, total), "test_nodes": total}

    backend = "neutronorch"
    if side == "pyg":
        import torch_geometric.typing as pyg_typing
        backend = "pyg-lib" if pyg_typing.WITH_PYG_LIB else "torch-sparse"
    print(json.dumps({"side": side, "loop": args.loop, "sampler": backend, "setup_seconds": setup,
                      "num_batches_per_epoch": len(train_loader), "torch": torch.__version__,
                      "python": sys.executable, "threads": args.threads}), flush=True)
    epochs = 0
    for line in sys.stdin:
        command = line.strip()
        if command == "epoch":
            print(json.dumps(epoch(epochs)), flush=True)
            epochs += 1
        elif command == "eval":
            print(json.dumps(evaluate()), flush=True)
        else:
            return


class Side:
    """A worker process of one side, answering one JSON line per command."""

    def __init__(self, side: str, args, forwarded: list[str], loop: str):
        python = args.ours_python if side == "ours" else args.peers_python
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                   PYTHONPATH=str(ROOT / "src"))
        self.process = subprocess.Popen([python, __file__, *forwarded, "--worker", side, "--loop", loop],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True)
        self.record = self._answer()
        self.record["epochs"] = []

    def _answer(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"a worker ended (exit {self.process.wait()}); its messages are above")
        return json.loads(line)

    def ask(self, command: str) -> dict:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.write("quit\n")
                self.process.stdin.close()
            except OSError:
                pass
            self.process.wait()


# ------------------------------------------------------------------------------------------- both sides

def ensure_dataset(args) -> None:
    path = Path(args.dataset)
    if args.dataset != str(DEFAULT) or (path / "meta.json").is_file():
        return
    print(f"[loader_vs_pyg] generating {path} (once)", file=sys.stderr, flush=True)
    subprocess.run([args.ours_python, "-m", "neutronorch", "generate", "synthetic", "--nodes", "1000000",
                    "--degree", "20", "--features", "100", "--classes", "16", "--out", str(path)], check=True)


def median_seconds(record: dict, skip_first: bool) -> float:
    epochs = record["epochs"][1:] if skip_first and len(record["epochs"]) > 1 else record["epochs"]
    return statistics.median(e["seconds"] for e in epochs)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        serve(args.worker, args)
        return 0
    ensure_dataset(args)
    forwarded = list(argv if argv is not None else sys.argv[1:])
    what = (f"the first {args.max_batches} batches of each epoch" if args.max_batches else "whole epochs") + \
        (f"; loop loader: {args.loader_batches or 'all'}" if "loader" in args.loops else "")
    print(f"dataset {args.dataset}; fanouts {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, "
          f"{args.epochs} epochs ({what}), torch threads {args.threads}, PyG workers {args.pyg_workers}; "
          f"load average before {os.getloadavg()[0]:.1f}", flush=True)
    records = {}
    sides = args.sides.split(",")
    for loop in args.loops.split(","):
        workers = {}
        try:
            for side in sides:  # both processes set up before either is timed; one runs at a time
                workers[side] = Side(side, args, forwarded, loop)
            for epoch in range(args.epochs):
                # ABBA: the sides take turns going first, so drifting load from other work weighs on both
                for side in (sides if epoch % 2 == 0 else sides[::-1]):
                    workers[side].record["epochs"].append(workers[side].ask("epoch"))
            for side in sides:
                workers[side].record.update(workers[side].ask("eval"))
        except RuntimeError as exc:
            print(f"[loader_vs_pyg] loop {loop}: {exc}", file=sys.stderr)
            return 1
        finally:
            for worker in workers.values():
                worker.close()
        for side in sides:
            records[f"{loop}/{side}"] = record = workers[side].record
            epochs = ", ".join(f"{e['seconds']:.2f}" for e in record["epochs"])
            waits = ", ".join(f"{e['loader_wait']:.2f}" for e in record["epochs"])
            acc = "-" if record.get("test_accuracy") is None else f"{record['test_accuracy']:.4f}"
            print(f"  {loop:>7} {side:>4} ({record['sampler']}): epoch seconds {epochs} (median "
                  f"{median_seconds(record, args.skip_first):.2f}); waiting on the loader {waits}; test accuracy "
                  f"{acc}", flush=True)
        if f"{loop}/ours" in records and f"{loop}/pyg" in records:
            ratio = (median_seconds(records[f"{loop}/ours"], args.skip_first)
                     / median_seconds(records[f"{loop}/pyg"], args.skip_first))
            print(f"  {loop:>7} ratio ours / PyG (median epoch): {ratio:.3f}", flush=True)
    if "trim/ours" in records and "example/pyg" in records and records["example/pyg"]["sampler"] != "pyg-lib":
        ratio = (median_seconds(records["trim/ours"], args.skip_first)
                 / median_seconds(records["example/pyg"], args.skip_first))
        print(f"  the loop passing batch.num_sampled_nodes/edges as written (PyG's loader with torch-sparse yields "
              f"None there, so its model runs untrimmed): ratio {ratio:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
