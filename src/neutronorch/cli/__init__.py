"""Command line: ``neutronorch train | convert | generate | partition | predict | embed | info``, the only part of
neutronorch that prints. A ``NeutronorchError`` is printed as one message without a traceback (status 2);
the core's `field_name` references are shown as the flags a user types (--field-name), in errors and log."""

import contextlib
import os
import signal
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    """Run a command; its exit status. Ctrl-C while the modules load is an interruption like any other,
    and output into a pipe whose reader has gone ends the command quietly (status 141), as SIGPIPE would."""
    from neutronorch.environment import check_environment, choose_wait_policy  # noqa: PLC0415
    from neutronorch.errors import ConfigError  # noqa: PLC0415

    try:
        check_environment()  # before numba is imported: it reads its variables then, and some fail the import
    except ConfigError as exc:
        print(f"neutronorch: error: {exc}", file=sys.stderr)
        return 2
    words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
    if words[:1] in (["train"], ["predict"], ["embed"]):  # commands that compute: before torch loads libgomp
        note = choose_wait_policy()
        if note is not None:
            print(f"note: {note}", file=sys.stderr)
    try:
        from neutronorch.cli.app import main as run  # noqa: PLC0415 - the slow imports, inside the guard
    except KeyboardInterrupt:
        print("neutronorch: interrupted", file=sys.stderr)
        return 130
    try:
        code = run(argv)
        sys.stdout.flush()  # here, not at exit, where a closed pipe would be reported
        return code
    except BrokenPipeError:  # stdout to /dev/null, so that flushing it at exit does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)  # (the signal module's 'Note on SIGPIPE')
        with contextlib.suppress(OSError, ValueError, AttributeError):  # no real stdout: nothing to flush
            os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
