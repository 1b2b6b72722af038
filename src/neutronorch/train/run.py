"""A run, of either kind of graph: ``Run`` (its parts, evaluation, checkpoints, resume; what a resumed run may
not change: ``check_resumable``), ``run_epochs`` and ``summarised`` (the summary, written whether the run
ends, fails or is stopped). ``trainer.build_run`` builds it from what the graph's kind builds (``Built``).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from neutronorch.config import TrainConfig
from neutronorch.data import Graph, TypedGraph
from neutronorch.errors import CheckpointError, Interrupted, OutputError, TrainingError
from neutronorch.nn.precision import Precision
from neutronorch.observe import Spans, StageTable, Utilisation, epoch_table
from neutronorch.orchestration.factory import Threads
from neutronorch.orchestration.mode import Mode
from neutronorch.train.checkpoint import dataset_fingerprint, save_checkpoint
from neutronorch.train.evaluate import evaluate
from neutronorch.train.loop import Progress, TimelineWindow, epoch_line, train_epoch
from neutronorch.train.distributed import GradientSync, World
from neutronorch.train.health import Health
from neutronorch.train.link_task import LinkTask, evaluate_links
from neutronorch.data.time_split import Appearance
from neutronorch.data.times import has_vertex_times
from neutronorch.train.temporal_links import evaluate_timed_links
from neutronorch.train.temporal_nodes import evaluate_timed_nodes, timed_nodes
from neutronorch.train.optim import Adam
from neutronorch.train.outputs import rank_file, save_or_rescue, write_summary
from neutronorch.train.resources import freed_blocks_returned
from neutronorch.train.replacing import Replacement
from neutronorch.train.summary import (MetricLog, named_scores, summarise, topology_in_file_order,
                                       write_run_curves, write_run_timeline)
from neutronorch.train.task import Task

logger = logging.getLogger("neutronorch")


@dataclass
class Built:
    """What a kind of graph builds for its run (``build_run``): the graph as trained (a typed one with its
    reverse relations, a link task's split), its model and optimizers, and the weights the ranks reduce
    (``dense``; ``tables``: the sparse embedding tables)."""

    graph: Graph | TypedGraph
    model: torch.nn.Module
    optimizer: Adam | list
    warnings: list[str]
    dense: list
    tables: list = field(default_factory=list)
    typed: object = None  # ``heterogeneous.TypedParts``


@dataclass
class Run:
    """One run; its resources are released by the ``ExitStack`` it was built in."""

    config: TrainConfig
    graph: Graph | TypedGraph
    device: torch.device
    threads: Threads
    model: torch.nn.Module
    optimizer: Adam | list  # a typed model's: Adam for its dense weights and its tables' (``typed``)
    mode: Mode
    spans: Spans
    stages: StageTable
    util: Utilisation
    metrics: MetricLog
    task: Task | LinkTask
    mode_choice: dict | None = None  # mode auto: the mode chosen, why, and from what (None: the mode was given)
    typed: object = None  # a typed graph's run: ``heterogeneous.TypedParts``
    history: list = field(default_factory=list)  # the epoch records so far (a resumed run's included)
    # The best evaluation so far: the metric on the validation and test sets, and its epoch.
    best: dict = field(default_factory=lambda: {"val": -float("inf"), "test": float("nan"), "epoch": -1})
    last_eval: dict = field(default_factory=dict)  # the last evaluation ({} before the first)
    start_epoch: int = 0  # where training starts: > 0, or a mid-epoch start_step, when resumed
    start_step: int = 0
    loss_sum: float = 0.0  # the resumed epoch's loss sum over its first start_step steps
    carried: dict | None = None  # and its tally of them (loop.Tally; None: a checkpoint written before it had one)
    stop: threading.Event | None = None  # set: finish the step, save, stop (Interrupted)
    progress: Progress | None = None
    stopped_early: bool = False  # --patience ran out
    # Time to the first step (perf_counter): train()'s entry, the first step's end; data loading's part.
    started: float = 0.0
    first_step_at: float | None = None
    data_seconds: float = 0.0
    precision: Precision = field(default_factory=Precision)
    world: World = field(default_factory=World)  # data parallel: this rank among the others
    sync: GradientSync | None = None  # data parallel: the gradient all-reduce and stop agreement
    health: Health = field(default_factory=lambda: Health({}))  # collapse (train/health.py)
    replacing: Replacement = field(default_factory=Replacement)  # the earlier outputs `overwrite` replaces
    fingerprint: dict | None = None  # the graph's, which checkpoints hold (with checkpoint_dir)
    timed_graph: Graph | None = None  # a node task by vertex times: the graph as sampled (evaluation's)
    appearance: Appearance | None = None  # a temporal link task's: when each vertex exists (its negatives')
    partitioned: object = None  # a run on a partition folder: its evaluation across the parts (``part_eval.py``)
    partition: dict | None = None  # and the partition's id, this rank's part and the parts, which checkpoints hold

    def evaluate(self, epoch: int, progress=None) -> dict[str, float]:
        """The metric on the validation and test sets: {"val": ..., "test": ...}; ``progress(layer, done,
        total)`` as inference goes; checked (``train/health.py``) as the evaluation after ``epoch``."""
        config, check, typed = self.config, self.health.evaluation(epoch), self.typed
        if self.partitioned is not None:  # rank r holds part r: full-neighbour inference across the parts
            with freed_blocks_returned():  # its chunks' blocks, of many sizes, would stay in the heap
                return self.partitioned.evaluate(self, check, progress)
        # Evaluation runs in float32 whatever the training precision; a typed graph's rows are read by type.
        store = None if typed is not None else self.mode.store.as_dtype(torch.float32)
        fanouts = None if typed is None else typed.eval_sampler.fanouts  # a typed graph's, per relation
        link = isinstance(self.task, LinkTask)
        if not link and has_vertex_times(self.graph):  # every vertex as of its own time (one process)
            if self.timed_graph is None:  # the graph as the mode samples it (by vertex times: a copy), made once
                self.timed_graph = timed_nodes(config, self.graph).timed_graph(self.graph)
            return evaluate_timed_nodes(self.model, self.graph, self.timed_graph, store, self.device, config,
                                        self.task, check, progress, fanouts)
        if link and self.graph.links.timed:  # sampled as of each link's time (one process)
            return evaluate_timed_links(self.model, self.graph, store, self.device, config, self.task.metric, check,
                                        progress, self.appearance, fanouts)
        if typed is not None:
            return typed.evaluate(self, check, progress)
        if self.world.distributed:  # batch normalisation's running statistics: rank 0's, on every rank
            self.world.broadcast_module(self.model, "the buffers' broadcast before evaluation", buffers_only=True)
        if link:
            return evaluate_links(self.model, self.graph, store, self.device, config.eval_batch_size, config.seed,
                                  config.eval_negatives, self.task, self.world, progress, check)
        return evaluate(self.model, self.graph, store, self.device, config.eval_fanouts, config.eval_batch_size,
                        config.seed, config.eval_max_nodes, self.task, self.world, topology_in_file_order(self.mode),
                        progress, check)

    def checkpoint(self, name: str, epoch: int, position: tuple[int, float, dict] | None = None) -> None:
        """Save the run; ``position`` (steps done, their loss sum, their tally: ``loop.Tally.as_dict``) when
        mid-epoch, else the epoch is complete. The metric logs are flushed first: every step before the
        checkpoint's position is in them before the checkpoint is written."""
        step, loss_sum, counts = position if position is not None else (self.mode.num_batches, 0.0, None)
        self.metrics.flush()
        mode_state = self.mode.state_dict()
        if self.partition is not None:  # every rank its own last.pt (part_checkpoint.py); best.pt rank 0 alone,
            # but where each rank holds its part's rows of the tables (named by ``table_rows``)
            if not self.world.main and name != "last.pt" and "table_rows" not in self.partition:
                return
            name = rank_file(self.world.rank, name)
        elif self.world.distributed:  # every rank's (NeutronOrch's hot sets differ); rank 0 writes them all
            states = self.world.gather_objects(mode_state, f"gathering the mode state for {name}")
            if not self.world.main:
                return
            mode_state = {"ranks": states}
        typed = self.typed
        save = lambda path: save_checkpoint(  # noqa: E731
            path, config=self.config, graph=self.graph, model=self.model,
            optimizer=self.optimizer if typed is None else typed.adam, epoch=epoch, history=self.history,
            best=self.best, position={"step": step, "loss_sum": loss_sum, **({"counts": counts} if counts else {})},
            mode_state=mode_state,
            world_size=self.world.size, mode_choice=self.mode_choice, fingerprint=self.fingerprint,
            partition=self.partition,
            typed=typed and (typed.sparse, typed.sampler.fanouts, typed.tables,
                             epoch * self.mode.num_batches + step))
        summary = self.config.summary_json  # a full disk: rescued beside the summary (``save_or_rescue``)
        rescue = [Path(summary).parent] if summary else []
        save_or_rescue(Path(self.config.checkpoint_dir) / name, save, rescue)
        if self.stop is None or not self.stop.is_set():  # a regular checkpoint, not a stop's (replacing.py)
            self.replacing.replace()  # replaces the earlier outputs `overwrite` set aside

    def resume(self, path: Path, state: dict) -> None:
        """Continue from ``state``, read from ``path`` (``checkpoint_dir``/last.pt), once its run is one this
        run may continue. An epoch is complete once its record is in the history: a typed run stopped after an
        epoch's last step, before its evaluation, resumes at that step, with no batch left."""
        typed = self.typed
        check_resumable(state, self.config, self.graph, str(path), self.world.size, self.fingerprint)
        if not self.mode.resumable:
            raise CheckpointError(f"{self.mode.name} mode cannot resume from a checkpoint.")
        saved_model, model = state["model_args"].get("custom"), getattr(self.model, "arguments", {}).get("custom")
        if saved_model != model:
            describe = lambda name: f"your own model {name}" if name else "a built-in model"  # noqa: E731
            raise CheckpointError(f"{path}: the run it continues trained {describe(saved_model)}; this one trains "
                                  f"{describe(model)}. Resume with the same model, or start a new run in another "
                                  f"`checkpoint_dir`.")
        if typed is not None:
            typed.check_resumable(state, self.model, str(path))
        try:  # the structure was checked; what is inside may still be damaged or foreign
            self.model.load_state_dict(state["model"])
            torch.set_rng_state(state["rng"]["torch"])
            if self.device.type == "cuda" and state["rng"]["cuda"] is not None:
                torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
            (self.optimizer if typed is None else typed.adam).load_state_dict(state["optimizer"])
            if typed is not None and typed.sparse is not None:
                typed.sparse.load_state_dict(state["tables_optimizer"]["state"])
            mode_state = state["mode_state"]
            gathered = self.world.distributed and self.partition is None  # a partitioned rank's file is its own
            self.mode.load_state_dict(mode_state["ranks"][self.world.rank] if gathered else mode_state)
            self.history, best = list(state["history"]), dict(state["best"])
            if "val_acc" in best:  # written before the metric was a setting: accuracy under its old keys
                best = {"val": best["val_acc"], "test": best["test_acc"], "epoch": best["epoch"]}
            self.best, epoch, position = best, int(state["epoch"]), state["position"]
            step, loss_sum, carried = position["step"], position["loss_sum"], position.get("counts")
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
            raise CheckpointError(
                f"{path}: its saved state cannot be restored ({type(exc).__name__}: {exc}); the file is "
                "damaged or was not written by this run's neutronorch. Train anew with `overwrite` (which "
                "replaces it) or into another `checkpoint_dir`.") from exc
        done = any(record["epoch"] == epoch for record in self.history)
        self.start_epoch, self.start_step, self.loss_sum, self.carried = (epoch + 1, 0, 0.0, None) if done else (
            epoch, step, loss_sum, carried)
        self.metrics.continue_at(self.start_epoch, self.start_epoch * self.mode.num_batches + self.start_step)
        logger.info(f"resumed from {path} at epoch {self.start_epoch}, step {self.start_step}")


def run_epochs(run: Run) -> dict | None:
    """Train every epoch of ``run``, evaluating as configured, into ``run.history``,
    ``run.best`` and ``run.last_eval``; returns the timeline written (or None)."""
    config, mode, epochs = run.config, run.mode, run.history
    run.last_eval = next((scores for scores in map(scores_of, reversed(epochs)) if scores), {})
    window = TimelineWindow(bool(config.timeline), config.epochs, config.timeline_steps, mode.warm_epochs)
    if run.stop is not None and run.stop.is_set():  # asked while the data loaded: no step to finish first
        raise Interrupted("stopped on request before the first step")
    mode.start(run.model)
    for epoch in range(run.start_epoch, config.epochs):
        record = train_epoch(run, epoch, window)
        mode.end_epoch(record)
        if config.eval_every > 0 and ((epoch + 1) % config.eval_every == 0 or epoch == config.epochs - 1):
            t0 = time.perf_counter()
            evaluating = getattr(run.progress, "evaluating", None)  # (epoch, layer, done, total), loop.py
            run.last_eval = run.evaluate(epoch, evaluating and functools.partial(evaluating, epoch))
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
        since_best = sum(1 for e in epochs if scores_of(e) and e["epoch"] > run.best["epoch"])
        if config.patience and scores_of(record) and since_best >= config.patience:
            run.stopped_early = True
            logger.info(f"stopping early: no better validation {run.task.metric} in {config.patience} evaluations "
                        f"(best {run.best['val']:.4f} at epoch {run.best['epoch']})")
            break
    timeline = write_run_timeline(run, f"{mode.name} mode, {config.model}{' (typed)' * bool(run.typed)}, "
                                       f"epoch {window.epoch}, first {min(config.timeline_steps, mode.num_batches)} steps")
    if config.epochs and not run.last_eval and config.eval_every >= 0:  # eval_every 0: after the last epoch
        t0 = time.perf_counter()
        run.last_eval = run.evaluate(config.epochs - 1)
        run.best = {**run.last_eval, "epoch": config.epochs - 1}
        run.history[-1].update(named_scores(run.task, run.last_eval), eval_seconds=time.perf_counter() - t0)
        run.health.after_epoch(run.history[-1], loss=False)
        if config.checkpoint_dir:
            run.checkpoint("best.pt", config.epochs - 1)
    return timeline


def summarised(run) -> dict:
    """Train ``run``'s epochs (``run_epochs``) and return its summary, written by the rank that writes to
    ``summary_json`` before the earlier outputs `overwrite` set aside are deleted. Nothing is lost when the run
    fails or is stopped: what was trained is summarised (and, stopped on request, saved) before raising."""
    try:
        timeline = run_epochs(run)
    except (Interrupted, TrainingError, OutputError) as exc:
        # Not ENDED: another rank may be gone, so the summary makes no collective.
        summary = summarise(run, "interrupted" if isinstance(exc, Interrupted) else "failed")
        summary["error"] = None if isinstance(exc, Interrupted) else str(exc)
        if run.world.main:
            try:
                write_run_curves(run)
                write_summary(run.config, summary)
            except OutputError as lost:  # the first error is the one to raise; say this one too
                logger.error(str(lost))
        raise
    write_run_curves(run)
    run.metrics.close()  # the logs' last lines: a full disk shows now, and in the summary
    summary = summarise(run, "stopped_early" if run.stopped_early else "completed", timeline)
    if run.world.main:
        write_summary(run.config, summary)
    return summary


def scores_of(record: dict) -> dict:
    """A record's evaluation as {"val": ..., "test": ...}, or {} if it was not evaluated."""
    return {"val": record["val_acc"], "test": record["test_acc"]} if "val_acc" in record else {}


# What each fingerprint key stands for, in the message that says what changed (a typed graph's per type and
# relation: a dict).
FINGERPRINT_NAMES = {"name": "the name", "nodes": "the vertex count", "edges": "the edge count",
                     "feature_dim": "the feature width", "classes": "the class count",
                     "topology_crc": "the topology", "split_crc": "the training split", "features_crc": "the features",
                     "labels_crc": "the labels", "val_crc": "the validation split", "test_crc": "the test split",
                     "num_nodes": "the vertex counts", "feature_dims": "the feature widths",
                     "target": "the target type", "edge_features_crc": "the edge features",
                     "edge_time_crc": "the edge times", "node_time_crc": "the vertex times",
                     "partition": "the partition"}


def fingerprint_changes(saved: dict, now: dict) -> list[str]:
    """What differs between two fingerprints, naming a typed graph's types and relations: ``the vertex counts
    (author 1500 then, 1499 now)``, ``the features of paper``. A key an older checkpoint lacks (its
    neutronorch did not fingerprint that array yet) is no difference, so older checkpoints keep resuming."""
    changes = []
    for key, value in now.items():
        before = saved.get(key, value)
        if before == value:
            continue
        name = FINGERPRINT_NAMES.get(key, key)
        if not (isinstance(value, dict) and isinstance(before, dict)):
            changes.append(name)
            continue
        parts = [part for part in {**before, **value} if before.get(part) != value.get(part)]
        if key.endswith("_crc"):
            changes.append(f"{name} of {', '.join(parts)}")
        else:
            changes.append(f"{name} ({'; '.join(f'{p} {before.get(p)} then, {value.get(p)} now' for p in parts)})")
    return changes


def check_resumable(state: dict, config: TrainConfig, graph: Graph | TypedGraph, source: str, world_size: int = 1,
                    fingerprint: dict | None = None) -> None:
    """A run may continue from ``state`` only on the same data (``fingerprint``: the graph's, when known) with
    the same model and training settings. The settings are compared first: one that shapes the data a run
    trains on (`task` link removes the validation and test edges, `split`) is named, not reported as changed
    data. Only the settings declared ``may_change`` (config.py) may differ."""
    # A setting added after the checkpoint was written had its default then.
    saved, now, defaults = state["config"], config.to_dict(), TrainConfig().to_dict()
    compared = set(now) - TrainConfig.resume_may_change()
    differ = [f"`{k}` {saved.get(k, defaults[k])!r} then, {now[k]!r} now" for k in sorted(compared)
              if saved.get(k, defaults[k]) != now[k]]
    if differ:
        data = (f" It trained on `dataset` {saved['dataset']!r}, and this run reads {now['dataset']!r}: a resumed "
                f"run is given its data and settings again, as they were." if saved.get("dataset") != now["dataset"]
                else "")
        raise CheckpointError(f"{source}: the run it continues had other settings: {'; '.join(differ)}.{data} Resume "
                              f"with the same settings (only outputs, epochs, evaluation, threads, device and precision may "
                              f"change), or start a new run in another `checkpoint_dir`.")
    if state.get("rng") is None:
        raise CheckpointError(f"{source}: holds no random state to resume from.")
    if int(state.get("world_size", 1)) != world_size:
        raise CheckpointError(f"{source}: written by a run of {state.get('world_size', 1)} data-parallel rank(s); "
                              f"resume with the same number (now {world_size}): torchrun --nproc-per-node and "
                              f"--nnodes as before.")
    found = fingerprint or dataset_fingerprint(graph)
    changed = fingerprint_changes(state["dataset"], found)
    if changed:
        what = "typed graph" if isinstance(graph, TypedGraph) else "dataset"
        raise CheckpointError(f"{source}: written for another {what}, or the data changed since: {', '.join(changed)} "
                              f"differ ({state['dataset']['name']} then, {found['name']} now). Resume on the data the "
                              f"run started with, or start a new run in another `checkpoint_dir`.")
