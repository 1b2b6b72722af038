"""Checkpoints, of both kinds of graph (docs/checkpoints.md): one ``torch.save`` file of the parts
``CHECKPOINT_PARTS`` lists, written atomically (a crash or a full disk mid-write leaves the previous one
intact) and read back for prediction and resume, every part checked; a reader given the other kind says
what the file is and which reader takes it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph, relation_label
from neutronorch.errors import CheckpointError, not_a_file, permission_message
from neutronorch.nn.custom import UserModel
from neutronorch.nn.link import LinkModel
from neutronorch.nn.models import GNN
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.atomic import write_atomically
from neutronorch.train.table_files import attach_tables, checkpoint_tables, sample_crc, stored_tables
from neutronorch.train.part_states import whole_tables

# Format 1 trained GCN with the mean (no ``gcn_norm``); 3 added ``kind``; 4 renamed a typed one's
# ``typed_mode_state`` to ``mode_state``.
FORMAT_VERSION = 4
HOMOGENEOUS, TYPED = "homogeneous", "typed"  # the kinds; a checkpoint of format 1 or 2 is homogeneous
# How a reader expecting another kind names each kind, and what reads it.
_KIND_READERS = {HOMOGENEOUS: ("a homogeneous graph's run", "a homogeneous graph"),
                 TYPED: ("a typed graph's run", "its typed graph (docs/heterogeneous.md)")}


def save_checkpoint(path: str | os.PathLike, *, config: TrainConfig, graph: Graph | TypedGraph, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer, epoch: int, history: list[dict], position: dict,
                    best: dict | None = None, mode_state: dict | None = None, world_size: int = 1,
                    mode_choice: dict | None = None, fingerprint: dict | None = None, typed=None,
                    partition: dict | None = None) -> Path:
    """Write a checkpoint atomically (temporary file, fsync, rename). It holds the random state, so a run
    resumed from it draws the dropout masks the uninterrupted run would have drawn. ``position``: steps of
    ``epoch`` done and the float32 sum of their losses (all of them when the epoch is complete). A typed
    graph's run gives ``typed``: (its tables' optimizer or None, fanouts per relation, its ``TypedTables`` or
    None, optimizer steps taken: the version of memory-mapped tables' files). A rank of a partitioned run gives
    ``partition``: the partition's ``id``, its ``part`` and the ``parts`` (``train/part_checkpoint.py``)."""
    device = next(model.parameters()).device
    state = {
        "format_version": FORMAT_VERSION,
        "kind": TYPED if typed is not None else HOMOGENEOUS,
        "config": config.to_dict(),
        "dataset": fingerprint or dataset_fingerprint(graph),
        "epoch": epoch, "history": history, "best": best, "position": position,
        "model_args": dict(model.arguments),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
        "mode_state": mode_state or {},  # what the mode carries across the boundary (NeutronOrch's snapshots)
        "world_size": world_size,  # data-parallel ranks (mode_state then holds each rank's under "ranks")
        # mode auto: the mode chosen, why and from what (the config holds the chosen mode, which a resumed
        # auto run keeps); None where the mode was given.
        "mode_choice": mode_choice,
        **({"partition": partition} if partition is not None else {}),
    }
    if typed is None:
        return write_atomically(path, lambda f: torch.save(state, f))
    sparse, fanouts, tables, version = typed
    state["tables_optimizer"] = None if sparse is None else {"class": type(sparse).__name__,
                                                             "state": sparse.state_dict()}
    state["fanouts"] = [[list(relation), list(f)] for relation, f in fanouts.items()]
    with stored_tables(state, Path(path), tables, version):  # memory-mapped tables: files beside it
        return write_atomically(path, lambda f: torch.save(state, f))


@dataclass
class Checkpoint:
    """A checkpoint read for inference, of either kind: the model (eval mode, on the CPU) and what produced it."""

    model: torch.nn.Module  # GNN, LinkModel, your own model's UserModel, or a typed run's TypedGNN
    config: TrainConfig
    epoch: int
    dataset: dict  # the fingerprint of the data it was trained on (a typed graph's with its reverse relations)
    history: list[dict]
    fanouts: dict[tuple, list[int]] | None = None  # a typed run's, per relation, as it sampled; None: homogeneous

    @property
    def typed(self) -> bool:
        return self.fanouts is not None


def load_checkpoint(path: str | os.PathLike, model: torch.nn.Module | None = None,
                    kind: str | None = None) -> Checkpoint:
    """Read a checkpoint written by training, of either kind of graph (of ``kind`` when given, else of the
    kind the file says): the model (ready for inference) and what produced it. A run of your own model
    (``train(..., model=...)``) saved its weights only: give ``model``, a module of the same class, which
    receives them."""
    state = load_state(path, kind)
    kind = state.get("kind", HOMOGENEOUS)
    if split_tables(state):  # a rank's of a typed run on parts: the tables made whole from every rank's file
        state = whole_tables(Path(path), state, lambda file: load_state(file, TYPED))
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in TrainConfig.keys()})
    return Checkpoint(_model(state, Path(path), model).eval(), config, int(state["epoch"]), state["dataset"],
                      state["history"], fanouts_of(state) if kind == TYPED else None)


def load_typed_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """``load_checkpoint`` of a file that must be a typed run's checkpoint."""
    return load_checkpoint(path, kind=TYPED)


def load_state(path: str | os.PathLike, kind: str | None = None) -> dict:
    """The raw contents of a checkpoint file of ``kind`` (None: of either), checked to be one this neutronorch
    can read: every part training and prediction read is there, of its type, and the weights fit the model
    they belong to (a typed one's memory-mapped tables attached from the files beside it)."""
    path = Path(path)
    state = read_state(path, kind)
    if state.get("kind", HOMOGENEOUS) == TYPED:
        if "typed_mode_state" in state:  # format 3's name for the mode's state
            state["mode_state"] = state.pop("typed_mode_state") or {}
        check_parts(state, path, optional=OPTIONAL_PARTS[:-2], fingerprint=TYPED_FINGERPRINT_KEYS)
        attach_tables(state, path)
    else:
        check_parts(state, path)
    if state["format_version"] < 2:  # before the setting existed, GCN normalised by the mean
        state["model_args"].setdefault("gcn_norm", "mean")
        state["config"].setdefault("gcn_norm", "mean")
    if "custom" not in state["model_args"]:  # a user's model is checked when its module is given
        _model(state, path)  # the weights must fit the model their arguments build
    return state


def read_state(path: Path, kind: str | None) -> dict:
    """A checkpoint file's contents, read safely (tensors and plain values only), of a format version this
    neutronorch reads and of a kind it reads (``kind`` when given: a file of another kind is refused saying
    what it is); its parts are not checked yet (``check_parts``)."""
    if not path.is_file():
        raise CheckpointError(f"{path}: {not_a_file(path, 'no such checkpoint file')}"
                              + (" (give DIR/best.pt or DIR/last.pt of --checkpoint-dir)." if path.is_dir() else "."))
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file fails in many ways
        if isinstance(exc, PermissionError):
            raise CheckpointError(permission_message(path)) from None
        # torch's own message for a file holding other objects suggests loading it with weights_only=False,
        # which would run any code the file names; it is not repeated.
        reason = "it holds objects other than tensors and plain values" if "eights only" in str(exc) else (
            f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        raise CheckpointError(f"{path}: cannot be read as a neutronorch checkpoint ({reason}). The file is truncated "
                              f"or not a checkpoint; use last.pt or best.pt of a --checkpoint-dir.") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{path}: not a neutronorch checkpoint (no format version).")
    version = state["format_version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise CheckpointError(f"{path}: not a neutronorch checkpoint (format version {version!r}, expected a whole "
                              f"number from 1); use last.pt or best.pt of a --checkpoint-dir.")
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path}: written in checkpoint format {version} by a newer "
                              f"neutronorch; this one reads format {FORMAT_VERSION}. Upgrade neutronorch.")
    found = state.get("kind", HOMOGENEOUS)
    if found not in _KIND_READERS:
        raise CheckpointError(f"{path}: a checkpoint of kind {found!r}, which this neutronorch does not read "
                              f"(it reads {' and '.join(_KIND_READERS)} ones).")
    if kind is not None and found != kind:
        args = state.get("model_args") if isinstance(state.get("model_args"), dict) else {}
        dataset = state.get("dataset") if isinstance(state.get("dataset"), dict) else {}
        what, reader = _KIND_READERS[found]
        raise CheckpointError(f"{path}: the checkpoint of {what} (model {args.get('kind', '?')}, dataset "
                              f"{dataset.get('name', '?')}), not of {_KIND_READERS[kind][0]}; predict, embed or "
                              f"resume it with {reader}.")
    return state


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The parts of a checkpoint and what each must be; a part that fails is named, so a damaged or foreign file
# is refused when it is read, not with a KeyError or TypeError wherever the part is first used.
CHECKPOINT_PARTS = {
    "config": (dict, "a dict of settings"),
    "dataset": (dict, "the dataset's fingerprint (a dict)"),
    "epoch": (_is_int, "a whole number"),
    "history": (list, "a list of epoch records"),
    "model_args": (dict, "the model's constructor arguments (a dict)"),
    "model": (dict, "the model's weights (a dict of tensors)"),
    "optimizer": (dict, "the optimizer's state (a dict)"),
    "best": (lambda v: v is None or isinstance(v, dict), "the best evaluation (a dict or None)"),
    "mode_state": (dict, "the mode's state (a dict)"),
    "position": (lambda v: isinstance(v, dict) and _is_int(v.get("step")) and isinstance(v.get("loss_sum"),
                                                                                          (int, float)),
                 "a dict with a whole `step` and a number `loss_sum`"),
    "rng": (lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("torch"), torch.Tensor)),
            "the random state (a dict holding a `torch` tensor)"),
    "world_size": (lambda v: _is_int(v) and v >= 1, "a whole number >= 1"),
    "mode_choice": (lambda v: v is None or isinstance(v, dict), "the choice of mode auto (a dict or None)"),
    "tables_optimizer": (lambda v: v is None or (isinstance(v, dict) and isinstance(v.get("state"), dict)),
                         "the embedding tables' optimizer (a dict holding a `state` dict, or None)"),
    "fanouts": (lambda v: isinstance(v, list) and all(isinstance(f, list) and len(f) == 2 for f in v),
                "a list of [relation, fanouts] pairs"),
    "partition": (lambda v: isinstance(v, dict) and isinstance(v.get("id"), str) and _is_int(v.get("part"))
                  and _is_int(v.get("parts")), "the partition's `id`, `part` and `parts` (a dict)"),
}
# Parts a checkpoint may lack: written before they existed, read only when a run resumes, a partitioned run's
# alone (``partition``), or (the last two) a typed one's alone.
OPTIONAL_PARTS = ("best", "mode_state", "position", "rng", "world_size", "mode_choice", "partition",
                  "tables_optimizer", "fanouts")
FINGERPRINT_KEYS = {"name": str, "nodes": int, "edges": int, "feature_dim": int, "classes": int}
TYPED_FINGERPRINT_KEYS = {"name": str, "num_nodes": dict, "edges": dict, "feature_dims": dict, "target": str,
                          "classes": int}


def check_parts(state: dict, path: Path, optional: tuple = OPTIONAL_PARTS, fingerprint: dict = FINGERPRINT_KEYS
                ) -> None:
    """Raise ``CheckpointError`` naming every part of ``state`` that is missing (unless ``optional``) or
    not what ``CHECKPOINT_PARTS`` says it must be, and every ``fingerprint`` key of its dataset not of its
    type."""
    problems = []
    for key, (kind, meaning) in CHECKPOINT_PARTS.items():
        if key not in state:
            if key not in optional:
                problems.append(f"`{key}` is missing")
            continue
        value = state[key]
        ok = isinstance(value, kind) if isinstance(kind, type) else kind(value)
        if not ok:
            problems.append(f"`{key}` is {type(value).__name__}, expected {meaning}")
    if not problems:
        if not all(isinstance(k, str) for k in state["config"]) or not all(isinstance(k, str)
                                                                            for k in state["model_args"]):
            problems.append("`config` or `model_args` has keys that are not names")
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state["model"].items()):
            problems.append("`model` holds entries that are not named tensors")
        for key, kind in fingerprint.items():
            value = state["dataset"].get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                problems.append(f"`dataset.{key}` is {value!r}, expected {kind.__name__}")
    if problems:
        raise CheckpointError(f"{path}: not a checkpoint this neutronorch can read: {'; '.join(problems)}. The file "
                              f"is damaged or was not written by neutronorch training; use last.pt or best.pt of a "
                              f"--checkpoint-dir, or train again.")


def _model(state: dict, path: Path, given: torch.nn.Module | None = None) -> torch.nn.Module:
    """The model the checkpoint's arguments build (or, for a user's model, ``given``), holding its weights (a
    typed one's memory-mapped tables attached)."""
    args, typed = state["model_args"], state.get("kind") == TYPED
    if "custom" in args or given is not None:
        return _user_model(state, path, given)
    try:
        tables = checkpoint_tables(state) or (part_rows(state) if split_tables(state) else None)
        build = (lambda a: TypedGNN(**{**a, "spec": TypedSpec.from_dict(a["spec"])},
                                    tables=tables)) if typed else (lambda a: GNN(**a))
        if "link_head" in args:  # a link task's: its encoder and head
            model = LinkModel(build(args["encoder"]), args["link_head"], args.get("head_dropout", 0.0))
        else:
            model = build(args)
    except Exception as exc:  # noqa: BLE001 - foreign arguments fail in the constructor in many ways
        raise CheckpointError(f"{path}: its model arguments build no {'relational ' * typed}model "
                              f"({type(exc).__name__}: {exc}). The file is damaged or from another program; use "
                              f"last.pt or best.pt of a --checkpoint-dir.") from None
    return holding_weights(model, state, path, "its weights do not fit the model its arguments describe",
                           "The file is damaged; use another checkpoint or train again.")


def split_tables(state: dict) -> bool:
    """Whether the checkpoint is a rank's of a typed run on several parts, its embedding tables its part's rows
    (``part_tables.py``)."""
    return state.get("kind") == TYPED and state.get("partition", {}).get("parts", 1) > 1


def part_rows(state: dict):
    """``TypedGNN``'s ``tables`` for a ``split_tables`` checkpoint: each table of the rows the rank held."""
    model = state["model"]  # a link model's under its encoder
    shape = lambda t: next(v.shape for k, v in model.items() if k.endswith(f"embeddings.{t}.weight"))  # noqa: E731
    return lambda node_type, rows, width: nn.Embedding(*shape(node_type), sparse=True)


def holding_weights(model, state: dict, path: Path, problem: str, advice: str = ""):
    """``model`` with the checkpoint's weights loaded, or a CheckpointError saying ``problem``."""
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        detail = " ".join(str(exc).split())[:300]
        raise CheckpointError(f"{path}: {problem} ({detail}).{' ' + advice if advice else ''}") from None
    return model


def _user_model(state: dict, path: Path, given: torch.nn.Module | None) -> UserModel:
    args = state["model_args"]
    name = args.get("custom")
    if name is None:
        raise CheckpointError(f"{path}: holds a built-in model ({args.get('kind')}); load it without `model`.")
    if given is None:
        raise CheckpointError(f"{path}: holds the weights of your own model ({name}), not the code that builds it; "
                              f"load it with load_checkpoint(path, model=<a new {name.rsplit('.', 1)[-1]}>) and pass "
                              f"that checkpoint to predict (the command line's predict and embed read built-in models "
                              f"only).")
    problem = f"its weights (of {name}) do not fit the model given, {type(given).__name__}"
    try:
        model = UserModel.wrap(given, int(args["num_layers"]), int(args["width"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {problem} ({exc}).") from None
    return holding_weights(model, state, path, problem)


def fanouts_of(state: dict) -> dict[tuple, list[int]]:
    """The fanouts per relation triple that a checkpoint's run sampled with."""
    return {tuple(relation): list(fanouts) for relation, fanouts in state["fanouts"]}


def check_fits(checkpoint: Checkpoint, graph: Graph | TypedGraph, source: str) -> None:
    """The model must fit the data it is applied to. A homogeneous one: its input width and classes (a link
    model's outputs are embeddings, not classes, so only its input width: its graph may have any classes, or
    none). A typed one (``graph`` with its reverse relations): the same target and classes, relations, and for
    each type the model reads its feature width, and for a featureless type (an embedding table, a row per
    vertex) its vertex count; the data may otherwise differ (other features, more papers)."""
    if checkpoint.typed:
        link = isinstance(checkpoint.model, LinkModel)  # its outputs are embeddings: no classes to fit
        differ = _typed_misfits(checkpoint.model.encoder if link else checkpoint.model, graph, link)
    else:
        found = dataset_fingerprint(graph)
        keys = ("feature_dim",) if isinstance(checkpoint.model, LinkModel) else ("feature_dim", "classes")
        differ = [f"{key} {checkpoint.dataset[key]} (checkpoint) vs {found[key]} (data)"
                  for key in keys if checkpoint.dataset[key] != found[key]]
    if differ:
        data = "graph" if checkpoint.typed else "dataset"
        raise CheckpointError(f"{source}: the checkpoint's model does not fit this {data}: {'; '.join(differ)}.")


def _typed_misfits(model: TypedGNN, graph: TypedGraph, link: bool = False) -> list[str]:
    args, spec = model.arguments, model.spec
    differ = []
    if link and graph.target != spec.target:
        differ.append(f"target {spec.target} (checkpoint) vs {graph.target} (data)")
    elif not link and (graph.target != spec.target or graph.num_classes != args["num_classes"]):
        differ.append(f"target {spec.target} of {args['num_classes']} classes (checkpoint) vs {graph.target} of "
                      f"{graph.num_classes} (data)")
    missing = [relation_label(r) for r in spec.relations if r not in graph.relations]
    extra = [relation_label(r) for r in graph.relations if r not in spec.relations]
    if missing or extra:
        differ.append("relations " + "; ".join(
            [f"{', '.join(missing)} missing from the data"] * bool(missing) + [f"{', '.join(extra)} unknown to the "
                                                                                f"model"] * bool(extra)))
    for t in model.input_types:
        width = spec.feature_dims[t]
        if t not in graph.num_nodes:
            differ.append(f"vertex type {t} missing from the data")
        elif graph.feature_dim(t) != width:
            differ.append(f"{t} feature width {width} (checkpoint) vs {graph.feature_dim(t)} (data; 0: none)")
        elif not width and graph.num_nodes[t] != spec.num_nodes[t]:
            differ.append(f"{t} embedding table of {spec.num_nodes[t]:,} rows (checkpoint) vs {graph.num_nodes[t]:,} "
                          f"vertices (data)")
    return differ


def dataset_fingerprint(graph) -> dict:
    """What identifies a graph cheaply: its sizes and checksums of strided samples of its arrays
    (``sample_crc``; its times' where it has them); a typed graph's per type and relation where there are
    several, and its target."""
    splits = {"labels_crc": None if graph.labels is None else sample_crc(graph.labels),  # a typed link graph's: none
              "split_crc": sample_crc(graph.train_idx), "val_crc": sample_crc(graph.val_idx),
              "test_crc": sample_crc(graph.test_idx)}
    if not isinstance(graph, TypedGraph):
        times = {f"{name}_crc": sample_crc(getattr(graph, name)) for name in ("edge_time", "node_time")
                 if getattr(graph, name) is not None}
        return {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
                "feature_dim": graph.feature_dim, "classes": graph.num_classes,
                "topology_crc": sample_crc(graph.indices), "features_crc": sample_crc(graph.features), **splits,
                **times}
    relations = {relation_label(r): relation for r, relation in graph.relations.items()}
    timed = {label: sample_crc(relation.edge_time) for label, relation in relations.items()
             if relation.edge_time is not None}
    times = ({"edge_time_crc": timed} if timed else {}) | (
        {"node_time_crc": {t: sample_crc(time) for t, time in graph.node_time.items()}} if graph.node_time else {})
    return {"name": graph.name, "num_nodes": {t: int(n) for t, n in graph.num_nodes.items()},
            "edges": {label: int(relation.num_edges) for label, relation in relations.items()},
            "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes}, "target": graph.target,
            "classes": int(graph.num_classes),
            "topology_crc": {label: sample_crc(relation.indices) for label, relation in relations.items()},
            "features_crc": {t: sample_crc(rows) for t, rows in graph.features.items()},
            "edge_features_crc": {label: sample_crc(relation.edge_features) for label, relation in relations.items()
                                  if relation.edge_features is not None}, **splits, **times}
