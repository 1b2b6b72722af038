"""NeutronOrch's mechanism, one part per module: ``mode.py`` is the mode the trainer drives, and
docs/architecture.md says which thread runs each module and what it owns."""

from neutronorch.orchestration.neutronorch.mode import NeutronOrchMode

__all__ = ["NeutronOrchMode"]
