"""Bounds that user values meet below Python: seeds (64-bit random generators), names (the file system
counts a name's bytes) and switches. Each check raises ``ConfigError`` naming the value, the limit and the
fix; imports nothing of ours but the errors."""

from __future__ import annotations

import os

from neutronorch.errors import ConfigError

SEED_MAX = 2**64 - 1  # numpy's and torch's generators take seeds of 64 bits; a larger one would wrap
NAME_MAX = 255  # bytes in one file or folder name on Linux, macOS and Windows file systems
PATH_MAX = 4096  # bytes in a whole path, on Linux


def check_seed(value, what: str = "`seed`") -> int:
    """``value`` as a seed: a whole number from 0 to 2**64 - 1 (never wrapped, truncated or clamped)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise ConfigError(f"{what} {value!r}: must be a whole number from 0 to {SEED_MAX} (2**64 - 1), the seeds "
                          f"the random generators take.")
    return value


def check_switch(value, what: str) -> bool:
    """``value`` as a switch: True or False, never another value read as one (``shuffle="no"`` is true)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{what} {value!r}: expected True or False, not a {type(value).__name__}.")
    return value


def name_bytes(name: str) -> int:
    """How many bytes ``name`` takes on disk (its UTF-8 encoding, as the file system stores it)."""
    return len(os.fsencode(name))


def name_max(folder: str | os.PathLike, which: str = "PC_NAME_MAX") -> int:
    """The longest name (``PC_PATH_MAX``: path), in bytes, that ``folder``'s file system takes (``NAME_MAX``,
    ``PATH_MAX`` where it does not say)."""
    try:
        return int(os.pathconf(folder, which))
    except (OSError, ValueError, AttributeError):
        return NAME_MAX if which == "PC_NAME_MAX" else PATH_MAX


def shown(name: str, limit: int = 24) -> str:
    """``name`` as an error message shows it: whole, or its start and length when it is long."""
    return repr(name) if len(name) <= limit else f"{name[:limit]!r}... ({len(name)} characters)"
