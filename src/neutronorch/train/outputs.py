"""The files a run writes: checked before any data is loaded (``output_guard``), and the summary written
atomically."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from neutronorch.atomic import open_array_atomically, write_atomically
from neutronorch.config import TrainConfig
from neutronorch.data import dataset_paths
from neutronorch.errors import ConfigError, OutputError
from neutronorch.train.output_guard import check_creatable, check_distinct, check_fresh, check_space, claim_folder

__all__ = ["CHECKPOINT_FILES", "check_creatable", "check_outputs", "check_checkpoint_space", "claim_checkpoint_dir",
           "open_array_atomically", "run_outputs", "save_or_rescue", "write_summary", "write_atomically", "write_json_atomically"]

CHECKPOINT_FILES = ("last.pt", "best.pt")


def run_outputs(config: TrainConfig) -> dict[str, list[Path]]:
    """The files a run writes, by field (the tensorboard folder aside: it adds a file of its own)."""
    files = {"summary_json": config.summary_json, "log_jsonl": config.log_jsonl, "log_csv": config.log_csv}
    outputs = {field: [Path(path)] for field, path in files.items() if path}
    if config.timeline:
        outputs["timeline"] = [Path(config.timeline), Path(config.timeline).with_suffix(".json")]
    if config.checkpoint_dir:
        outputs["checkpoint_dir"] = [Path(config.checkpoint_dir) / name for name in CHECKPOINT_FILES]
    return outputs


def check_outputs(config: TrainConfig, reads: dict[str, list] | None = None) -> None:
    """Fail before training (never after it) if an output cannot be written, would overwrite an input
    (the dataset, or the files in ``reads``) or another output, or holds an earlier run's results that
    neither ``resume`` nor ``overwrite`` says to continue or replace."""
    if config.timeline:
        _check_timeline(config.timeline)
    outputs = run_outputs(config)
    folders = {"tensorboard": [Path(config.tensorboard)]} if config.tensorboard else {}
    check_distinct({"dataset": dataset_paths(config.dataset), **(reads or {})}, {**outputs, **folders})
    if config.checkpoint_dir and Path(config.checkpoint_dir).exists() and not Path(config.checkpoint_dir).is_dir():
        raise ConfigError(f"`checkpoint_dir` {config.checkpoint_dir}: exists and is not a folder.")
    check_fresh(outputs, config.overwrite, config.resume, again=" (or continue that run with `resume`)")
    for field, path in (("log_jsonl", config.log_jsonl), ("log_csv", config.log_csv),
                        ("tensorboard", config.tensorboard)):
        if path and not Path(path).resolve().parent.exists():
            raise ConfigError(f"`{field}` {path}: the folder {Path(path).resolve().parent} does not exist.")
    for field, paths in {**outputs, **folders}.items():
        check_creatable(field, paths[0])


@contextlib.contextmanager
def claim_checkpoint_dir(config: TrainConfig) -> Iterator[None]:
    """Hold ``checkpoint_dir`` for this run (another run into it is refused while this one lasts), and
    check again under the lock that it holds no earlier run's checkpoints, unless ``resume`` (they are
    continued) or ``overwrite`` (they are removed now, so none is ever taken for this run's)."""
    if not config.checkpoint_dir:
        yield
        return
    with claim_folder("checkpoint_dir", config.checkpoint_dir) as folder:
        files = [folder / name for name in CHECKPOINT_FILES]
        check_fresh({"checkpoint_dir": files}, config.overwrite, config.resume,
                    again=" (or continue that run with `resume`)")
        if config.overwrite and not config.resume:
            for path in files:
                path.unlink(missing_ok=True)
        yield


def check_checkpoint_space(config: TrainConfig, parameters) -> None:
    """``checkpoint_dir``'s disk has room for last.pt and best.pt: the weights and Adam's two moments."""
    if config.checkpoint_dir:
        state = 3 * sum(p.numel() * p.element_size() for p in parameters)
        check_space("checkpoint_dir", config.checkpoint_dir, 2 * state + 2**20)


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
            raise OutputError(f"{exc} A copy was saved to {copy} instead; move it to {path} once there is "
                              f"room.") from exc
        raise


def _check_timeline(path: str) -> None:
    if not path.lower().endswith(".png"):
        raise ConfigError(f"`timeline` {path}: give a .png path (the raw spans go next to it as .json).")
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional
    except ImportError:
        raise ConfigError("`timeline` needs matplotlib: pip install matplotlib (or the project's [plot] "
                          "extra).") from None
    parent = Path(path).parent
    if not parent.exists():
        raise ConfigError(f"`timeline` {path}: the folder {parent} does not exist.")


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
