"""A run's epochs, for both kinds of graph: ``run_epochs`` (evaluation every ``eval_every``, the best validation
score, checkpoints after each epoch, ``patience``, the epoch's log line and stage table) and ``summarised`` (the
summary, written whether the run ends, fails or is stopped).

What differs by kind is asked of the run: a homogeneous run is ``trainer.py``'s ``Run``, a typed one
``typed_task.py``'s ``_TypedRun``. Each has ``epochs()`` (``run_epochs`` with its progress),
``train_epoch(epoch, control, window, progress, loss_progress)`` (``train/loop.py``'s, with the run's
optimizers and dropout keys), ``evaluate(epoch, progress)``, ``checkpoint(name, epoch, position)`` and
``summary(status, timeline)``, and the fields the loop reads: ``RunState``'s (history, best, last_eval, the
start position, stop, health, world, ...) and its parts' (config, mode, task, metrics, stages). How a
checkpoint is written and a run resumed from one is ``resume.py``'s, for both kinds.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from neutronorch.errors import Interrupted, OutputError, TrainingError
from neutronorch.nn.precision import Precision
from neutronorch.observe import epoch_table
from neutronorch.train.loop import (EpochControl, Progress, TimelineWindow, epoch_line, evaluation_progress,
                                    noting_first_step)
from neutronorch.train.distributed import GradientSync, World
from neutronorch.train.health import Health
from neutronorch.train.outputs import write_summary
from neutronorch.train.replacing import Replacement
from neutronorch.train.summary import named_scores, write_run_timeline

logger = logging.getLogger("neutronorch")


@dataclass(kw_only=True)
class RunState:
    """What a run of either kind holds for ``run_epochs`` and its summary, besides its parts (model, mode,
    optimizers), which each kind's run adds."""

    history: list = field(default_factory=list)  # the epoch records so far (a resumed run's included)
    # The best evaluation so far: the metric on the validation and test sets, and its epoch.
    best: dict = field(default_factory=lambda: {"val": -float("inf"), "test": float("nan"), "epoch": -1})
    last_eval: dict = field(default_factory=dict)  # the last evaluation ({} before the first)
    start_epoch: int = 0  # where training starts: > 0, or a mid-epoch start_step, when resumed
    start_step: int = 0
    loss_sum: float = 0.0  # the resumed epoch's loss sum over its first start_step steps
    stop: threading.Event | None = None  # set: finish the step, save, stop (Interrupted)
    progress: Progress | None = None
    stopped_early: bool = False  # --patience ran out
    # Time to the first step: train() entry and the end of the run's first optimizer step (perf_counter),
    # and the seconds of those spent loading the dataset.
    started: float = 0.0
    first_step_at: float | None = None
    data_seconds: float = 0.0
    precision: Precision = field(default_factory=Precision)
    world: World = field(default_factory=World)  # data parallel: this rank among the others
    sync: GradientSync | None = None  # data parallel: the gradient all-reduce and stop agreement
    health: Health = field(default_factory=lambda: Health({}))  # collapse (train/health.py)
    replacing: Replacement = field(default_factory=Replacement)  # the earlier outputs `overwrite` replaces
    window: TimelineWindow | None = None  # the steps whose spans the timeline draws (run_epochs)
    stop_at_last_step = False  # a stop after an epoch's last step: the epoch is recorded and saved first
    label = ""  # after the model's name in the timeline's title


def run_epochs(run, progress: Progress | None) -> dict | None:
    """Train every epoch of ``run`` (a ``Run`` or a typed run), evaluating as configured, into ``run.history``,
    ``run.best`` and ``run.last_eval``; returns the timeline written (or None)."""
    config, mode, epochs = run.config, run.mode, run.history
    run.last_eval = next((scores for scores in map(scores_of, reversed(epochs)) if scores), {})
    run.window = window = TimelineWindow(bool(config.timeline), config.epochs, config.timeline_steps)
    if run.stop is not None and run.stop.is_set():  # asked while the data loaded: no step to finish first
        raise Interrupted("stopped on request before the first step")
    mode.start(run.model)
    saving = config.checkpoint_dir and mode.resumable_mid_epoch
    for epoch in range(run.start_epoch, config.epochs):
        resumed = epoch == run.start_epoch
        control = EpochControl(run.start_step if resumed else 0, run.loss_sum if resumed else 0.0, run.stop,
                               config.checkpoint_every,
                               (lambda e, k, loss: run.checkpoint("last.pt", e, (k, float(loss)))) if saving else None,
                               run.stop_at_last_step)
        record = run.train_epoch(epoch, control, window, noting_first_step(run, progress),
                                 getattr(progress, "loss", None))
        mode.end_epoch(record)
        if config.eval_every > 0 and ((epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1):
            t0 = time.perf_counter()
            run.last_eval = run.evaluate(epoch, evaluation_progress(progress, epoch))
            record.update(named_scores(run.task, run.last_eval), eval_seconds=time.perf_counter() - t0)
            if run.last_eval["val"] > run.best["val"] or run.best["epoch"] < 0:
                run.best = {**run.last_eval, "epoch": epoch}
        run.health.after_epoch(record)
        epochs.append(record)
        if config.checkpoint_dir:
            t0 = time.perf_counter()
            run.checkpoint("last.pt", epoch)
            if "val_acc" in record and run.best["epoch"] == epoch:
                run.checkpoint("best.pt", epoch)
            record["checkpoint_seconds"] = round(time.perf_counter() - t0, 4)
        run.metrics.epoch(record)
        logger.info(epoch_line(record, stages=not config.stage_table, metric=run.task.metric))
        if config.stage_table:
            logger.info(epoch_table(record, run.stages))
        if run.stop is not None and run.stop.is_set() and epoch + 1 < config.epochs:
            raise Interrupted(f"stopped on request after epoch {epoch}")
        if config.patience and scores_of(record) and _evaluations_since_best(run) >= config.patience:
            run.stopped_early = True
            logger.info(f"stopping early: no better validation {run.task.metric} in {config.patience} evaluations "
                        f"(best {run.best['val']:.4f} at epoch {run.best['epoch']})")
            break
    timeline = write_run_timeline(run, f"{mode.name} mode, {config.model}{run.label}, epoch {window.epoch}, first "
                                       f"{config.timeline_steps} steps", run.stages)
    if config.epochs and not run.last_eval and config.eval_every >= 0:  # eval_every 0: after the last epoch
        run.last_eval = run.evaluate(config.epochs - 1)
        run.best = {**run.last_eval, "epoch": config.epochs - 1}
        run.history[-1].update(named_scores(run.task, run.last_eval))
        run.health.after_epoch(run.history[-1], loss=False)
        if config.checkpoint_dir:
            run.checkpoint("best.pt", config.epochs - 1)
    return timeline


def summarised(run) -> dict:
    """Train ``run``'s epochs (``run.epochs()``) and return its summary, written by the rank that writes to
    ``summary_json`` before the earlier outputs `overwrite` set aside are deleted. Nothing is lost when the run
    fails or is stopped: what was trained is summarised (and, stopped on request, saved) before raising."""
    try:
        timeline = run.epochs()
    except (Interrupted, TrainingError, OutputError) as exc:
        # Not ENDED: another rank may be gone, so the summary makes no collective.
        summary = run.summary("interrupted" if isinstance(exc, Interrupted) else "failed")
        summary["error"] = None if isinstance(exc, Interrupted) else str(exc)
        if run.world.main:
            try:
                write_summary(run.config, summary)
            except OutputError as lost:  # the first error is the one to raise; say this one too
                logger.error(str(lost))
        raise
    run.metrics.close()  # the logs' last lines: a full disk shows now, and in the summary
    summary = run.summary("stopped_early" if run.stopped_early else "completed", timeline)
    if run.world.main:
        write_summary(run.config, summary)
    return summary


def _evaluations_since_best(run) -> int:
    evaluated = [e["epoch"] for e in run.history if scores_of(e)]
    return sum(1 for epoch in evaluated if epoch > run.best["epoch"])


def scores_of(record: dict) -> dict:
    """A record's evaluation as {"val": ..., "test": ...}, or {} if it was not evaluated."""
    return {"val": record["val_acc"], "test": record["test_acc"]} if "val_acc" in record else {}
