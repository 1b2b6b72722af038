"""Checkpoints of typed runs: ``last.pt`` and ``best.pt`` in ``checkpoint_dir``, the exact resume from
``last.pt``, and reading one back for ``predict`` and ``embed`` (``train/typed_predict.py``).

A typed checkpoint is a file of ``checkpoint.py``'s format (the same atomic write, format version and part
checks) whose ``kind`` is ``typed``. It holds every part a homogeneous one holds (the configuration, the
epoch, the epoch records, the best evaluation, the position within the epoch, the random state, the model's
constructor arguments, ``TypedGNN.arguments``, and its weights, embedding tables included, and Adam's state
for the dense weights) and besides:

- ``dataset``: the typed graph's fingerprint, as it was trained (reverse relations added): its name, the
  vertex count and feature width of every type, every relation's edge count, the target and its classes,
  and checksums of strided samples of every relation's topology and edge features, every type's features,
  the labels and the three splits (``sample_crc``: about 4,096 rows of each, so a memory-mapped array is never read whole);
- ``tables_optimizer``: the embedding tables' optimizer (``RowAdam``, or ``SparseAdam`` off the CPU): its
  class and state, each table's step count and two moments;
- ``fanouts``: every relation's fanouts as the sampler resolved them (per relation, when ``train_typed`` was
  given a dict), which predictions sample with;
- ``table_files`` (memory-mapped tables, ``embedding_storage`` mmap): the folder beside the checkpoint that
  holds those tables' weights and moments, which ``model`` and ``tables_optimizer`` then leave out
  (``train/table_files.py``: written with the checkpoint, checked when read).

Size: the weights and Adam's two moments, 12 bytes per parameter; an embedding table row of width ``w``
costs ``12 w`` bytes (768 at the default 64), in each of ``last.pt`` and ``best.pt`` (or its table folder).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from neutronorch.config import TrainConfig
from neutronorch.data.typed import TypedGraph, relation_label
from neutronorch.errors import CheckpointError
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.train.checkpoint import (CHECKPOINT_PARTS, TYPED, check_parts, checkpoint_state, holding_weights,
                                          read_state, sample_crc)
from neutronorch.train.outputs import write_atomically
from neutronorch.train.resume import check_same_data, check_settings, last_checkpoint, restore
from neutronorch.train.table_files import attach_tables, checkpoint_tables, stored_tables

# A typed checkpoint's parts: a homogeneous one's less the modes' (typed runs train in exact mode, in one
# process), and the tables' optimizer and the fanouts.
TYPED_PARTS = {**{k: v for k, v in CHECKPOINT_PARTS.items() if k not in ("mode_state", "world_size", "mode_choice")},
               "tables_optimizer": (lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("state"), dict)),
                                    "the embedding tables' optimizer (a dict holding a `state` dict, or None)"),
               "fanouts": (lambda v: isinstance(v, list) and all(isinstance(f, list) and len(f) == 2 for f in v),
                           "a list of [relation, fanouts] pairs")}
TYPED_OPTIONAL = ("best", "position", "rng", "typed_mode_state")
TYPED_FINGERPRINT_KEYS = {"name": str, "num_nodes": dict, "edges": dict, "feature_dims": dict, "target": str,
                          "classes": int}



def typed_fingerprint(graph: TypedGraph) -> dict:
    """What identifies a typed graph cheaply: its sizes per type and relation, its target, and checksums of
    strided samples of its arrays (``sample_crc``), per relation and type where there are several."""
    relations = {relation_label(r): relation for r, relation in graph.relations.items()}
    return {"name": graph.name, "num_nodes": {t: int(n) for t, n in graph.num_nodes.items()},
            "edges": {label: int(relation.num_edges) for label, relation in relations.items()},
            "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes}, "target": graph.target,
            "classes": int(graph.num_classes),
            "topology_crc": {label: sample_crc(relation.indices) for label, relation in relations.items()},
            "features_crc": {t: sample_crc(rows) for t, rows in graph.features.items()},
            "edge_features_crc": {label: sample_crc(relation.edge_features) for label, relation in relations.items()
                                  if relation.edge_features is not None},
            "labels_crc": sample_crc(graph.labels), "split_crc": sample_crc(graph.train_idx),
            "val_crc": sample_crc(graph.val_idx), "test_crc": sample_crc(graph.test_idx)}


def spec_of(arguments: dict) -> TypedSpec:
    """The ``TypedSpec`` a model's stored arguments describe (``TypedSpec.from_dict``, edge feature widths
    included: R-GAT's ``lin_edge`` weights and the relations SAGE and R-GCN weight their means by follow from
    them)."""
    return TypedSpec.from_dict(arguments["spec"])


def fanouts_of(state: dict) -> dict[tuple, list[int]]:
    """The fanouts per relation triple that a checkpoint's run sampled with."""
    return {tuple(relation): list(fanouts) for relation, fanouts in state["fanouts"]}


def save_typed_checkpoint(path: str | Path, run, epoch: int, position: dict, fingerprint: dict) -> Path:
    """Write ``run``'s state (a typed run: its config, graph, model, ``adam``, ``sparse``, sampler, history
    and best) atomically: the temporary file beside ``path``, flushed and renamed into place."""
    state = {**checkpoint_state(TYPED, run.config, fingerprint, run.model, run.adam, epoch, run.history, position,
                                run.best),
             "tables_optimizer": None if run.sparse is None else {"class": type(run.sparse).__name__,
                                                                  "state": run.sparse.state_dict()},
             "fanouts": [[list(relation), list(f)] for relation, f in run.sampler.fanouts.items()],
             # NeutronOrch: the version, the snapshots and summed hot-row gradient in flight ({} in the others)
             "typed_mode_state": run.mode.state_dict() if run.mode is not None else None}
    version = epoch * run.num_batches + position["step"]  # optimizer steps taken
    with stored_tables(state, Path(path), getattr(run, "tables", None), version):  # mapped tables: files beside
        return write_atomically(path, lambda f: torch.save(state, f))


def load_typed_state(path: str | Path) -> dict:
    """The contents of a typed checkpoint, checked to be one this neutronorch reads: every part there and of
    its type, and the weights fitting the model its arguments build (a homogeneous checkpoint is refused
    saying so)."""
    path = Path(path)
    state = read_state(path, TYPED)
    check_parts(state, path, TYPED_PARTS, TYPED_OPTIONAL, TYPED_FINGERPRINT_KEYS)
    attach_tables(state, path)  # memory-mapped tables, from the files beside it
    typed_model(state, path)
    return state


def typed_model(state: dict, path: Path) -> TypedGNN:
    """The model a typed checkpoint's arguments build, holding its weights, in eval mode on the CPU."""
    try:
        model = TypedGNN(**{**state["model_args"], "spec": spec_of(state["model_args"])},
                         tables=checkpoint_tables(state))
    except Exception as exc:  # noqa: BLE001 - foreign arguments fail in the constructor in many ways
        raise CheckpointError(f"{path}: its model arguments build no relational model ({type(exc).__name__}: "
                              f"{exc}). The file is damaged or from another program; use last.pt or best.pt of a "
                              f"--checkpoint-dir.") from None
    model = holding_weights(model, state, path, "its weights do not fit the model its arguments describe",
                            "The file is damaged; use another checkpoint or train again.")
    return model.eval()


@dataclass
class TypedCheckpoint:
    """A typed checkpoint read for inference: the model (eval mode, on the CPU) and what produced it."""

    model: TypedGNN
    config: TrainConfig
    epoch: int
    dataset: dict  # the fingerprint of the graph it was trained on (reverse relations added)
    history: list[dict]
    fanouts: dict[tuple, list[int]]  # per relation, as the run sampled


def load_typed_checkpoint(path: str | Path) -> TypedCheckpoint:
    """Read a typed run's checkpoint (``last.pt`` or ``best.pt``): its model, ready for inference, and what
    produced it. ``predict`` and ``embed`` take it (or its path) with a ``TypedGraph``."""
    state = load_typed_state(path)
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in TrainConfig.keys()})
    return TypedCheckpoint(typed_model(state, Path(path)), config, int(state["epoch"]), state["dataset"],
                           state["history"], fanouts_of(state))


def check_typed_fits(checkpoint: TypedCheckpoint, graph: TypedGraph, source: str) -> None:
    """The model must fit ``graph`` (reverse relations added): the same target and classes, relations, and
    for each type the model reads its feature width, and for a featureless type (an embedding table, a row per
    vertex) its vertex count. The data may otherwise differ (other features, more papers)."""
    args, spec = checkpoint.model.arguments, checkpoint.model.spec
    differ = []
    if graph.target != spec.target or graph.num_classes != args["num_classes"]:
        differ.append(f"target {spec.target} of {args['num_classes']} classes (checkpoint) vs {graph.target} of "
                      f"{graph.num_classes} (data)")
    missing = [relation_label(r) for r in spec.relations if r not in graph.relations]
    extra = [relation_label(r) for r in graph.relations if r not in spec.relations]
    if missing or extra:
        differ.append("relations " + "; ".join(
            [f"{', '.join(missing)} missing from the data"] * bool(missing) + [f"{', '.join(extra)} unknown to the "
                                                                                f"model"] * bool(extra)))
    for t in checkpoint.model.input_types:
        width = spec.feature_dims[t]
        if t not in graph.num_nodes:
            differ.append(f"vertex type {t} missing from the data")
        elif graph.feature_dim(t) != width:
            differ.append(f"{t} feature width {width} (checkpoint) vs {graph.feature_dim(t)} (data; 0: none)")
        elif not width and graph.num_nodes[t] != spec.num_nodes[t]:
            differ.append(f"{t} embedding table of {spec.num_nodes[t]:,} rows (checkpoint) vs {graph.num_nodes[t]:,} "
                          f"vertices (data)")
    if differ:
        raise CheckpointError(f"{source}: the checkpoint's model does not fit this graph: {'; '.join(differ)}.")


def resume_typed(run) -> None:
    """Restore the typed run ``run`` from ``checkpoint_dir``/last.pt (``restore``: weights, both optimizers,
    random state, history, best, the mode's state) and set where it continues, once the checkpoint's run is
    one it may continue: the same graph, settings, model arguments (``train_typed``'s ``num_bases`` and
    ``embed_dim`` too), fanouts per relation and tables' optimizer."""
    path, state = last_checkpoint(run.config, load_typed_state)
    source = str(path)
    check_settings(state, run.config, source)  # a setting that differs is named before the graph
    check_same_data(state, typed_fingerprint(run.graph), source, "typed graph")
    saved, now = state["model_args"], run.model.arguments
    differ = [f"the model's `{k}` {saved.get(k)!r} then, {now[k]!r} now" for k in now
              if k != "spec" and saved.get(k) != now[k]]
    before, after = fanouts_of(state), run.sampler.fanouts
    differ += [f"the fanouts of {relation_label(r)} {before.get(r)} then, {after.get(r)} now"
               for r in {**before, **after} if before.get(r) != after.get(r)]
    tables = state["tables_optimizer"]
    if (tables and tables.get("class")) != (run.sparse and type(run.sparse).__name__):
        differ.append(f"the embedding tables' optimizer {tables and tables.get('class')} then (RowAdam for CPU "
                      f"tables, SparseAdam elsewhere), {run.sparse and type(run.sparse).__name__} now: resume "
                      f"on the device the run started on")
    if differ:
        raise CheckpointError(f"{source}: the run it continues trained otherwise: {'; '.join(differ)}. Resume "
                              f"with the same `fanouts`, `num_bases` and `embed_dim` (train_typed's arguments) "
                              f"and device, or start a new run in another `checkpoint_dir`.")

    def optimizers_and_mode(state: dict) -> None:
        run.adam.load_state_dict(state["optimizer"])
        if run.sparse is not None:
            run.sparse.load_state_dict(state["tables_optimizer"]["state"])
        run.resumed_mode = state.get("typed_mode_state")  # loaded into the mode once it is built

    restore(run, state, path, optimizers_and_mode)
