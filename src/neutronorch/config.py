"""Training configuration: ``TrainConfig``, composed of the parts in config_parts.py, validated once at the
edge (CLI, config file or API); the core trusts a validated ``TrainConfig`` and never re-checks it."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import MISSING, dataclass, field, fields, replace

from neutronorch.capabilities import MODE_CHOICES, TASKS
from neutronorch.config_parts import (PARTS, EvaluationConfig, LinkConfig, LogConfig, NetworkConfig,
                                      NeutronOrchConfig, OptimizationConfig, OutputConfig, PlacementConfig,
                                      SamplingConfig, may_change, setting, settings_of)
from neutronorch.data import DATASET_SPEC_HELP
from neutronorch.data.checks import METRICS
from neutronorch.data.feature_norm import FEATURE_NORMS
from neutronorch.errors import ConfigError
from neutronorch.limits import check_seed
from neutronorch.nn.names import PRECISIONS, needs_degrees
from neutronorch.sampling.fanouts import parse_fanouts

# The settings whose default depends on the task: None until ``validate`` puts the task's there; a value given
# always wins. Node classification: chosen by a sweep on the small citation graphs (docs/accuracy.md). Link
# prediction: chosen by a sweep of its own on Cora, CiteSeer and DBLP (docs/link-prediction.md,
# bench/link_sweep.py); no weight decay, as OGB's link baselines train (5e-3 shrank a dot head's embeddings
# until Cora's test MRR fell from 0.42 to 0.11).
TASK_DEFAULTS = {"node": {"dropout": 0.7, "lr": 0.003, "batch_size": 0, "weight_decay": 5e-3},
                 "link": {"dropout": 0.3, "lr": 0.001, "batch_size": 1024, "weight_decay": 0.0}}
TASK_WEIGHT_DECAY = {task: defaults["weight_decay"] for task, defaults in TASK_DEFAULTS.items()}
LINK_METRICS = re.compile(r"(mrr|rocauc|hits@[1-9][0-9]*)$")  # a link task's (train/link_metrics.py)
MAX_PREFETCH = 1024  # mini-batches a producer may run ahead; a buffer each, allocated up front
MAX_HIDDEN = 65536  # a layer's width: its hidden x hidden float32 weight takes 16 GiB at this width
MAX_THREADS = 4096  # torch and numba take thread counts as 32-bit numbers, and no machine has more cores
# a setting's bound (its option) -> the values it takes
BOUNDS = {"positive": lambda value: value > 0, "at least 1": lambda value: value >= 1,
          "zero or more": lambda value: value >= 0}


@dataclass(init=False)
class TrainConfig:
    """The settings of the run as a whole, and its parts (``config.sampling``, ...). Every setting is also
    read and written by its own name: ``config.fanouts`` is ``config.sampling.fanouts``. A part may be given
    whole (``TrainConfig(sampling=SamplingConfig(...))``); settings given by name apply over it."""

    dataset: str = may_change(
        "synthetic", metavar="SPEC", short="folder, file, or synthetic[:nodes=N] (the default)",
        help=f"dataset spec: {DATASET_SPEC_HELP}")
    partitions: str | None = setting(
        None, type=str, metavar="DIR",
        help="train on a partition folder (`neutronorch partition`) instead of `dataset`: rank r of a torchrun "
             "launch holds part r only and asks the other ranks for what it lacks; a node or link task in exact "
             "or neutronorch mode on the CPU (docs/distributed.md, \"Partitioned training\")")
    deal_by: str | None = setting(
        None, type=str, metavar="DIR",
        help="data parallel on the whole graph: deal each global batch's seeds (a link task's: by their source) "
             "to the ranks by their part in the partition folder DIR, as `--partitions DIR` deals them, so that the "
             "two runs' losses compare step for step (docs/distributed.md, \"Partitioned training\")")
    task: str = setting(
        "node", choices=TASKS, short="node (classification) or link (prediction)",
        help="node: classify vertices by their labels; link: predict edges, trained on seed edges with drawn "
             "negatives and scored by MRR, Hits@K or ROC-AUC against held-out edges "
             "(docs/link-prediction.md)")
    split: str | None = setting(
        None, type=str, metavar="SPEC", short="ratio:, per-class: or time:TRAIN,VAL; a link task: edges:TRAIN,VAL",
        help="split for data without one: ratio:TRAIN,VAL or per-class:TRAIN,VAL of the vertices; a link task: "
             "edges:TRAIN,VAL of the edges, validation and test edges left out of message passing (by time on a "
             "graph with edge times); time:TRAIN,VAL re-splits a graph with vertex times by them, the earliest "
             "vertices training (default: the data's own split, else ratio:0.6,0.2; synthetic graphs: "
             "ratio:0.1,0.05; link: edges:0.85,0.05)")
    split_index: int = setting(
        0, metavar="K", bound="zero or more",
        help="which of the dataset's stored splits to use (the heterophilous .npz files hold 10: 0..9)")
    times: bool = setting(
        False,
        help="read the times an OGB folder's layout carries: ogbn-arxiv's and ogbn-papers100M's vertex years, "
             "ogbl-collab's edge and link years; the task is then sampled by time (docs/temporal.md). Native "
             "folders, converted JODIE files and PyG or DGL graphs keep their times without it")
    normalize_features: str = setting(
        "none", choices=FEATURE_NORMS,
        help="the feature rows the model reads: none (as given) or row (each row divided by its sum where that "
             "is above 1, as PyG's NormalizeFeatures; non-negative rows in memory; per featured type of a typed "
             "graph); recorded in checkpoints, which predict and embed apply (docs/datasets.md)")
    mode: str = setting(
        "exact", choices=MODE_CHOICES, short="exact (default), device, neutronorch; auto picks",
        help="placement of the stages: exact samples and gathers on the host and computes every layer of every "
             "mini-batch on the device; device also samples and gathers on the training device (graph and features "
             "resident there, or read from pinned host memory beyond --gpu-memory-gb); neutronorch computes hot "
             "vertices' bottom layer on the host once per super-batch and reuses it; auto chooses one when the run "
             "starts, says which and why (the log and the summary's mode_choice) and keeps it when resumed: exact on "
             "the CPU; on a GPU device while the topology and features fit --gpu-memory-gb, else device or "
             "neutronorch by a short measured probe")
    device: str = may_change(
        "auto", choices=("auto", "cpu", "cuda"), short="training device; auto (default): CUDA if present",
        help="training device; auto picks CUDA when available")
    precision: str = may_change(
        "fp32", choices=PRECISIONS, metavar="PREC", short="fp32 (default) or bf16; auto: bf16 where native",
        help="fp32, or bf16: bfloat16 features, activations and matrix products (AMX on CPUs, tensor cores on GPUs) "
             "with float32 weights, optimizer state, loss and evaluation; auto = bf16 where the training device "
             "computes it natively, else fp32 (the run says which)")
    threads: int = may_change(0, help="training threads; 0 = all cores")
    dist_timeout: float = may_change(
        600.0, metavar="SECONDS", bound="positive",
        help="data parallel (launched with torchrun): seconds a collective waits for the other ranks before the run "
             "fails saying so")
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
            value = settings.pop(f.name, MISSING)
            if value is MISSING:
                value = f.default_factory() if f.default_factory is not MISSING else f.default
            setattr(self, f.name, value)
        for name, value in settings.items():  # over the parts: each setting's property replaces its part
            if name not in _PART_OF:
                raise TypeError(f"TrainConfig() got an unexpected keyword argument {name!r}")
            setattr(self, name, value)

    @classmethod
    def resume_may_change(cls) -> frozenset[str]:
        """The settings a resumed run may change (declared with ``may_change``)."""
        return frozenset(f.name for f in setting_fields() if f.metadata.get("resume") == "may change")

    def settings_given(self, names) -> list[str]:
        """Those of the settings ``names`` given other values than their defaults, as `name` value."""
        defaults = {f.name: f.default for f in setting_fields()}
        return [f"`{name}` {getattr(self, name)}" for name in names if getattr(self, name) != defaults[name]]

    def validate(self) -> "TrainConfig":
        """Normalise and check every field; raise ``ConfigError`` saying how to fix the first problem."""
        for part, kind in PARTS.items():
            if not isinstance(getattr(self, part), kind):
                raise ConfigError(f"`{part}` {getattr(self, part)!r}: expected a {kind.__name__} (or give its "
                                  f"settings by name: {', '.join(f.name for f in settings_of(kind))}).")
        check_types(self)
        check_seed(self.seed)
        self.fanouts = parse_fanouts(self.fanouts)
        if self.layers < 0:
            raise ConfigError(f"`layers` {self.layers}: must be 0 (one per `fanouts` entry) or a number "
                              f"of layers.")
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
        self.sampling = replace(self.sampling, degrees=needs_degrees(self.model, self.gcn_norm))
        for name, value in TASK_DEFAULTS.get(self.task, {}).items():  # an unknown task: refused below
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.hot_ratio = _auto_or(self.hot_ratio, "hot_ratio", "a fraction in [0, 1] such as 0.1",
                                  lambda ratio: 0 <= ratio <= 1,
                                  "the share of reached bottom-layer vertices made hot must be in [0, 1] "
                                  "(or 'auto')")
        for name, which in (("gpu_cache_gb", "device"), ("host_cache_gb", "host")):
            setattr(self, name, _auto_or(getattr(self, name), name, f"a size in GiB such as 2.5 (0 turns the {which} "
                                         f"feature cache off)", lambda size: math.isfinite(size) and size >= 0,
                                         "must be 'auto' or zero or more GiB"))
        for f in setting_fields():  # each setting's choices and bound (its option)
            value, option = getattr(self, f.name), f.metadata
            if option.get("choices") is not None and value not in option["choices"]:
                raise ConfigError(f"`{f.name}` {value!r}: choose one of {', '.join(option['choices'])}.")
            if option.get("bound") and value is not None and not BOUNDS[option["bound"]](value):
                what = (option.get("short") or option["help"]).split(" (default")[0].split(";")[0]
                raise ConfigError(f"`{f.name}` {value}: must be {option['bound']} ({what}).")
        checks = [
            (self.batch_size >= 0, f"`batch_size` {self.batch_size}: must be a positive number of seeds "
                                   f"(or 0 to choose from the training-set size)."),
            (self.eval_max_nodes >= 0, f"`eval_max_nodes` {self.eval_max_nodes}: must be 0 (every vertex) or "
                                       f"a positive number of vertices per set."),
            (self.hidden <= MAX_HIDDEN, f"`hidden` {self.hidden}: wider than a layer can be built here (at most "
                                        f"{MAX_HIDDEN}, whose square weight alone takes 16 GiB); give a width "
                                        f"such as 256."),
            (not (self.residual and self.architecture == "blocks"),
             "`residual`: graph blocks are residual already; give `residual` with `architecture` plain only."),
            (self.task == "link" or self.metric in ("auto",) + METRICS,
             f"`metric` {self.metric!r}: choose auto or one of {', '.join(METRICS)}"
             + (" (mrr, hits@K and rocauc score link tasks: give `task` link)." if LINK_METRICS.match(self.metric)
                else ".")),
            (self.task == "node" or self.metric == "auto" or bool(LINK_METRICS.match(self.metric)),
             f"`metric` {self.metric!r}: a link task scores by auto (the dataset's own, else mrr), mrr, rocauc "
             f"or hits@K (hits@50)."),
            (self.model not in ("gat", "rgat") or self.heads < 1 or self.hidden % self.heads == 0,
             f"`hidden` {self.hidden} is not divisible by `heads` {self.heads}; "
             f"{'GAT' if self.model == 'gat' else 'R-GAT'} splits the hidden width evenly across heads."),
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

    def to_dict(self) -> dict:
        """Every setting by name, flat (as checkpoints and summaries store them)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in setting_fields()}

    @property
    def hot_sets_per_node(self) -> bool:
        """Whether data-parallel ranks on one node share NeutronOrch's hot sets (``hot_set="node"``)."""
        return self.mode == "neutronorch" and self.hot_set == "node"

    @classmethod
    def keys(cls) -> list[str]:
        """Every setting's name."""
        return [f.name for f in setting_fields()]

    @classmethod
    def sections(cls) -> dict[str, list[str]]:
        """The settings of each part, by the part's name (a config file's sections)."""
        return {part: [f.name for f in settings_of(kind)] for part, kind in PARTS.items()}


def setting_fields() -> list:
    """The ``Field`` of every setting, the run's own, then each part's (its option in its metadata)."""
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


# Parsed by their own functions, which accept several forms.
_PARSED = {"fanouts", "eval_fanouts", "hot_ratio", "gpu_cache_gb", "host_cache_gb"}
# A value type -> whether a value is one, and how a message words it (any other type: "a string").
_VALUES = {bool: (lambda value: isinstance(value, bool), "true or false"),
           int: (lambda value: isinstance(value, int) and not isinstance(value, bool), "a whole number"),
           float: (lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
                   and math.isfinite(value), "a finite number")}


def value_type(f) -> type:
    """The type a setting's value must have: its option's, else its default's."""
    return f.metadata.get("type") or type(f.default)


def check_types(config: TrainConfig) -> None:
    """Raise ``ConfigError`` unless every setting holds a value of its type (a config file can give any)."""
    for f in setting_fields():
        value = getattr(config, f.name)
        if f.name in _PARSED or (value is None and f.default is None):
            continue
        want = value_type(f)
        ok, what = _VALUES.get(want, (lambda value: isinstance(value, want), "a string"))
        if not ok(value):
            kind = "a non-finite number" if isinstance(value, float) and want is float else f"a {type(value).__name__}"
            hint = number_hint(value, want) if isinstance(value, str) and want in (int, float) else ""
            raise ConfigError(f"`{f.name}` {value!r}: expected {what}, not {kind}{hint}.")
        if want is int and f.name != "seed" and not -2**63 <= value < 2**63:  # the seed: check_seed's 64 bits
            raise ConfigError(f"`{f.name}` {value}: too large; counts are 64-bit whole numbers, below 2**63.")


def number_hint(value: str, want: type) -> str:
    """For a number written as text where ``want`` (int or float) is expected: how to write it instead."""
    try:
        number = float(value)
    except ValueError:
        return ""
    if not math.isfinite(number) or (want is int and not number.is_integer()):
        return ""
    if want is int:
        return f"; write it with digits only ({int(number)}), which every config file reads as a number"
    return f"; give it as a number ({value.strip()}, not quoted)"


def _auto_or(value, field: str, expected: str, allowed, why: str) -> str | float:
    """``value`` as "auto" or a number (``expected`` words it) that ``allowed`` takes; else ConfigError."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"`{field}` {value!r}: expected 'auto' or {expected}.") from None
    if not allowed(number):
        raise ConfigError(f"`{field}` {value!r}: {why}.")
    return number


def auto_batch_size(num_train: int) -> int:
    """Seeds per mini-batch when none is given: about 32 optimizer steps per epoch on small training sets
    (140 Cora seeds in one batch learn far too slowly), from 32 to 1024 seeds."""
    return min(1024, max(32, num_train // 32))
