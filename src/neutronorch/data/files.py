"""Turning the operating system's refusals to read an input into ``DataError``s that say what to do.

A loader that catches ``OSError`` to report a truncated or damaged file must not tell a user whose file is
merely unreadable to fetch it again: ``read_error`` words a permission problem as one. ``reads_files``
wraps each public loader so that a ``PermissionError`` raised anywhere below it (``open``, ``np.load``, a
memory map, listing a folder) ends as such a ``DataError`` too, naming the path the system refused.
"""

from __future__ import annotations

import functools
import os

from neutronorch.errors import DataError


def permission_message(path) -> str:
    return (f"cannot read {path}: permission denied; give the user running neutronorch read access to it (and "
            f"to the folders above it), e.g. chmod a+r for a file, a+rx for a folder, or run as its owner.")


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
