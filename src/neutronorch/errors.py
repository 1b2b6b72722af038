"""User-facing errors.

Every problem a user can fix (bad file, bad option, missing device) raises a subclass of
``NeutronorchError`` whose message says what is wrong and how to fix it. The CLI prints these without a
traceback; anything else escaping is a bug and keeps its traceback.
"""


class NeutronorchError(Exception):
    """A problem the user can fix; the message says how."""


class DataError(NeutronorchError):
    """A dataset file is missing, truncated or inconsistent."""


class ConfigError(NeutronorchError):
    """An option or a combination of options makes no sense."""


class OutputError(ConfigError):
    """An output cannot be written: no space left, no permission, a read-only disk. Found before the work
    starts where it can be; a write that fails later keeps the previous file and says what was saved."""


class CheckpointError(NeutronorchError):
    """A checkpoint is missing, unreadable, from a newer neutronorch, or does not fit the data."""


class Interrupted(NeutronorchError):
    """The run was asked to stop (SIGINT, SIGTERM); its last step was finished and saved."""


class TrainingError(NeutronorchError):
    """Training cannot go on (the loss diverged)."""
