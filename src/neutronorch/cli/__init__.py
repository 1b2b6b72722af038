"""Command line: ``neutronorch train | convert | generate | predict | embed | info``.

The only part of neutronorch that prints. Options are validated here (through ``TrainConfig.validate``); a
``NeutronorchError`` is printed as one clear message without a traceback and exits with status 2. The
core names configuration fields in backticks (`batch_size`); here they are shown as the flags a user
types (--batch-size), in errors and in the run's log alike. The core's log (``logging`` logger
``neutronorch``) goes to stderr, and a progress bar shows each epoch's steps.
"""

import sys

__all__ = ["as_flags", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    """Run a command; Ctrl-C while the modules load (torch takes a second or more) is an interruption like
    any other, not a traceback."""
    try:
        from neutronorch.cli.app import main as run  # noqa: PLC0415 - the slow imports, inside the guard
    except KeyboardInterrupt:
        print("neutronorch: interrupted", file=sys.stderr)
        return 130
    return run(argv)


def __getattr__(name: str):
    if name == "as_flags":
        from neutronorch.cli.app import as_flags  # noqa: PLC0415
        return as_flags
    if name == "build_parser":
        from neutronorch.cli.options import build_parser  # noqa: PLC0415
        return build_parser
    raise AttributeError(f"module 'neutronorch.cli' has no attribute {name!r}")
