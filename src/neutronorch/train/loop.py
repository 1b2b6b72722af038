"""One epoch of training: batches from the mode, ``train_step`` on each, and the epoch's record. Per-batch
work here must not synchronise with the device: losses are summed on the device and read once per epoch
(step losses for the metric logs once per ``log_every`` steps).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from neutronorch.config import TrainConfig
from neutronorch.errors import ConfigError, Interrupted, TrainingError
from neutronorch.observe import Spans, Utilisation, reuse_line
from neutronorch.train.resources import peak_rss_mb
from neutronorch.train.step import step_masks, train_step

# progress(epoch, steps done, steps in the epoch): called after every step. The object given as progress
# may also have these methods, each called when present:
#   loss(epoch, mean): the epoch's running mean training loss, whenever the loop reads the loss anyway
#     (before the progress call of every step on the CPU, of every DIVERGENCE_CHECK_STEPS-th on CUDA);
#   evaluating(epoch, layer, done, total): the evaluation after the epoch, after every chunk of its
#     inference (layer 1.. of layer-wise inference, rows done and rows of that layer; layer 0: sampled).
Progress = Callable[[int, int, int], None]
# On CUDA the loss is checked for divergence every this many steps (reading it waits for the device);
# on the CPU after every step.
DIVERGENCE_CHECK_STEPS = 16


def check_call(config, progress, stop):
    """``train``'s own arguments, checked before any work: a ``TrainConfig`` (returned), a ``progress`` that
    can be called and a ``stop`` that says whether it is set (a ``threading.Event``)."""
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"`config`: expected a neutronorch TrainConfig, not a {type(config).__name__} "
                          f"(TrainConfig(**options) takes a dict of options).")
    if progress is not None and not callable(progress):
        raise ConfigError(f"`progress`: expected a function progress(epoch, done, total), not a "
                          f"{type(progress).__name__}.")
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise ConfigError(f"`stop`: expected a threading.Event (set it to stop the run), not a "
                          f"{type(stop).__name__}.")
    return config


class TimelineWindow:
    """Keeps the raw spans of ``steps`` training steps from the start of one epoch (the first after the mode's
    ``warm_epochs``, if there is one: those include JIT compilation and cold caches), and takes a utilisation
    sample where the window starts and ends, so that a window shorter than the sampling interval is covered too."""

    def __init__(self, enabled: bool, epochs: int, steps: int, warm_epochs: int = 1):
        self.enabled = enabled
        self.epoch = max(0, min(warm_epochs, epochs - 1))
        self.steps = steps
        self.active = False

    def begin_epoch(self, epoch: int, spans: Spans, util: Utilisation) -> None:
        if self.enabled and epoch == self.epoch:
            util.sample()
            spans.keep = self.active = True
            spans.opened = time.perf_counter()  # the producers' waits through the evaluation before are not drawn

    def end_epoch(self, spans: Spans, util: Utilisation) -> None:
        if self.active:
            spans.keep = self.active = False
            util.sample()


def _diverged(epoch: int, steps: int) -> TrainingError:
    return TrainingError(f"the training loss became NaN or infinite in epoch {epoch} (within its first {steps} "
                         f"steps): the run diverged. Lower `lr`, or check the features for extreme values.")


class Tally:
    """What an epoch's record adds up over its steps: training and CPU seconds, seconds per stage and the
    spans' counters, the rows, edges and bytes its batches moved and the host store's rows. A run stopped
    mid-epoch keeps the tally of the steps it ran in its checkpoint (``as_dict``: the position's ``counts``),
    and its resumption starts from it, so that the resumed epoch's record is the whole epoch's."""

    MOVED = ("sampled_edges", "feature_rows", "feature_bytes", "cache_hits", "device_bytes")  # Batch.counts()

    def __init__(self, carried: dict | None = None):
        carried = carried or {}
        self.seconds, self.cpu_seconds = float(carried.get("seconds", 0.0)), float(carried.get("cpu_seconds", 0.0))
        self.stage_seconds = dict(carried.get("stage_seconds", {}))
        self.counts = dict(carried.get("counts", {}))  # the spans' counters
        self.moved = [int(carried.get("moved", {}).get(name, 0)) for name in self.MOVED]
        self.host = [int(n) for n in carried.get("host", (0, 0))]  # host store's rows, of them its cache's hits
        self._clock = (time.perf_counter(), time.process_time())

    def batch(self, counts) -> None:
        self.moved = [total + n for total, n in zip(self.moved, counts)]

    def fold(self, spans: Spans, store) -> "Tally":
        """Add the time since the last fold, the spans' totals and the store's counts (both taken)."""
        now = (time.perf_counter(), time.process_time())
        self.seconds += now[0] - self._clock[0]
        self.cpu_seconds += now[1] - self._clock[1]
        self._clock = now
        totals, counts = spans.take()
        for into, taken in ((self.stage_seconds, totals), (self.counts, counts)):
            for name, value in taken.items():
                into[name] = into.get(name, 0) + value
        if store is not None:
            self.host = [total + n for total, n in zip(self.host, store.take_counts())]
        return self

    def as_dict(self) -> dict:
        return {"seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "stage_seconds": dict(self.stage_seconds),
                "counts": dict(self.counts), "moved": dict(zip(self.MOVED, self.moved)), "host": list(self.host)}


def train_epoch(run, epoch: int, window: TimelineWindow) -> dict:
    """Train one epoch of ``run`` (a ``run.Run``: its model, optimizers, mode, task's loss, precision and,
    data parallel, reduction) from ``run.start_step`` on when it is the run's first, else from its start;
    return its record (without evaluation). The record covers the whole epoch, a resumed one's included (its
    steps before ``run.start_step`` from the tally its checkpoint carried, ``run.carried``; one written
    before checkpoints carried it: counters from the resumption on, said by ``counted_from_step``), as does
    ``run.progress.loss(epoch, running mean)``. ``last.pt`` is saved mid-epoch every ``checkpoint_every``
    steps, and when ``run.stop`` is set (then ``Interrupted``), after the steps' losses are logged."""
    model, mode, spans, util, metrics = run.model, run.mode, run.spans, run.util, run.metrics
    seed, every, stop, progress = run.config.seed, run.config.checkpoint_every, run.stop, run.progress
    loss_progress = getattr(progress, "loss", None)
    resumed = epoch == run.start_epoch and run.start_step > 0  # resumed mid-epoch (or at a typed run's last step)
    start_step, loss_sum = (run.start_step, run.loss_sum) if epoch == run.start_epoch else (0, 0.0)
    counted_from = start_step if resumed and run.carried is None else 0
    saving = run.config.checkpoint_dir and mode.resumable_mid_epoch
    # A stop after the epoch's last step saves and raises too, before the epoch's record (a typed run's);
    # else the epoch's end has its own checkpoint and stop check.
    stop_at_last_step = run.typed is not None
    # A typed model's dropout masks are keyed by the global batch (step.py).
    masks = (lambda batch: step_masks(seed, batch.epoch, batch.index)) if run.typed is not None else None
    # Data parallel: the step's reduction, each rank weighted by its loss terms.
    sync = run.sync and (lambda batch, loss: run.sync(run.task.loss_weight(batch.labels), loss))
    model.train()
    spans.take()  # drop what the producers recorded between epochs (evaluation time)
    util.take()
    device = next(model.parameters()).device
    total_loss = torch.full((), loss_sum, dtype=torch.float32, device=device)
    check_every = DIVERGENCE_CHECK_STEPS if device.type == "cuda" else 1
    num_batches = start_step
    if mode.store is not None:
        mode.store.take_counts()  # rows gathered outside training (evaluation) are not this epoch's
    tally = Tally(run.carried if resumed else None)
    window.begin_epoch(epoch, spans, util)
    with mode.batches(epoch, start_step) as batches:
        batches = iter(batches)
        while True:
            with spans.stage("wait", num_batches):
                batch = next(batches, None)
            if batch is None:
                break
            batch_counts = batch.counts()  # before the step releases the batch's buffer
            loss = train_step(model, run.optimizer, mode, batch, spans, num_batches, run.task.loss,
                              run.precision, sync, masks)
            total_loss += loss  # NaN and infinities survive the sum: it is finite iff every loss was
            if (num_batches + 1) % check_every == 0:
                mean = float(total_loss) / (num_batches + 1)  # the steps before start_step included
                if not math.isfinite(mean):
                    raise _diverged(epoch, num_batches + 1)
                if loss_progress is not None:
                    loss_progress(epoch, mean)
            if metrics.per_step:
                metrics.step(epoch, num_batches, loss)
            num_batches += 1
            tally.batch(batch_counts)
            if num_batches >= window.steps:
                window.end_epoch(spans, util)
            if run.first_step_at is None:  # the summary's time to the first step
                run.first_step_at = time.perf_counter()
            if progress is not None:
                progress(epoch, num_batches, mode.num_batches)
            stopping = stop is not None and stop.is_set()
            if num_batches < mode.num_batches or (stopping and stop_at_last_step):
                if saving and (stopping or (every and num_batches % every == 0)):
                    run.checkpoint("last.pt", epoch, (num_batches, float(total_loss),
                                                      tally.fold(spans, mode.store).as_dict()))
                if stopping:
                    raise Interrupted(f"stopped on request in epoch {epoch} after step {num_batches} of "
                                      f"{mode.num_batches}")
    metrics.write_pending()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if not bool(torch.isfinite(total_loss)):
        raise _diverged(epoch, num_batches)
    tally.fold(spans, mode.store)
    window.end_epoch(spans, util)
    seconds, stage_seconds, counts, (host_rows, host_hits) = (tally.seconds, tally.stage_seconds, tally.counts,
                                                              tally.host)
    sampled_edges, input_nodes, feature_bytes, cache_hits, device_bytes = tally.moved
    return {
        "epoch": epoch,
        # A resumed epoch's: where it resumed (its times and counts still cover the whole epoch; its utilisation
        # and peak memory the resumed part).
        **({"resumed_at_step": start_step} if resumed else {}),
        **({"counted_from_step": counted_from} if counted_from else {}),
        "seconds": seconds,
        "cpu_seconds": round(tally.cpu_seconds, 4),  # every thread of the process: work, barely swung by others
        "train_loss": float(total_loss) / max(1, num_batches),
        "stage_seconds": {k: round(v, 4) for k, v in sorted(stage_seconds.items(),
                                                           key=lambda kv: run.stages.display_order(kv[0]))},
        "lane_busy": run.stages.lane_busy(stage_seconds, seconds),
        "utilisation": util.take(),
        # Rows and bytes of the batches trained this epoch; hot tables copied by the host producer count
        # when their copy starts.
        "moved": {"feature_rows": input_nodes, "feature_bytes": feature_bytes,
                  "device_bytes": device_bytes + counts.get("device_bytes", 0), "cache_hits": cache_hits,
                  # Rows the host store gathered (those the device cache missed, and the host producer's),
                  # and of them those its host cache served.
                  "host_rows": host_rows, "host_cache_hits": host_hits},
        "batches": num_batches,
        "sampled_edges": sampled_edges,
        "input_nodes_per_batch": input_nodes / max(1, num_batches - counted_from),
        "peak_rss_mb": round(peak_rss_mb(), 1),  # high-water mark so far, before this epoch's evaluation
    }


def epoch_line(record: dict, stages: bool = True, metric: str = "accuracy") -> str:
    """The epoch's log line: loss, scores, training time and, when they ran, the evaluation's and the
    checkpoints' times (the epoch's wall time is their sum); a partitioned run's bytes sent by its ranks (the
    least and the most); a collapse when one was found (``train/health.py``); with ``stages``, seconds per
    stage."""
    parts = [f"epoch {record['epoch']:3d}", f"loss {record['train_loss']:.4f}"]
    if "val_acc" in record:
        parts += [f"val {metric} {record['val_acc']:.4f}", f"test {record['test_acc']:.4f}"]
    times = (("time", "seconds"), ("eval", "eval_seconds"), ("checkpoint", "checkpoint_seconds"))
    parts.append(" + ".join(f"{name} {record[key]:.2f}s" for name, key in times if key in record))
    if record.get("exchange"):  # every rank's, in rank 0's record (train/part_exchange.py)
        sent = [rank["sent_bytes"] for rank in record["exchange"]]
        unit, scale = ("MB", 1e6) if max(sent) >= 1e5 else ("kB", 1e3)
        parts.append(f"sent {min(sent) / scale:,.1f}-{max(sent) / scale:,.1f} {unit} a rank")
    if record.get("collapsed"):  # train/health.py
        parts.append("collapsed: " + "; ".join(record["collapsed"]))
    if stages:
        parts.append("[" + " ".join(f"{k} {v:.2f}" for k, v in record["stage_seconds"].items() if v) + "]")
        if reuse := reuse_line(record):
            parts.append(f"reuse {reuse}")
    return " | ".join(parts)
