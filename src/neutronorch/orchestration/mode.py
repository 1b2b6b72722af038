"""What the trainer needs from a mode, and nothing more (``docs/architecture.md``, "The mode protocol").

Modes are siblings that implement ``Mode``; none inherits from another, and nothing outside a mode branches
on its name.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol, runtime_checkable

import torch

from neutronorch.features.cache import FeatureCache
from neutronorch.features.placement import Placement
from neutronorch.features.store import FeatureStore
from neutronorch.nn.splice import HotRows
from neutronorch.observe import StageTable
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.sampling.block import Block
from neutronorch.sampling.neighbor_sampler import batch_key

# Mini-batches per call of a sampler that reads the device once for them all (``reads_grouped``); others
# take one per call, so none waits behind the others.
SAMPLE_GROUP = 4


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

    def load_state_dict(self, state: dict) -> None:
        """Before ``start``: continue from a checkpoint's ``state_dict()``."""

    def close(self) -> None:
        """After the last epoch, or on any error: stop every thread the mode runs, release what it holds."""


class LoadingMode:
    """What exact and device mode share (a mixin, not a mode): batches sampled by ``new_sampler()``'s sampler
    (seeds on ``sample_device``, on ``sample_stream`` if any) and loaded by ``loader`` on a producer thread
    named after it, each depending only on (seed, epoch, batch); no step hooks."""

    resumable = resumable_mid_epoch = True
    producer_threads: int | None = None  # the producer's numba threads (None: numba's count)
    new_sampler: Callable[[], object]
    sample_device = torch.device("cpu")
    sample_stream = None

    def __init__(self, seeds, loader, sampling, spans):
        self.seeds, self.loader, self.sampling, self.spans = seeds, loader, sampling, spans
        self.store, self.placement, self.cache = loader.store, loader.placement, loader.cache
        self.num_batches = seeds.num_batches

    def batches(self, epoch: int, start: int = 0) -> Prefetcher:
        return Prefetcher(lambda: self._produce(epoch, start), depth=self.sampling.prefetch,
                          name=self.loader.producer, threads=self.producer_threads)

    def _produce(self, epoch: int, start: int) -> Iterator:
        sampler = self.seeds.sampler(self.new_sampler())
        batches = self.seeds.epoch(epoch)
        with torch.cuda.stream(self.sample_stream):  # None: a no-op
            size = SAMPLE_GROUP if getattr(sampler, "reads_grouped", False) else 1
            for first in range(start, len(batches), size):
                group = [(index, batches[index]) for index in range(first, min(first + size, len(batches)))]
                with self.spans.stage("sample", first if size == 1 else -1):
                    device = self.sample_device
                    seeds = [batch.seeds.to(device, non_blocking=True) for _, batch in group]
                    subgraphs = sampler.sample_many(seeds, [batch_key(self.sampling.seed, epoch, index)
                                                            for index, _ in group])
                    subgraphs = [subgraph if batch.exclude is None else  # a link task's seed edges
                                 self.seeds.exclude(subgraph, batch.exclude.to(device, non_blocking=True))
                                 for (_, batch), subgraph in zip(group, subgraphs)]
                for (index, batch), subgraph in zip(group, subgraphs):
                    yield self.loader.load(epoch, index, subgraph, targets=batch.targets)

    def start(self, model: torch.nn.Module) -> None:
        self.loader.start(model)

    def step_inputs(self, batch: MiniBatch) -> StepInputs:
        """The trainer's first call on a batch: its stream waits for the batch's copies."""
        batch.wait()
        return StepInputs(batch.blocks, batch.features, None, batch.ids)

    def summary(self) -> dict:
        return self.loader.summary()

    def close(self) -> None:
        self.loader.close()

    def before_step(self, batch: MiniBatch) -> None:
        pass

    def averaged_gradients(self) -> None:
        return None

    def after_step(self, batch: MiniBatch) -> None:
        pass

    def end_epoch(self, record: dict) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
