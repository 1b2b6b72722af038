"""What a failed `train` leaves for the user: its last line in the run's console copy."""

from __future__ import annotations

import contextlib
import os


def to_console_log(path: str | None, text: str) -> None:
    """``text`` (a line the command printed, not logged) at the end of the run's console copy, where the run
    made one (a run that failed before it leaves no folder); a copy that cannot be written loses the line."""
    if path and os.path.isfile(path):
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as log:
            log.write(text + "\n")
