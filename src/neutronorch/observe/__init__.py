"""Where the time goes: stage spans on lanes, processor utilisation and their pictures. A leaf package: it
imports nothing of neutronorch, so every other part may record into it; modes and the trainer declare their
own stages with a ``StageTable``."""

from neutronorch.observe.report import epoch_table, reuse_line, reuse_summary, write_timeline
from neutronorch.observe.spans import LANES, Spans, StageTable
from neutronorch.observe.utilisation import Utilisation

__all__ = ["LANES", "Spans", "StageTable", "Utilisation", "epoch_table", "reuse_line", "reuse_summary", "write_timeline"]
