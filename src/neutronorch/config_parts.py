"""The parts a run's configuration is made of, each the settings one component takes.

``TrainConfig`` (config.py) is composed of these parts plus the few settings of the run as a whole. Each part
is a frozen dataclass: a component handed one cannot change the run's configuration, and a copy of a
``TrainConfig`` shares its parts safely. Two kinds of field:

- *settings* (``setting``/``may_change``): what a user gives, by keyword (``TrainConfig(fanouts=[15, 10])``),
  on the command line or in a config file's section named after the part (``[sampling]``). Each states once
  whether a resumed run may change it.
- *resolved* (``resolved``): what the run works out when it starts (a data-parallel rank, whether blocks
  carry degrees); never a setting, never saved.

Like config.py, this module uses nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# The field metadata every setting carries: may a resumed run change it (``TrainConfig.resume_may_change``)?
_FIXED = {"resume": "fixed"}
_MAY_CHANGE = {"resume": "may change"}
_RESOLVED = {"resolved": True}


def setting(default=None, *, factory=None):
    """A setting a resumed run must keep: it changes the model or the training."""
    if factory is not None:
        return field(default_factory=factory, metadata=_FIXED)
    return field(default=default, metadata=_FIXED)


def may_change(default):
    """A setting a resumed run may change: where outputs go, how the run reports, how long it trains, its
    threads and where it runs; results do not depend on them."""
    return field(default=default, metadata=_MAY_CHANGE)


def resolved(default):
    """Worked out when the run starts (``dataclasses.replace`` on the part); not a setting."""
    return field(default=default, metadata=_RESOLVED)


def settings_of(part) -> list:
    """The ``dataclasses.Field`` of every setting of a part (a class or an instance), in order."""
    return [f for f in fields(part) if not f.metadata.get("resolved")]


@dataclass(frozen=True)
class NetworkConfig:
    """The model: which architecture, its widths and its regularisation."""

    model: str = setting("sage")
    layers: int = setting(0)  # 0: one per `fanouts` entry; N with a single fanout repeats it N times
    hidden: int = setting(256)
    heads: int = setting(4)
    gcn_norm: str = setting("symmetric")
    residual: bool = setting(False)  # skip connections around every layer but the output layer
    norm: str = setting("none")  # between layers, before the activation: none, layer or batch
    architecture: str = setting("plain")  # plain (a stack of layers) or blocks (residual graph blocks, nn/blocks.py)
    dropout: float = setting(0.7)


@dataclass(frozen=True)
class SamplingConfig:
    """How mini-batches are drawn: the modes' and the cache ranking's part of the configuration."""

    fanouts: list[int] = setting(factory=lambda: [10, 10])  # seed hop first
    batch_size: int = setting(0)  # 0: auto_batch_size(training seeds); the run resolves it (never 0 in a mode)
    seed: int = setting(0)  # also seeds the model's initial weights
    prefetch: int = may_change(2)
    degrees: bool = resolved(False)  # blocks carry their sources' graph degrees (the model normalises by them)
    rank: int = resolved(0)  # data parallel: this rank trains part ``rank`` of each global batch of batch_size * world
    world: int = resolved(1)
    file_order: bool = resolved(False)  # host samplers read the topology in file order (``read_order``)
    shuffle: bool = resolved(True)  # False: every epoch takes the seeds in their given order (``NeighborLoader``)
    sampler_threads: int = may_change(0)


@dataclass(frozen=True)
class OptimizationConfig:
    """How long and how the weights are trained."""

    epochs: int = may_change(50)
    lr: float = setting(0.003)
    weight_decay: float | None = setting(None)  # None: the task's (``TASK_WEIGHT_DECAY``), resolved by validate
    patience: int = may_change(0)  # stop after this many evaluations without a better validation score (0: never)


@dataclass(frozen=True)
class EvaluationConfig:
    """What evaluation scores and how it samples."""

    metric: str = setting("auto")  # accuracy, rocauc, f1-micro, f1-macro; auto: the dataset's (train/task.py)
    eval_every: int = may_change(1)
    eval_fanouts: list[int] | None = may_change(None)
    eval_batch_size: int = may_change(4096)
    eval_max_nodes: int = may_change(0)  # 0: every validation and test vertex


@dataclass(frozen=True)
class LinkConfig:
    """A link task's part (``task="link"``): how pairs are scored, and the negatives of each positive."""

    link_head: str = setting("dot")  # dot or mlp (nn/link.py)
    negatives: int = setting(1)  # destinations drawn per training positive
    eval_negatives: int = may_change(100)  # drawn per evaluation positive where the data stores none
    link_direction: str = setting("auto")  # auto, undirected or directed: an edge and its reverse in edges:... splits


@dataclass(frozen=True)
class NeutronOrchConfig:
    """NeutronOrch mode's part of the configuration."""

    super_batch: int = setting(8)
    hot_ratio: str | float = setting("auto")
    staleness_bound: int | None = setting(None)  # None: 2 * super_batch - 1 (``resolved_staleness``)
    hot_grad: str = setting("cpu")
    hot_error_budget: float = setting(0.02)
    snapshot_lead: int | None = setting(None)  # None: auto (2 steps, more while the trainer waits for hot rows)
    hot_set: str = setting("rank")  # data parallel: rows hot on several ranks of a node computed by each or once
    host_threads: int = may_change(0)

    @property
    def resolved_staleness(self) -> int:
        """The staleness bound in optimizer steps; by default 2P-1, the smallest that lets the host compute
        super-batch s+1's hot embeddings during all of super-batch s."""
        return 2 * self.super_batch - 1 if self.staleness_bound is None else self.staleness_bound


@dataclass(frozen=True)
class PlacementConfig:
    """Where data lives and how it is read: the placement's and the feature store's part."""

    gpu_memory_gb: float | None = setting(None)  # None: the device's memory
    gpu_cache_gb: str | float = setting("auto")  # auto: as much as the budget holds (CUDA), none on the CPU; 0: none
    cache_policy: str = setting("presample")
    device_sampling: str = setting("auto")  # neutronorch: bottom hop sampled on the device (auto: on CUDA)
    read_order: str = setting("auto")  # memory-mapped features and topology: file order when they may not fit
    host_cache_gb: str | float = setting("auto")  # memory-mapped features: hottest rows in memory
    host_cache_dir: str | None = setting(None)  # the host cache's file of cold rows (None: next to the features)
    embedding_storage: str = may_change("auto")  # typed graphs' embedding tables: memory, mmap (files) or auto
    embedding_dir: str | None = may_change(None)  # mmap tables' files (None: checkpoint_dir, else the temp folder)


@dataclass(frozen=True)
class OutputConfig:
    """What the run keeps: its summary and checkpoints."""

    summary_json: str | None = may_change(None)
    checkpoint_dir: str | None = may_change(None)  # last.pt after every epoch, best.pt at each better score
    checkpoint_every: int = may_change(0)  # also write last.pt every this many steps (0: at epoch ends only)
    resume: bool = may_change(False)  # continue from checkpoint_dir/last.pt
    overwrite: bool = may_change(False)  # replace an earlier run's outputs (summary, logs, timeline, checkpoints)


@dataclass(frozen=True)
class LogConfig:
    """How the run reports while it trains: the metric logs, the timeline and what the command line shows."""

    log_jsonl: str | None = may_change(None)
    log_csv: str | None = may_change(None)
    tensorboard: str | None = may_change(None)
    log_every: int = may_change(20)
    timeline: str | None = may_change(None)  # .png; the raw spans go next to it as .json
    timeline_steps: int = may_change(40)
    progress: bool = may_change(True)  # the command line's progress bar (train() reports through its callback)
    stage_table: bool = may_change(True)


# TrainConfig's parts: the attribute each is held under, and its class. A config file's sections take these names.
PARTS = {"network": NetworkConfig, "sampling": SamplingConfig, "optimization": OptimizationConfig,
         "evaluation": EvaluationConfig, "link": LinkConfig, "neutronorch": NeutronOrchConfig, "placement": PlacementConfig,
         "outputs": OutputConfig, "logging": LogConfig}
