"""User-facing errors: every problem a user can fix raises a ``NeutronorchError`` whose message says what is
wrong and how to fix it; the CLI prints it without a traceback. Anything else escaping is a bug."""


class NeutronorchError(Exception):
    """A problem the user can fix; the message says how."""


class DataError(NeutronorchError):
    """A dataset file is missing, truncated or inconsistent."""


class ConfigError(NeutronorchError):
    """An option or a combination of options makes no sense."""


class OutputError(ConfigError):
    """An output cannot be written (no space left, no permission, a read-only disk)."""


class CheckpointError(NeutronorchError):
    """A checkpoint is missing, unreadable, from a newer neutronorch, or does not fit the data."""


class Interrupted(NeutronorchError):
    """The run was asked to stop (SIGINT, SIGTERM); its last step was finished and saved."""


class TrainingError(NeutronorchError):
    """Training cannot go on (the loss diverged)."""


def permission_message(path) -> str:
    return (f"cannot read {path}: permission denied; give the user running neutronorch read access to it (and "
            f"to the folders above it), e.g. chmod a+r for a file, a+rx for a folder, or run as its owner.")


def not_a_file(path, missing: str) -> str:
    """Why ``path``, which is no regular file, cannot be read as one: ``missing`` (the caller's wording) when
    nothing is there, else what is there instead. A folder or a named pipe is never called missing, and a
    pipe is never opened (reading one waits for a writer)."""
    import os
    import stat

    try:
        mode = os.stat(path).st_mode
    except OSError:
        return missing
    if stat.S_ISDIR(mode):
        return "is a folder, not a file"
    kind = "a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
    return f"is {kind}, not a regular file"
