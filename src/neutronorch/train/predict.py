"""Predictions from a trained model, of either kind of graph: ``predict`` (the classes or class probabilities of
chosen vertices) and ``embed`` (one layer's rows), checked alike for both kinds; only how the rows are
computed differs (docs/checkpoints.md; a typed graph's: docs/heterogeneous.md, Predictions). A link
checkpoint's pairs are scored by ``link_predict.score_pairs``."""

from __future__ import annotations

import functools
import numbers
import os

import numpy as np
import torch

from neutronorch.capabilities import check_prediction, check_static
from neutronorch.data.feature_norm import normalized
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.limits import check_switch
from neutronorch.features.store import FeatureStore, TypedInputs
from neutronorch.nn.link import LinkModel
from neutronorch.nn.typed_models import TypedGNN, reachable_types
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.checkpoint import HOMOGENEOUS, TYPED, Checkpoint, check_fits, load_checkpoint
from neutronorch.train.health import output_check
from neutronorch.train.layerwise import LayerProgress, emit_chunks, emitter, layerwise, typed_layers
from neutronorch.train.prediction_io import (NODE_SETS, Nodes, check_prediction_output, prediction_rows,
                                             scratch_folder, select_nodes, write_rows)
from neutronorch.train.resources import resolve_device
from neutronorch.train.task import Task, score
from neutronorch.train.evaluate import inference_key, typed_logits


def predict(checkpoint: Checkpoint | str | os.PathLike, graph: Graph | TypedGraph,
            nodes: Nodes = "test", probabilities: bool = False, device: str = "cpu", chunk_size: int = 4096, *,
            out: str | os.PathLike | None = None, scratch: str | None = "auto",
            progress: LayerProgress | None = None, overwrite: bool = False, fanouts=None) -> np.ndarray:
    """Predicted classes (int64) of ``nodes``, or with ``probabilities`` their class probabilities (float32, a
    row per vertex; a multi-label graph's: a 0/1 row per vertex, int8, or each task's probability), in the order
    of ``nodes``: ``test``, ``val``, ``train``, ``all``, a ``.npy`` file of vertex ids, or the ids (a numpy
    array, list, tuple or torch tensor). A homogeneous graph's rows come from complete neighbourhoods; a
    ``TypedGraph``'s (with a typed checkpoint) are its target type's, from neighbourhoods sampled as the run's
    evaluation sampled them (``fanouts``: other fanouts, -1 for all).

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


def embed(checkpoint: Checkpoint | str | os.PathLike, graph: Graph | TypedGraph,
          layer: int | None = None, nodes: Nodes = "all", device: str = "cpu", chunk_size: int = 4096, *,
          out: str | os.PathLike | None = None, scratch: str | None = "auto", progress: LayerProgress | None = None,
          overwrite: bool = False, node_type: str | None = None, fanouts=None) -> np.ndarray:
    """The output of layer ``layer`` (1 = the bottom layer, after its activation; the last layer gives the
    logits) of ``nodes``, as float32 rows; the rest as for ``predict``. For a link checkpoint the layers are
    its encoder's: the last gives the embeddings its head scores. A ``TypedGraph``'s rows are ``node_type``'s
    (default the target's), ``layer`` by default its last hidden layer (the module docstring says which types
    a layer computes); a homogeneous graph's ``embed`` is given its ``layer``."""
    device = check_request(graph, device, chunk_size, overwrite=overwrite)
    check_asked(graph, fanouts=fanouts, scratch=scratch, embedding=True, layer=layer, node_type=node_type)
    return _rows(checkpoint, graph, nodes, layer, node_type, None, device, chunk_size, out, scratch, progress,
                 overwrite, fanouts)


def _rows(checkpoint, graph: Graph | TypedGraph, nodes: Nodes, layer: int | None, node_type: str | None,
          form: tuple | None, device: torch.device, chunk_size: int, out, scratch, progress, overwrite: bool,
          fanouts) -> np.ndarray:
    """The rows ``predict`` (``form``: their shape, dtype and the transform of the logits) or ``embed`` (``form``
    None: layer ``layer``'s float32 rows of ``node_type``) gives, written by ``write_rows``."""
    given = [nodes] if isinstance(nodes, (str, os.PathLike)) and nodes not in NODE_SETS else []  # a .npy file
    check_prediction_output(out, scratch, checkpoint, graph, overwrite, {"nodes": given})
    typed, predicting = isinstance(graph, TypedGraph), form is not None
    checkpoint, graph = checkpoint_for(checkpoint, graph, pairs=False if predicting else None)
    model = checkpoint.model.encoder if isinstance(checkpoint.model, LinkModel) else checkpoint.model  # its layers
    layers = model.num_layers
    if predicting:
        layer = layers
    elif layer is None:  # the last hidden layer
        if layers < 2:
            raise ConfigError("`layer`: a one-layer model has no hidden layer (its only layer gives the logits); "
                              "give `layer` 1 for them.")
        layer = layers - 1
    elif not 0 <= layer <= layers:
        last = "the embeddings the link head scores" if isinstance(checkpoint.model, LinkModel) else "the logits"
        raise ConfigError(f"`layer` {layer}: the model has layers 1..{layers} (1 reads the inputs; {layers} gives "
                          f"{last}; 0 gives the inputs: features, or a featureless type's embedding table).")
    if typed:
        node_type = node_type or graph.target
        check_computed(model, node_type, layer)
    ids = select_nodes(graph, nodes, node_type)
    if not predicting:
        tables = getattr(model, "embeddings", {}) if typed else {}
        if layer == 0:
            width = (tables[node_type].embedding_dim if node_type in tables else graph.feature_dim(node_type)) \
                if typed else graph.feature_dim
        else:
            width = model.arguments["num_classes" if layer == layers else "hidden"] if typed else \
                model.width(layer - 1)
        form = ((width,), np.float32, None)
    shape, dtype, transform = form
    # Checked before the transform: an argmax of NaN rows is a class.
    check = output_check("logits") if predicting else output_check(f"layer {layer} outputs", *(
        [f"{node_type} vertices"] if typed else []))
    model.to(device)
    if layer == 0:  # the rows the bottom layer reads: features, or a featureless type's learned table
        fill = functools.partial(_inputs, model, graph, node_type, ids, chunk_size)
    elif typed:
        fill = typed_fill(checkpoint, graph, fanouts, node_type, layer, ids, device, chunk_size, progress, check,
                          transform)
    else:
        folder = scratch_folder(model, graph, layer, scratch, out)
        fill = lambda array: layerwise(  # noqa: E731
            model, graph, FeatureStore(graph.features, graph.labels), torch.from_numpy(ids), device, chunk_size,
            layer, out=array, transform=transform, scratch=folder, progress=progress, check=check)
    return write_rows(out, (ids.shape[0], *shape), dtype, fill)


def _inputs(model, graph: Graph | TypedGraph, node_type: str | None, ids: np.ndarray, chunk_size: int,
            out: np.ndarray) -> None:
    """``embed``'s layer 0: ``ids``' input rows into ``out``, a chunk at a time."""
    for start in range(0, ids.shape[0], chunk_size):
        chunk = ids[start:start + chunk_size]
        if isinstance(graph, TypedGraph) and node_type in getattr(model, "embeddings", {}):
            with torch.no_grad():
                rows = model.embeddings[node_type](torch.from_numpy(chunk).to(next(model.parameters()).device))
            out[start:start + chunk.shape[0]] = rows.float().cpu().numpy()
        else:
            features = graph.features[node_type] if isinstance(graph, TypedGraph) else graph.features
            out[start:start + chunk.shape[0]] = np.asarray(features[chunk], dtype=np.float32)


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
    check_static(graph)  # inference reads every neighbour, whatever its time (docs/temporal.md)
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


def checkpoint_for(checkpoint: Checkpoint | str | os.PathLike, graph: Graph | TypedGraph,
                   pairs: bool | None = None) -> tuple[Checkpoint, Graph | TypedGraph]:
    """The checkpoint (read if a path is given, as the graph's kind reads one), checked to fit ``graph`` and,
    unless ``pairs`` is None, to do what is asked of it (``check_task``); and the graph as the model reads it
    (a typed graph with its reverse relations, as trained)."""
    typed = isinstance(graph, TypedGraph)
    if isinstance(checkpoint, Checkpoint) and checkpoint.typed != typed:
        kinds = ("typed", "homogeneous") if not typed else ("homogeneous", "typed")
        model = getattr(checkpoint.model, "kind", type(checkpoint.model).__name__)
        raise ConfigError(f"a {kinds[0]} graph's checkpoint (model {model}), and {graph.name} is "
                          f"{kinds[1]}; give the {kinds[0]} graph it was trained on.")
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint, kind=TYPED if typed else HOMOGENEOUS)
    if pairs is not None:
        check_task(checkpoint, pairs)
    if typed:
        graph = graph.with_reverse()
    # The rows as the run read them (--normalize-features; none in a checkpoint from before the setting).
    graph = normalized(graph, checkpoint.config.normalize_features)
    check_fits(checkpoint, graph, graph.name)
    return checkpoint, graph


def check_task(checkpoint: Checkpoint, pairs: bool) -> None:
    """A link checkpoint scores pairs, any other classifies vertices: the other request is refused, saying
    which to make."""
    if isinstance(checkpoint.model, LinkModel) and not pairs:
        raise ConfigError("this checkpoint scores pairs: give --pairs (in Python, score_pairs); it was trained with "
                          "--task link. embed gives its vertices' embeddings.")
    if pairs and not isinstance(checkpoint.model, LinkModel):
        raise ConfigError("this checkpoint classifies vertices: use predict --nodes (in Python, predict); pairs "
                          "are scored by a checkpoint of a run with --task link.")


def prediction_score(graph: Graph, nodes: Nodes, output: np.ndarray, probabilities: bool
                     ) -> tuple[str, float]:
    """(metric, value) of ``predict``'s output for ``nodes`` against the graph's labels: the dataset's
    metric, or accuracy when that needs probabilities and ``output`` holds decisions."""
    task = Task.of(graph)
    labels = np.asarray(graph.labels)[select_nodes(graph, nodes)]
    if not probabilities:
        if task.metric == "rocauc":
            task = Task(task.multilabel, task.num_classes, "accuracy")
        # Decisions as probabilities of 0 and 1: accuracy and F1 read only the decisions.
        output = output.astype(np.float32) if task.multilabel else np.eye(task.num_classes, dtype=np.float32)[output]
    return task.metric, score(task.metric, task.multilabel, task.num_classes, np.asarray(output), labels)


def typed_fill(checkpoint: Checkpoint, graph: TypedGraph, fanouts, node_type: str, layer: int, ids: np.ndarray,
               device: torch.device, chunk_size: int, progress: LayerProgress | None, check, transform):
    """``fill(array)``: ``array[i]`` = ``transform`` (None: none) of ``node_type``'s row of ``ids[i]`` at layer
    ``layer``, once ``check`` has found it finite; sampled with the run's evaluation fanouts or ``fanouts``
    (checked here, before any work), layer by layer when every one is -1."""
    model, config = checkpoint.model, checkpoint.config
    model = model.encoder if isinstance(model, LinkModel) else model  # a link checkpoint's layers: its encoder's
    if isinstance(fanouts, int):  # -1: every neighbour, at every layer
        fanouts = [fanouts] * model.num_layers
    sampler = TypedNeighborSampler(graph, fanouts if fanouts is not None else (
        config.eval_fanouts if config.eval_fanouts is not None else checkpoint.fanouts))
    if sampler.num_layers != model.num_layers:
        raise ConfigError(f"`fanouts` {fanouts}: {sampler.num_layers} layer(s), and the model has "
                          f"{model.num_layers}; give one fanout per layer.")
    every = fanouts is not None and all(f == -1 for drawn in sampler.fanouts.values() for f in drawn)

    def fill(array: np.ndarray) -> None:
        if every:  # every neighbour: layer by layer (the layers below first)
            compute = typed_layers(model, graph, node_type, layer, device, chunk_size, progress)
        elif layer == model.num_layers and node_type == model.spec.target:  # the logits (sampled from the target)
            compute = lambda chunk: typed_logits(  # noqa: E731
                model, graph, sampler, torch.from_numpy(chunk), device, len(chunk), config.seed)
        else:
            # Hop h of a sample is the bottom hop of a sampler whose fanouts end at h (``sample_bottom``).
            hops = [TypedNeighborSampler(graph, {r: f[:hop + 1] for r, f in sampler.fanouts.items()})
                    for hop in range(model.num_layers - layer, model.num_layers)]
            compute = lambda chunk: hidden_rows(model, graph, hops, node_type, chunk, device,  # noqa: E731
                                                config.seed)

        def rows(chunk: np.ndarray) -> torch.Tensor:  # a repeated id computed once (the seeds must be unique)
            unique, inverse = np.unique(chunk, return_inverse=True)
            return compute(chunk) if len(unique) == len(chunk) else compute(unique)[torch.from_numpy(inverse)]
        emit_chunks(ids, chunk_size, rows, emitter(array, transform, check), layer, progress)
    return fill


def check_computed(model: TypedGNN, node_type: str, layer: int) -> None:
    """Raise ``ConfigError`` unless layer ``layer`` computes rows of ``node_type``, naming the layers that do."""
    spec, layers = model.spec, model.num_layers
    if node_type not in spec.num_nodes:
        raise ConfigError(f"`node_type` {node_type!r}: the model's graph has no such vertex type; its types: "
                          f"{', '.join(spec.num_nodes)}.")
    reached = reachable_types(spec, layers)
    computed = reached[layers - layer]
    if node_type in computed:
        return
    having = [k for k in range(1, layers + 1) if node_type in reached[layers - k]]
    if having:
        fix = f"layers 1..{having[-1]} compute its rows: give `layer` {having[-1]} or lower"
    elif node_type in reached[layers]:
        rows = "its features" if spec.feature_dims[node_type] else "its embedding table (model.embeddings)"
        fix = f"the model only reads {node_type}'s rows, no layer computes them: they are {rows}, `layer` 0"
    else:
        fix = f"the model never reads {node_type}"
    raise ConfigError(f"`node_type` {node_type}: layer {layer} computes rows of {', '.join(computed)} only (the types "
                      f"within {layers - layer} relation(s) of the target {spec.target}); {fix}.")


@torch.no_grad()
def hidden_rows(model: TypedGNN, graph: TypedGraph, hops: list[TypedNeighborSampler], node_type: str,
                ids: np.ndarray, device: torch.device, seed: int) -> torch.Tensor:
    """Rows of ``node_type``'s unique ``ids`` at layer ``len(hops)`` (float32 on the CPU): ``hops[i]`` draws hop
    ``L - len(hops) + i`` from the previous hop's frontier (the first from ``ids``), and the model's own
    layers (``layer_forward``, in eval mode) run over those blocks up to that layer."""
    model.eval()
    destinations, blocks = {node_type: ids}, []
    for sampler in hops:
        block = sampler.sample_bottom(destinations, inference_key(seed))
        blocks.insert(0, block)
        destinations = {t: v.numpy() for t, v in block.src_ids.items()}
    features, input_ids = TypedInputs(graph)(blocks[0].src_ids, device)
    x = model.input_rows(features, input_ids)
    for index, block in enumerate(blocks):
        x = model.layer_forward(index, block.to(device), x)
    return x[node_type].float().cpu()
