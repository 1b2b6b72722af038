"""What a run reports: its summary (``summarise``; README lists its keys), its timeline
(``observe/report.py``) and its metric logs (``MetricLog``: JSONL, CSV and TensorBoard,
docs/observability.md). A log or the timeline that cannot be written does not stop the training; the run
ends with an ``OutputError`` naming the file once it is saved and summarised (docs/errors.md).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import statistics
import time
from pathlib import Path

import torch

from neutronorch.atomic import write_atomically, write_error
from neutronorch.config import LogConfig
from neutronorch.data import Graph, TypedGraph, dataset_paths
from neutronorch.data.typed import relation_label
from neutronorch.errors import ConfigError, OutputError
from neutronorch.observe import write_timeline
from neutronorch.observe.report import curves_png
from neutronorch.train.resources import peak_rss_mb, resident_mb

logger = logging.getLogger("neutronorch")
ENDED = ("completed", "stopped_early")  # a summary's statuses when every epoch ran, or patience ran out


def given_dataset(graph, spec: str) -> str:
    """The `dataset` a run records for ``graph``, given to ``train`` in memory (``spec`` as configured; None:
    ``spec``): ``spec`` when the graph's arrays are memory-mapped from the files it names, else
    ``graph:NAME``, so the summary, logs and checkpoints never name a dataset that was not trained."""
    if graph is None:
        return spec
    if not isinstance(graph, (Graph, TypedGraph)):
        raise ConfigError(f"`graph`: expected a neutronorch Graph or TypedGraph (load_dataset, Graph.from_arrays, "
                          f"from_pyg), not a {type(graph).__name__}; a dataset's spec or folder goes in `dataset`.")
    graph.check_given()  # its files are read below: one built by hand is checked first
    files = graph.files()
    roots = [path.expanduser().resolve() for path in dataset_paths(spec)]
    inside = lambda file: any(Path(file).resolve().is_relative_to(root) for root in roots)  # noqa: E731
    return spec if files and all(inside(file) for file in files) else f"graph:{graph.name}"


def moved_totals(epochs: list[dict]) -> dict:
    """The rows and bytes the epochs' records moved (``moved``), summed over the run."""
    return {name: sum(e["moved"].get(name, 0) for e in epochs)
            for name in ("feature_rows", "feature_bytes", "device_bytes", "cache_hits", "host_rows", "host_cache_hits")}


def summarise(run, status: str, timeline: dict | None = None) -> dict:
    """The summary of ``run`` (either kind) as it stands: ``status`` is completed, stopped_early, interrupted
    or failed; an ended run's scores (a stopped or failed one's, none); the keys both kinds have, the kind's
    own (a typed run's: ``TypedParts.summary``) and the mode's (``Mode.summary``). An ended run's summary,
    data parallel, gathers every rank's peak resident memory (a collective: every rank makes it)."""
    config, times, ended, key = run.config, [e["seconds"] for e in run.history], status in ENDED, run.task.key
    last_eval = run.last_eval if ended else {}
    best = run.best if last_eval else {}  # no score is reported when nothing was evaluated
    distributed = run.world.summary(config.batch_size, ended)
    return {
        "status": status,
        "mode": run.mode.name,
        "config": config.to_dict(),
        "device": str(run.device),
        "precision": {"name": run.precision.name, "reason": run.precision.reason},
        "epochs": run.history,
        "epoch_seconds_median": statistics.median(times) if times else None,
        "metric": run.task.metric,
        # The best and the last evaluation's scores, under the metric's key and again under the names they had
        # when accuracy was the only metric.
        f"val_{key}": best.get("val"), f"test_{key}": best.get("test"), "best_epoch": best.get("epoch"),
        f"final_val_{key}": last_eval.get("val"), f"final_test_{key}": last_eval.get("test"),
        "val_acc": best.get("val"), "test_acc": best.get("test"),
        "final_val_acc": last_eval.get("val"), "final_test_acc": last_eval.get("test"),
        "warnings": list(run.health.warnings),  # training that collapsed (train/health.py)
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "timeline": timeline,
        "checkpoints": None if not config.checkpoint_dir else {
            name: str(path) if (path := Path(config.checkpoint_dir) / f"{name}.pt").is_file() else None
            for name in ("last", "best")},
        "distributed": distributed,  # None in one process
        # Seconds from entering train() to the end of the first optimizer step (None: no step), of which
        # data_seconds loading the dataset (0 when the graph was passed in).
        "startup": {"data_seconds": round(run.data_seconds, 4),
                    "first_step_seconds": None if run.first_step_at is None
                    else round(run.first_step_at - run.started, 4)},
        "mode_choice": run.mode_choice,  # mode auto: {"chosen", "reason", "measured"}; None where it was given
        "moved": moved_totals(run.history),  # a resumed history's records may predate the host cache's keys
        "dataset": _dataset(run),
        **(run.typed.summary(run) if run.typed is not None else _homogeneous(run)),
        **({"link": _link_summary(run, last_eval)} if config.task == "link" else {}),
        **run.mode.summary(),
        **({"error": run.metrics.lost} if run.metrics.lost else {}),  # a log or the timeline lost
    }


def _homogeneous(run) -> dict:
    mode, moved = run.mode, moved_totals(run.history)
    return {
        "threads": {"train": run.threads.train, **mode.threads},
        "resident_mb": resident_mb(),  # at the end: own (anon) and mapped-file (file) memory
        "host_cache": None if mode.store.host_cache is None
        else mode.store.host_cache.summary(moved["host_rows"], moved["host_cache_hits"]),
        "placement": dataclasses.asdict(mode.placement),
        # --read-order as resolved: how memory-mapped features and the host samplers' topology were read.
        "read_order": {"features": "file" if mode.store.ordered else "batch",
                       "topology": "file" if topology_in_file_order(mode) else "batch"},
    }


def _dataset(run) -> dict:
    """The graph's sizes (a typed one's per type and relation), and a node task's classes and training
    vertices (a link task's edges are under ``link``)."""
    graph = run.graph
    if run.typed is None:
        entry = {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
                 "feature_dim": graph.feature_dim}
    else:
        entry = {"name": graph.name, "nodes": sum(graph.num_nodes.values()), "edges": graph.num_edges,
                 "node_types": dict(graph.num_nodes),
                 "relations": [relation_label(r) for r in graph.relations],
                 "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes}}
    if run.config.task != "link":
        entry.update({"target": graph.target} if run.typed is not None else {}, classes=graph.num_classes,
                     train=int(len(graph.train_idx)))
    return entry


def _link_summary(run, last_eval: dict) -> dict:
    """A link task's split and every metric it reports, at the best and at the last evaluation (a typed graph's:
    and its relation)."""
    links = run.graph.links
    others = lambda scores: {k: v for k, v in scores.items() if k.startswith(("val_", "test_"))}  # noqa: E731
    relation = {"relation": "/".join(links.ends.relation)} if links.ends is not None else {}
    return {**relation, "edges": {"train": int(links.train.shape[1]), "val": int(links.val.shape[1]),
                                  "test": int(links.test.shape[1])},
            "undirected": links.undirected, "direction": links.direction or None, "issues": links.issues,
            "negatives": links.negative_kind, "head": run.config.link_head,
            "best": others(run.best) if last_eval else None, "final": others(last_eval) if last_eval else None}


def write_run_timeline(run, title: str) -> dict | None:
    """The timeline of ``run``'s window (``timeline``: a .png, the raw spans beside it as .spans.json), written
    atomically by the main rank when spans were recorded; what was written, or None. A failure to write is
    said at once and kept for the run's end (``MetricLog.lose``)."""
    config = run.config
    if not (config.timeline and run.spans.events and run.world.main):
        return None
    try:
        written = write_timeline(config.timeline, run.spans.events, run.util.samples, title, run.stages,
                                 save=lambda path, data: write_atomically(path, lambda f: f.write(data)))
    except (OSError, OutputError) as exc:
        run.metrics.lose(config.timeline, exc)
        return None
    logger.info(f"timeline: {written['png']} ({written['spans']} spans; raw spans in {written['json']})")
    return written


def write_run_curves(run) -> None:
    """The training curves of ``run``'s epochs (``curves``: a .png), written atomically by the main rank; a
    failure to write is said and kept for the run's end (``MetricLog.lose``)."""
    config = run.config
    if not (config.curves and run.history and run.world.main):
        return
    try:
        png = curves_png(run.history, run.task.metric)
        if png is not None:
            write_atomically(config.curves, lambda f: f.write(png))
    except (OSError, OutputError) as exc:
        run.metrics.lose(config.curves, exc)


def topology_in_file_order(mode) -> bool:
    """Whether the mode's host samplers read the topology in file order (``--read-order``, as resolved)."""
    sampling = getattr(mode, "sampling", None)
    return bool(sampling is not None and sampling.file_order)


def named_scores(task, scores: dict) -> dict:
    """An evaluation as an epoch record holds it: under the metric's name, and (for compatibility) as
    ``val_acc`` and ``test_acc``, which hold the metric too; a link task's other metrics as they are."""
    return {f"val_{task.key}": scores["val"], f"test_{task.key}": scores["test"],
            "val_acc": scores["val"], "test_acc": scores["test"],
            **{key: value for key, value in scores.items() if key not in ("val", "test")}}


def _jsonl_record(line: bytes) -> tuple[str, int] | None:
    """A JSON-lines log record's kind and its step (a step's) or epoch (an epoch's); None: another line."""
    try:
        record = json.loads(line)
        return (record["kind"], int(record["step" if record["kind"] == "step" else "epoch"]))
    except (ValueError, KeyError, TypeError):
        return None


def _csv_record(line: bytes) -> tuple[str, int] | None:
    """A CSV log row's kind and its step (a step's) or epoch (an epoch's); None: the header, another line."""
    kind, _, rest = line.decode("utf-8", "replace").partition(",")
    epoch, _, rest = rest.partition(",")
    step = rest.partition(",")[0]
    try:
        return (kind, int(step if kind == "step" else epoch)) if kind in ("step", "epoch") else None
    except ValueError:
        return None


CSV_COLUMNS = ("kind", "epoch", "step", "loss", "seconds", "val_acc", "test_acc", "elapsed")  # every version's


class MetricLog:
    def __init__(self, config: LogConfig, metric_key: str, append: bool = False):
        """``metric_key``: the metric's name in keys (``Task.key``: ``rocauc``, ``f1_micro``). ``append``: a
        resumed run adds to the logs of the run it continues."""
        self._score_keys = (f"val_{metric_key}", f"test_{metric_key}")
        self.every = config.log_every
        self._start = time.perf_counter()
        self.next_step = 0  # the number of the next logged step (a resumed run continues the count)
        self._pending: list[torch.Tensor] = []  # step losses not yet read, of consecutive batches of one epoch
        self._pending_at = (0, 0)  # (epoch, batch) of the first of them
        self._paths = {"jsonl": config.log_jsonl, "csv": config.log_csv, "tb": config.tensorboard}
        self.lost: str | None = None  # the first output that could not be written, said as an OutputError's message
        mode, self._jsonl, self._csv_file, self._csv, self._tb = ("a" if append else "w"), None, None, None, None
        if config.log_jsonl:
            self._write("jsonl", lambda: setattr(self, "_jsonl", open(config.log_jsonl, mode)))
        fresh_csv = not (append and config.log_csv and Path(config.log_csv).is_file()
                         and Path(config.log_csv).stat().st_size > 0)
        self._csv_width = len(CSV_COLUMNS + self._score_keys)  # then the scores under the metric's name
        if not fresh_csv:  # a resumed run keeps the header it finds (one of 8 columns: before the metric's)
            with open(config.log_csv, newline="") as f:
                self._csv_width = len(next(csv.reader(f), CSV_COLUMNS))
        if config.log_csv and not self.lost:
            self._write("csv", lambda: setattr(self, "_csv_file", open(config.log_csv, mode, newline="")))
        self._csv = csv.writer(self._csv_file) if self._csv_file else None
        if self._csv and fresh_csv:
            self._write("csv", lambda: self._csv.writerow(CSV_COLUMNS + self._score_keys))
        if config.tensorboard and not self.lost:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional
            self._write("tb", lambda: setattr(self, "_tb", SummaryWriter(config.tensorboard)))
        self.per_step = any(x is not None for x in (self._jsonl, self._csv, self._tb))

    def step(self, epoch: int, batch: int, loss: torch.Tensor) -> None:
        """Log one step's loss (a device tensor): kept until ``every`` are pending, then read in one transfer
        and written; ``flush`` writes those pending sooner (the epoch's end, a checkpoint, the run's end)."""
        if self._pending and (epoch, batch) != (self._pending_at[0], self._pending_at[1] + len(self._pending)):
            self.write_pending()
        if not self._pending:
            self._pending_at = (epoch, batch)
        self._pending.append(loss)
        if len(self._pending) >= self.every:
            self.write_pending()

    def write_pending(self) -> None:
        """Write the step losses pending (``step``)."""
        if self._pending:
            (epoch, first), losses, self._pending = self._pending_at, self._pending, []
            self.steps(epoch, first, losses)

    def flush(self) -> None:
        """Write the step losses pending and hand every log's lines to the system. Called before each
        checkpoint: every step before a checkpoint's position is in the logs when the checkpoint is written, so
        a run stopped there (or killed after it) loses none, and its resumption writes each step once
        (``continue_at``)."""
        self.write_pending()
        for name, log in (("jsonl", self._jsonl), ("csv", self._csv_file), ("tb", self._tb)):
            if log is not None:
                self._write(name, log.flush)

    def continue_at(self, epoch: int, step: int) -> None:
        """A resumed run's logs continue at ``epoch``'s record and global step ``step`` (its checkpoint's
        position): the records past it, written after that checkpoint by a run that then failed or was
        killed, are cut off (and a last line cut short), so that each step is in the logs once; TensorBoard
        hides its events from ``step`` on (``purge_step``)."""
        self.next_step = step
        for name, handle, kind_of in (("jsonl", self._jsonl, _jsonl_record), ("csv", self._csv_file, _csv_record)):
            if handle is not None:
                self._write(name, lambda: self._cut(self._paths[name], handle, kind_of, epoch, step))
        if self._tb is not None:
            from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional
            self._write("tb", lambda: (self._tb.close(), setattr(
                self, "_tb", SummaryWriter(self._paths["tb"], purge_step=step))))

    def _cut(self, path: str, handle, kind_of, epoch: int, step: int) -> None:
        """Cut ``path`` (open for appending as ``handle``) at its first record past (``epoch``, ``step``)."""
        handle.flush()
        offset, past, cut = 0, None, {"step": 0, "epoch": 0, "torn": 0}
        with open(path, "rb") as f:
            for line in f:
                record = kind_of(line) if line.endswith(b"\n") else ("torn", 0)
                if past is None and record is not None and (
                        record[0] == "torn" or (record[0] == "step" and record[1] >= step)
                        or (record[0] == "epoch" and record[1] >= epoch)):
                    past = offset
                if past is not None and record is not None and record[0] in cut:
                    cut[record[0]] += 1
                offset += len(line)
        if past is not None:
            os.truncate(path, past)
            what = ", ".join(f"{n} {name} record(s)" if name != "torn" else f"{n} line cut short"
                             for name, n in cut.items() if n)
            logger.info(f"{path}: cut {what} past the checkpoint this run resumes from (written after it); the "
                        f"steps are logged again as they are trained again")

    def steps(self, epoch: int, first_batch: int, losses: list[torch.Tensor]) -> None:
        """Log consecutive steps' losses (device tensors; read here in one transfer)."""
        values = torch.stack(losses).float().cpu().tolist()
        elapsed = round(time.perf_counter() - self._start, 3)
        steps = list(range(self.next_step, self.next_step + len(values)))
        self.next_step += len(values)
        if self._jsonl:
            self._write("jsonl", lambda: self._jsonl.write("".join(json.dumps(
                {"kind": "step", "epoch": epoch, "batch": first_batch + offset, "step": step, "loss": loss,
                 "elapsed": elapsed}) + "\n" for offset, (step, loss) in enumerate(zip(steps, values)))))
        if self._csv:
            self._write("csv", lambda: self._csv.writerows(["step", epoch, step, loss, "", "", "", elapsed, "", ""]
                                                           [:self._csv_width] for step, loss in zip(steps, values)))
        if self._tb:
            self._write("tb", lambda: [self._tb.add_scalar("train/loss", loss, step)
                                       for step, loss in zip(steps, values)])

    def epoch(self, record: dict) -> None:
        self.write_pending()  # the epoch's steps before its record
        elapsed = round(time.perf_counter() - self._start, 3)
        if self._jsonl:
            line = json.dumps({"kind": "epoch", "step": self.next_step, "elapsed": elapsed, **record}) + "\n"
            self._write("jsonl", lambda: (self._jsonl.write(line), self._jsonl.flush()))
        if self._csv:
            val, test = record.get("val_acc", ""), record.get("test_acc", "")
            row = ["epoch", record["epoch"], self.next_step, record["train_loss"], record["seconds"], val,
                   test, elapsed, val, test][:self._csv_width]
            self._write("csv", lambda: (self._csv.writerow(row), self._csv_file.flush()))
        if self._tb:
            self._write("tb", lambda: self._tensorboard_epoch(record))

    def _write(self, log: str, write) -> None:
        """Run ``write`` on ``log``; a failure gives the logs up (``lose``)."""
        try:
            write()
        except OSError as exc:
            self.lose(self._paths[log], exc)
            self.close()

    def lose(self, path, exc: OSError | OutputError) -> None:
        """Note that ``path`` (a log, the timeline) could not be written: said at once, and by ``checked``
        at the end of the run (the first such file)."""
        error = str(exc if isinstance(exc, OutputError) else write_error(Path(path), exc, existed=True))
        logger.warning(f"{error.split('; ')[0]}; training goes on without it, and the run will end with this error")
        self.lost = self.lost or f"{error} The run went on without it; what it trained was saved and summarised."

    def checked(self, summary: dict) -> dict:
        """``summary``, once the run is saved and summarised, or an ``OutputError`` for the first log or
        timeline that could not be written."""
        if self.lost:
            raise OutputError(self.lost)
        return summary

    def _tensorboard_epoch(self, record: dict) -> None:
        tb, epoch = self._tb, record["epoch"]
        for key in ("seconds", "train_loss", "val_acc", "test_acc", *self._score_keys):
            if key in record:
                tb.add_scalar(f"epoch/{key}", record[key], epoch)
        for stage, seconds in record["stage_seconds"].items():
            tb.add_scalar(f"stage_seconds/{stage}", seconds, epoch)
        for lane, share in record.get("lane_busy", {}).items():
            tb.add_scalar(f"busy/{lane}", share, epoch)
        util = record.get("utilisation") or {}
        for key in ("process_cores", "process_share", "machine_share", "gpu_percent"):
            if util.get(key) is not None:
                tb.add_scalar(f"utilisation/{key}", util[key], epoch)
        tb.flush()

    def close(self) -> None:
        try:
            self.write_pending()  # the steps since the last group, whatever ends the run
        except RuntimeError as exc:  # a device that failed: the losses cannot be read from it
            logger.warning(f"the last {len(self._pending)} step losses could not be read for the logs ({exc})")
            self._pending = []
        for name, log in (("jsonl", self._jsonl), ("csv", self._csv_file), ("tb", self._tb)):
            if log is not None:
                try:
                    log.close()  # the last lines are flushed here: a full disk shows now
                except OSError as exc:
                    self.lose(self._paths[name], exc)
        self._jsonl = self._csv_file = self._csv = self._tb = None
        self.per_step = False  # no log left to take step losses
