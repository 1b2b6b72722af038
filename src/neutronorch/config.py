"""Training configuration: one dataclass, validated once at the edge (CLI, config file or API).

The core trusts a ``TrainConfig`` that passed ``validate``; it never re-checks arguments.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, fields

from neutronorch.config_keys import read_config_mapping
from neutronorch.errors import ConfigError
from neutronorch.nn.names import ARCHITECTURES, GCN_NORMS, MODELS, NORMS, PRECISIONS, needs_degrees
from neutronorch.sampling.fanouts import parse_fanouts

MODES = ("exact", "device", "neutronorch")
MODE_CHOICES = MODES + ("auto",)  # auto: one of MODES, chosen when the run starts (orchestration/choice.py)
METRICS = ("accuracy", "rocauc", "f1-micro", "f1-macro")
HOT_GRADS = ("stop", "cpu")
HOT_SETS = ("node", "rank")
DEVICES = ("auto", "cpu", "cuda")
CACHE_POLICIES = ("presample", "degree")
DEVICE_SAMPLING = ("auto", "on", "off")
READ_ORDERS = ("auto", "file", "batch")


def may_change(default):
    """A setting a resumed run may change (``TrainConfig.resume_may_change``): where outputs go, how the run
    reports, how long it trains, its threads and where it runs; results do not depend on them. Every other
    setting changes the model or the training, and a resume with another value is refused."""
    return field(default=default, metadata={"resume": "may change"})


@dataclass
class TrainConfig:
    dataset: str = may_change("synthetic")
    split: str | None = None
    model: str = "sage"
    fanouts: list[int] = field(default_factory=lambda: [10, 10])
    hidden: int = 256
    heads: int = 4
    gcn_norm: str = "symmetric"
    residual: bool = False  # skip connections around every layer but the output layer
    architecture: str = "plain"  # plain (a stack of layers) or blocks (residual graph blocks, nn/blocks.py)
    norm: str = "none"  # between layers, before the activation: none, layer or batch
    layers: int = 0  # 0: one per `fanouts` entry; N with a single fanout repeats it N times
    metric: str = "auto"  # accuracy, rocauc, f1-micro, f1-macro; auto: the dataset's (see train/task.py)
    split_index: int = 0  # which of the dataset's stored splits (the heterophilous .npz files hold 10)
    batch_size: int = 0  # 0: auto_batch_size(number of training seeds)
    epochs: int = may_change(50)
    lr: float = 0.003
    weight_decay: float = 5e-3
    dropout: float = 0.7
    seed: int = 0
    device: str = may_change("auto")
    precision: str = may_change("fp32")  # fp32, bf16 or auto (bf16 where the device has it natively); nn/precision.py
    mode: str = "exact"  # exact, device, neutronorch, or auto (chosen when the run starts)
    eval_every: int = may_change(1)
    eval_fanouts: list[int] | None = may_change(None)
    eval_batch_size: int = may_change(4096)
    eval_max_nodes: int = may_change(0)  # 0: every validation and test vertex
    patience: int = may_change(0)  # stop after this many evaluations without a better validation accuracy (0: never)
    prefetch: int = may_change(2)
    threads: int = may_change(0)
    sampler_threads: int = may_change(0)
    # NeutronOrch mode
    super_batch: int = 8
    hot_ratio: str | float = "auto"
    staleness_bound: int | None = None  # None: 2 * super_batch - 1
    hot_grad: str = "cpu"
    hot_error_budget: float = 0.02
    snapshot_lead: int | None = None  # None: auto (2 steps, more while the trainer waits for hot rows)
    hot_set: str = "rank"  # data parallel: rows hot on several ranks of a node computed by each ("rank") or once
    host_threads: int = may_change(0)
    # Placement on the device (CUDA; see features/placement.py)
    gpu_memory_gb: float | None = None  # None: the device's memory
    gpu_cache_gb: str | float = "auto"  # auto: as much as the budget holds (CUDA), none on the CPU; 0: none
    cache_policy: str = "presample"
    device_sampling: str = "auto"  # neutronorch: bottom hop sampled on the device (auto: on CUDA)
    read_order: str = "auto"  # memory-mapped features and topology: file order when they may not fit in memory
    host_cache_gb: str | float = "auto"  # memory-mapped features: hottest rows in memory (auto: when they do not fit)
    host_cache_dir: str | None = None  # the host cache's file of cold rows (None: next to the features)
    # Observation
    summary_json: str | None = may_change(None)
    timeline: str | None = may_change(None)  # .png; the raw spans go next to it as .json
    timeline_steps: int = may_change(40)
    log_jsonl: str | None = may_change(None)
    log_csv: str | None = may_change(None)
    tensorboard: str | None = may_change(None)
    log_every: int = may_change(20)
    checkpoint_dir: str | None = may_change(None)  # last.pt after every epoch, best.pt at each better validation score
    checkpoint_every: int = may_change(0)  # also write last.pt every this many steps (0: at epoch ends only)
    resume: bool = may_change(False)  # continue from checkpoint_dir/last.pt
    overwrite: bool = may_change(False)  # replace an earlier run's outputs (summary, logs, timeline, checkpoints)
    progress: bool = may_change(True)  # the command line's progress bar (train() reports through its callback instead)
    dist_timeout: float = may_change(600.0)  # data parallel: seconds a collective waits for the other ranks
    stage_table: bool = may_change(True)

    @classmethod
    def resume_may_change(cls) -> frozenset[str]:
        """The settings a resumed run may change (declared with ``may_change``)."""
        return frozenset(f.name for f in fields(cls) if f.metadata.get("resume") == "may change")

    def validate(self) -> "TrainConfig":
        """Normalise and check every field; raise ``ConfigError`` saying how to fix the first problem."""
        _check_types(self)
        self.fanouts = parse_fanouts(self.fanouts)
        if self.layers < 0:
            raise ConfigError(f"`layers` {self.layers}: must be 0 (one per `fanouts` entry) or a number of layers.")
        if self.layers and len(self.fanouts) == 1:
            self.fanouts = self.fanouts * self.layers
        elif self.layers and len(self.fanouts) != self.layers:
            raise ConfigError(f"`layers` {self.layers} but `fanouts` has {len(self.fanouts)} entries: give one "
                              f"fanout per layer, or a single fanout to use in every layer.")
        if self.eval_fanouts is not None:
            self.eval_fanouts = parse_fanouts(self.eval_fanouts, field="eval_fanouts")
            if self.layers and len(self.eval_fanouts) == 1:
                self.eval_fanouts = self.eval_fanouts * self.layers
            if len(self.eval_fanouts) != len(self.fanouts):
                raise ConfigError(f"`eval_fanouts` has {len(self.eval_fanouts)} entries but the model has "
                                  f"{len(self.fanouts)} layers (one per `fanouts` entry).")
        self.hot_ratio = _parse_hot_ratio(self.hot_ratio)
        self.gpu_cache_gb = _parse_cache_size(self.gpu_cache_gb)
        self.host_cache_gb = _parse_cache_size(self.host_cache_gb, "host_cache_gb", "host")
        checks = [
            (self.model in MODELS, f"`model` {self.model!r}: choose one of {', '.join(MODELS)}."),
            (self.mode in MODE_CHOICES, f"`mode` {self.mode!r}: choose one of {', '.join(MODE_CHOICES)}."),
            (self.device in DEVICES, f"`device` {self.device!r}: choose one of {', '.join(DEVICES)}."),
            (self.precision in PRECISIONS,
             f"`precision` {self.precision!r}: choose one of {', '.join(PRECISIONS)}."),
            (self.batch_size >= 0, f"`batch_size` {self.batch_size}: must be a positive number of seeds "
                                   f"(or 0 to choose from the training-set size)."),
            (self.eval_batch_size >= 1, f"`eval_batch_size` {self.eval_batch_size}: must be positive."),
            (self.eval_max_nodes >= 0, f"`eval_max_nodes` {self.eval_max_nodes}: must be 0 (every vertex) or "
                                       f"a positive number of vertices per set."),
            (self.hidden >= 1, f"`hidden` {self.hidden}: must be positive."),
            (self.heads >= 1, f"`heads` {self.heads}: must be positive."),
            (self.gcn_norm in GCN_NORMS, f"`gcn_norm` {self.gcn_norm!r}: choose one of {', '.join(GCN_NORMS)}."),
            (self.norm in NORMS, f"`norm` {self.norm!r}: choose one of {', '.join(NORMS)}."),
            (self.architecture in ARCHITECTURES,
             f"`architecture` {self.architecture!r}: choose one of {', '.join(ARCHITECTURES)}."),
            (not (self.residual and self.architecture == "blocks"),
             "`residual`: graph blocks are residual already; give `residual` with `architecture` plain only."),
            (self.metric in ("auto",) + METRICS, f"`metric` {self.metric!r}: choose auto or one of "
                                                  f"{', '.join(METRICS)}."),
            (self.split_index >= 0, f"`split_index` {self.split_index}: must be 0 or more."),
            (self.model != "gat" or self.heads < 1 or self.hidden % self.heads == 0,
             f"`hidden` {self.hidden} is not divisible by `heads` {self.heads}; GAT splits the hidden width "
             f"evenly across heads."),
            (self.epochs >= 0, f"`epochs` {self.epochs}: must be zero or more."),
            (0 < self.lr < math.inf, f"`lr` {self.lr}: must be a finite positive number."),
            (self.weight_decay >= 0, f"`weight_decay` {self.weight_decay}: must be zero or more."),
            (0 <= self.dropout < 1, f"`dropout` {self.dropout}: must be in [0, 1)."),
            (self.eval_every >= -1, f"`eval_every` {self.eval_every}: must be -1 (never), 0 (after the last "
                                    f"epoch only) or more."),
            (self.prefetch >= 1, f"`prefetch` {self.prefetch}: must be at least 1."),
            (self.patience >= 0, f"`patience` {self.patience}: must be 0 (never stop early) or a number of "
                                 f"evaluations."),
            (not self.patience or self.eval_every > 0,
             "`patience` counts evaluations without a better validation accuracy: give `eval_every` 1 or "
             "more."),
            (self.threads >= 0 and self.sampler_threads >= 0 and self.host_threads >= 0,
             "`threads`/`sampler_threads`/`host_threads` must be >= 0 (0 picks automatically)."),
            (self.hot_grad in HOT_GRADS, f"`hot_grad` {self.hot_grad!r}: choose one of {', '.join(HOT_GRADS)}."),
            (self.hot_set in HOT_SETS, f"`hot_set` {self.hot_set!r}: choose one of {', '.join(HOT_SETS)}."),
            (self.snapshot_lead is None or self.snapshot_lead >= 0,
             f"`snapshot_lead` {self.snapshot_lead}: must be zero or more optimizer steps."),
            (self.hot_error_budget > 0, f"`hot_error_budget` {self.hot_error_budget}: must be positive."),
            (self.gpu_memory_gb is None or self.gpu_memory_gb > 0,
             f"`gpu_memory_gb` {self.gpu_memory_gb}: must be a positive number of GiB (the device memory "
             f"this run may use)."),
            (self.read_order in READ_ORDERS,
             f"`read_order` {self.read_order!r}: choose one of {', '.join(READ_ORDERS)}."),
            (self.cache_policy in CACHE_POLICIES,
             f"`cache_policy` {self.cache_policy!r}: choose one of {', '.join(CACHE_POLICIES)}."),
            (self.device_sampling in DEVICE_SAMPLING,
             f"`device_sampling` {self.device_sampling!r}: choose one of {', '.join(DEVICE_SAMPLING)}."),
            (self.super_batch >= 1, f"`super_batch` {self.super_batch}: must be at least 1 mini-batch."),
            (0 < self.dist_timeout < math.inf, f"`dist_timeout` {self.dist_timeout}: must be a positive number "
                                                 f"of seconds."),
            (self.timeline_steps >= 1, f"`timeline_steps` {self.timeline_steps}: must be at least 1."),
            (self.log_every >= 1, f"`log_every` {self.log_every}: must be at least 1 step."),
            (self.checkpoint_every >= 0, f"`checkpoint_every` {self.checkpoint_every}: must be 0 (epoch ends "
                                         f"only) or a number of steps."),
            (not self.checkpoint_every or bool(self.checkpoint_dir),
             "`checkpoint_every` writes `checkpoint_dir`/last.pt: give `checkpoint_dir` too."),
            (not self.resume or bool(self.checkpoint_dir),
             "`resume` continues from `checkpoint_dir`/last.pt: give `checkpoint_dir` too."),
            (self.staleness_bound is None or self.staleness_bound >= self.super_batch - 1,
             f"`staleness_bound` {self.staleness_bound} is below `super_batch` {self.super_batch} minus 1: the "
             f"last mini-batch of a super-batch reuses hot embeddings at least P-1 = {self.super_batch - 1} "
             f"optimizer steps old. Raise `staleness_bound` to at least {self.super_batch - 1}, or lower "
             f"`super_batch`."),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        return self

    @property
    def resolved_staleness(self) -> int:
        """The staleness bound in optimizer steps; by default 2P-1, the smallest that lets the host compute
        super-batch s+1's hot embeddings during all of super-batch s."""
        return 2 * self.super_batch - 1 if self.staleness_bound is None else self.staleness_bound

    def to_dict(self) -> dict:
        return asdict(self)

    # Each component takes the part of the configuration it uses.
    @property
    def sampling(self) -> "SamplingConfig":
        return SamplingConfig(list(self.fanouts), self.batch_size, self.seed, self.prefetch,
                              needs_degrees(self.model, self.gcn_norm))

    @property
    def hot_sets_per_node(self) -> bool:
        """Whether data-parallel ranks on one node share NeutronOrch's hot sets (``hot_set="node"``)."""
        return self.mode == "neutronorch" and self.hot_set == "node"

    @property
    def neutronorch(self) -> "NeutronOrchConfig":
        return NeutronOrchConfig(self.super_batch, self.hot_ratio, self.resolved_staleness, self.hot_grad,
                                 self.hot_error_budget, self.snapshot_lead, self.hot_set)

    @property
    def logging(self) -> "LogConfig":
        return LogConfig(self.log_jsonl, self.log_csv, self.tensorboard, self.log_every)

    @property
    def placement(self) -> "PlacementConfig":
        return PlacementConfig(self.gpu_memory_gb, self.gpu_cache_gb, self.cache_policy, self.device_sampling)

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in fields(cls)]


@dataclass(frozen=True)
class SamplingConfig:
    """How mini-batches are drawn: the modes' and the cache ranking's part of the configuration."""

    fanouts: list[int]  # seed hop first
    batch_size: int  # resolved (never 0)
    seed: int
    prefetch: int
    degrees: bool = False  # blocks carry their sources' graph degrees (the model normalises by them)
    rank: int = 0  # data parallel: this rank trains part ``rank`` of each global batch of batch_size * world
    world: int = 1
    file_order: bool = False  # host samplers read the topology in file order (``TrainConfig.read_order``)
    shuffle: bool = True  # False: every epoch takes the seeds in their given order (``NeighborLoader``)


@dataclass(frozen=True)
class NeutronOrchConfig:
    """NeutronOrch mode's part of the configuration (``staleness_bound`` resolved)."""

    super_batch: int
    hot_ratio: str | float
    staleness_bound: int
    hot_grad: str
    hot_error_budget: float
    snapshot_lead: int | None
    hot_set: str = "rank"


@dataclass(frozen=True)
class PlacementConfig:
    """Where data lives on a GPU: the placement's part of the configuration."""

    gpu_memory_gb: float | None
    gpu_cache_gb: str | float
    cache_policy: str
    device_sampling: str


@dataclass(frozen=True)
class LogConfig:
    """The metric logs' part of the configuration."""

    log_jsonl: str | None
    log_csv: str | None
    tensorboard: str | None
    log_every: int


# Fields whose default is None, and the type their value must have when given.
_OPTIONAL_TYPES = {"split": str, "staleness_bound": int, "snapshot_lead": int, "gpu_memory_gb": float,
                   "summary_json": str, "timeline": str, "log_jsonl": str, "log_csv": str, "tensorboard": str,
                   "checkpoint_dir": str, "host_cache_dir": str}
# Parsed by their own functions, which accept several forms.
_PARSED = {"fanouts", "eval_fanouts", "hot_ratio", "gpu_cache_gb", "host_cache_gb"}


def _check_types(config: TrainConfig) -> None:
    """Every field holds a value of its type (a config file can give any YAML value): a clear error
    instead of a ``TypeError`` deep inside the run."""
    for f in fields(config):
        value = getattr(config, f.name)
        if f.name in _PARSED or (value is None and f.default is None):
            continue
        want = _OPTIONAL_TYPES.get(f.name) or type(f.default)
        if want is bool:
            ok, what = isinstance(value, bool), "true or false"
        elif want is int:
            ok, what = isinstance(value, int) and not isinstance(value, bool), "a whole number"
        elif want is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            what = "a finite number"
        else:
            ok, what = isinstance(value, want), "a string"
        if not ok:
            kind = "a non-finite number" if isinstance(value, float) and want is float else f"a {type(value).__name__}"
            raise ConfigError(f"`{f.name}` {value!r}: expected {what}, not {kind}.")


def _parse_hot_ratio(value) -> str | float:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        ratio = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"`hot_ratio` {value!r}: expected 'auto' or a fraction in [0, 1] such as 0.1.") from None
    if not 0 <= ratio <= 1:
        raise ConfigError(f"`hot_ratio` {value!r}: the share of reached bottom-layer vertices made hot must "
                          f"be in [0, 1] (or 'auto').")
    return ratio


def _parse_cache_size(value, field: str = "gpu_cache_gb", which: str = "device") -> str | float:
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        size = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"`{field}` {value!r}: expected 'auto' or a size in GiB such as 2.5 (0 turns "
                          f"the {which} feature cache off).") from None
    if not math.isfinite(size) or size < 0:
        raise ConfigError(f"`{field}` {value!r}: must be 'auto' or zero or more GiB.")
    return size


def auto_batch_size(num_train: int) -> int:
    """Seeds per mini-batch when none is given: about 32 optimizer steps per epoch on small training sets
    (140 Cora seeds in one batch learn far too slowly), never below 32 nor above 1024 seeds."""
    return min(1024, max(32, num_train // 32))


def load_config_file(path: str | os.PathLike, extra: tuple[str, ...] = (),
                     sections: dict[str, list[str]] | None = None) -> dict:
    """Read a YAML, TOML or JSON file whose keys are ``TrainConfig`` fields (dashes or underscores), or one of
    ``extra`` (keys of the caller's own, such as the command line's ``run_name`` and ``save``). Keys may also
    sit in sections, ``sections`` naming each one's keys (the command line's option groups: ``[model]``
    holding ``hidden``, ...); a key in another section than its own is an error that names its section."""
    data = read_config_mapping(path)
    known = set(TrainConfig.keys()) | set(extra)
    sections = sections or {}
    home = {name: title for title, names in sections.items() for name in names}
    flat = []  # (key as written, value, section or None)
    for key, value in data.items():
        if isinstance(value, dict) and str(key) in sections:
            flat.extend((inner, inner_value, str(key)) for inner, inner_value in value.items())
        else:
            flat.append((key, value, None))
    out = {}
    for key, value, section in flat:
        name = str(key).replace("-", "_")
        if name in ("no_progress", "no_stage_table", "no_save") and isinstance(value, bool):
            name, value = name[3:], not value  # the flags' spelling: --no-progress, --no-stage-table, --no-save
        if name not in known:
            sections_known = f" Sections: {', '.join(sections)}." if sections else ""
            raise ConfigError(f"--config {path}: unknown key {key!r}. Known keys: {', '.join(sorted(known))}."
                              f"{sections_known}")
        if section is not None and home.get(name, section) != section:
            raise ConfigError(f"--config {path}: {key!r} is under [{section}], but belongs under [{home[name]}] "
                              f"(or at the top level).")
        if name in out:  # batch-size and batch_size, or progress and no-progress: which one would be meant?
            raise ConfigError(f"--config {path}: {key!r} sets `{name}`, which an earlier key sets too; give it once.")
        out[name] = value
    return out
