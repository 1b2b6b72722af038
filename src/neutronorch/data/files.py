"""Opening a dataset's files (a dataset folder is written whole by ``atomic.write_folder``).
``open_npy`` is the one way a ``.npy`` array is opened (memory-mapped, never unpickled). ``read_error`` words
a permission problem as one, never as a damaged file to fetch again; ``reads_files`` makes a
``PermissionError`` escaping a public loader such a ``DataError``."""

from __future__ import annotations

import functools
import mmap
import os
import threading
from pathlib import Path
from typing import Callable

import numpy as np

from neutronorch.errors import DataError, not_a_file, permission_message

REFETCH = "The dataset is incomplete or damaged; fetch it again."
# progress(what, done, total): bytes of the file being read (an edge file built a chunk at a time: read twice).
Progress = Callable[[str, int, int], None]


def read_error(path, exc: BaseException, problem: str) -> DataError:
    """The error for ``exc`` raised while reading ``path``: a permission problem as such, anything else as
    ``problem`` (the message for a damaged file, naming its fix)."""
    if isinstance(exc, PermissionError):
        return DataError(permission_message(exc.filename or path))
    return DataError(problem)


def holds_objects(exc: BaseException) -> bool:
    """Whether numpy refused a ``.npy`` array because it holds Python objects (``allow_pickle=False``, or a
    memory map of an object dtype, empty or not): numpy's advice to load the pickle is never passed on."""
    return isinstance(exc, ValueError) and ("allow_pickle" in str(exc) or "Python objects in dtype" in str(exc))


def reads_files(loader):
    """Let a ``PermissionError`` escaping ``loader`` become a ``DataError`` naming the refused path (or the
    loader's first argument when the system names none)."""
    @functools.wraps(loader)
    def wrapper(*args, **kwargs):
        try:
            return loader(*args, **kwargs)
        except PermissionError as exc:
            path = exc.filename or (os.fspath(args[0]) if args and isinstance(args[0], (str, os.PathLike)) else "")
            raise DataError(permission_message(path or "an input file")) from None

    return wrapper


def present(path: Path, what: str, fix: str = REFETCH) -> Path:
    """``path``, or a ``DataError`` saying the file (``what``: its role) is missing, and ``fix``."""
    if not path.is_file():
        raise DataError(f"{path}: {not_a_file(path, 'file is missing')}; it holds {what}. {fix}")
    return path


# numpy reads a .npy header with ``ast.literal_eval``, which CPython 3.11 can fail with a spurious SystemError ("AST
# constructor recursion depth mismatch", python/cpython#106905) when threads parse at once (the ranks of a
# partitioned run held by threads of one process open their parts together): one thread opens a file at a time.
_HEADER_LOCK = threading.Lock()


def release_pages(array: np.ndarray) -> None:
    """Let go of this process's resident pages of ``array``'s file mapping (``open_npy``'s), for a file read once
    and not again soon: its pages stay in the page cache, and a later read maps them again. Nothing for an array
    in memory, or where the system offers no such advice."""
    mapped = getattr(array, "_mmap", None)
    if mapped is not None and hasattr(mmap, "MADV_DONTNEED"):
        mapped.madvise(mmap.MADV_DONTNEED)


def open_npy(path: Path, what: str, fix: str = REFETCH, mmap: bool = True) -> np.ndarray:
    """The ``.npy`` array at ``path`` (``what``: its role), a read-only memory map unless ``mmap`` is False;
    plain numbers only: a pickle is refused, never loaded. ``fix`` ends every error."""
    present(path, what, fix)
    try:
        with _HEADER_LOCK:
            return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except OSError as exc:
        raise read_error(path, exc, f"{path}: cannot be opened ({exc}). {fix}") from None
    except Exception as exc:  # noqa: BLE001 - a damaged header fails in many ways (EOF, tokenizer, syntax)
        if holds_objects(exc):  # numpy's advice would run the pickle
            raise DataError(f"{path}: holds pickled Python objects, not numbers; it holds {what} as plain "
                            f"numbers. {fix}") from None
        raise DataError(f"{path}: cannot be read as a .npy array ({type(exc).__name__}: {exc}); the file is "
                        f"truncated or not a .npy file. {fix}") from None
