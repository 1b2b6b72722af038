"""``Run``: what one homogeneous run holds, built by ``trainer.py`` and read by its epochs, its checkpoints
and its summary (``summary.py``). A record only: it runs nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from neutronorch.config import TrainConfig
from neutronorch.data import Graph
from neutronorch.nn.models import GNN
from neutronorch.nn.precision import Precision
from neutronorch.observe import Spans, StageTable, Utilisation
from neutronorch.orchestration.factory import Threads
from neutronorch.orchestration.mode import Mode
from neutronorch.train.distributed import GradientSync, World
from neutronorch.train.health import Health
from neutronorch.train.metrics_log import MetricLog
from neutronorch.train.optim import Adam
from neutronorch.train.replacing import Replacement
from neutronorch.train.task import Task


@dataclass
class Run:
    """Everything one run holds; its resources are released by the ``ExitStack`` it was built in."""

    config: TrainConfig
    graph: Graph
    device: torch.device
    threads: Threads
    model: GNN
    optimizer: Adam
    mode: Mode
    spans: Spans
    stages: StageTable
    util: Utilisation
    metrics: MetricLog
    task: Task
    history: list = field(default_factory=list)  # the epoch records so far (a resumed run's included)
    # The best evaluation so far: the metric on the validation and test sets, and its epoch.
    best: dict = field(default_factory=lambda: {"val": -float("inf"), "test": float("nan"), "epoch": -1})
    start_epoch: int = 0  # where training starts: > 0, or a mid-epoch start_step, when resumed
    start_step: int = 0
    loss_sum: float = 0.0  # the resumed epoch's loss sum over its first start_step steps
    stop: threading.Event | None = None  # set: finish the step, save, stop (Interrupted)
    stopped_early: bool = False  # --patience ran out
    # Time to the first step: train() entry and the end of the run's first optimizer step (perf_counter),
    # and the seconds of those spent loading the dataset.
    started: float = 0.0
    first_step_at: float | None = None
    data_seconds: float = 0.0
    precision: Precision = field(default_factory=Precision)
    world: World = field(default_factory=World)  # data parallel: this rank among the others
    mode_choice: dict | None = None  # mode auto: the mode chosen, why, and from what (None: the mode was given)
    sync: GradientSync | None = None  # data parallel: the gradient all-reduce and stop agreement
    health: Health = field(default_factory=lambda: Health({}))  # collapse (train/health.py)
    replacing: Replacement = field(default_factory=Replacement)  # the earlier outputs `overwrite` replaces
