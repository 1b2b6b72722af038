"""Training configuration: ``TrainConfig``, composed of the parts in config_parts.py, validated once at the
edge (CLI, config file or API).

The core trusts a ``TrainConfig`` that passed ``validate``; it never re-checks arguments. Each component
takes the part it uses (``config.sampling``, ``config.neutronorch``, ``config.placement``, ...).
"""

from __future__ import annotations

import copy
import math
import os
import re
from dataclasses import MISSING, dataclass, field, fields, replace

from neutronorch.config_keys import float_text, number_hint, read_config_mapping
from neutronorch.config_parts import (PARTS, EvaluationConfig, LinkConfig, LogConfig, NetworkConfig,
                                      NeutronOrchConfig, OptimizationConfig, OutputConfig, PlacementConfig,
                                      SamplingConfig, may_change, setting, settings_of)
from neutronorch.data.edge_split import LINK_DIRECTIONS
from neutronorch.errors import ConfigError
from neutronorch.limits import check_seed
from neutronorch.nn.names import (ARCHITECTURES, GCN_NORMS, LINK_HEADS, MODELS, NORMS, PRECISIONS, RELATIONAL_ONLY,
                                  needs_degrees)
from neutronorch.sampling.fanouts import parse_fanouts

TASKS = ("node", "link")
# Adam's L2 weight decay when none is given, per task. Node classification: chosen on the small citation
# graphs (docs/accuracy.md). Link prediction: none, as OGB's link baselines train; 5e-3 shrank a dot head's
# embeddings until Cora's test MRR fell from 0.42 to 0.11 (docs/link-prediction.md).
TASK_WEIGHT_DECAY = {"node": 5e-3, "link": 0.0}
MODES = ("exact", "device", "neutronorch")
MODE_CHOICES = MODES + ("auto",)  # auto: one of MODES, chosen when the run starts (orchestration/choice.py)
TYPED_MODE_CHOICES = ("exact", "device", "neutronorch", "auto")  # what a typed graph trains with (train/typed_config.py)
TYPED_OWN_MODEL_MODES = ("exact", "device", "auto")  # your own module's, on a typed graph (train/typed_own.py)
METRICS = ("accuracy", "rocauc", "f1-micro", "f1-macro")
LINK_METRICS = re.compile(r"(mrr|rocauc|hits@[1-9][0-9]*)$")  # a link task's (train/link_metrics.py)
HOT_GRADS = ("stop", "cpu")
HOT_SETS = ("node", "rank")
DEVICES = ("auto", "cpu", "cuda")
CACHE_POLICIES = ("presample", "degree")
DEVICE_SAMPLING = ("auto", "on", "off")
READ_ORDERS = ("auto", "file", "batch")
MAX_PREFETCH = 1024  # mini-batches a producer may run ahead; a buffer each, allocated up front
MAX_HIDDEN = 65536  # a layer's width: its hidden x hidden float32 weight takes 16 GiB at this width
MAX_THREADS = 4096  # torch and numba take thread counts as 32-bit numbers, and no machine has more cores
EMBEDDING_STORAGES = ("auto", "memory", "mmap")  # where a typed graph's embedding tables live (train/typed_tables.py)


@dataclass(init=False)
class TrainConfig:
    """A run's configuration: the settings of the run as a whole, and its parts (config_parts.py), each the
    settings one component takes: ``config.sampling`` (a ``SamplingConfig``), ``config.neutronorch``, ...

    Every setting is also read and written by its own name, whichever part holds it: ``config.fanouts`` is
    ``config.sampling.fanouts``, and ``TrainConfig(fanouts=[15, 10], super_batch=4)`` sets both parts. A part
    may be given whole (``TrainConfig(sampling=SamplingConfig(...))``); settings given by name apply over it.
    ``to_dict`` and ``keys`` list the settings by name, flat, as checkpoints and summaries store them."""

    dataset: str = may_change("synthetic")
    task: str = setting("node")  # node (classification) or link (prediction; the `link` part)
    split: str | None = setting(None)
    split_index: int = setting(0)  # which of the dataset's stored splits (the heterophilous .npz files hold 10)
    mode: str = setting("exact")  # exact, device, neutronorch, or auto (chosen when the run starts)
    device: str = may_change("auto")
    precision: str = may_change("fp32")  # fp32, bf16 or auto (bf16 where the device has it natively); nn/precision.py
    threads: int = may_change(0)
    dist_timeout: float = may_change(600.0)  # data parallel: seconds a collective waits for the other ranks
    network: NetworkConfig = field(default_factory=NetworkConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    optimization: OptimizationConfig = field(default_factory=OptimizationConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)
    link: LinkConfig = field(default_factory=LinkConfig)
    neutronorch: NeutronOrchConfig = field(default_factory=NeutronOrchConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    outputs: OutputConfig = field(default_factory=OutputConfig)
    logging: LogConfig = field(default_factory=LogConfig)

    def __init__(self, **settings):
        for f in fields(self):
            if f.name in settings:
                value = settings.pop(f.name)
            else:
                value = f.default_factory() if f.default_factory is not MISSING else f.default
            setattr(self, f.name, value)
        by_part: dict[str, dict] = {}
        for name, value in settings.items():
            if name not in _PART_OF:
                raise TypeError(f"TrainConfig() got an unexpected keyword argument {name!r}")
            by_part.setdefault(_PART_OF[name], {})[name] = value
        for part, values in by_part.items():
            setattr(self, part, replace(getattr(self, part), **values))

    @classmethod
    def resume_may_change(cls) -> frozenset[str]:
        """The settings a resumed run may change (declared with ``may_change``)."""
        return frozenset(f.name for f in _settings() if f.metadata.get("resume") == "may change")

    def settings_given(self, names) -> list[str]:
        """Those of the settings ``names`` given other values than their defaults, as `name` value: what a
        run that has no use for them refuses instead of ignoring."""
        defaults = {f.name: f.default for f in _settings()}
        return [f"`{name}` {getattr(self, name)}" for name in names if getattr(self, name) != defaults[name]]

    def link_settings_given(self) -> list[str]:
        """The link task's settings (``LinkConfig``) given other values than their defaults: what a node task
        would ignore, and refuses (``check_node_task``, ``check_typed_config``)."""
        return self.settings_given(f.name for f in settings_of(LinkConfig))

    def validate(self) -> "TrainConfig":
        """Normalise and check every field; raise ``ConfigError`` saying how to fix the first problem."""
        for part, kind in PARTS.items():
            if not isinstance(getattr(self, part), kind):
                raise ConfigError(f"`{part}` {getattr(self, part)!r}: expected a {kind.__name__} (or give its "
                                  f"settings by name: {', '.join(f.name for f in settings_of(kind))}).")
        _check_types(self)
        check_seed(self.seed)
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
        # The model normalises by its sources' graph degrees (GCN's symmetric norm): the blocks carry them.
        self.sampling = replace(self.sampling, degrees=needs_degrees(self.model, self.gcn_norm))
        if self.weight_decay is None and self.task in TASK_WEIGHT_DECAY:
            self.weight_decay = TASK_WEIGHT_DECAY[self.task]
        self.hot_ratio = _parse_hot_ratio(self.hot_ratio)
        self.gpu_cache_gb = _parse_cache_size(self.gpu_cache_gb)
        self.host_cache_gb = _parse_cache_size(self.host_cache_gb, "host_cache_gb", "host")
        checks = [
            (self.model in MODELS + RELATIONAL_ONLY,
             f"`model` {self.model!r}: choose one of {', '.join(MODELS + RELATIONAL_ONLY)} "
             f"({', '.join(RELATIONAL_ONLY)}: typed graphs only)."),
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
            (self.hidden <= MAX_HIDDEN, f"`hidden` {self.hidden}: wider than a layer can be built here (at most "
                                        f"{MAX_HIDDEN}, whose square weight alone takes 16 GiB); give a width "
                                        f"such as 256."),
            (self.heads >= 1, f"`heads` {self.heads}: must be positive."),
            (self.gcn_norm in GCN_NORMS, f"`gcn_norm` {self.gcn_norm!r}: choose one of {', '.join(GCN_NORMS)}."),
            (self.norm in NORMS, f"`norm` {self.norm!r}: choose one of {', '.join(NORMS)}."),
            (self.architecture in ARCHITECTURES,
             f"`architecture` {self.architecture!r}: choose one of {', '.join(ARCHITECTURES)}."),
            (not (self.residual and self.architecture == "blocks"),
             "`residual`: graph blocks are residual already; give `residual` with `architecture` plain only."),
            (self.task in TASKS, f"`task` {self.task!r}: choose one of {', '.join(TASKS)}."),
            (self.task == "link" or self.metric in ("auto",) + METRICS,
             f"`metric` {self.metric!r}: choose auto or one of {', '.join(METRICS)}"
             + (" (mrr, hits@K and rocauc score link tasks: give `task` link)." if LINK_METRICS.match(self.metric)
                else ".")),
            (self.task == "node" or self.metric == "auto" or bool(LINK_METRICS.match(self.metric)),
             f"`metric` {self.metric!r}: a link task scores by auto (the dataset's own, else mrr), mrr, rocauc "
             f"or hits@K (hits@50)."),
            (self.link_head in LINK_HEADS, f"`link_head` {self.link_head!r}: choose one of {', '.join(LINK_HEADS)}."),
            (self.link_direction in LINK_DIRECTIONS,
             f"`link_direction` {self.link_direction!r}: choose one of {', '.join(LINK_DIRECTIONS)}."),
            (self.negatives >= 1, f"`negatives` {self.negatives}: must be at least 1 per positive."),
            (self.eval_negatives >= 1, f"`eval_negatives` {self.eval_negatives}: must be at least 1 per positive."),
            (self.split_index >= 0, f"`split_index` {self.split_index}: must be 0 or more."),
            (self.model not in ("gat", "rgat") or self.heads < 1 or self.hidden % self.heads == 0,
             f"`hidden` {self.hidden} is not divisible by `heads` {self.heads}; "
             f"{'GAT' if self.model == 'gat' else 'R-GAT'} splits the hidden width evenly across heads."),
            (self.epochs >= 0, f"`epochs` {self.epochs}: must be zero or more."),
            (0 < self.lr < math.inf, f"`lr` {self.lr}: must be a finite positive number."),
            (self.weight_decay is None or self.weight_decay >= 0,
             f"`weight_decay` {self.weight_decay}: must be zero or more."),
            (0 <= self.dropout < 1, f"`dropout` {self.dropout}: must be in [0, 1)."),
            (self.eval_every >= -1, f"`eval_every` {self.eval_every}: must be -1 (never), 0 (after the last "
                                    f"epoch only) or more."),
            (1 <= self.prefetch <= MAX_PREFETCH, f"`prefetch` {self.prefetch}: must be 1 to {MAX_PREFETCH} mini-batches "
                                                  f"ahead (each holds a buffer of its rows)."),
            (self.patience >= 0, f"`patience` {self.patience}: must be 0 (never stop early) or a number of "
                                 f"evaluations."),
            (not self.patience or self.eval_every > 0,
             "`patience` counts evaluations without a better validation accuracy: give `eval_every` 1 or "
             "more."),
            (all(0 <= n <= MAX_THREADS for n in (self.threads, self.sampler_threads, self.host_threads)),
             f"`threads`/`sampler_threads`/`host_threads` must be 0 (picks automatically) to {MAX_THREADS}."),
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
            (self.embedding_storage in EMBEDDING_STORAGES,
             f"`embedding_storage` {self.embedding_storage!r}: choose one of {', '.join(EMBEDDING_STORAGES)}."),
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
            (not (self.resume and self.overwrite),
             "`resume` and `overwrite` contradict each other: `resume` continues the earlier run and adds to its "
             "outputs, `overwrite` replaces them; give one."),
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
        """The staleness bound in optimizer steps (``NeutronOrchConfig.resolved_staleness``)."""
        return self.neutronorch.resolved_staleness

    def to_dict(self) -> dict:
        """Every setting by name, flat (as checkpoints and summaries store them)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in _settings()}

    @property
    def hot_sets_per_node(self) -> bool:
        """Whether data-parallel ranks on one node share NeutronOrch's hot sets (``hot_set="node"``)."""
        return self.mode == "neutronorch" and self.hot_set == "node"

    @classmethod
    def keys(cls) -> list[str]:
        """Every setting's name."""
        return [f.name for f in _settings()]

    @classmethod
    def sections(cls) -> dict[str, list[str]]:
        """The settings of each part, by the part's name (a config file's sections)."""
        return {part: [f.name for f in settings_of(kind)] for part, kind in PARTS.items()}


def _settings() -> list:
    """The ``Field`` of every setting: the run's own, then each part's."""
    own = [f for f in fields(TrainConfig) if f.name not in PARTS]
    return own + [f for kind in PARTS.values() for f in settings_of(kind)]


def _by_name(part: str, name: str) -> property:
    def get(self):
        return getattr(getattr(self, part), name)

    def put(self, value):
        setattr(self, part, replace(getattr(self, part), **{name: value}))

    return property(get, put, doc=f"``{part}.{name}``")


_PART_OF = {f.name: part for part, kind in PARTS.items() for f in settings_of(kind)}
for _name, _part in _PART_OF.items():
    setattr(TrainConfig, _name, _by_name(_part, _name))


# Fields whose default is None, and the type their value must have when given.
_OPTIONAL_TYPES = {"split": str, "staleness_bound": int, "snapshot_lead": int, "gpu_memory_gb": float,
                   "weight_decay": float, "summary_json": str, "timeline": str, "log_jsonl": str, "log_csv": str, "tensorboard": str,
                   "checkpoint_dir": str, "host_cache_dir": str, "embedding_dir": str}
# Parsed by their own functions, which accept several forms.
_PARSED = {"fanouts", "eval_fanouts", "hot_ratio", "gpu_cache_gb", "host_cache_gb"}


def _wanted(f) -> type:
    """The type a setting's value must have."""
    return _OPTIONAL_TYPES.get(f.name) or type(f.default)


def _check_types(config: TrainConfig) -> None:
    """Every field holds a value of its type (a config file can give any YAML value): a clear error
    instead of a ``TypeError`` deep inside the run."""
    for f in _settings():
        value = getattr(config, f.name)
        if f.name in _PARSED or (value is None and f.default is None):
            continue
        want = _wanted(f)
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
            hint = number_hint(value, want) if isinstance(value, str) and want in (int, float) else ""
            raise ConfigError(f"`{f.name}` {value!r}: expected {what}, not {kind}{hint}.")
        if want is int and f.name != "seed" and not -2**63 <= value < 2**63:  # the seed: check_seed's 64 bits
            raise ConfigError(f"`{f.name}` {value}: too large; counts are 64-bit whole numbers, below 2**63.")


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


def load_config_file(path: str | os.PathLike, extra: dict[str, str | None] | None = None) -> dict:
    """Read a YAML, TOML or JSON file whose keys are ``TrainConfig`` settings (dashes or underscores), or keys
    of the caller's own (``extra``: each key and its section, such as the command line's ``run_name`` under
    ``outputs``). A part's settings may sit in a section named after the part (``[sampling]`` holding
    ``fanouts``, ``[neutronorch]`` holding ``super_batch``: ``TrainConfig.sections()``) or at the top level; a
    key in another section than its own is an error that names its section. A section with nothing under it
    (``network:`` alone in YAML) sets nothing; a key set to null (``lr: ~``) keeps its default. A setting
    that takes a float may be given as text that reads as one: YAML 1.1 (PyYAML) reads ``1e-3``, without a
    dot, as a string."""
    data = read_config_mapping(path)
    extra = extra or {}
    known = set(TrainConfig.keys()) | set(extra)
    sections = TrainConfig.sections()
    home = {name: part for part, names in sections.items() for name in names}
    home.update({name: part for name, part in extra.items() if part is not None})
    floats = {f.name for f in _settings() if _wanted(f) is float}
    flat = []  # (key as written, value, section or None)
    for key, value in data.items():
        if str(key) in sections and (isinstance(value, dict) or value is None):
            flat.extend((inner, inner_value, str(key)) for inner, inner_value in (value or {}).items())
        elif str(key) in sections:
            raise ConfigError(f"--config {path}: {key!r} is a section, not a setting: give its settings under it "
                              f"({', '.join(sections[str(key)][:3])}, ...), not {value!r}.")
        else:
            flat.append((key, value, None))
    out, seen = {}, set()
    for key, value, section in flat:
        name = str(key).replace("-", "_")
        negated = name in ("no_progress", "no_stage_table", "no_save")  # the flags' spelling: --no-progress, ...
        name = name[3:] if negated else name
        if name not in known:
            raise ConfigError(f"--config {path}: unknown key {key!r}. Known keys: {', '.join(sorted(known))}. "
                              f"Sections: {', '.join(sections)}.")
        if section is not None and home.get(name) != section:
            where = f"under [{home[name]}] (or at the top level)" if name in home else "at the top level"
            raise ConfigError(f"--config {path}: {key!r} is under [{section}], but belongs {where}.")
        if name in seen:  # batch-size and batch_size, or progress and no-progress: which one would be meant?
            raise ConfigError(f"--config {path}: {key!r} sets `{name}`, which an earlier key sets too; give it once.")
        seen.add(name)
        if value is None:
            continue  # null: the default
        if negated and not isinstance(value, bool):
            raise ConfigError(f"--config {path}: {key!r} {value!r}: expected true or false.")
        out[name] = float_text(value) if name in floats else (not value if negated else value)
    _check_types(TrainConfig(**{k: v for k, v in out.items() if k not in extra}))  # one a flag replaces too
    return out
