"""How ``predict`` and ``embed`` (``predict.py``) compute a typed checkpoint's rows, given a ``TypedGraph``
(docs/heterogeneous.md, Predictions, says more).

**What is sampled.** As the run's evaluation sampled: its ``eval_fanouts`` for every relation, else its training
fanouts per relation (``fanouts`` overrides both: one list, or a dict as ``typed_fanouts`` reads it), with the
one key ``inference_key(seed)`` for every chunk. The sampler keys each vertex's draws by that key and the
vertex, so a vertex's rows depend on the vertex alone (to float32 rounding: the products run over chunks of
other sizes), not on its chunk, and predicting the test vertices scores what the run's evaluation scored.

**Embeddings.** Layer ``k``'s output (1 = the bottom layer's, after its activation) exists for the types within
``L - k`` relations of the target (``reachable_types``; ``L`` layers) and is what layer ``k + 1`` reads; a type
no layer computes is refused, naming the layers that do. A vertex's row at layer ``k`` is computed as in a
prediction where it sits ``L - k`` hops from the seeds: the sampler's hops ``L - k`` to ``L - 1`` drawn from it
(``sample_bottom`` of samplers whose fanouts end at each hop in turn), then the model's own layers up to ``k``.

**Every neighbour, layer by layer.** With ``fanouts`` -1 for every relation, inference runs layer by layer
(``layerwise.lower_layers``, the per-layer driver a homogeneous graph's inference runs too): two hops through a
hub relation reach most of the graph from any chunk, so each chunk's whole computation graph would repeat most
of it. Layer ``k`` computes, for every vertex, the types a later layer reads (``needed_types``), chunk by chunk
of destinations from all their in-neighbours through every relation; only the asked layer is limited to the
asked vertices. One float32 table per computed type and layer is held in memory.
"""

from __future__ import annotations

import os

import numpy as np
import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.errors import ConfigError
from neutronorch.nn.typed_models import TypedGNN, reachable_types
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.layerwise import Emitter, LayerProgress, emit_chunks, lower_layers
from neutronorch.train.checkpoint import TypedCheckpoint, check_typed_fits, load_typed_checkpoint
from neutronorch.train.typed_inputs import gather_frontier, inference_key, typed_logits


def typed_model(checkpoint: TypedCheckpoint | str | os.PathLike, graph: TypedGraph, fanouts
                ) -> tuple[TypedCheckpoint, TypedGraph, TypedNeighborSampler]:
    """The checkpoint (read if a path), the graph with its reverse relations (as trained), checked to fit the
    model, and the sampler inference draws with."""
    if not isinstance(checkpoint, TypedCheckpoint):
        checkpoint = load_typed_checkpoint(checkpoint)
    graph = graph.with_reverse()
    check_typed_fits(checkpoint, graph, graph.name)
    config = checkpoint.config
    if isinstance(fanouts, int):  # -1: every neighbour, at every layer
        fanouts = [fanouts] * checkpoint.model.num_layers
    chosen = fanouts if fanouts is not None else (
        config.eval_fanouts if config.eval_fanouts is not None else checkpoint.fanouts)
    sampler = TypedNeighborSampler(graph, chosen)
    if sampler.num_layers != checkpoint.model.num_layers:
        raise ConfigError(f"`fanouts` {fanouts}: {sampler.num_layers} layer(s), and the model has "
                          f"{checkpoint.model.num_layers}; give one fanout per layer.")
    return checkpoint, graph, sampler


def typed_fill(model: TypedGNN, graph: TypedGraph, sampler: TypedNeighborSampler, fanouts, node_type: str,
               layer: int, ids: np.ndarray, device: torch.device, chunk_size: int, progress: LayerProgress | None,
               check, transform, seed: int):
    """``fill(array)``: ``array[i]`` = ``transform`` (None: none) of ``node_type``'s row of ``ids[i]`` at layer
    ``layer`` (``model.num_layers``: the target's logits), once ``check`` has found it finite. Layer by layer
    with every neighbour (``fanouts`` -1), else sampled by ``sampler`` a chunk at a time."""
    def fill(array: np.ndarray) -> None:
        if full_neighbours(fanouts, model.num_layers):  # every neighbour: layer by layer (the layers below first)
            compute = full_neighbour_layers(model, graph, node_type, layer, device, chunk_size, progress)
        elif layer == model.num_layers:  # the logits
            compute = lambda chunk: typed_logits(  # noqa: E731
                model, graph, sampler, torch.from_numpy(chunk), device, len(chunk), seed)
        else:
            # Hop h of a sample is the bottom hop of a sampler whose fanouts end at h (``sample_bottom``).
            hops = [TypedNeighborSampler(graph, {r: f[:hop + 1] for r, f in sampler.fanouts.items()})
                    for hop in range(model.num_layers - layer, model.num_layers)]
            compute = lambda chunk: hidden_rows(model, graph, hops, node_type, chunk, device, seed)  # noqa: E731
        emit_chunks(ids, chunk_size, _unique_seeds(compute), Emitter(array, transform, check), layer, progress)
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
        fix = f"the model only reads {node_type}'s rows, no layer computes them: they are {rows}"
    else:
        fix = f"the model never reads {node_type}"
    raise ConfigError(f"`node_type` {node_type}: layer {layer} computes rows of {', '.join(computed)} only (the types "
                      f"within {layers - layer} relation(s) of the target {spec.target}); {fix}.")


@torch.no_grad()
def hidden_rows(model: TypedGNN, graph: TypedGraph, hops: list[TypedNeighborSampler], node_type: str,
                ids: np.ndarray, device: torch.device, seed: int) -> torch.Tensor:
    """Rows of ``node_type``'s unique ``ids`` at layer ``len(hops)`` (float32 on the CPU): ``hops[i]`` draws hop
    ``L - len(hops) + i`` from the previous hop's frontier (the first from ``ids``), and the model's own
    layers (``layer_output``, ``activate``, in eval mode) run over those blocks up to that layer."""
    model.eval()
    destinations, blocks = {node_type: ids}, []
    for sampler in hops:
        block = sampler.sample_bottom(destinations, inference_key(seed))
        blocks.insert(0, block)
        destinations = {t: v.numpy() for t, v in block.src_ids.items()}
    features, input_ids = gather_frontier(graph, blocks[0].src_ids, device)
    x = model.input_rows(features, input_ids)
    for index, block in enumerate(blocks):
        y = model.layer_output(index, block.to(device), x)
        x = {t: model.activate(rows) for t, rows in y.items()}
    return x[node_type].float().cpu()


def full_neighbours(fanouts, layers: int) -> bool:
    """Whether ``fanouts`` (as ``predict`` takes them) asks for every neighbour of every relation."""
    if fanouts is None:
        return False
    if isinstance(fanouts, int):
        return fanouts == -1
    if isinstance(fanouts, dict):
        return all(all(f == -1 for f in ([v] if isinstance(v, int) else v)) for v in fanouts.values())
    values = list(fanouts)
    return len(values) in (1, layers) and all(v == -1 for v in values)


def needed_types(model: TypedGNN, node_type: str, layer: int) -> list[set[str]]:
    """``out[k]``: the types layer ``k`` (0-based) must compute for ``node_type`` at layer ``layer`` (1-based)."""
    relations = model.spec.relations
    needed = [set() for _ in range(layer)]
    needed[layer - 1] = {node_type}
    for k in range(layer - 1, 0, -1):
        needed[k - 1] = needed[k] | {r[0] for r in relations if r[2] in needed[k]}
    return needed


def full_neighbour_layers(model: TypedGNN, graph: TypedGraph, node_type: str, layer: int, device: torch.device,
                          chunk_size: int, progress: LayerProgress | None):
    """``top(ids)``: the rows of ``node_type``'s unique ``ids`` at layer ``layer`` (1-based; ``model.num_layers``:
    the target's logits), every neighbourhood whole, float32 on the CPU, once the layers below it are computed
    for every vertex a later layer reads (here, before it returns). ``graph`` two-way, as trained."""
    model.eval()
    sampler, needed = TypedNeighborSampler(graph, [-1] * model.num_layers), needed_types(model, node_type, layer)

    @torch.no_grad()
    def rows(k: int, t: str, chunk: np.ndarray, previous: dict | None) -> torch.Tensor:
        block = sampler.sample_bottom({t: chunk}, 0)
        if previous is None:
            x = model.input_rows(*gather_frontier(graph, block.src_ids, device))
        else:
            x = {s: previous[s][v].to(device) for s, v in block.src_ids.items() if s in previous}
        y = model.layer_output(k, block.to(device), x)[t]
        return (y if k == model.num_layers - 1 else model.activate(y)).float().cpu()

    below = lower_layers(layer, lambda k: {t: graph.num_nodes[t] for t in graph.num_nodes if t in needed[k]},
                         lambda k, t, start, end, previous: rows(k, t, np.arange(start, end, dtype=np.int64), previous),
                         lambda k, t: model.arguments["hidden"], torch.device("cpu"), None, chunk_size, progress)
    return lambda ids: rows(layer - 1, node_type, np.asarray(ids, dtype=np.int64), below)


def _unique_seeds(compute):
    """``compute`` of a chunk's ids, a repeated id computed once (the sampler takes unique seeds)."""
    def rows(chunk: np.ndarray) -> torch.Tensor:
        unique, inverse = np.unique(chunk, return_inverse=True)
        return compute(chunk) if unique.shape[0] == chunk.shape[0] else compute(unique)[torch.from_numpy(inverse)]
    return rows
