"""One training step, the same for every mode, the trainer, the tests and the benchmarks. It must not
synchronise with the device: the loss comes back as a device tensor, read by the caller when it chooses.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Callable, Sequence

import torch
from torch.nn import functional as F

from neutronorch.nn.activation import dropout_keys
from neutronorch.nn.precision import Precision
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.batch import MiniBatch
from neutronorch.orchestration.mode import Mode
from neutronorch.sampling.neighbor_sampler import batch_key, mix_key

# The trainer's own stages (the mode's go on their lanes; see each mode's ``stages``).
TRAINER_STAGES = StageTable({"wait": "trainer", "forward": "trainer", "backward": "trainer",
                             "all_reduce": "trainer", "step": "trainer"},
                            waits=frozenset({"wait"}))
TRAINING_DROPOUT = 0x7479_7065_645F_6470  # mixed into a batch's key: its training forward's dropout key stream


def step_masks(seed: int, epoch: int, index: int) -> AbstractContextManager:
    """Within it, this thread's dropout keys come from global batch ``index`` of ``epoch``'s stream, not from
    torch's generator (a typed model's forward runs in it): a mask is keyed by (that key, the call, the row's
    vertex), so a vertex's mask is one process's whichever rank holds it, and a rank whose part reaches fewer
    types (or none: an empty part) makes fewer calls without moving anything the next steps draw."""
    return dropout_keys(mix_key(batch_key(seed, epoch, index), TRAINING_DROPOUT))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
               mode: Mode, batch: MiniBatch, spans: Spans | None = None, step: int = -1,
               loss_fn: Callable | None = None, precision: Precision | None = None, sync: Callable | None = None,
               masks: Callable[[MiniBatch], AbstractContextManager] | None = None) -> torch.Tensor:
    """Forward, loss (``loss_fn(logits, labels)``, default cross-entropy, from float32 logits), backward and
    step of ``optimizer`` (one, or several that step together) on ``batch``; returns the detached loss. The
    forward runs in ``precision`` and in ``masks(batch)`` (a typed run's dropout keys: ``step_masks``).
    ``sync(batch, loss)``, data parallel, makes the gradients the global batch's before the step and returns
    the global batch's loss, returned instead of this rank's. The batch's host buffer is released."""
    optimizers = optimizer if isinstance(optimizer, Sequence) else (optimizer,)
    stage = (lambda name: spans.stage(name, step)) if spans is not None else (lambda name: nullcontext())
    inputs = mode.step_inputs(batch)
    with stage("forward"):
        with (precision or Precision()).autocast(batch.labels.device), masks(batch) if masks else nullcontext():
            logits = model(*inputs)
        loss = (loss_fn or F.cross_entropy)(logits.float(), batch.labels)
    with stage("backward"):
        for each in optimizers:
            each.zero_grad()
        loss.backward()
    mode.before_step(batch)
    if sync is not None:
        with stage("all_reduce"):
            loss = sync(batch, loss.detach())
    with stage("step"):
        for each in optimizers:
            each.step()
    mode.after_step(batch)
    batch.release()
    return loss.detach()
