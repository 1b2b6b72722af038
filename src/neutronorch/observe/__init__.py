"""Where the time goes: stage spans on lanes, processor utilisation and their pictures.

A leaf package: it imports nothing of neutronorch, so every other part (modes, the trainer, benchmarks)
may record into it without an import cycle. Modes and the trainer each declare their own stages with a
``StageTable``; this package only records spans and interprets them through such tables.
"""

from neutronorch.observe.report import epoch_table, write_timeline
from neutronorch.observe.spans import LANES, Spans, StageTable
from neutronorch.observe.utilisation import Utilisation

__all__ = ["LANES", "Spans", "StageTable", "Utilisation", "epoch_table", "write_timeline"]
