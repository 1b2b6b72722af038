"""Predictions from a trained model: exact full-neighbour inference of chosen vertices (never stale).

A link checkpoint's model (``nn.link.LinkModel``) is an encoder and a head: inference runs the encoder's
layers (``embed``), and its pairs are scored by ``link_predict.score_pairs``. A typed graph's checkpoint,
given with its ``TypedGraph``, is read by ``typed_predict.py`` (``predict`` and ``embed`` hand it over)."""

from __future__ import annotations

import numbers
import os

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.limits import check_switch
from neutronorch.features.store import FeatureStore
from neutronorch.nn.link import LinkModel
from neutronorch.train.checkpoint import Checkpoint, check_fits, load_checkpoint
from neutronorch.train.health import output_check
from neutronorch.train.layerwise import LayerProgress, layerwise
from neutronorch.train.prediction_io import (Nodes, check_prediction_output, node_files, prediction_rows,
                                             scratch_folder, select_nodes, write_rows)
from neutronorch.train.resources import resolve_device
from neutronorch.train.task import Task, score
from neutronorch.train.typed_checkpoint import TypedCheckpoint
from neutronorch.train.typed_predict import embed_typed, predict_typed


def predict(checkpoint: Checkpoint | TypedCheckpoint | str | os.PathLike, graph: Graph | TypedGraph,
            nodes: Nodes = "test", probabilities: bool = False, device: str = "cpu", chunk_size: int = 4096, *,
            out: str | os.PathLike | None = None, scratch: str | None = "auto",
            progress: LayerProgress | None = None, overwrite: bool = False, fanouts=None) -> np.ndarray:
    """Predicted classes (int64) of ``nodes``, or with ``probabilities`` their class probabilities
    (float32, one row per vertex), from the checkpoint's model over complete neighbourhoods. For a
    multi-label graph: a 0/1 row per vertex (int8), or with ``probabilities`` each task's probability.
    ``nodes``: ``test``, ``val``, ``train``, ``all``, a ``.npy`` file of vertex ids, or the ids themselves (a
    numpy array, list, tuple or torch tensor); the rows follow their order.

    With ``out`` (a ``.npy`` path) the rows are written there chunk by chunk through a memory map (atomically)
    and the file is returned opened read-only; ``scratch`` is where the intermediate layers' embeddings are
    memory-mapped: ``"auto"`` (in memory when they fit in half the available memory, else beside ``out``
    or in the system's temporary folder), a folder, or None (in memory). ``progress(layer, done, total)``
    is called after every chunk. ``out`` must not be one of the inputs (the checkpoint, the graph's files,
    the ``nodes`` file), and is not replaced if it exists unless ``overwrite``. A link checkpoint scores
    pairs instead (``score_pairs``), and is refused here.

    A ``TypedGraph`` (with a typed checkpoint) is predicted by ``typed_predict.predict_typed``: the target
    type's ``nodes``, from neighbourhoods sampled as the run's evaluation sampled them (``fanouts``: other
    fanouts, -1 for all; ``scratch`` does not apply)."""
    device = check_request(graph, device, probabilities=probabilities, overwrite=overwrite)
    if isinstance(graph, TypedGraph):
        return predict_typed(checkpoint, graph, nodes, probabilities, device, chunk_size, out=out, progress=progress,
                             overwrite=overwrite, fanouts=fanouts)
    _homogeneous_only(fanouts=fanouts)
    check_prediction_output(out, scratch, checkpoint, graph, overwrite, {"nodes": node_files(nodes)})
    checkpoint = checkpoint_for(checkpoint, graph, pairs=False)
    shape, dtype, transform = prediction_rows(Task.of(graph), probabilities)
    return _infer(checkpoint, graph, nodes, None, shape, dtype, transform, device, chunk_size, out, scratch, progress)


def _homogeneous_only(**given) -> None:
    """Refuse the settings that only typed graphs' predictions take."""
    for name, value in given.items():
        if value is not None:
            raise ConfigError(f"`{name}` {value}: for a typed graph's checkpoint (a TypedGraph); a homogeneous "
                              f"graph's predictions read every neighbour of its one vertex type.")


def embed(checkpoint: Checkpoint | TypedCheckpoint | str | os.PathLike, graph: Graph | TypedGraph,
          layer: int | None = None, nodes: Nodes = "all", device: str = "cpu", chunk_size: int = 4096, *,
          out: str | os.PathLike | None = None, scratch: str | None = "auto", progress: LayerProgress | None = None,
          overwrite: bool = False, node_type: str | None = None, fanouts=None) -> np.ndarray:
    """The output of layer ``layer`` (1 = the bottom layer, after its activation; the last layer gives the
    logits) of ``nodes``, as float32 rows, over complete neighbourhoods; ``out``, ``scratch``, ``progress``
    and ``overwrite`` as for ``predict``. For a link checkpoint the layers are its encoder's: the last
    gives the embeddings its head scores.

    A ``TypedGraph`` is embedded by ``typed_predict.embed_typed``: ``node_type``'s rows (default the
    target's) at ``layer`` (default the last hidden layer), sampled as ``predict`` samples."""
    device = check_request(graph, device, overwrite=overwrite)
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, numbers.Integral)):
        raise ConfigError(f"`layer` {layer!r}: expected a whole number (1 = the bottom layer's output).")
    if (node_type is not None and not isinstance(node_type, str)) or node_type == "":
        raise ConfigError(f"`node_type` {node_type!r}: name a vertex type of the graph (None: the target's).")
    if isinstance(graph, TypedGraph):
        return embed_typed(checkpoint, graph, layer, nodes, device, chunk_size, node_type=node_type, out=out,
                           progress=progress, overwrite=overwrite, fanouts=fanouts)
    check_embed_request(layer, node_type, fanouts)
    check_prediction_output(out, scratch, checkpoint, graph, overwrite, {"nodes": node_files(nodes)})
    checkpoint = checkpoint_for(checkpoint, graph)
    encoder = encoder_of(checkpoint.model)
    layers = encoder.num_layers
    if not 1 <= layer <= layers:
        raise ConfigError(f"`layer` {layer}: the model has layers 1..{layers} (1 reads the features).")
    width = encoder.width(layer - 1)
    return _infer(checkpoint, graph, nodes, layer, (width,), np.float32, None, device, chunk_size, out, scratch,
                  progress)


def check_request(graph, device, **switches) -> torch.device:
    """What ``predict``, ``embed`` and ``score_pairs`` are given, checked before any work: the graph (a
    ``Graph`` or ``TypedGraph``, validated unless loaded as it is: ``check_given``), the device (returned)
    and the switches (True or False)."""
    if not isinstance(graph, (Graph, TypedGraph)):
        raise ConfigError(f"`graph`: expected the neutronorch Graph or TypedGraph the checkpoint was trained on "
                          f"(load_dataset, load_typed_dataset), not a {type(graph).__name__}.")
    for name, value in switches.items():
        check_switch(value, f"`{name}`")
    device = resolve_device(device)
    graph.check_given(classes=False)  # inference reads no label
    return device


def check_embed_request(layer: int | None, node_type: str | None = None, fanouts=None, typed: bool = False) -> None:
    """What ``embed`` of a homogeneous graph must be given (a typed graph's has defaults), checkable before any
    data is read."""
    if not typed:
        _homogeneous_only(node_type=node_type, fanouts=fanouts)
        if layer is None:
            raise ConfigError("`layer`: give the layer whose output to write (1 = the bottom layer's; a typed "
                              "graph's embeddings default to its last hidden layer).")


def checkpoint_for(checkpoint: Checkpoint | str | os.PathLike, graph: Graph,
                   pairs: bool | None = None) -> Checkpoint:
    """The checkpoint (read if a path is given), checked to fit ``graph`` and, unless ``pairs`` is None, to
    do what is asked of it (``check_task``)."""
    if isinstance(checkpoint, TypedCheckpoint):
        raise ConfigError(f"a typed graph's checkpoint (model {checkpoint.model.kind}), and {graph.name} is "
                          f"homogeneous; give the typed graph it was trained on.")
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint)
    if pairs is not None:
        check_task(checkpoint, pairs)
    check_fits(checkpoint, graph, graph.name)
    return checkpoint


def check_task(checkpoint: Checkpoint, pairs: bool) -> None:
    """A link checkpoint scores pairs, any other classifies vertices: the other request is refused, saying
    which to make."""
    if isinstance(checkpoint.model, LinkModel) and not pairs:
        raise ConfigError("this checkpoint scores pairs: give --pairs (in Python, score_pairs); it was trained with "
                          "--task link. embed gives its vertices' embeddings.")
    if pairs and not isinstance(checkpoint.model, LinkModel):
        raise ConfigError("this checkpoint classifies vertices: use predict --nodes (in Python, predict); pairs "
                          "are scored by a checkpoint of a run with --task link.")


def encoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The model whose layers inference runs: a link model's encoder, else the model itself."""
    return model.encoder if isinstance(model, LinkModel) else model


def _infer(checkpoint: Checkpoint, graph: Graph, nodes: Nodes, layers: int | None, row_shape: tuple, dtype,
           transform, device: str, chunk_size: int, out, scratch, progress) -> np.ndarray:
    ids = torch.from_numpy(select_nodes(graph, nodes))
    target = torch.device(device)
    model = encoder_of(checkpoint.model).to(target)
    folder = scratch_folder(model, graph, layers or model.num_layers, scratch, out)
    check = output_check("logits" if layers is None else f"layer {layers} outputs")
    return write_rows(out, (ids.shape[0], *row_shape), dtype, lambda array: layerwise(
        model, graph, FeatureStore(graph.features, graph.labels), ids, target, chunk_size, layers, out=array,
        transform=transform, scratch=folder, progress=progress, check=check))


def prediction_score(graph: Graph, nodes: Nodes, output: np.ndarray, probabilities: bool,
                     metric: str = "auto") -> tuple[str, float]:
    """(metric, value) of ``predict``'s output for ``nodes`` against the graph's labels: the dataset's
    metric, or accuracy when that needs probabilities and ``output`` holds decisions."""
    task = Task.of(graph, metric)
    labels = np.asarray(graph.labels)[select_nodes(graph, nodes)]
    if not probabilities:
        if task.metric == "rocauc":
            task = Task(task.multilabel, task.num_classes, "accuracy")
        # Decisions as probabilities of 0 and 1: accuracy and F1 read only the decisions.
        output = output.astype(np.float32) if task.multilabel else np.eye(task.num_classes, dtype=np.float32)[output]
    return task.metric, score(task.metric, task.multilabel, task.num_classes, np.asarray(output), labels)

