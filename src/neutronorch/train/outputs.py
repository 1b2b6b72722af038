"""The files a run writes: checked before any data is loaded (``output_guard``), the summary written
atomically, and the command line's run folders (``runs/NAME/``: a run's results kept when no output is
named)."""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import json
import logging
import math
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from neutronorch.atomic import make_folder, remove_made, write_atomically
from neutronorch.config import TrainConfig
from neutronorch.data import dataset_paths
from neutronorch.errors import ConfigError, OutputError
from neutronorch.train.output_guard import (LOCK_NAME, check_creatable, check_distinct, check_fresh,
                                              check_name_lengths, check_nothing_set_aside, check_space)

CHECKPOINT_FILES = ("last.pt", "best.pt")
RANK_FILE = re.compile(r"(last|best)\.rank-[1-9][0-9]*\.pt")  # a partitioned run's rank r > 0 (``rank_file``)


def rank_file(rank: int, name: str = "last.pt") -> str:
    """The file of ``name`` (``last.pt`` or ``best.pt``) that rank ``rank`` of a partitioned run writes: ``name``
    itself for rank 0 (the model that prediction reads), ``last.rank-R.pt`` for the others (``best.rank-R.pt``
    where each rank holds its part's rows of the embedding tables; docs/distributed.md)."""
    return name if rank == 0 else f"{name.removesuffix('.pt')}.rank-{rank}.pt"


def rank_files(folder: Path) -> list[Path]:
    """The files of ranks > 0 of a partitioned run in ``folder``, as they exist now."""
    return sorted(p for p in folder.glob("*.rank-*.pt") if RANK_FILE.fullmatch(p.name)) if folder.is_dir() else []


OUTPUT_FIELDS = ("summary_json", "checkpoint_dir", "log_jsonl", "log_csv", "tensorboard", "timeline", "console_log",
                 "curves")
BESIDE = ("timeline", "console_log", "curves")  # outputs named beside a run folder (they make none of their own)


def run_outputs(config: TrainConfig) -> dict[str, list[Path]]:
    """The files a run writes, by field (the tensorboard folder aside: it adds a file of its own)."""
    files = {"summary_json": config.summary_json, "log_jsonl": config.log_jsonl, "log_csv": config.log_csv,
             "console_log": config.console_log, "curves": config.curves}
    outputs = {field: [Path(path)] for field, path in files.items() if path}
    if config.timeline:
        outputs["timeline"] = [Path(config.timeline), Path(config.timeline).with_suffix(".spans.json")]
    if config.checkpoint_dir:
        folder = Path(config.checkpoint_dir)  # and an earlier partitioned run's other ranks' files
        outputs["checkpoint_dir"] = [folder / name for name in CHECKPOINT_FILES] + rank_files(folder)
    return outputs


def check_outputs(config: TrainConfig, reads: dict[str, list] | None = None, made: Path | None = None) -> None:
    """Fail before training (never after it) if an output cannot be written, would overwrite an input
    (the dataset, or the files in ``reads``) or another output, or holds an earlier run's results that
    neither ``resume`` nor ``overwrite`` says to continue or replace, or shares a folder with outputs that a
    killed run set aside while replacing them. ``made``: a folder to be made for the
    outputs once they pass (a run folder), which the logs' folder may be."""
    outputs = run_outputs(config)
    folders = {"tensorboard": [Path(config.tensorboard)]} if config.tensorboard else {}
    for field, paths in {**outputs, **folders}.items():  # first: a name too long fails every check below
        for path in paths:  # the summary and the checkpoints are written under a temporary name first
            check_name_lengths(field, path, temporary=field in ("summary_json", "checkpoint_dir"))
    for field, beside in (("timeline", " (the raw spans go next to it as .spans.json)"), ("curves", "")):
        if getattr(config, field) and not getattr(config, field).lower().endswith(".png"):
            raise ConfigError(f"`{field}` {getattr(config, field)}: give a .png path{beside}.")
        if getattr(config, field) and not has_matplotlib():
            raise ConfigError(f"`{field}` needs matplotlib: pip install matplotlib (or the project's [plot] "
                              f"extra).")
    check_distinct({"dataset": dataset_paths(config.dataset), **(reads or {})}, {**outputs, **folders})
    if config.checkpoint_dir and Path(config.checkpoint_dir).exists() and not Path(config.checkpoint_dir).is_dir():
        raise ConfigError(f"`checkpoint_dir` {config.checkpoint_dir}: exists and is not a folder.")
    check_fresh(outputs, config.overwrite, config.resume)
    for field, path in (("log_jsonl", config.log_jsonl), ("log_csv", config.log_csv),
                        ("console_log", config.console_log), ("tensorboard", config.tensorboard),
                        ("timeline", config.timeline)):
        if path and not Path(path).resolve().parent.exists() and Path(path).parent != made:
            raise ConfigError(f"`{field}` {path}: the folder {Path(path).resolve().parent} does not exist.")
    for field, paths in {**outputs, **folders}.items():
        check_creatable(field, paths[0])
        # A killed run's set-aside outputs (train/replacing.py) are the user's to keep or drop first.
        check_nothing_set_aside(field, paths[0] if field == "tensorboard" else paths[0].parent)


def has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional
    except ImportError:
        return False
    return True


def check_checkpoint_space(config: TrainConfig, parameters) -> None:
    """``checkpoint_dir``'s disk has room for last.pt and best.pt: the weights and Adam's two moments."""
    if config.checkpoint_dir:
        state = 3 * sum(p.numel() * p.element_size() for p in parameters)
        check_space("checkpoint_dir", config.checkpoint_dir, 2 * state + 2**20)


@contextlib.contextmanager
def console_copy(path: str, resume: bool) -> Iterator[None]:
    """While the block runs, the ``neutronorch`` logger's lines also go to ``path`` (continued when
    ``resume``), warnings marked as the command line marks them."""
    handler = logging.FileHandler(path, mode="a" if resume else "w", encoding="utf-8")
    handler.setFormatter(_ConsoleFormat())
    logger = logging.getLogger("neutronorch")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        handler.close()


def marked(record: logging.LogRecord, text: str) -> str:
    """A log line as the console shows it: a warning marked (a note stays as it is)."""
    return f"warning: {text}" if record.levelno >= logging.WARNING and not text.startswith("note:") else text


class _ConsoleFormat(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return marked(record, record.getMessage())


def write_summary(config: TrainConfig, summary: dict) -> None:
    """The summary to ``summary_json``, atomically; on a full disk a copy goes where it can."""
    if config.summary_json:
        save_or_rescue(config.summary_json, lambda path: write_json_atomically(path, summary),
                       [config.checkpoint_dir] if config.checkpoint_dir else [])


def save_or_rescue(path: str | os.PathLike, write: Callable[[Path], object], elsewhere: list) -> None:
    """``write(path)``; if that fails (a full disk, a folder gone read-only), ``write`` a copy into the
    first folder of ``elsewhere`` that takes it, then raise the error saying where the copy is."""
    try:
        write(Path(path))
    except OutputError as exc:
        stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        for folder in [*elsewhere, tempfile.gettempdir()]:
            copy = Path(folder) / f"neutronorch-rescued-{stamp}-{Path(path).name}"
            try:
                write(copy)
            except (OutputError, OSError):
                continue
            tables = sorted(p.name for p in copy.parent.glob(f"{glob.escape(copy.stem)}-tables-*"))  # a typed run's
            beside = f" with its table folder {', '.join(tables)}/ (move both)" if tables else ""
            raise OutputError(f"{exc} A copy was saved to {copy}{beside} instead; move it to {path} once there is "
                              f"room.") from exc
        raise


def _finite(value):
    """``value`` with every NaN or infinite float replaced by None: strict JSON that every parser reads."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_json_atomically(path: str, data: dict) -> None:
    """Write ``data`` as strict JSON (NaN and infinities as null) to ``path``, atomically."""
    text = json.dumps(_finite(data), indent=2, allow_nan=False) + "\n"
    write_atomically(path, lambda f: f.write(text.encode()))


# ----- run folders: where the command line keeps a run's results when no output is named ---------------

RUNS = Path("runs")
# A run folder's files (and the checkpoints: the folder's own).
RUN_FILES = {"summary_json": "summary.json", "log_jsonl": "metrics.jsonl", "console_log": "console.log"}


@dataclasses.dataclass
class RunFolder:
    """``runs/NAME/``: a run's summary, metric log and checkpoints. ``made``: the folders this run made (the
    run folder, and ``runs/`` when it was not there), removed again by ``discard_if_empty``."""

    path: Path
    made: list[Path] = dataclasses.field(default_factory=list)

    def outputs(self, config: TrainConfig) -> TrainConfig:
        """``config`` with its outputs in this folder (a console log named elsewhere stays there)."""
        files = {field: str(self.path / name) for field, name in RUN_FILES.items()}
        if has_matplotlib():  # cheap where it is installed
            files["curves"] = str(self.path / "curves.png")
        named = {field: getattr(config, field) for field in BESIDE if getattr(config, field)}
        return dataclasses.replace(config, checkpoint_dir=str(self.path), **{**files, **named})

    def discard_if_empty(self) -> None:
        """Remove the folders this run made if it wrote nothing into them (it failed before its first
        output): a run that kept nothing leaves no folder."""
        remove_made(self.made, also=(LOCK_NAME, RUN_FILES["console_log"]))  # each kept when anything else is there


def names_outputs(config: TrainConfig) -> bool:
    """Whether ``config`` names an output of its own (then no run folder is made); those of ``BESIDE`` go
    where they are named beside a run folder."""
    return any(getattr(config, field) for field in OUTPUT_FIELDS if field not in BESIDE)


def generated_run_name(config: TrainConfig, now: time.struct_time | None = None) -> str:
    """A UTC time stamp, the model and the dataset's short name (``synthetic``, ``Cora`` for
    ``pyg:Cora@~/data``, a path's last part; a partitioned run's folder's): ``2026-12-03T07-15-02-sage-synthetic``."""
    source = config.partitions or config.dataset
    if source.startswith("synthetic"):
        word = "synthetic"
    elif source.startswith("pyg:"):
        word = source[4:].partition("@")[0]
    else:
        word = Path(source.rstrip("/\\")).name
        for suffix in (".gz", ".npz", ".txt", ".tsv", ".edges"):
            word = word.removesuffix(suffix)
    word = re.sub(r"[^A-Za-z0-9._-]+", "-", word).strip("-.")[:40] or "data"
    return f"{time.strftime('%Y-%m-%dT%H-%M-%S', now or time.gmtime())}-{config.model}-{word}"


def open_run_folder(config: TrainConfig, name: str | None = None, reads: dict[str, list] | None = None,
                    root: Path = RUNS) -> tuple[TrainConfig, RunFolder]:
    """Where a run that names no output keeps its results: ``root/name/``, or with no ``name`` a new folder
    named by ``generated_run_name`` (a counter added if one of that name exists), never an existing run's
    unless ``resume`` (continue it) or ``overwrite`` (replace its results). Every check (the options, the
    outputs against the inputs in ``reads``, the folder writable) passes before the folder is made.
    Returns the config with its outputs in the folder, and the folder."""
    if name is not None:  # one folder name: no path separator, not hidden, printable, of a length that fits
        if not name or "/" in name or "\\" in name or name.startswith(".") or not name.isprintable():
            raise ConfigError(f"`run_name` {name!r}: give a folder name (letters, digits, -, _, =, ...; no / "
                              f"and not starting with a dot); the run's results go to {root}/NAME/.")
        check_name_lengths("run_name", root / name / RUN_FILES["summary_json"], what="`run_name`")
        folder = base = root / name
        if folder.exists() and not folder.is_dir():
            raise ConfigError(f"`run_name` {name}: {folder} exists and is not a folder. Give another name.")
        if folder.exists() and not (config.resume or config.overwrite):
            raise ConfigError(f"`run_name` {name}: {folder}/ already holds an earlier run's results, and a run "
                              f"never writes into another's folder. Give another name, continue that run with "
                              f"`resume`, or replace its results with `overwrite`.")
        check_nothing_set_aside("run_name", folder)  # a killed run's: before the folder is judged by what it holds
        if config.resume and not (folder / "last.pt").is_file():
            raise ConfigError(f"`resume` `run_name` {name}: {folder}/ holds no last.pt to continue from"
                              f"{'' if folder.exists() else ' (no such run)'}. Give the name of a run that "
                              f"saved one (ls {root}/).")
    elif config.resume:
        raise ConfigError(f"`resume` continues a run from its last.pt: name the run (`run_name`, its folder "
                          f"{root}/NAME/), or give `checkpoint_dir` too.")
    else:
        base = root / generated_run_name(config)
        folder = _unused(base)
    existed = folder.exists()  # a named run's, continued or replaced
    run = RunFolder(folder)
    # Every check before anything is made: the options, then the folder and the outputs in it.
    checked = run.outputs(config).validate()
    check_creatable("run_name", folder / RUN_FILES["summary_json"], what=f"the run folder {folder}/",
                    fix="Run from a folder you can write to, name the outputs (`summary_json`, "
                        "`checkpoint_dir`), or pass `no_save`.")
    check_outputs(checked, reads, made=folder)
    while True:
        try:
            run.made = make_folder(run.path, exist_ok=existed)  # the run folder, then runs/ if it was not there
        except FileExistsError:  # another run took this name meanwhile
            if name is not None:
                raise ConfigError(f"`run_name` {name}: {run.path}/ was made by another run meanwhile; give "
                                  f"another name.") from None
            run.path = _unused(base)  # the next free counter
            continue
        except OSError as exc:
            raise OutputError(f"cannot make the run folder {run.path}/ ({exc.strerror or exc}). Run from a "
                              f"folder you can write to, or pass `no_save`.") from None
        return run.outputs(config), run


def _unused(base: Path) -> Path:
    """``base``, or ``base-2``, ``base-3``, ... whichever does not exist yet."""
    candidate, n = base, 2
    while candidate.exists():
        candidate, n = base.with_name(f"{base.name}-{n}"), n + 1
    return candidate
