"""Files written whole or not at all: a temporary file beside the target, flushed to disk and renamed into
place, so a crash, a kill or a full disk mid-write leaves the previous file (or none), never half of one.

Temporary files are named ``.<target>.tmp-<pid>@<host>-<random>``. A write removes what it left itself when
it fails or is interrupted, and the next write to the same target removes what a killed process of the same
machine left (its process no longer runs; another machine's, on a shared disk, is never touched), so
nothing accumulates beside outputs. A failed write raises ``OutputError`` naming the target, the reason (a
full disk says how much was free) and what was kept. A folder is written whole the same way
(``write_folder``). Imports nothing of ours but the errors.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import itertools
import os
import shutil
import socket
import stat
import tempfile
import uuid
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numpy as np

from neutronorch.errors import OutputError

_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def host_tag() -> str:
    """This machine's name as temporary names carry it (letters and digits, ``_`` for the rest)."""
    return "".join(c if c.isalnum() else "_" for c in socket.gethostname()) or "host"


def temp_prefix(target: Path) -> str:
    return f".{target.name}.tmp-{os.getpid()}@{host_tag()}-"


def sweep_stale(target: Path) -> None:
    """Remove the temporary files and folders that processes of this machine no longer running left beside
    ``target``."""
    with contextlib.suppress(OSError):
        for leftover in target.parent.glob(f".{glob.escape(target.name)}.tmp-*@{host_tag()}-*"):
            pid = leftover.name[len(f".{target.name}.tmp-"):].split("@", 1)[0]
            if pid.isdigit() and not process_running(int(pid)):
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover, ignore_errors=True)
                else:
                    leftover.unlink(missing_ok=True)


def make_folder(folder: str | os.PathLike, exist_ok: bool = True) -> list[Path]:
    """Make ``folder`` and whichever of its parents are missing; return the folders made, deepest first, for
    ``remove_made``. If the making fails, what it made is removed again before the ``OSError`` is raised."""
    folder = Path(folder)
    missing = list(itertools.takewhile(lambda path: not path.exists(), [folder, *folder.parents]))
    made = []  # only what this call made: a folder another process makes meanwhile is never removed here
    try:
        for path in reversed(missing or [folder]):  # the topmost first
            try:
                path.mkdir()
            except FileExistsError:
                if (path == folder and not exist_ok) or not path.is_dir():
                    raise
                continue
            made.append(path)
    except OSError:
        remove_made(made[::-1])
        raise
    return made[::-1]


def remove_made(made: list[Path], also: tuple[str, ...] = ()) -> None:
    """Remove the folders ``make_folder`` made (deepest first) while they are empty once the files named in
    ``also`` (a lock) are gone; the first that holds anything else is kept, and so are those above it, with
    the files of ``also`` in it (a failed run's console copy stays beside the checkpoints it wrote)."""
    for folder in made:
        with contextlib.suppress(OSError):
            if also and {p.name for p in folder.iterdir()} <= set(also):
                for name in also:
                    (folder / name).unlink(missing_ok=True)
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:
            return


def process_running(pid: int) -> bool:
    """Whether process ``pid`` of this machine still runs (this one does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def write_error(target: Path, exc: BaseException, existed: bool) -> OutputError:
    """The ``OutputError`` for a write of ``target`` that failed with ``exc`` (an ``OSError``)."""
    reason = getattr(exc, "strerror", None) or str(exc)
    if getattr(exc, "errno", None) in _FULL:
        free = free_bytes(target.parent)
        reason += f" ({free / 2**20:.1f} MiB free)" if free is not None else ""
        fix = "Free some space, or choose a path on another disk"
    else:
        fix = "Choose a folder you can write to"
    kept = "what was there is kept" if existed else "nothing was written"
    return OutputError(f"cannot write {target}: {reason}; {kept}. {fix}.")


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes an unprivileged writer may still use on ``path``'s disk (the nearest existing folder's), or
    None where unknown."""
    try:
        stats = os.statvfs(existing_ancestor(Path(path).expanduser().absolute()))
    except (OSError, AttributeError):
        return None
    return stats.f_bavail * stats.f_frsize


def existing_ancestor(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


class _Recording:
    """A file whose write errors are remembered: torch.save reports a failed write as a RuntimeError of
    its own, and the ``OSError`` underneath is what says the disk is full."""

    def __init__(self, f: BinaryIO):
        self._f, self.error = f, None

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def flush(self) -> None:
        self._f.flush()


@contextlib.contextmanager
def _beside(target: Path, new: Callable[[Path, str], Path]) -> Iterator[Path]:
    """A temporary file or folder ``new(folder, prefix)`` made beside ``target`` (its folder made if needed)
    for the block to fill and move into place; on an error it is removed, with the folders made, and an
    ``OSError`` becomes ``OutputError``."""
    existed, made = target.exists(), []
    try:
        made = make_folder(target.parent)  # removed again if the write fails
        sweep_stale(target)
        tmp = new(target.parent, temp_prefix(target))
    except OSError as exc:
        remove_made(made)
        raise write_error(target, exc, existed) from exc
    try:
        yield tmp
    except BaseException as exc:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        remove_made(made)
        if isinstance(exc, OSError):
            raise write_error(target, exc, existed) from exc
        raise


def _new_file(parent: Path, prefix: str) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=parent)
    os.close(fd)
    return Path(tmp)


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder named ``prefix`` + random letters, with a plain ``mkdir``'s permissions
    (``mkdtemp``'s would be private, 0700)."""
    while True:
        path = parent / f"{prefix}{uuid.uuid4().hex[:12]}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


@contextlib.contextmanager
def _temporary(target: Path) -> Iterator[Path]:
    """A temporary file beside ``target``, renamed onto it when the block ends without an error."""
    with _beside(target, _new_file) as tmp:
        yield tmp
        mask = os.umask(0)
        os.umask(mask)
        with open(tmp, "rb+") as f:
            os.fchmod(f.fileno(), 0o666 & ~mask)  # what open() would have given (mkstemp gives 0600)
            os.fsync(f.fileno())
        os.replace(tmp, target)


def write_folder(target: Path, fill: Callable[[Path], None]) -> Path:
    """Call ``fill`` on a new folder beside ``target`` and move it into place, replacing ``target`` (which the
    caller has checked may be replaced). A failed write leaves what was there, and arrays memory-mapped from
    ``target`` stay readable meanwhile."""
    with _beside(target, _new_folder) as partial:
        if target.is_dir():  # a folder that was there (empty, or a dataset replaced) keeps its permissions
            os.chmod(partial, stat.S_IMODE(target.stat().st_mode))
        fill(partial)
        if target.exists():
            # Not a temporary name of the sweep's: between the two renames it holds the only copy.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            target.replace(old / target.name)
            try:
                partial.replace(target)
            except BaseException:
                (old / target.name).replace(target)  # what was there goes back
                old.rmdir()
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            partial.replace(target)
    return target


def write_atomically(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write`` on a temporary file beside ``path`` (its folder made if needed), flush it to disk and
    rename it into place."""
    target = Path(path)
    with _temporary(target) as tmp:
        with open(tmp, "wb") as f:
            recording = _Recording(f)
            try:
                write(recording)
                f.flush()
            except Exception as exc:  # noqa: BLE001 - a writer that wrapped the OSError in its own exception
                if recording.error is None:
                    raise
                raise recording.error from exc
    return target


@contextlib.contextmanager
def open_array_atomically(path: str | os.PathLike, shape: tuple[int, ...], dtype) -> Iterator[np.ndarray]:
    """A ``.npy`` file of ``shape`` and ``dtype`` to fill in place, memory-mapped (never held whole in
    memory), renamed into place when the block ends without an error."""
    target = Path(path)
    with _temporary(target) as tmp:
        if int(np.prod(shape)) == 0:  # an empty file cannot be mapped
            array = np.empty(shape, dtype)
            yield array
            with open(tmp, "wb") as f:
                np.save(f, array)
        else:
            array = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
            reserve(tmp)
            yield array
            array.flush()
            del array


def reserve(path: str | os.PathLike) -> None:
    """Allocate a (memory-mapped, still sparse) file's blocks now: a memory map on a disk that fills up
    mid-write kills the process with SIGBUS, where a refused allocation here is an ordinary error."""
    if not hasattr(os, "posix_fallocate"):
        return
    with open(path, "rb+") as f:
        try:
            os.posix_fallocate(f.fileno(), 0, os.fstat(f.fileno()).st_size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise  # the file system cannot reserve (then it is written as before); anything else fails
