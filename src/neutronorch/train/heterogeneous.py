"""A typed graph's part of a run (docs/heterogeneous.md): ``typed_model`` builds, for ``trainer.build_run``,
what a typed run has beside every run's, and ``TypedParts`` is what the ``Run`` holds of it: its evaluation,
what a resumed run may not change, the summary's typed keys.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import numpy as np
import torch

from neutronorch.capabilities import OWN_MODULE_REFUSED
from neutronorch.config import TrainConfig
from neutronorch.data import TypedGraph
from neutronorch.data.links import row_statistics
from neutronorch.data.typed import relation_label
from neutronorch.errors import CheckpointError, ConfigError
from neutronorch.nn.custom import ModelProtocolError, UserModel, check_trainable
from neutronorch.nn.link import LinkModel, optimizer_groups
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.checkpoint import fanouts_of
from neutronorch.train.distributed import shared_logits
from neutronorch.train.evaluate import eval_subset, scored, typed_logits
from neutronorch.train.health import check_learnable
from neutronorch.train.link_task import LinkTask, evaluate_links, typed_link_graph
from neutronorch.train.optim import Adam, RowAdam
from neutronorch.train.run import Built
from neutronorch.train.typed_tables import TypedTables, plan_tables


@dataclass
class TypedOptions:
    """A typed run's model settings beyond ``TrainConfig``'s: per-relation ``fanouts`` (``typed_fanouts``)
    instead of ``config.fanouts``, R-GCN's ``num_bases`` (basis decomposition), ``embed_dim``, the
    featureless types' table width for sage and rgat (default ``hidden``), and ``table_lr``, the tables'
    learning rate (default ``config.lr``)."""

    fanouts: object = None
    num_bases: int | None = None
    embed_dim: int | None = None
    table_lr: float | None = None


def check_own_model_config(config: TrainConfig) -> None:
    """Raise ``ConfigError`` for a setting your own module cannot train a typed graph with (before any work)."""
    refused = [
        (("typed", config.mode) in OWN_MODULE_REFUSED, OWN_MODULE_REFUSED.get(("typed", config.mode))),
        (bool(config.checkpoint_dir),
         "`checkpoint_dir`: checkpoints of your own module in a typed run are not written yet (a typed checkpoint "
         "rebuilds a built-in model from its arguments; yours needs your module to load into). Leave "
         "`checkpoint_dir`, `checkpoint_every` and `resume` out, and save module.state_dict() after train()."),
        (config.embedding_storage not in ("auto", "memory"),
         f"`embedding_storage` {config.embedding_storage}: it places the built-in models' embedding tables; your "
         f"module's tables are its own. Leave `embedding_storage` out."),
    ]
    for bad, message in refused:
        if bad:
            raise ConfigError(f"{message} docs/heterogeneous.md, 'Your own module'.")


def typed_model(config: TrainConfig, graph: TypedGraph, device: torch.device, user_model: torch.nn.Module | None,
                options: TypedOptions, stack: contextlib.ExitStack, samplers=None, table_maker=None,
                statistics=None) -> Built:
    """A typed graph's part of ``build_run``: the graph with its reverse relations, its samplers, its model
    (``TypedGNN``, or ``user_model`` adapted by ``UserModel``), its tables (``plan_tables``: where they live,
    checked; open while ``stack`` is) and optimizers. ``samplers``: ``new(fanouts)``, which makes a sampler of
    the graph as trained (a partitioned run's: ``graph`` then already holds its reverse relations);
    ``table_maker``: the built-in model's tables (``TypedGNN``'s ``tables``) instead of where ``plan_tables``
    puts them (a partitioned run's, of its part's rows); ``statistics``: a link model's input-row statistics
    per featured type (default: ``graph``'s rows')."""
    link = config.task == "link"  # a relation's edges (train/link_task.py's typed_link_graph)
    warnings = check_learnable(graph, not link)
    if samplers is None:
        graph = typed_link_graph(graph, config) if link else graph.with_reverse()
        samplers = functools.partial(TypedNeighborSampler, graph)
    sampler = samplers(options.fanouts if options.fanouts is not None else config.fanouts)
    eval_fanouts = sampler.fanouts if config.eval_fanouts is None else config.eval_fanouts
    eval_sampler = samplers(eval_fanouts)
    if eval_sampler.num_layers != sampler.num_layers:
        raise ConfigError(f"`eval_fanouts` has {eval_sampler.num_layers} entries but the fanouts give "
                          f"{sampler.num_layers} layers; give one per layer.")
    if user_model is not None:
        try:
            model = UserModel(user_model, sampler.num_layers, graph.num_classes, graph.target)
            check_trainable(user_model, model.kind, sparse_tables=True)  # RowAdam or SparseAdam moves sparse tables
        except ModelProtocolError as exc:
            raise ConfigError(f"`model`: {exc}.") from None
        config.embedding_storage = "memory"  # no built-in model's tables to plan: your module's are its own
    tables = (stack.enter_context(plan_tables(config, graph, sampler.num_layers, options.embed_dim, device))
              if table_maker is None else None)  # a partitioned run's own
    if user_model is None:
        try:
            model = TypedGNN(config.model, TypedSpec.of(graph), config.hidden,
                             config.hidden if link else graph.num_classes, sampler.num_layers,
                             dropout=config.dropout, heads=config.heads, num_bases=options.num_bases,
                             embed_dim=options.embed_dim, tables=table_maker or tables.maker)
        except ValueError as exc:
            raise ConfigError(f"{graph.name}: {exc}.") from None
        if link:  # the typed GNN's rows of the relation's two end types are the embeddings a link head scores
            # Each featured type's RMS row norm and mean row: its input weights scaled, its outputs centred.
            if statistics is None:
                statistics = {t: row_statistics(rows) for t, rows in graph.features.items()}
            model = LinkModel(model, config.link_head, input_norm={t: n for t, (n, _) in statistics.items()},
                              input_mean={t: torch.from_numpy(m) for t, (_, m) in statistics.items() if m is not None})
    model = model.to(device)
    dense = model.dense_parameters()  # none where your own module keeps every weight in sparse tables
    adam = Adam(optimizer_groups(model, config.lr, dense), lr=config.lr, weight_decay=config.weight_decay) \
        if dense else None
    embeddings = model.embedding_parameters()
    table_lr = config.lr if options.table_lr is None else options.table_lr
    if not (isinstance(table_lr, (int, float)) and 0 < table_lr < float("inf")):
        raise ConfigError(f"`TypedOptions.table_lr` {table_lr!r}: the embedding tables' learning rate must be a "
                          f"positive number (or None: the run's `lr`).")
    # The tables' optimizer: RowAdam for float32 CPU tables, else SparseAdam (the same update as sparse-tensor
    # ops; a torch.optim.Optimizer, whose import of torch._dynamo takes seconds: made only when needed).
    sparse = None
    if embeddings and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in embeddings):
        sparse = RowAdam(embeddings, lr=table_lr, moments=tables and tables.moments)  # None: tables in memory
    elif embeddings:
        sparse = torch.optim.SparseAdam(embeddings, lr=table_lr)
    parameters = {"dense": sum(p.numel() for p in dense), "embedding": sum(p.numel() for p in embeddings)}
    parts = TypedParts(sampler, eval_sampler, adam, sparse, tables if user_model is None else None,
                       parameters)
    return Built(graph, model, [o for o in (adam, sparse) if o is not None], warnings, dense, embeddings, parts)


def saved_lr(state: dict) -> float:
    """The learning rate in the state of the tables' optimizer: RowAdam's, or SparseAdam's (one group)."""
    return float(state["lr"] if "lr" in state else state["param_groups"][0]["lr"])


@dataclass
class TypedParts:
    """What a typed graph's run holds besides a homogeneous one's parts (``run.py``'s ``Run.typed``)."""

    sampler: TypedNeighborSampler  # the training fanouts, per relation
    eval_sampler: TypedNeighborSampler
    adam: Adam | None  # the dense weights' optimizer; None where your own module keeps every weight in tables
    sparse: object  # the embedding tables' (RowAdam or SparseAdam), or None without tables
    tables: TypedTables | None  # where the tables live (train/typed_tables.py), memory-mapped ones' moments too
    parameters: dict  # {"dense": ..., "embedding": ...} counts

    @property
    def table_lr(self) -> float | None:
        """The tables' learning rate, as their optimizer holds it."""
        return None if self.sparse is None else saved_lr(self.sparse.state_dict())

    def evaluate(self, run, check, progress=None) -> dict[str, float]:
        """The metric on the validation and test sets (``eval_max_nodes``: a fixed sample of each), from
        samples of the one evaluation key (``typed_logits``); ``progress(0, done, total)`` after each set."""
        config, graph, scores, done = run.config, run.graph, {}, 0
        if isinstance(run.task, LinkTask):
            return evaluate_links(run.model, graph, self.eval_sampler, run.device, config.eval_batch_size,
                                  config.seed, config.eval_negatives, run.task, check=check)
        sets = {"val": eval_subset(graph.val_idx, config.eval_max_nodes, config.seed),
                "test": eval_subset(graph.test_idx, config.eval_max_nodes, config.seed + 1)}
        total = sum(len(nodes) for nodes in sets.values())
        for name, nodes in sets.items():
            logits = shared_logits(run.world, lambda part: typed_logits(
                run.model, graph, self.eval_sampler, part, run.device, config.eval_batch_size, config.seed),
                torch.from_numpy(nodes))  # data parallel: a share on each rank, gathered
            labels = torch.from_numpy(np.asarray(graph.labels[nodes]))
            scores.update(scored(run.task, {name: (logits, labels)}, check))  # finite, collapse noted
            done += len(nodes)
            if progress is not None:
                progress(0, done, total)
        return scores

    def check_resumable(self, state: dict, model: TypedGNN, source: str) -> None:
        """A typed run continues the checkpoint's only with its model arguments (``TypedOptions``'
        ``num_bases`` and ``embed_dim`` too), fanouts per relation and tables' optimizer."""
        saved, now = state["model_args"], model.arguments
        differ = [f"the model's `{k}` {saved.get(k)!r} then, {now[k]!r} now" for k in now
                  if k != "spec" and saved.get(k) != now[k]]
        before, after = fanouts_of(state), self.sampler.fanouts
        differ += [f"the fanouts of {relation_label(r)} {before.get(r)} then, {after.get(r)} now"
                   for r in {**before, **after} if before.get(r) != after.get(r)]
        tables, sparse = state["tables_optimizer"], self.sparse and type(self.sparse).__name__
        if (tables and tables.get("class")) != sparse:
            differ.append(f"the embedding tables' optimizer {tables and tables.get('class')} then (RowAdam for CPU "
                          f"tables, SparseAdam elsewhere), {sparse} now: resume on the device the run started on")
        elif tables and saved_lr(tables["state"]) != self.table_lr:
            differ.append(f"the embedding tables' learning rate {saved_lr(tables['state'])} then, {self.table_lr} now")
        if differ:
            raise CheckpointError(f"{source}: the run it continues trained otherwise: {'; '.join(differ)}. Resume "
                                  f"with the same `fanouts`, `num_bases`, `embed_dim` and `table_lr` (`TypedOptions`) "
                                  f"and device, or start a new run in another `checkpoint_dir`.")

    def summary(self, run) -> dict:
        """A typed run's own summary keys (``summary.summarise``); a mode that reads memory-mapped featured
        types on the host gives their ``host_cache`` and ``read_order`` (``TypedInputs.summary``)."""
        return {
            "host_cache": None, "read_order": None,
            "model": {"kind": run.model.kind, "typed": True, "parameters": self.parameters,
                      "arguments": run.model.arguments},
            "fanouts": {relation_label(r): f for r, f in self.sampler.fanouts.items()},
            "embedding_tables": None if self.tables is None else {**self.tables.summary(), "lr": self.table_lr},
            "threads": {"train": run.threads.train, "sampler": run.threads.sampler},
        }
