"""Optional metric logs: JSONL (every field), CSV (one row per logged step and per epoch) and TensorBoard
(docs/observability.md). Step losses are read from the device once every ``log_every`` steps, never once per
step. A log (or the timeline) that cannot be written does not stop the training; the run ends with an
``OutputError`` naming the file once it is saved and summarised (``checked``; docs/errors.md).
"""

from __future__ import annotations

import csv
import json
import logging
import time
from pathlib import Path

import torch

from neutronorch.atomic import write_error
from neutronorch.config import LogConfig
from neutronorch.errors import OutputError


logger = logging.getLogger("neutronorch")

CSV_COLUMNS = ("kind", "epoch", "step", "loss", "seconds", "val_acc", "test_acc", "elapsed")  # every version's


class MetricLog:
    def __init__(self, config: LogConfig, metric_key: str, append: bool = False):
        """``metric_key``: the metric's name in keys (``Task.key``: ``rocauc``, ``f1_micro``). ``append``: a
        resumed run adds to the logs of the run it continues."""
        self._score_keys = (f"val_{metric_key}", f"test_{metric_key}")
        self.every = config.log_every
        self._start = time.perf_counter()
        self._step = 0
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

    def continue_at(self, step: int) -> None:
        """Number the next logged step ``step`` (a resumed run continues the count)."""
        self._step = step

    def steps(self, epoch: int, first_batch: int, losses: list[torch.Tensor]) -> None:
        """Log consecutive steps' losses (device tensors; read here in one transfer)."""
        values = torch.stack(losses).float().cpu().tolist()
        elapsed = round(time.perf_counter() - self._start, 3)
        steps = list(range(self._step, self._step + len(values)))
        self._step += len(values)
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
        elapsed = round(time.perf_counter() - self._start, 3)
        if self._jsonl:
            line = json.dumps({"kind": "epoch", "step": self._step, "elapsed": elapsed, **record}) + "\n"
            self._write("jsonl", lambda: (self._jsonl.write(line), self._jsonl.flush()))
        if self._csv:
            val, test = record.get("val_acc", ""), record.get("test_acc", "")
            row = ["epoch", record["epoch"], self._step, record["train_loss"], record["seconds"], val, test, elapsed,
                   val, test][:self._csv_width]
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
        tb.add_scalar("epoch/seconds", record["seconds"], epoch)
        tb.add_scalar("epoch/train_loss", record["train_loss"], epoch)
        for key in ("val_acc", "test_acc", *self._score_keys):
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
        for name, log in (("jsonl", self._jsonl), ("csv", self._csv_file), ("tb", self._tb)):
            if log is not None:
                try:
                    log.close()  # the last lines are flushed here: a full disk shows now
                except OSError as exc:
                    self.lose(self._paths[name], exc)
        self._jsonl = self._csv_file = self._csv = self._tb = None
        self.per_step = False  # no log left to take step losses
