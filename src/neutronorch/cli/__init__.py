"""Command line: ``neutronorch train | convert | generate | predict | embed | info``.

The only part of neutronorch that prints. Options are validated here (through ``TrainConfig.validate``); a
``NeutronorchError`` is printed as one clear message without a traceback and exits with status 2. The
core names configuration fields in backticks (`batch_size`); here they are shown as the flags a user
types (--batch-size), in errors and in the run's log alike. The core's log (``logging`` logger
``neutronorch``) goes to stderr, and a progress bar shows each epoch's steps.
"""

from neutronorch.cli.app import as_flags, main
from neutronorch.cli.options import build_parser

__all__ = ["as_flags", "build_parser", "main"]
