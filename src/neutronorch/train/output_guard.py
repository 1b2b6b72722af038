"""Nothing lost: an output never overwrites an input, another output of the same command, or (unless asked)
another run's output, and a run's checkpoint folder is its own while it runs (``claim_folder``). Every
command that writes files calls these checks before it loads any data. It must never write anything but its
probe files (removed at once) and the folder's lock file (removed when the run ends, with the folder when the
lock made it and nothing else is there).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, Mapping

from neutronorch.atomic import (existing_ancestor, free_bytes, host_tag, make_folder, process_running,
                                remove_made, temp_prefix)
from neutronorch.errors import ConfigError, OutputError
from neutronorch.limits import name_bytes, name_max, shown

PathLike = str | os.PathLike
LOCK_NAME = ".neutronorch.lock"
SET_ASIDE = ".neutronorch-replaced-"  # + PID@HOST-RANDOM: an earlier run's outputs, set aside (replacing.py)


def _same(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)  # hard links, bind mounts
    except OSError:
        return False


def _inside(path: Path, folder: Path) -> bool:
    """``path`` lies strictly inside ``folder`` (compared by identity where both exist)."""
    return any(_same(parent, folder) for parent in path.parents)


def _hard_link_inside(path: Path, folder: Path) -> Path | None:
    """The file under ``folder`` that ``path`` is another name of (an existing file with several links)."""
    try:
        found = path.stat()
    except OSError:
        return None
    if not path.is_file() or found.st_nlink < 2:
        return None
    for parent, _, names in os.walk(folder):
        for name in names:
            candidate = Path(parent) / name
            with contextlib.suppress(OSError):
                if os.path.samestat(candidate.lstat(), found):
                    return candidate
    return None


def check_distinct(reads: Mapping[str, Iterable[PathLike]], writes: Mapping[str, Iterable[PathLike]],
                   replaces: Mapping[str, PathLike] | None = None) -> None:
    """Refuse outputs that would destroy an input or each other. ``reads``: field -> the files or folders it
    reads; ``writes``: field -> the files it writes; ``replaces``: field -> a folder written as a whole
    (replaced), which must hold no input."""
    inputs = [(field, Path(p).expanduser().resolve()) for field, paths in reads.items() for p in paths]
    outputs = [(field, Path(p).expanduser().resolve()) for field, paths in writes.items() for p in paths]
    for field, out in outputs:
        for source, path in inputs:
            if _same(out, path):
                raise ConfigError(f"`{field}` {out}: is also read as `{source}`; writing it would destroy that "
                                  f"input. Choose another path.")
            if path.is_dir() and _inside(out, path):
                raise ConfigError(f"`{field}` {out}: lies inside {path}, the folder read as `{source}`; "
                                  f"outputs never go into an input's folder. Choose a path outside it.")
            linked = _hard_link_inside(out, path) if path.is_dir() else None
            if linked is not None:
                raise ConfigError(f"`{field}` {out}: is a hard link to {linked}, in the folder read as `{source}`; "
                                  f"writing it would destroy that input. Choose another path.")
    for i, (field, out) in enumerate(outputs):
        for other, path in outputs[i + 1:]:
            if _same(out, path):
                what = f"`{field}` and `{other}`" if field != other else f"`{field}`"
                raise ConfigError(f"{what} would both write {out}; give each output its own path.")
    for field, folder in (replaces or {}).items():
        folder = Path(folder).expanduser().resolve()
        for source, path in inputs:
            if _same(folder, path) or _inside(path, folder):
                raise ConfigError(f"`{field}` {folder}: holds `{source}` {path}, which writing it would replace. "
                                  f"Choose another folder.")


def check_fresh(writes: Mapping[str, Iterable[PathLike]], overwrite: bool, resume: bool | None = None) -> None:
    """Refuse outputs that already exist (another run's), unless ``overwrite``, or ``resume`` (the run
    that wrote them goes on; None: outputs no run continues, and the message offers no ``resume``)."""
    again = "" if resume is None else " (or continue that run with `resume`)"
    for field, paths in writes.items():
        for path in map(Path, paths):
            if path.is_dir():
                raise ConfigError(f"`{field}` {path}: is a folder; give the path of the file to write.")
            if path.exists() and not (overwrite or resume):
                raise ConfigError(f"`{field}` {path}: already exists (the output of an earlier run?) and is never "
                                  f"replaced silently. Give a new path{again}, or pass `overwrite` to replace it.")


def check_creatable(field: str, path: PathLike, what: str | None = None,
                    fix: str = "Choose a folder you can write to.") -> None:
    """``path`` can be written: its folder exists or can be made, and really takes a new file (one is
    created there and removed: permissions, read-only disks and full inode tables all show). ``what``: how
    the message names the output (default: the field and the path); ``fix``: what it advises."""
    check_name_lengths(field, path, what)
    what = what or f"`{field}` {path}"
    folder = existing_ancestor(Path(path).expanduser().absolute().parent)
    if not folder.is_dir():
        raise ConfigError(f"{what}: cannot be written ({folder} is not a folder). {fix}")
    try:
        fd, probe = tempfile.mkstemp(prefix=".neutronorch-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"{what}: cannot be written ({folder}: {exc.strerror or exc}). {fix}") from None


def check_name_lengths(field: str, path: PathLike, what: str | None = None, temporary: bool = False) -> None:
    """Every name in ``path`` fits its file system's limit, which counts bytes (255 on the common ones; a CJK
    character takes 3), with ``temporary`` the last one with room for the temporary name it is written under
    (``.NAME.tmp-PID@HOST-RANDOM``, ``atomic.py``); and the whole path fits ``PATH_MAX``. ``what``: how the
    message names the output (default: the field)."""
    what = what or f"`{field}`"
    path = Path(path).expanduser()
    folder = existing_ancestor(path.absolute().parent)
    limit = name_max(folder)
    for i, part in enumerate(path.parts):
        if part in (path.anchor, ".", ".."):
            continue
        size, last = name_bytes(part), temporary and i == len(path.parts) - 1
        extra = name_bytes(temp_prefix(Path(part))) + 12 - size if last else 0  # mkstemp's 8 or a folder's 12
        if size + extra > limit:
            written = f", and it is written under a temporary name {extra} bytes longer" if extra else ""
            raise ConfigError(f"{what} {shown(part)}: the name is {size} bytes long in UTF-8{written}; names on "
                              f"this file system take at most {limit} bytes. Give a name of at most "
                              f"{limit - extra} bytes.")
    total = name_bytes(str(path.absolute())) + 64
    if total > name_max(folder, "PC_PATH_MAX"):
        raise ConfigError(f"{what} {shown(str(path))}: the path is {total - 64} bytes long in UTF-8; paths take at "
                          f"most {name_max(folder, 'PC_PATH_MAX')} bytes. Give a shorter path.")


def check_space(field: str, path: PathLike, needed: int) -> None:
    """``path``'s disk has at least ``needed`` bytes free (it is refused before the work, not after)."""
    free = free_bytes(path)
    if free is not None and free < needed:
        raise OutputError(f"`{field}` {path}: needs about {size_text(needed)}, and its disk has {size_text(free)} "
                          f"free. Free some space, or choose a path on another disk.")


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


@contextlib.contextmanager
def claim_folder(field: str, folder: PathLike) -> Iterator[Path]:
    """Hold an exclusive lock on ``folder`` (made if needed) until the block ends; refuse it while another
    process holds it. The lock goes with the process, however it ends, so none is ever left stale; its file
    is removed when the block ends, and the folder too when this lock made it and it holds nothing else."""
    import fcntl  # noqa: PLC0415 - POSIX only; the rest of this module is not

    folder, made = Path(folder), []
    lock = folder / LOCK_NAME
    while True:
        try:
            made = made or make_folder(folder)  # with its missing parents: removed again if the run leaves nothing
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            remove_made(made)
            raise OutputError(f"`{field}` {folder}: cannot be written ({exc.strerror or exc}). Choose a folder you "
                              f"can write to.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(f"`{field}` {folder}: in use by another run (process {holder}); two runs writing "
                              f"one folder would mix their checkpoints. Give this run another folder, or wait "
                              f"for that one to end.") from None
        with contextlib.suppress(OSError):
            if os.path.samestat(os.fstat(fd), lock.stat()):  # still the file the path names
                break
        os.close(fd)  # its holder removed the file as it ended: lock the one there now
    try:
        with contextlib.suppress(OSError):  # who holds it, for the message above; the lock itself is enough
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield folder
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()  # while still held: a run that opened this file meanwhile sees it gone and retries
        os.close(fd)  # releases the lock
        remove_made(made)  # kept when the run wrote anything there


def check_nothing_set_aside(field: str, folder: PathLike) -> None:
    """Refuse ``folder`` while it holds an earlier run's outputs that a run replacing them (``overwrite``)
    set aside and neither put back nor deleted: its process was killed outright. Only the user can say which
    results to keep; a set-aside folder of a run still going is its own."""
    folder = Path(folder).expanduser()
    with contextlib.suppress(OSError):
        for aside in sorted(folder.glob(f"{SET_ASIDE}*")):
            owner, _, _ = aside.name[len(SET_ASIDE):].rpartition("-")
            pid, _, host = owner.partition("@")
            if host == host_tag() and pid.isdigit() and process_running(int(pid)):
                continue
            held = ", ".join(sorted(p.name for p in aside.iterdir())) or "nothing"
            raise ConfigError(f"`{field}` {folder}: holds {aside.name}/, an earlier run's outputs ({held}) that a "
                              f"run with `overwrite` (process {pid or '?'}) set aside and was stopped before it put "
                              f"them back or wrote its own. To keep them: mv {aside}/* {folder}/ (over what that run "
                              f"left); to drop them: rm -r {aside}. Then run again.")
