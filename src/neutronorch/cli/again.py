"""What a stopped or failed `train` leaves for the user: the command that continues it, and its last line in
the run's console copy."""

from __future__ import annotations

import contextlib
import os
import shlex


def resume_command(words: list[str] | None, run_name: str | None = None) -> str:
    """The command line that continues a run stopped part-way: train's words as it was started (its data, model
    and training settings; a resumed run must give them again), less ``--overwrite`` (the earlier results are
    this run's now), with ``--resume`` and, where its folder's name was generated, ``--run-name NAME``."""
    if words is None:  # train() called without a command line: say what to add
        return "the same command with --resume" + (f" --run-name {run_name}" if run_name else "")
    kept = [w for w in words if w != "--overwrite"]
    named = any(w == "--run-name" or w.startswith("--run-name=") for w in kept)
    extra = (["--resume"] if "--resume" not in kept else []) + (["--run-name", run_name] if run_name and not named
                                                                 else [])
    return shlex.join(["neutronorch", "train", *kept, *extra])


def to_console_log(path: str | None, text: str) -> None:
    """``text`` (a line the command printed, not logged) at the end of the run's console copy, where the run
    made one (a run that failed before it leaves no folder); a copy that cannot be written loses the line."""
    if path and os.path.isfile(path):
        with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as log:
            log.write(text + "\n")
