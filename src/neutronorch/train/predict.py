"""Predictions from a trained model, of either kind of graph: ``predict`` (the classes or class probabilities of
chosen vertices) and ``embed`` (one layer's rows). One request check, one output path (checked before any
work, written atomically, the scratch folder, progress) and one rule for the layer and the vertex type; only
how the rows are computed differs by kind: a homogeneous graph's by exact layer-wise inference over complete
neighbourhoods (``layerwise.py``, never stale), a typed graph's as its run's evaluation sampled them
(``typed_predict.py``).

A link checkpoint's model (``nn.link.LinkModel``) is an encoder and a head: inference runs the encoder's
layers (``embed``), and its pairs are scored by ``link_predict.score_pairs``."""

from __future__ import annotations

import numbers
import os

import numpy as np
import torch

from neutronorch.capabilities import check_prediction
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
from neutronorch.train.checkpoint import TypedCheckpoint
from neutronorch.train.typed_predict import check_computed, typed_fill, typed_model


def predict(checkpoint: Checkpoint | TypedCheckpoint | str | os.PathLike, graph: Graph | TypedGraph,
            nodes: Nodes = "test", probabilities: bool = False, device: str = "cpu", chunk_size: int = 4096, *,
            out: str | os.PathLike | None = None, scratch: str | None = "auto",
            progress: LayerProgress | None = None, overwrite: bool = False, fanouts=None) -> np.ndarray:
    """Predicted classes (int64) of ``nodes``, or with ``probabilities`` their class probabilities (float32, a
    row per vertex; a multi-label graph's: a 0/1 row per vertex, int8, or each task's probability), in the order
    of ``nodes``: ``test``, ``val``, ``train``, ``all``, a ``.npy`` file of vertex ids, or the ids (a numpy
    array, list, tuple or torch tensor). A homogeneous graph's rows come from complete neighbourhoods; a
    ``TypedGraph``'s (with a typed checkpoint) are its target type's, from neighbourhoods sampled as the run's
    evaluation sampled them (``fanouts``: other fanouts, -1 for all; ``typed_predict.py``).

    With ``out`` (a ``.npy`` path, never one of the inputs, replaced only with ``overwrite``) the rows are
    written there chunk by chunk through a memory map, atomically, and the file is returned opened read-only.
    ``scratch``: where a homogeneous graph's intermediate layers go, ``"auto"`` (in memory when they fit in
    half the available memory, else memory-mapped beside ``out`` or in the temporary folder), a folder, or None
    (in memory; a typed graph's always are). ``progress(layer, done, total)`` is called after every chunk. A
    link checkpoint scores pairs instead (``score_pairs``), and is refused here."""
    device = check_request(graph, device, chunk_size, probabilities=probabilities, overwrite=overwrite)
    check_asked(graph, fanouts=fanouts, scratch=scratch)
    return _rows(checkpoint, graph, nodes, None, None, prediction_rows(Task.of(graph), probabilities), device,
                 chunk_size, out, scratch, progress, overwrite, fanouts)


def embed(checkpoint: Checkpoint | TypedCheckpoint | str | os.PathLike, graph: Graph | TypedGraph,
          layer: int | None = None, nodes: Nodes = "all", device: str = "cpu", chunk_size: int = 4096, *,
          out: str | os.PathLike | None = None, scratch: str | None = "auto", progress: LayerProgress | None = None,
          overwrite: bool = False, node_type: str | None = None, fanouts=None) -> np.ndarray:
    """The output of layer ``layer`` (1 = the bottom layer, after its activation; the last layer gives the
    logits) of ``nodes``, as float32 rows; the rest as for ``predict``. For a link checkpoint the layers are
    its encoder's: the last gives the embeddings its head scores. A ``TypedGraph``'s rows are ``node_type``'s
    (default the target's), ``layer`` by default its last hidden layer (``typed_predict.py`` says which types
    a layer computes); a homogeneous graph's ``embed`` is given its ``layer``."""
    device = check_request(graph, device, chunk_size, overwrite=overwrite)
    check_asked(graph, fanouts=fanouts, scratch=scratch, embedding=True, layer=layer, node_type=node_type)
    return _rows(checkpoint, graph, nodes, layer, node_type, None, device, chunk_size, out, scratch, progress,
                 overwrite, fanouts)


def _rows(checkpoint, graph: Graph | TypedGraph, nodes: Nodes, layer: int | None, node_type: str | None,
          form: tuple | None, device: torch.device, chunk_size: int, out, scratch, progress, overwrite: bool,
          fanouts) -> np.ndarray:
    """The rows ``predict`` (``form``: their shape, dtype and the transform of the logits) or ``embed`` (``form``
    None: layer ``layer``'s float32 rows of ``node_type``) gives: the output checked, the checkpoint read and
    checked to fit, the layer and vertex type resolved, then the rows written (``write_rows``)."""
    check_prediction_output(out, scratch, checkpoint, graph, overwrite, {"nodes": node_files(nodes)})
    typed, predicting = isinstance(graph, TypedGraph), form is not None
    if typed:
        checkpoint, graph, sampler = typed_model(checkpoint, graph, fanouts)
        model = checkpoint.model
    else:
        checkpoint = checkpoint_for(checkpoint, graph, pairs=False if predicting else None)
        model = encoder_of(checkpoint.model)
    layers = model.num_layers
    layer = layers if predicting else embedding_layer(layers, layer)
    if typed:
        node_type = node_type or graph.target
        check_computed(model, node_type, layer)
    ids = select_nodes(graph, nodes, node_type)
    if not predicting:
        width = model.arguments["num_classes" if layer == layers else "hidden"] if typed else model.width(layer - 1)
        form = ((width,), np.float32, None)
    shape, dtype, transform = form
    # Checked before the transform: an argmax of NaN rows is a class.
    check = output_check("logits") if predicting else output_check(f"layer {layer} outputs", *(
        [f"{node_type} vertices"] if typed else []))
    model.to(device)
    if typed:
        fill = typed_fill(model, graph, sampler, fanouts, node_type, layer, ids, device, chunk_size, progress, check,
                          transform, checkpoint.config.seed)
    else:
        folder = scratch_folder(model, graph, layer, scratch, out)
        fill = lambda array: layerwise(  # noqa: E731
            model, graph, FeatureStore(graph.features, graph.labels), torch.from_numpy(ids), device, chunk_size,
            layer, out=array, transform=transform, scratch=folder, progress=progress, check=check)
    return write_rows(out, (ids.shape[0], *shape), dtype, fill)


def check_request(graph, device, chunk_size: int = 1, **switches) -> torch.device:
    """What ``predict``, ``embed`` and ``score_pairs`` are given, checked before any work: the graph (a
    ``Graph`` or ``TypedGraph``, validated unless loaded as it is: ``check_given``), the device (returned),
    ``chunk_size`` and the switches (True or False)."""
    if not isinstance(graph, (Graph, TypedGraph)):
        raise ConfigError(f"`graph`: expected the neutronorch Graph or TypedGraph the checkpoint was trained on "
                          f"(load_dataset, load_typed_dataset), not a {type(graph).__name__}.")
    for name, value in switches.items():
        check_switch(value, f"`{name}`")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, numbers.Integral) or chunk_size < 1:
        raise ConfigError(f"`chunk_size` {chunk_size!r}: must be a positive whole number (vertices per chunk).")
    device = resolve_device(device)
    graph.check_given(classes=False)  # inference reads no label
    return device


def check_asked(graph: Graph | TypedGraph | str, *, fanouts=None, scratch: str | None = "auto",
                embedding: bool = False, layer: int | None = None, node_type: str | None = None) -> None:
    """What ``predict`` (and with ``embedding``, ``embed``) of ``graph`` (or of its kind, ``homogeneous`` or
    ``typed``) is asked, checkable before any data is read: what its kind cannot honour is refused
    (``capabilities.PREDICTION_UNHONOURED``), and a homogeneous graph's ``embed`` is given its layer."""
    kind = graph if isinstance(graph, str) else "typed" if isinstance(graph, TypedGraph) else "homogeneous"
    if embedding and layer is not None and (isinstance(layer, bool) or not isinstance(layer, numbers.Integral)):
        raise ConfigError(f"`layer` {layer!r}: expected a whole number (1 = the bottom layer's output).")
    if embedding and ((node_type is not None and not isinstance(node_type, str)) or node_type == ""):
        raise ConfigError(f"`node_type` {node_type!r}: name a vertex type of the graph (None: the target's).")
    check_prediction(kind, fanouts=fanouts, node_type=node_type, scratch_dir=scratch)
    if embedding and kind == "homogeneous" and layer is None:
        raise ConfigError("`layer`: give the layer whose output to write (1 = the bottom layer's; a typed "
                          "graph's embeddings default to its last hidden layer).")


def embedding_layer(layers: int, layer: int | None) -> int:
    """``layer``, checked to be one of the model's ``layers``, or the last hidden layer when None."""
    if layer is None:
        if layers < 2:
            raise ConfigError("`layer`: a one-layer model has no hidden layer (its only layer gives the logits); "
                              "give `layer` 1 for them.")
        return layers - 1
    if not 1 <= layer <= layers:
        raise ConfigError(f"`layer` {layer}: the model has layers 1..{layers} (1 reads the inputs; {layers} gives "
                          f"the logits).")
    return layer


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

