"""Memory-mapped embedding tables in checkpoints: files in ``<stem>-tables-<version>-<random>/`` beside
``last.pt`` and ``best.pt``, which name the folder and each file's size and ``sample_crc`` under
``table_files`` (docs/heterogeneous.md, Embedding tables in files). The folder is renamed into place before
the checkpoint is written and older ones removed after: a crash at any point leaves the previous checkpoint
with its own folder. Files are checked before use and mapped copy-on-write: reading never changes them.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import secrets
import shutil
import zlib
from pathlib import Path

import numpy as np
import torch

from neutronorch.atomic import sweep_stale, write_folder
from neutronorch.config import TrainConfig
from neutronorch.errors import CheckpointError, ConfigError
from neutronorch.train.outputs import CHECKPOINT_FILES

CHECKPOINT_COPIES = 3  # on a checkpoint disk at once: last.pt's tables, their replacement being written, best.pt's
COPY_BYTES = 64 << 20
_NO_COPY_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)


def sample_crc(array) -> int:
    """The CRC-32 of a strided sample of ``array``'s rows, about 4,096 of them: a strided view reads only
    its rows, so a memory-mapped array larger than memory is never read whole."""
    step = max(1, array.shape[0] // 4096)
    return zlib.crc32(np.ascontiguousarray(array[::step]).tobytes())


def folder_pattern(stem: str) -> re.Pattern:
    """The table folders of a checkpoint named ``stem`` (``last``): exactly what this module names them."""
    return re.compile(rf"{re.escape(stem)}-tables-[0-9]+-[0-9a-f]{{8}}")


def table_folders(parent: Path, stem: str) -> list[Path]:
    pattern = folder_pattern(stem)
    return [p for p in parent.glob(f"{glob.escape(stem)}-tables-*") if p.is_dir() and pattern.fullmatch(p.name)]


def check_table_folders(config: TrainConfig) -> None:
    """Refuse a ``checkpoint_dir`` holding an earlier run's table folders, unless the run continues it
    (``resume``) or replaces its results (``overwrite``: they are set aside with the checkpoints,
    ``train/replacing.py``); nothing is read or written."""
    if not config.checkpoint_dir or config.resume or config.overwrite:
        return
    folder = Path(config.checkpoint_dir).expanduser()
    found = [p.name for name in CHECKPOINT_FILES for p in table_folders(folder, Path(name).stem)]
    if found:
        raise ConfigError(f"`checkpoint_dir` {folder}: holds an earlier run's embedding table files "
                          f"({', '.join(found)}) and they are never replaced silently. Give a new folder, continue "
                          f"that run with `resume`, or pass `overwrite` to replace them.")


@contextlib.contextmanager
def stored_tables(state: dict, path: Path, tables, version: int):
    """Around the atomic write of the checkpoint ``state`` to ``path``: ``tables``' memory-mapped tables
    (``TypedTables``, None for none) written into a new folder beside ``path`` and taken out of ``state``,
    which names them instead; the folder removed again if the write fails, and once it succeeds the folders
    of ``path``'s name it replaces."""
    made = None
    if tables is not None and tables.arrays:
        made, record = _write_folder(path, tables, version)
        order = list(tables.shapes)
        optimizer = (state.get("tables_optimizer") or {}).get("state", {}).get("tables")
        for node_type, entry in record["tables"].items():
            state["model"].pop(f"embeddings.{node_type}.weight", None)
            entry["index"] = order.index(node_type)
            if optimizer is not None:
                optimizer[entry["index"]].update(exp_avg=None, exp_avg_sq=None)
        state["table_files"] = record
    try:
        yield
    except BaseException:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    for old in table_folders(path.parent, path.stem):
        if old != made:
            shutil.rmtree(old, ignore_errors=True)


def _write_folder(path: Path, tables, version: int) -> tuple[Path, dict]:
    """The tables' files copied into ``<stem>-tables-<version>-<random>/`` beside ``path`` (linked from the
    last folder written, at the same version), flushed, renamed into place (``write_folder``); and their
    record."""
    final = path.parent / f"{path.stem}-tables-{version}-{secrets.token_hex(4)}"
    earlier = tables.written if tables.written and tables.written[0] == version else None
    record = {"folder": final.name, "tables": {}}

    def fill(folder: Path) -> None:
        for node_type, parts in tables.arrays.items():
            files = {}
            for part, array in parts.items():
                name = f"{node_type}.{part}.npy"
                if earlier is not None:  # the last folder's file, immutable once written: linked, not copied
                    with contextlib.suppress(OSError):
                        os.link(earlier[1] / name, folder / name)
                if not (folder / name).exists():
                    _copy(tables.fds[(node_type, part)], folder / name)
                files[part] = {"file": name, "bytes": (folder / name).stat().st_size,
                               "crc": earlier[2][(node_type, part)] if earlier else sample_crc(array)}
            record["tables"][node_type] = {"shape": list(parts["weight"].shape), "files": files}
        _fsync_folder(folder)

    for leftover in path.parent.glob(f".{glob.escape(path.stem)}-tables-*.tmp-*"):  # killed writes' folders
        name = leftover.name[1:].split(".tmp-", 1)[0]
        if folder_pattern(path.stem).fullmatch(name):
            sweep_stale(path.parent / name)
    write_folder(final, fill)
    _fsync_folder(path.parent)
    tables.written = (version, final, {(t, p): f["crc"] for t, e in record["tables"].items()
                                       for p, f in e["files"].items()})
    return final, record


def _copy(source_fd: int, target: Path) -> None:
    """The whole file open as ``source_fd`` into a new ``target``, flushed to disk: ``copy_file_range`` (the
    file system may share or copy the blocks itself), else reads and writes a chunk at a time."""
    size = os.fstat(source_fd).st_size
    with open(target, "wb") as out:
        done = 0
        try:
            while done < size:
                moved = os.copy_file_range(source_fd, out.fileno(), size - done, done, done)
                if moved == 0:
                    break
                done += moved
        except (OSError, AttributeError) as exc:
            if isinstance(exc, OSError) and exc.errno not in _NO_COPY_RANGE:
                raise
        while done < size:
            chunk = os.pread(source_fd, min(COPY_BYTES, size - done), done)
            if not chunk:
                raise OSError(errno.EIO, f"the table file ended at {done:,} of {size:,} bytes")
            os.pwrite(out.fileno(), chunk, done)
            done += len(chunk)
        os.fsync(out.fileno())


def _fsync_folder(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def attach_tables(state: dict, path: Path) -> None:
    """Put a checkpoint's table files back into ``state`` (read from ``path``), as the tensors the model's
    weights and the tables' optimizer's state hold: memory maps, copy-on-write. Every file is checked first
    (there, its size, its array's shape, its sample's checksum); a ``CheckpointError`` names each that fails.
    A checkpoint without table files is left as it is."""
    record = state.get("table_files")
    if record is None:
        return
    if not (isinstance(record, dict) and isinstance(record.get("folder"), str)
            and isinstance(record.get("tables"), dict)
            and all(isinstance(e, dict) and isinstance(e.get("files"), dict) for e in record["tables"].values())):
        raise CheckpointError(f"{path}: not a checkpoint this neutronorch can read: `table_files` is not the record "
                              f"of its embedding table files. The file is damaged; use another checkpoint.")
    folder = path.parent / record["folder"]
    advice = (f"A checkpoint's table files are written with it and travel with it: keep {folder.name}/ beside "
              f"{path.name} (copy or move both). Use another checkpoint, or train again.")
    if not folder.is_dir():
        raise CheckpointError(f"{path}: its embedding tables are kept beside it in {folder}/, which is missing. "
                              f"{advice}")
    optimizer = (state.get("tables_optimizer") or {}).get("state", {}).get("tables")
    problems = []
    for node_type, entry in record["tables"].items():
        for part, meta in entry["files"].items():
            array, problem = _opened(folder / str(meta.get("file")), meta, entry.get("shape"))
            if problem:
                problems.append(f"{node_type}'s {part} ({meta.get('file')}): {problem}")
                continue
            tensor = torch.from_numpy(array)
            if part == "weight":
                state["model"][f"embeddings.{node_type}.weight"] = tensor
            elif optimizer is not None and isinstance(entry.get("index"), int) and entry["index"] < len(optimizer):
                optimizer[entry["index"]][part] = tensor
    if problems:
        raise CheckpointError(f"{path}: its embedding table files in {folder}/ are missing or damaged: "
                              f"{'; '.join(problems)}. {advice}")


def _opened(file: Path, meta: dict, shape) -> tuple[np.ndarray | None, str | None]:
    """A table file memory-mapped copy-on-write, or what is wrong with it."""
    if not file.is_file():
        return None, "missing"
    size, written = file.stat().st_size, meta.get("bytes")
    if size != written:
        return None, f"{size:,} bytes, {written:,} when written (truncated or replaced)" if isinstance(written, int) \
            else f"{size:,} bytes, of no size recorded (the checkpoint is damaged)"
    try:
        array = np.lib.format.open_memmap(file, mode="c")
    except (OSError, ValueError) as exc:
        return None, f"not a readable .npy array ({exc})"
    if array.dtype != np.float32 or list(array.shape) != shape:
        return None, f"a {array.dtype} array of shape {tuple(array.shape)}, written as float32 {tuple(shape or ())}"
    if sample_crc(array) != meta.get("crc"):
        return None, "its sampled rows' checksum differs from the one written (the file was changed or damaged)"
    return array, None


def checkpoint_tables(state: dict):
    """``TypedGNN``'s ``tables`` for the model a checkpoint holds: the tables ``attach_tables`` mapped (a
    model built so reads them from their files, never copied into memory), the others made as usual; None
    when the checkpoint keeps every table inside it."""
    record = state.get("table_files")
    if not record:
        return None
    mapped = {t: state["model"].get(f"embeddings.{t}.weight") for t in record["tables"]}
    return lambda node_type, rows, width: mapped.get(node_type)
