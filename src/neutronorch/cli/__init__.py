"""Command line: ``neutronorch train | convert | generate | predict | embed | info``.

The only part of neutronorch that prints. Options are validated here (through ``TrainConfig.validate``); a
``NeutronorchError`` is printed as one clear message without a traceback and exits with status 2. The
core names configuration fields in backticks (`batch_size`); here they are shown as the flags a user
types (--batch-size), in errors and in the run's log alike. The core's log (``logging`` logger
``neutronorch``) goes to stderr, and a progress bar shows each epoch's steps.
"""

import os
import signal
import sys

__all__ = ["build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run a command. The environment is checked first (``environment.py``); Ctrl-C while the modules load (torch takes a second or more) is an interruption like
    any other, not a traceback. Output into a pipe whose reader has gone (``neutronorch info DIR | head -1``)
    ends the command quietly, as a Unix tool that SIGPIPE stops: exit status 141, no traceback."""
    from neutronorch.environment import check_environment  # noqa: PLC0415
    from neutronorch.errors import ConfigError  # noqa: PLC0415

    try:
        check_environment()  # before numba is imported: it reads its variables then, and some fail the import
    except ConfigError as exc:
        print(f"neutronorch: error: {exc}", file=sys.stderr)
        return 2
    try:
        from neutronorch.cli.app import main as run  # noqa: PLC0415 - the slow imports, inside the guard
    except KeyboardInterrupt:
        print("neutronorch: interrupted", file=sys.stderr)
        return 130
    try:
        code = run(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would be reported
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 128 + signal.SIGPIPE


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it on the way out does not fail again (Python's docs,
    'Note on SIGPIPE')."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real stdout (replaced by a caller): nothing to flush
        pass
    finally:
        os.close(devnull)


def __getattr__(name: str):
    if name == "build_parser":
        from neutronorch.cli.options import build_parser  # noqa: PLC0415
        return build_parser
    raise AttributeError(f"module 'neutronorch.cli' has no attribute {name!r}")
