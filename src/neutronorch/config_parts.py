"""The parts ``TrainConfig`` (config.py) is composed of, each the settings one component takes; frozen, so a
component handed one cannot change the run's configuration. A *setting* (``setting``/``may_change``) is what
a user gives, with its option (``OPTION_SPEC``); a *resolved* field is worked out when the run starts, never
given or saved. Like config.py, this module uses nothing above it."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from neutronorch.data.edge_split import LINK_DIRECTIONS
from neutronorch.nn.names import ARCHITECTURES, GCN_NORMS, LINK_HEADS, MODELS, NORMS, RELATIONAL_ONLY

# A setting's option (cli/options.py makes the parser from it; a bool setting is a switch): ``help`` (the full
# help; --help-all adds the default unless it is None), ``short`` (the help ``train --help`` lists it with;
# without one only ``--help-all`` lists it), ``choices`` (which ``validate`` checks), ``type`` (its value's,
# where the default is None), ``metavar`` (what the help shows for its value, by default N for a whole number;
# with choices, in --help only), ``bound`` (the numbers it takes, ``config.BOUNDS``; ``validate`` checks it).
OPTION_SPEC = ("help", "short", "choices", "type", "metavar", "bound")


def setting(default=None, *, factory=None, resume: str = "fixed", **spec):
    """A setting a resumed run must keep: it changes the model or the training. ``spec``: its option, kept in
    its field's metadata with ``resume`` (``TrainConfig.resume_may_change``)."""
    if "help" not in spec or set(spec) - set(OPTION_SPEC):
        raise TypeError(f"a setting's option takes help and any of {', '.join(OPTION_SPEC[1:])}, not "
                        f"{sorted(spec)}")
    metadata = {"resume": resume, **spec}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def may_change(default, **spec):
    """A setting a resumed run may change: where outputs go, how the run reports, how long it trains, its
    threads and where it runs; results do not depend on them. ``spec``: its option."""
    return setting(default, resume="may change", **spec)


def resolved(default):
    """Worked out when the run starts (``dataclasses.replace`` on the part); not a setting."""
    return field(default=default, metadata={"resolved": True})


def settings_of(part) -> list:
    """The ``Field`` of every setting of a part (a class or an instance), in order."""
    return [f for f in fields(part) if not f.metadata.get("resolved")]


@dataclass(frozen=True)
class NetworkConfig:
    """The model: which architecture, its widths and its regularisation."""

    model: str = setting(
        "sage", choices=MODELS + RELATIONAL_ONLY, metavar="MODEL",
        short="sage (default), gcn or gat; typed: also rgcn, rgat",
        help="GNN architecture: sage, gcn or gat; for a typed graph (docs/heterogeneous.md) sage, rgcn or "
             "rgat")
    layers: int = setting(
        0, help="number of layers; 0 = one per --fanouts entry; with a single fanout, that fanout in every "
                "layer")
    hidden: int = setting(256, bound="positive", short="hidden width (default: 256)", help="hidden width")
    heads: int = setting(4, bound="positive", help="GAT and R-GAT attention heads in hidden layers")
    gcn_norm: str = setting(
        "symmetric", choices=GCN_NORMS,
        help="GCN normalisation: symmetric = Kipf & Welling's D^-1/2 (A+I) D^-1/2 by graph degrees (PyG's GCNConv, "
             "DGL's GraphConv), mean = the mean over the vertex and its sampled neighbours")
    residual: bool = setting(
        False,
        help="skip connections around every layer but the output layer (identity, or a learned projection where the "
             "widths differ)")
    norm: str = setting(
        "none", choices=NORMS,
        help="normalisation between layers, before the activation: none, layer (LayerNorm) or batch "
             "(BatchNorm)")
    architecture: str = setting(
        "plain", choices=ARCHITECTURES,
        help="plain: a stack of graph layers with ReLU and dropout between; blocks: an input map, one residual block "
             "h + FFN(aggregate(norm(h))) per layer, and a linear head, as the heterophilous-graph baselines of "
             "Platonov et al. (docs/models.md)")
    dropout: float | None = setting(
        None, type=float, metavar="P",
        help="dropout after each hidden layer; on CPU resolved to steps of 1/256 (default: 0.7 for a node task, "
             "0.3 for a link task)")


@dataclass(frozen=True)
class SamplingConfig:
    """How mini-batches are drawn: the modes' and the cache ranking's part of the configuration."""

    fanouts: list[int] = setting(
        factory=lambda: [10, 10], metavar="LIST", short="neighbours per layer, -1 all (default: 10,10)",
        help="neighbours sampled per layer, seed hop first; -1 takes all")
    # None: the task's (validate); 0: auto_batch_size(training seeds), which the run resolves (never 0 in a mode)
    batch_size: int | None = setting(
        None, type=int, short="seeds per batch (default: auto; link: 1024)",
        help="seeds per mini-batch; 0 = min(1024, max(32, training seeds // 32)) (default: 0 for a node task, "
             "1024 for a link task)")
    seed: int = setting(
        0, metavar="S", short="seed of weights, sampling and order (default: 0)",
        help="seed of model init, seed order and sampling")
    prefetch: int = may_change(2, help="mini-batches prepared ahead of training")
    temporal_strategy: str = setting(
        "uniform", choices=("uniform", "last"),
        help="a graph with times: the earlier edges a hop draws, uniformly or the most recent (docs/temporal.md)")
    degrees: bool = resolved(False)  # blocks carry their sources' graph degrees (the model normalises by them)
    rank: int = resolved(0)  # data parallel: this rank trains part ``rank`` of each global batch of batch_size * world
    world: int = resolved(1)
    file_order: bool = resolved(False)  # host samplers read the topology in file order (``read_order``)
    shuffle: bool = resolved(True)  # False: every epoch takes the seeds in their given order (``NeighborLoader``)
    sampler_threads: int = may_change(0, help="sampler/gather threads; 0 = half the cores")


@dataclass(frozen=True)
class OptimizationConfig:
    """How long and how the weights are trained."""

    epochs: int = may_change(
        50, bound="zero or more", short="training epochs (default: 50)", help="training epochs")
    lr: float | None = setting(
        None, type=float, metavar="LR", bound="positive", short="Adam learning rate (default: 0.003; link: 0.001)",
        help="Adam learning rate (default: 0.003 for a node task, 0.001 for a link task)")
    weight_decay: float | None = setting(
        None, type=float, metavar="WD", bound="zero or more",
        help="Adam weight decay (default: 5e-3 for a node task, 0 for a link task)")
    patience: int = may_change(
        0, help="stop after this many evaluations without a better validation score (--metric; the summary "
                "and best.pt hold the best epoch); 0 = never stop early")


@dataclass(frozen=True)
class EvaluationConfig:
    """What evaluation scores and how it samples."""

    metric: str = setting(
        "auto", metavar="METRIC",
        help="what evaluation scores: accuracy, rocauc, f1-micro, f1-macro; auto = the dataset's own (ROC-AUC for the "
             "binary heterophilous graphs), else ROC-AUC for multi-label labels, accuracy otherwise; a link task: "
             "mrr, hits@K (hits@50) or rocauc, auto = the dataset's own, else mrr")
    eval_every: int = may_change(
        1, help="evaluate val/test every N epochs; 0 evaluates only after the last, -1 never (timing runs)")
    eval_fanouts: list[int] | None = may_change(
        None, metavar="LIST", help="sampled inference with these fanouts instead of exact full-neighbour "
                                   "inference")
    eval_batch_size: int = may_change(4096, bound="positive", help="destinations per inference chunk")
    eval_max_nodes: int = may_change(
        0, help="evaluate on a seeded random sample of at most this many validation and test vertices each; "
                "with exact inference only the last layer gets cheaper (every layer below runs over all "
                "vertices), so pair it with --eval-fanouts to save real time; 0 = all")


@dataclass(frozen=True)
class LinkConfig:
    """A link task's part (``task="link"``): how pairs are scored, and the negatives of each positive."""

    link_head: str = setting(
        "dot", choices=LINK_HEADS,
        help="link task: how a pair of embeddings is scored: dot (their inner product) or mlp (a two-layer perceptron "
             "over their element-wise product, as OGB's examples)")
    negatives: int = setting(
        1, metavar="K", bound="at least 1",
        help="link task: destinations drawn uniformly per training positive, seeded like the neighbour draws")
    eval_negatives: int = may_change(
        100, metavar="K", bound="at least 1",
        help="link task: destinations drawn per validation and test positive where the data stores no negatives of "
             "its own (the same at every evaluation)")
    link_direction: str = setting(
        "auto", choices=LINK_DIRECTIONS,
        help="link task, --split edges:...: undirected (an edge and its reverse are one link, held out of message "
             "passing both ways), directed (each edge a link), or auto: undirected when at least half of the edges "
             "have their reverse")
    link_relation: str | None = setting(
        None, type=str, metavar="RELATION",
        help="link task on a typed graph: the relation whose edges are predicted, SRC/NAME/DST or a name only one "
             "relation has (default: the graph's only relation)")


@dataclass(frozen=True)
class NeutronOrchConfig:
    """NeutronOrch mode's part of the configuration."""

    super_batch: int = setting(
        8, metavar="P", bound="at least 1", short="neutronorch: batches per super-batch (default: 8)",
        help="neutronorch: mini-batches per super-batch P; hot embeddings are computed once per super-batch")
    hot_ratio: str | float = setting(
        "auto", metavar="R", short="neutronorch: share of vertices hot (default: auto)",
        help="neutronorch: share of the vertices a super-batch reaches in its bottom layer made hot, or auto to tune "
             "it between epochs from measured host and device time, down to 0 (no hot rows, no host work, probed "
             "again every few epochs) while reuse does not pay")
    staleness_bound: int | None = setting(
        None, type=int, metavar="S",
        help="neutronorch: most optimizer steps between the parameters hot embeddings were computed from and their "
             "use; at least P-1 (default: 2P-1)")
    hot_grad: str = setting(
        "cpu", choices=("stop", "cpu"),
        help="neutronorch: cpu adds the hot rows' bottom-layer gradient, computed on the host once per super-batch; "
             "stop treats hot rows as constants (faster, but the bottom layer then learns nothing from them)")
    hot_error_budget: float = setting(
        0.02, metavar="E", bound="positive",
        help="neutronorch with --hot-ratio auto: cap r so that (share of bottom-layer rows served hot) x (measured "
             "drift of a row per step x mean staleness) stays below this")
    snapshot_lead: int | None = setting(
        None, type=int, bound="zero or more",
        help="neutronorch: optimizer steps between a super-batch's W0 snapshot and its first mini-batch (the host's "
             "time to compute its hot rows); capped by S-P+1; default: auto (2, raised while the trainer waits for "
             "hot rows; on a typed graph it stays 2)")
    hot_set: str = setting(
        "rank", choices=("node", "rank"),
        help="neutronorch, data parallel: each rank plans its own hot sets; a row hot on several ranks of a node is "
             "computed by each of them (rank) or by one of them and sent to the others (node: less host work, more "
             "data moved between the ranks; see docs/distributed.md)")
    host_threads: int = may_change(
        0, help="neutronorch: threads of the planner's and of the host compute thread's sampling and "
                "aggregation kernels (each); 0 = half the cores")

    @property
    def resolved_staleness(self) -> int:
        """The staleness bound in optimizer steps; by default 2P-1, the smallest that lets the host compute
        super-batch s+1's hot embeddings during all of super-batch s."""
        return 2 * self.super_batch - 1 if self.staleness_bound is None else self.staleness_bound


@dataclass(frozen=True)
class PlacementConfig:
    """Where data lives and how it is read: the placement's and the feature store's part."""

    gpu_memory_gb: float | None = setting(
        None, type=float, metavar="G", bound="positive",
        short="GiB of GPU memory the run may use (default: all)",
        help="device memory this run may use, in GiB: the budget for the training workspace, the topology (where the "
             "device samples) and the feature cache; set it below the GPU's size to emulate a smaller GPU (default: "
             "the whole device)")
    gpu_cache_gb: str | float = setting(
        "auto", metavar="G",
        help="GiB of the hottest feature rows kept on the device; rows not cached are read from pinned host memory; "
             "auto fills what the budget leaves (every row when they fit), 0 turns the cache off; on a CPU-only run a "
             "number builds the cache in host memory; a typed graph's featured types share it in proportion to their "
             "bytes")
    cache_policy: str = setting(
        "presample", choices=("presample", "degree"),
        help="how the cache ranks rows: presample counts bottom-frontier appearances over a few sampled mini-batches, "
             "degree uses out-degree")
    device_sampling: str = setting(
        "auto", choices=("auto", "on", "off"),
        help="neutronorch: sample every hop and plan each super-batch on the device (topology placed there, or read "
             "from pinned host memory; a typed graph's placed there) instead of on the host; auto = on "
             "with CUDA")
    read_order: str = setting(
        "auto", choices=("auto", "file", "batch"),
        help="how memory-mapped features and topology are read (a typed graph's relations: in batch order): file "
             "reads each mini-batch's rows and adjacency front to back (needed when the page cache cannot keep them: "
             "in batch order, readahead then reads pages that are evicted before use); batch in the batch's order "
             "(faster while everything stays in memory); auto = file when the memory-mapped arrays are larger than "
             "half the memory left beside the run's working memory")
    host_cache_gb: str | float = setting(
        "auto", metavar="G",
        help="GiB of the hottest feature rows (below those on the device) copied into memory when the features are a "
             "memory map; the other rows are copied once into a compact file of their own, so each mini-batch's pass "
             "over the file is that much shorter; auto = 60%% of the memory left beside the run's working memory when "
             "the features do not fit in it (none when they do), 0 = off; a typed graph's memory-mapped featured types "
             "share it by their bytes")
    host_cache_dir: str | None = setting(
        None, type=str, metavar="DIR",
        help="folder for the host cache's file of the rows it does not hold (deleted as soon as it is open): needs "
             "that many bytes free (default: next to the features, else the temporary folder)")
    embedding_storage: str = may_change(
        "auto", choices=("auto", "memory", "mmap"),
        help="typed graphs: where the featureless types' embedding tables and their two Adam moments live: memory; "
             "mmap, in files the OS pages rows of in and out (CPU runs; checkpoints keep them as files beside last.pt "
             "and best.pt); auto = memory while they take at most half the memory available, else mmap")
    embedding_dir: str | None = may_change(
        None, type=str, metavar="DIR",
        help="folder for mmap tables' files (deleted as soon as they are open; 12 bytes per table entry) (default: "
             "--checkpoint-dir, else the temporary folder, the first with room)")


@dataclass(frozen=True)
class OutputConfig:
    """What the run keeps: its summary and checkpoints."""

    summary_json: str | None = may_change(
        None, type=str, metavar="PATH", short="write the run summary (accuracy, times) here",
        help="write the run summary (config, per-epoch times, stages, utilisation, data moved, accuracy, "
             "memory) here")
    checkpoint_dir: str | None = may_change(
        None, type=str, metavar="DIR", short="write last.pt each epoch, best.pt at each best",
        help="write DIR/last.pt after every epoch and DIR/best.pt whenever the validation score (--metric) improves "
             "(model, optimizer, config, dataset fingerprint, history; written atomically); `neutronorch predict` "
             "reads them")
    checkpoint_every: int = may_change(
        0, help="also write DIR/last.pt every this many steps, so that a killed run loses at most that many; "
                "0 = at epoch ends only")
    resume: bool = may_change(
        False, short="continue the run of --run-name/--checkpoint-dir",
        help="continue the run whose checkpoints are in --checkpoint-dir from its last.pt (raise --epochs to train "
             "longer), mid-epoch included, in every mode")
    overwrite: bool = may_change(
        False, short="replace an earlier run's outputs, not refuse them",
        help="replace the outputs of an earlier run (--summary-json, the logs, --timeline, the checkpoints in "
             "--checkpoint-dir), kept aside until this run has written its first checkpoint (or its summary) and put "
             "back if it fails before; without it a run refuses paths that already hold them")


@dataclass(frozen=True)
class LogConfig:
    """How the run reports while it trains: the metric logs, the timeline and what the command line shows."""

    log_jsonl: str | None = may_change(
        None, type=str, metavar="PATH", help="write step losses and epoch records as JSON lines here")
    log_csv: str | None = may_change(
        None, type=str, metavar="PATH", help="write step losses and epoch results as CSV here")
    tensorboard: str | None = may_change(
        None, type=str, metavar="DIR",
        help="write TensorBoard scalars (loss, epoch time, validation and test scores, stages, utilisation) to this "
             "folder (needs tensorboard)")
    log_every: int = may_change(
        20, bound="at least 1", help="steps per group of logged step losses, read from the device together")
    timeline: str | None = may_change(
        None, type=str, metavar="PNG",
        help="draw the stage timeline (a Gantt chart of the host, sampler, copy and trainer lanes, with CPU/GPU "
             "utilisation) of a window of steps to this .png; the raw spans go next to it as .spans.json (needs "
             "matplotlib)")
    timeline_steps: int = may_change(
        40, bound="at least 1", help="steps in the timeline window, from the start of the second epoch (the "
                                     "first if the run has one epoch; the third with --hot-ratio auto)")
    progress: bool = may_change(True, help="no progress bar (the per-epoch lines stay)")
    stage_table: bool = may_change(True, help="no per-lane stage breakdown after each epoch line")
    console_log: str | None = may_change(
        None, type=str, metavar="PATH",
        help="copy the run's log lines (epoch lines, stage tables, warnings) into this file, continued by a "
             "resumed run (a run folder keeps them as console.log)")
    curves: str | None = may_change(
        None, type=str, metavar="PNG",
        help="draw the training curves (the loss; validation and test scores) per epoch to this .png at the run's "
             "end (needs matplotlib; a run folder draws curves.png where matplotlib is installed)")


# TrainConfig's parts: the attribute each is held under, and its class. A config file's sections take these names.
PARTS = {"network": NetworkConfig, "sampling": SamplingConfig, "optimization": OptimizationConfig,
         "evaluation": EvaluationConfig, "link": LinkConfig, "neutronorch": NeutronOrchConfig, "placement": PlacementConfig,
         "outputs": OutputConfig, "logging": LogConfig}
