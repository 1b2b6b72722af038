"""The files a run writes: checked before any data is loaded, and the summary written atomically."""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from neutronorch.config import TrainConfig
from neutronorch.errors import ConfigError


def check_outputs(config: TrainConfig) -> None:
    """Fail before training (never after it) if an output cannot be written."""
    if config.timeline:
        _check_timeline(config.timeline)
    if config.summary_json:
        check_creatable("summary_json", config.summary_json)
    if config.checkpoint_dir:
        if Path(config.checkpoint_dir).exists() and not Path(config.checkpoint_dir).is_dir():
            raise ConfigError(f"`checkpoint_dir` {config.checkpoint_dir}: exists and is not a folder.")
        check_creatable("checkpoint_dir", str(Path(config.checkpoint_dir) / "last.pt"))
    for field, path in (("log_jsonl", config.log_jsonl), ("log_csv", config.log_csv),
                        ("tensorboard", config.tensorboard)):
        if path and not Path(path).resolve().parent.exists():
            raise ConfigError(f"`{field}` {path}: the folder {Path(path).resolve().parent} does not exist.")
    if config.tensorboard:
        try:
            import tensorboard  # noqa: F401, PLC0415 - optional
        except ImportError:
            raise ConfigError("`tensorboard` needs the tensorboard package: pip install tensorboard.") from None


def check_creatable(field: str, path: str | os.PathLike) -> None:
    """``path``'s folder exists or can be made: its nearest existing ancestor is a writable folder."""
    parent = Path(path).resolve().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise ConfigError(f"`{field}` {path}: cannot be written ({parent} is not a writable folder).")


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


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a temporary file beside ``path`` (its folder made if needed), flush it to disk and
    rename it into place: a crash or a full disk mid-write leaves the previous file (or none), never half
    of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~_umask())  # what open() would have given (mkstemp gives 0600)
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@contextlib.contextmanager
def open_array_atomically(path: str | os.PathLike, shape: tuple[int, ...], dtype) -> Iterator[np.ndarray]:
    """A ``.npy`` file of ``shape`` and ``dtype`` to fill in place, memory-mapped (never held whole in
    memory): written beside ``path``, flushed to disk and renamed into place when the block ends without
    an error; on an error the previous file (or none) stays."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        if int(np.prod(shape)) == 0:  # an empty file cannot be mapped
            array = np.empty(shape, dtype)
            yield array
            with open(tmp, "wb") as f:
                np.save(f, array)
        else:
            array = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
            yield array
            array.flush()
            del array
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
