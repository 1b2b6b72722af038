"""A user's own training loop with neutronorch's NeighborLoader against a peer's loader: the machinery that
``loader_vs_pyg.py`` and ``loader_vs_dgl.py`` share.

Each side (``ours``, the peer's) runs in its own process, driven over stdin by the orchestrator
(``compare``): both processes are set up first, then they take turns epoch by epoch (ABBA order), so that load
from other work on a shared machine weighs on both; one runs at a time. A script supplies what differs: its
options (``parser`` gives the common ones) and ``setup``, which builds one side's loaders, model and loop
(a ``Loop``). The loop itself is the same on both sides: ``prepare`` (what the loop does with a loader's item
before the model; timed as waiting on the loader), ``forward``, cross entropy, backward, Adam step.

Epoch times are medians over the epochs (the first included unless ``--skip-first``). ``--max-batches N``
times the first N batches of each epoch. Test accuracy: after training, each side's own loader over the first
``--eval-nodes`` test vertices (same fanouts, in order).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "bench" / "out" / "synthetic-n1000000-d20-f100-c16-p0.6-h0.7-x0.5-s0"
PEERS = ROOT / ".venv-peers" / "bin" / "python"


def parser(description: str, peer: str, loops: tuple[str, ...], loops_help: str,
           ours_python: str = sys.executable) -> argparse.ArgumentParser:
    """The options both scripts take; ``peer`` names the other side (``pyg``, ``dgl``)."""
    p = argparse.ArgumentParser(description=description)
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
    p.add_argument("--loops", default="example", help=loops_help)
    p.add_argument("--eval-nodes", type=int, default=8192, help="test vertices scored after training (0: none)")
    p.add_argument("--skip-first", action="store_true", help="leave the first epoch out of the medians")
    p.add_argument("--sides", default=f"ours,{peer}", help="which loaders to run, in order")
    p.add_argument("--peers-python", default=str(PEERS))
    p.add_argument("--ours-python", default=ours_python)
    p.add_argument("--json", help="write both sides' records here")
    p.add_argument("--worker", choices=("ours", peer), help=argparse.SUPPRESS)
    p.add_argument("--loop", choices=loops, default="example", help=argparse.SUPPRESS)
    return p


# ------------------------------------------------------------------------------------------- one side

@dataclass
class Loop:
    """One side's loaders and loop. ``prepare(item) -> (inputs, y)``: what the loop takes from a loader's item
    (timed with the loader); ``forward(model, inputs)``: the seeds' outputs; ``touch(inputs, y)``: every tensor
    read once (the loaders-alone loop); ``model()``: the model, built after the seed is set."""

    train: object
    test: object | None
    model: Callable
    prepare: Callable
    forward: Callable
    touch: Callable
    sampler: str


def serve(side: str, args, setup: Callable) -> None:
    """One side, driven over stdin by the orchestrator: a JSON line when ready, then one per command
    (``epoch``: train one epoch; ``eval``: test accuracy; ``quit``). ``setup(side, graph, args, fanouts)``
    gives the side's ``Loop``."""
    import torch
    import torch.nn.functional as F

    from neutronorch.data import load_dataset

    torch.set_num_threads(args.threads)
    fanouts = [int(f) for f in args.fanouts.split(",")]
    t0 = time.perf_counter()
    graph = load_dataset(args.dataset)
    loop = setup(side, graph, args, fanouts)
    setup_seconds = time.perf_counter() - t0
    torch.manual_seed(args.seed)
    model = loop.model()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train_model = args.loop != "loader"

    def epoch(number: int) -> dict:
        model.train()
        waited = stepped = loss_sum = 0.0
        count = 0
        start = time.perf_counter()
        it = iter(loop.train)
        while True:
            t = time.perf_counter()
            item = next(it, None)
            if item is None:
                break
            inputs, y = loop.prepare(item)
            t1 = time.perf_counter()
            if train_model:
                optimizer.zero_grad()
                loss = F.cross_entropy(loop.forward(model, inputs), y)
                loss.backward()
                optimizer.step()
                loss_sum += loss.item()
            else:
                loss_sum += loop.touch(inputs, y) * 0
            t2 = time.perf_counter()
            waited, stepped, count = waited + (t1 - t), stepped + (t2 - t1), count + 1
            if count == (args.loader_batches if args.loop == "loader" else args.max_batches):
                break
        del it  # ours: closes the epoch's producer thread (the peer's: drops its iterator)
        seconds = time.perf_counter() - start
        print(f"[{side} {args.loop}] epoch {number}: {seconds:.2f} s, {count} batches (waiting on the loader "
              f"{waited:.2f} s, steps {stepped:.2f} s), loss {loss_sum / max(1, count):.4f}", file=sys.stderr,
              flush=True)
        return {"epoch": number, "seconds": seconds, "batches": count, "loader_wait": waited, "step": stepped,
                "loss": loss_sum / max(1, count), "load_average": os.getloadavg()[0]}

    @torch.no_grad()
    def evaluate() -> dict:
        if loop.test is None or not train_model:
            return {"test_accuracy": None}
        model.eval()
        correct = total = 0
        for item in loop.test:
            inputs, y = loop.prepare(item)
            correct += int((loop.forward(model, inputs).argmax(-1) == y).sum())
            total += int(y.shape[0])
        return {"test_accuracy": correct / max(1, total), "test_nodes": total}

    weights = float(sum(p.detach().double().abs().sum() for p in model.parameters()))
    print(json.dumps({"side": side, "loop": args.loop, "sampler": loop.sampler, "setup_seconds": setup_seconds,
                      "num_batches_per_epoch": len(loop.train), "initial_weights_abs_sum": weights,
                      "torch": torch.__version__, "python": sys.executable, "threads": args.threads}), flush=True)
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
    """A worker process of one side (``script --worker SIDE --loop LOOP``), one JSON line per command."""

    def __init__(self, script: str, side: str, args, forwarded: list[str], loop: str):
        python = args.ours_python if side == "ours" else args.peers_python
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
                   PYTHONPATH=str(ROOT / "src"))
        self.process = subprocess.Popen([python, script, *forwarded, "--worker", side, "--loop", loop],
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

def median_seconds(record: dict, skip_first: bool) -> float:
    epochs = record["epochs"][1:] if skip_first and len(record["epochs"]) > 1 else record["epochs"]
    return statistics.median(e["seconds"] for e in epochs)


def compare(script: str, args, argv, peer: str, label: str, settings: str) -> dict | None:
    """Every loop of ``--loops`` on every side of ``--sides``, the sides taking turns epoch by epoch; prints
    each side's epochs and the ratio ours / ``label``, writes ``--json``; the records (None: a worker failed).
    ``settings``: the peer's loader settings, for the header."""
    if args.dataset == str(DEFAULT):
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from common import ensure_graph

        ensure_graph(1_000_000, 20, 100, 16)
    forwarded = list(argv if argv is not None else sys.argv[1:])
    what = (f"the first {args.max_batches} batches of each epoch" if args.max_batches else "whole epochs") + \
        (f"; loop loader: {args.loader_batches or 'all'}" if "loader" in args.loops else "")
    print(f"dataset {args.dataset}; fanouts {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, "
          f"{args.epochs} epochs ({what}), torch threads {args.threads}, {settings}; "
          f"load average before {os.getloadavg()[0]:.1f}", flush=True)
    records = {}
    sides = args.sides.split(",")
    for loop in args.loops.split(","):
        workers = {}
        try:
            for side in sides:  # both processes set up before either is timed; one runs at a time
                workers[side] = Side(script, side, args, forwarded, loop)
            for epoch in range(args.epochs):
                # ABBA: the sides take turns going first, so drifting load from other work weighs on both
                for side in (sides if epoch % 2 == 0 else sides[::-1]):
                    workers[side].record["epochs"].append(workers[side].ask("epoch"))
            for side in sides:
                workers[side].record.update(workers[side].ask("eval"))
        except RuntimeError as exc:
            print(f"[{Path(script).stem}] loop {loop}: {exc}", file=sys.stderr)
            return None
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
        if f"{loop}/ours" in records and f"{loop}/{peer}" in records:
            ratio = (median_seconds(records[f"{loop}/ours"], args.skip_first)
                     / median_seconds(records[f"{loop}/{peer}"], args.skip_first))
            print(f"  {loop:>7} ratio ours / {label} (median epoch): {ratio:.3f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "records": records}, indent=1))
    return records
