"""The training loop shared by every mode, and the run summary it returns.

A mode produces mini-batches and runs the forward pass; this loop owns the optimizer, the loss, timing,
progress display, evaluation and the summary. Per-batch work here must not synchronise with the device
(losses are summed on the device and read once per epoch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numba
import torch
from torch.nn import functional as F
from tqdm import tqdm

from neutronorch.config import TrainConfig, auto_batch_size
from neutronorch.data import Graph, load_dataset
from neutronorch.errors import ConfigError
from neutronorch.nn.models import GNN
from neutronorch.orchestration.device import DeviceMode
from neutronorch.orchestration.exact import ExactMode
from neutronorch.orchestration.neutronorch import NeutronOrchMode
from neutronorch.train.evaluate import evaluate
from neutronorch.train.memory import keep_freed_memory, peak_rss_mb
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.telemetry import (LANES, Spans, Utilisation, epoch_table, lane_busy, lane_of,
                                         write_timeline)

MODE_CLASSES = {"exact": ExactMode, "device": DeviceMode, "neutronorch": NeutronOrchMode}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is available to this PyTorch "
                          f"(torch {torch.__version__}, cuda build: {torch.version.cuda or 'no'}). "
                          "Use --device cpu, or install a CUDA build of PyTorch on a machine with a GPU.")
    return torch.device(name)


def thread_budget(config: TrainConfig) -> tuple[int, int, int]:
    """(training, sampler, host producer) threads, set once so that the stages do not fight over cores.
    Producers get half the cores each: they do not run all the time, and the trainer waits for neither
    when they keep ahead."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    numba_max = numba.config.NUMBA_NUM_THREADS
    half = max(1, min(cores, numba_max) // 2)
    train_threads = config.threads or cores
    sampler_threads = min(config.sampler_threads or half, numba_max)
    host_threads = min(config.host_threads or half, numba_max)
    return train_threads, sampler_threads, host_threads


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def train(config: TrainConfig, graph: Graph | None = None) -> dict:
    """Train as ``config`` says and return the run summary (also written to ``config.summary_json``)."""
    config = dataclasses.replace(config).validate()  # resolved values (batch size) go into a copy
    device = resolve_device(config.device)
    with _memory_budget(device, config.gpu_memory_gb):
        return _train(config, graph, device)


@contextlib.contextmanager
def _memory_budget(device: torch.device, gigabytes: float | None):
    """Emulate a smaller GPU for the run: the caching allocator refuses what the budget does not hold.
    Lifted afterwards, so later runs in the same process get the whole device again."""
    if device.type != "cuda" or gigabytes is None:
        yield
        return
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, gigabytes * 2**30 / total), device)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def _train(config: TrainConfig, graph: Graph | None, device: torch.device) -> dict:
    keep_freed_memory()
    train_threads, sampler_threads, host_threads = thread_budget(config)
    torch.set_num_threads(train_threads)
    torch.manual_seed(config.seed)
    if graph is None:
        t0 = time.perf_counter()
        graph = load_dataset(config.dataset, config.split, config.seed)
        log(f"loaded {graph.describe()} in {time.perf_counter() - t0:.1f}s")
    for note in graph.notes:
        log(f"note: {note}")
    if config.batch_size == 0:
        config.batch_size = auto_batch_size(len(graph.train_idx))

    model = GNN(config.model, graph.feature_dim, config.hidden, graph.num_classes, len(config.fanouts),
                dropout=config.dropout, heads=config.heads).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    if config.mode == "neutronorch":
        mode = NeutronOrchMode(graph, config, device, sampler_threads, host_threads)
        threads = f"{train_threads} train / {sampler_threads} sampler / {host_threads} host"
        extra = (f", super-batch {config.super_batch}, hot ratio {config.hot_ratio}, staleness bound "
                 f"{config.resolved_staleness}, hot grad {config.hot_grad}")
    else:
        mode = MODE_CLASSES[config.mode](graph, config, device, sampler_threads)
        threads, extra = f"{train_threads} train / {sampler_threads} sampler", ""
    log(f"mode {config.mode}, model {config.model}, fanouts {config.fanouts}, device {device}, "
        f"batch size {config.batch_size}, threads {threads}, {mode.num_batches} batches per epoch{extra}")
    if device.type == "cuda" or mode.cache is not None:
        log(f"placement: {mode.placement.describe()}")
    for note in mode.placement.notes:
        log(f"note: {note}")

    epochs, best = [], {"val_acc": -1.0, "test_acc": float("nan"), "epoch": -1}
    last_eval: dict[str, float] = {}
    timeline_info = None
    window = _TimelineWindow(config)
    metrics = MetricLog(config)
    util = Utilisation(device)
    mode.start(model)
    try:
        for epoch in range(config.epochs):
            record = _train_epoch(model, optimizer, mode, epoch, config, util, metrics, window)
            mode.end_epoch(record)
            if config.eval_every > 0 and ((epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1):
                t0 = time.perf_counter()
                last_eval = evaluate(model, graph, mode.store, device, config.eval_fanouts,
                                     config.eval_batch_size, config.seed, config.eval_max_nodes)
                record.update(last_eval, eval_seconds=time.perf_counter() - t0)
                if last_eval["val_acc"] > best["val_acc"]:
                    best = {**last_eval, "epoch": epoch}
            epochs.append(record)
            metrics.epoch(record)
            log(_epoch_line(record, stages=not config.stage_table))
            if config.stage_table:
                log(epoch_table(record))
        if config.timeline and mode.spans.events:
            timeline_info = write_timeline(
                config.timeline, mode.spans.events, util.samples,
                f"{config.mode} mode, {config.model}, epoch {window.epoch}, first {config.timeline_steps} steps")
            log(f"timeline: {timeline_info['png']} ({timeline_info['spans']} spans; raw spans in "
                f"{timeline_info['json']})")
    finally:
        mode.close()
        util.close()
        metrics.close()
    if config.epochs and not last_eval and config.eval_every >= 0:
        last_eval = evaluate(model, graph, mode.store, device, config.eval_fanouts, config.eval_batch_size,
                             config.seed, config.eval_max_nodes)
        best = {**last_eval, "epoch": config.epochs - 1}

    seconds = [e["seconds"] for e in epochs]
    summary = {
        "mode": config.mode,
        "config": config.to_dict(),
        "dataset": {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
                    "feature_dim": graph.feature_dim, "classes": graph.num_classes,
                    "train": int(len(graph.train_idx))},
        "device": str(device),
        "threads": {"train": train_threads, "sampler": sampler_threads,
                    **({"host": host_threads} if config.mode == "neutronorch" else {})},
        "epochs": epochs,
        "epoch_seconds_median": statistics.median(seconds) if seconds else None,
        "val_acc": best["val_acc"] if last_eval else None,
        "test_acc": best["test_acc"] if last_eval else None,
        "best_epoch": best["epoch"] if last_eval else None,
        "final_val_acc": last_eval.get("val_acc"),
        "final_test_acc": last_eval.get("test_acc"),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "moved": {key: sum(e["moved"][key] for e in epochs) for key in ("feature_rows", "feature_bytes",
                                                                           "device_bytes", "cache_hits")},
        "placement": mode.placement.to_dict(),
        "timeline": timeline_info,
        **mode.summary(),
    }
    if config.summary_json:
        path = Path(config.summary_json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _train_epoch(model: GNN, optimizer: torch.optim.Optimizer, mode, epoch: int, config: TrainConfig,
                 util: Utilisation, metrics: MetricLog, timeline: "_TimelineWindow") -> dict:
    model.train()
    spans = mode.spans
    spans.take()  # drop what the producers recorded between epochs (evaluation time)
    util.take()
    total_loss = torch.zeros((), device=mode.device)
    step_losses = []
    num_batches = sampled_edges = input_nodes = feature_bytes = device_bytes = cache_hits = 0
    start = time.perf_counter()
    bar = tqdm(total=mode.num_batches, desc=f"epoch {epoch}", unit="batch", leave=False,
               disable=None if config.progress else True, file=sys.stderr)
    timeline.begin_epoch(epoch, spans)
    with mode.batches(epoch) as batches:
        batches = iter(batches)
        while True:
            t0 = time.perf_counter()
            batch = next(batches, None)
            t1 = time.perf_counter()
            spans.add("wait", t0, t1, num_batches)
            if batch is None:
                break
            mode.prepare(batch)
            t1 = time.perf_counter()
            logits = mode.forward(model, batch)
            loss = F.cross_entropy(logits, batch.labels)
            t2 = time.perf_counter()
            spans.add("forward", t1, t2, num_batches)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            t3 = time.perf_counter()
            spans.add("backward", t2, t3, num_batches)
            mode.before_step(batch)
            t4 = time.perf_counter()
            optimizer.step()
            spans.add("step", t4, time.perf_counter(), num_batches)
            mode.after_step(batch)
            batch.release()
            total_loss += loss.detach()
            if metrics.per_step:
                step_losses.append(loss.detach())
                if len(step_losses) == metrics.every:
                    metrics.steps(epoch, num_batches + 1 - len(step_losses), step_losses)
                    step_losses = []
            num_batches += 1
            sampled_edges += batch.subgraph.num_sampled_edges
            input_nodes += batch.subgraph.input_nodes.shape[0]
            feature_bytes += batch.features.nbytes
            cache_hits += batch.cache_hits
            device_bytes += batch.device_bytes
            timeline.after_step(spans, num_batches)
            bar.update(1)
    if step_losses:
        metrics.steps(epoch, num_batches - len(step_losses), step_losses)
    if mode.device.type == "cuda":
        torch.cuda.synchronize(mode.device)
    seconds = time.perf_counter() - start
    timeline.end_epoch(spans)
    bar.close()
    stages, counts = spans.take()
    return {
        "epoch": epoch,
        "seconds": seconds,
        "train_loss": float(total_loss) / max(1, num_batches),
        "stage_seconds": {k: round(v, 4) for k, v in sorted(stages.items(), key=_stage_order)},
        "lane_busy": lane_busy(stages, seconds),
        "utilisation": util.take(),
        # Rows and bytes of the batches trained this epoch; hot tables copied by the host producer count
        # when their copy starts.
        "moved": {"feature_rows": input_nodes, "feature_bytes": feature_bytes,
                  "device_bytes": device_bytes + counts.get("device_bytes", 0), "cache_hits": cache_hits},
        "batches": num_batches,
        "sampled_edges": sampled_edges,
        "input_nodes_per_batch": input_nodes / max(1, num_batches),
        "peak_rss_mb": round(peak_rss_mb(), 1),  # high-water mark so far, before this epoch's evaluation
    }


def _stage_order(item):
    stage = item[0]
    return LANES.index(lane_of(stage)), stage


class _TimelineWindow:
    """Keeps the raw spans of ``steps`` training steps from the start of one epoch (the second, if there is
    one: the first includes JIT compilation and cold caches)."""

    def __init__(self, config: TrainConfig):
        self.path = config.timeline
        self.epoch = min(1, config.epochs - 1)
        self.steps = config.timeline_steps
        self.active = False

    def begin_epoch(self, epoch: int, spans: Spans) -> None:
        if self.path and epoch == self.epoch:
            spans.keep = self.active = True

    def after_step(self, spans: Spans, done: int) -> None:
        if self.active and done >= self.steps:
            spans.keep = self.active = False

    def end_epoch(self, spans: Spans) -> None:
        if self.active:
            spans.keep = self.active = False


def _epoch_line(record: dict, stages: bool = True) -> str:
    parts = [f"epoch {record['epoch']:3d}", f"loss {record['train_loss']:.4f}"]
    if "val_acc" in record:
        parts += [f"val {record['val_acc']:.4f}", f"test {record['test_acc']:.4f}"]
    parts.append(f"time {record['seconds']:.2f}s")
    if stages:
        parts.append("[" + " ".join(f"{k} {v:.2f}" for k, v in record["stage_seconds"].items() if v) + "]")
    return " | ".join(parts)
