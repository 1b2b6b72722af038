"""What the trainer needs from a mode, and nothing more (``docs/architecture.md``, "The mode protocol").

Modes are siblings that implement ``Mode``; none inherits from another, and nothing outside a mode branches
on its name. A mode that subclasses ``Mode`` has its step hooks and ``load_state_dict`` do nothing, and its
``state_dict`` hold nothing, unless it overrides them.
"""

from __future__ import annotations

from typing import Iterator, Protocol, runtime_checkable

import torch

from neutronorch.features.cache import FeatureCache
from neutronorch.features.placement import Placement
from neutronorch.features.store import FeatureStore
from neutronorch.nn.splice import HotRows
from neutronorch.observe import StageTable
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.sampling.block import Block


class StepInputs(tuple):
    """The model's arguments for one step, in the order it takes them (``model(*inputs)``): a homogeneous
    graph's ``(blocks, features, hot)``; a typed graph's ``(blocks, features, ids, hot)``, with ``features``
    and ``hot`` by vertex type and ``ids`` every type's input vertices (an embedding table's rows)."""

    def __new__(cls, blocks: list[Block], features: torch.Tensor | dict[str, torch.Tensor],
                hot: HotRows | dict[str, HotRows] | None = None, ids: dict[str, torch.Tensor] | None = None):
        return super().__new__(cls, (blocks, features, hot) if ids is None else (blocks, features, ids, hot))

    blocks = property(lambda self: self[0])
    features = property(lambda self: self[1])


@runtime_checkable
class Mode(Protocol):
    name: str
    stages: StageTable  # the lane of every stage this mode records
    store: FeatureStore | None  # None: a typed graph's modes read its rows without one
    placement: Placement | None  # ... and place nothing by a homogeneous ``Placement``
    cache: FeatureCache | None
    num_batches: int
    threads: dict[str, int]  # the threads of its own stages' kernels, by stage ("sampler", "host")
    resumable: bool  # whether a run can continue from a checkpoint at an epoch boundary
    resumable_mid_epoch: bool  # and within an epoch (``batches(epoch, start)`` with start > 0)
    warm_epochs: int  # the first epochs, slower than the rest (compiling, cold caches): the timeline draws the next

    def start(self, model: torch.nn.Module) -> None:
        """Before the first epoch."""

    def batches(self, epoch: int, start: int = 0) -> Iterator[MiniBatch]:
        """This epoch's mini-batches from number ``start`` on (a resumable mode's; others take 0), as an
        iterator that is also a context manager, produced ahead."""

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        """In the training thread, before the step: the model's inputs, ordered after the batch's copies."""

    def before_step(self, batch: MiniBatch) -> None:
        """After the backward pass, before the optimizer step."""

    def averaged_gradients(self) -> dict[torch.Tensor, torch.Tensor] | None:
        """Data parallel, after ``before_step``: gradients this rank adds that the ranks average with equal
        weights, apart from the loss-weighted mean of the others (by parameter; None: none this step)."""

    def after_step(self, batch: MiniBatch) -> None:
        """After the optimizer step."""

    def end_epoch(self, record: dict) -> None:
        """After each epoch's training (before evaluation), with the epoch's record to add to."""

    def summary(self) -> dict:
        """Mode-specific entries of the run summary."""

    def describe(self) -> str:
        """One line for the run's log: how the mode is set up."""

    def state_dict(self) -> dict:
        """At an epoch boundary: what the mode needs to continue a run exactly (for a checkpoint)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Before ``start``: continue from a checkpoint's ``state_dict()``."""

    def close(self) -> None:
        """After the last epoch, or on any error: stop every thread the mode runs, release what it holds."""
