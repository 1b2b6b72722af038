"""Exact layer-wise inference over complete neighbourhoods, in bounded memory.

Layer l is computed once per vertex that a later layer needs, from all of its in-neighbours, a chunk of
destinations at a time (``lower_layers``, for either kind of graph), its rows kept in memory or memory-mapped
in a ``scratch`` folder; the requested rows of the last layer are written chunk by chunk into ``out`` (a
memory-mapped ``.npy`` too), so a result larger than memory is never held whole. Data parallel, each rank
computes a contiguous share of every intermediate layer's chunks and the ranks share them.

Separable layers read their input rows in place, global ids as source positions (the previous layer's rows,
or the features themselves where they can be read as they are: ``_features_in_place``, docs/memory.md);
non-separable layers (GAT), and rows on the host for a model on a GPU, use relabelled chunks."""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from neutronorch.atomic import reserve, sweep_stale, temp_prefix, write_error
from neutronorch.data.graph import Graph
from neutronorch.data.typed import TypedGraph
from neutronorch.features.store import FeatureStore, TypedInputs
from neutronorch.nn.models import GNN
from neutronorch.nn.typed_models import TypedGNN, reachable_types
from neutronorch.sampling.block import Block
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from neutronorch.train.distributed import World

# progress(layer 1.., rows done, rows of that layer): called after every chunk.
LayerProgress = Callable[[int, int, int], None]
Transform = Callable[[torch.Tensor], torch.Tensor]
Emit = Callable[[object, torch.Tensor], None]  # emit(positions in the output, their rows)


@torch.no_grad()
def layerwise(model: GNN, graph: Graph, store: FeatureStore, nodes: torch.Tensor, device: torch.device,
              chunk_size: int = 4096, layers: int | None = None, *, out: torch.Tensor | np.ndarray | None = None,
              transform: Transform | None = None, scratch: str | None = None,
              progress: LayerProgress | None = None, world: World | None = None,
              check: Callable[[torch.Tensor], None] | None = None) -> torch.Tensor | np.ndarray:
    """The output of layer ``layers`` (default: the last, the logits; after its activation otherwise) of
    ``nodes``, written into ``out`` (one row per requested vertex, in their order; a new CPU float32
    tensor when None) after ``check`` (raises on rows it refuses) and ``transform`` of each chunk's float32
    CPU rows. Returns ``out``."""
    model.eval()
    chunk_size = max(1, min(chunk_size, graph.num_nodes))  # a chunk larger than the graph is the whole graph
    upto = model.num_layers if layers is None else layers
    if out is None:
        if transform is not None:
            raise ValueError("layerwise: give `out` with a `transform` (its rows' type and width)")
        out = torch.empty((nodes.shape[0], model.width(upto - 1)))
    emit = emitter(out, transform, check)
    if not getattr(model, "layerwise", True):  # a user's model (``UserModel``): whole neighbourhoods
        logits = sampled_logits(model, graph, store, [-1] * model.num_layers, device)
        emit_chunks(nodes, chunk_size, lambda chunk: logits(chunk, 0), emit, model.num_layers, progress)
        return out
    if upto < 1:
        raise ValueError("`layers` must be at least 1")
    run = _Run(model, graph, store, device, chunk_size, progress)
    with _scratch(scratch) as folder:
        below = lower_layers(upto, lambda layer: {None: graph.num_nodes}, run.rows,
                             lambda layer, _: model.width(layer), device, folder, chunk_size, progress, world)
        run.last(upto - 1, None if below is None else below[None], nodes, emit)
    return out


def lower_layers(upto: int, sizes: Callable[[int], dict], compute, width: Callable[[int, object], int],
                 device: torch.device, folder: str | None, chunk_size: int, progress: LayerProgress | None,
                 world: World | None = None) -> dict | None:
    """Layers 1..``upto - 1``' rows by key of ``sizes(layer)`` (key -> vertex count; a vertex type, None for a
    homogeneous graph), chunks ``start..end-1`` computed by ``compute(layer, key, start, end, previous)``
    (``previous``: the layer below's rows by key, None under the bottom layer) into buffers on ``device`` or
    memory-mapped in ``folder``. Returns layer ``upto - 1``'s (None when ``upto`` is 1)."""
    world, previous = world or World(), None
    for layer in range(upto - 1):
        counts = sizes(layer)
        total, done, current = sum(counts.values()), 0, {}
        for key, count in counts.items():
            name = f"layer{layer + 1}" if key is None else f"layer{layer + 1}-{key}"
            buffer = current[key] = _buffer((count, width(layer, key)), device, folder, name)
            shares = torch.tensor_split(torch.arange(0, count, chunk_size), world.size)
            for start in shares[world.rank].tolist():
                end = min(count, start + chunk_size)
                buffer[start:end] = compute(layer, key, start, end, previous).to(buffer.device)
                if progress is not None:
                    progress(layer + 1, done + end, total)
            if world.distributed:
                bounds = [(int(share[0]), min(count, int(share[-1]) + chunk_size)) for share in shares if share.numel()]
                world.share_rows(buffer, bounds, f"sharing layer {layer + 1} of the evaluation")
            done += count
        previous = current
    return previous


def typed_layers(model: TypedGNN, graph: TypedGraph, node_type: str, layer: int, device: torch.device,
                 chunk_size: int, progress: LayerProgress | None):
    """``top(ids)``: the rows of ``node_type``'s unique ``ids`` at layer ``layer`` (1-based), every
    neighbourhood whole, float32 on the CPU. The layers below are computed here, before it returns, for every
    vertex of the types a later layer reads, one table per type and layer in memory. ``graph`` two-way, as
    trained."""
    model.eval()
    sampler = TypedNeighborSampler(graph, [-1] * model.num_layers)
    needed = reachable_types(model.spec, layer - 1, node_type)[::-1]  # by layer: the types it must compute

    @torch.no_grad()
    def rows(k: int, t: str, chunk: np.ndarray, previous: dict | None) -> torch.Tensor:
        block = sampler.sample_bottom({t: chunk}, 0)
        if previous is None:
            x = model.input_rows(*TypedInputs(graph)(block.src_ids, device))
        else:
            x = {s: previous[s][v].to(device) for s, v in block.src_ids.items() if s in previous}
        return model.layer_forward(k, block.to(device), x)[t].float().cpu()

    below = lower_layers(layer, lambda k: {t: graph.num_nodes[t] for t in graph.num_nodes if t in needed[k]},
                         lambda k, t, start, end, previous: rows(k, t, np.arange(start, end, dtype=np.int64), previous),
                         lambda k, t: model.arguments["hidden"], torch.device("cpu"), None, chunk_size, progress)
    return lambda ids: rows(layer - 1, node_type, np.asarray(ids, dtype=np.int64), below)


@contextlib.contextmanager
def last_layer_rows(model: GNN, graph: Graph, store: FeatureStore, nodes: torch.Tensor, device: torch.device,
                    chunk_size: int = 4096, *, scratch: str | None = None, progress: LayerProgress | None = None,
                    world: World | None = None) -> Iterator[torch.Tensor]:
    """The last layer's rows of ``nodes`` (in their order) as a CPU float32 tensor alive while the block runs:
    in memory (``scratch`` None), else memory-mapped in a temporary folder in ``scratch`` (with the
    intermediate layers), removed when the block ends."""
    with _scratch(scratch) as folder:
        rows = _buffer((nodes.shape[0], model.width(model.num_layers - 1)), torch.device("cpu"), folder, "last")
        layerwise(model, graph, store, nodes, device, chunk_size, out=rows, scratch=scratch, progress=progress,
                  world=world)
        yield rows


class _Run:
    def __init__(self, model: GNN, graph: Graph, store: FeatureStore, device: torch.device, chunk_size: int,
                 progress: LayerProgress | None):
        self.model, self.graph, self.store, self.device = model, graph, store, device
        self.chunk_size, self.progress = chunk_size, progress
        self.sampler = NeighborSampler(graph.indptr, graph.indices, [-1], model.needs_degrees)
        with warnings.catch_warnings():
            # Read-only memory maps: the tensors are only read, so torch's writability warning does not apply.
            warnings.simplefilter("ignore", UserWarning)
            self.indptr = torch.from_numpy(np.asarray(graph.indptr, dtype=np.int64))
            self.indices = torch.from_numpy(np.asarray(graph.indices))
        # Every vertex's graph in-degree, the sources' of the in-place blocks (when the model reads them).
        self.degrees = (self.indptr[1:] - self.indptr[:-1]).float().to(device) if model.needs_degrees else None
        self.features = _features_in_place(store, device)

    def in_place(self, layer: int, hidden: torch.Tensor | None) -> torch.Tensor | None:
        """What layer ``layer`` reads in place (global ids as source positions): the previous layer's rows,
        or for the input layer the features themselves where they can be; None: relabelled chunks."""
        rows = self.features if hidden is None else hidden
        if rows is not None and self.model.layers[layer].separable and rows.device == self.device:
            return rows
        return None

    def contiguous(self, layer: int, hidden: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Layer ``layer`` of vertices start..end-1, reading ``hidden`` in place."""
        lo, hi = int(self.indptr[start]), int(self.indptr[end])
        block = Block(end - start, self.graph.num_nodes, self.indptr[start:end + 1] - lo, self.indices[lo:hi], start,
                      self.degrees)
        return self.model.layer_forward(layer, block.to(self.device), hidden)

    def relabelled(self, layer: int, hidden: torch.Tensor | None, targets: torch.Tensor) -> torch.Tensor:
        """Layer ``layer`` of ``targets``, through a block over their neighbourhoods' rows only."""
        subgraph = self.sampler.sample(targets.numpy(), 0)
        sources = subgraph.input_nodes
        x_src = self.store.gather(sources) if hidden is None else hidden[sources.to(hidden.device)]
        return self.model.layer_forward(layer, subgraph.blocks[0].to(self.device), x_src.to(self.device))

    def rows(self, layer: int, _key, start: int, end: int, previous: dict | None) -> torch.Tensor:
        """Layer ``layer`` of vertices start..end-1 (``lower_layers``' ``compute``)."""
        hidden = None if previous is None else previous[None]
        source = self.in_place(layer, hidden)
        if source is not None:
            return self.contiguous(layer, source, start, end)
        return self.relabelled(layer, hidden, torch.arange(start, end))

    def last(self, layer: int, hidden: torch.Tensor | None, nodes: torch.Tensor, emit: Emit) -> None:
        """The requested rows of the last layer, chunk by chunk to ``emit``."""
        # The input layer as the last one computes only the requested vertices: rows of whole in-place chunks
        # would come from products over other row counts, which round differently.
        source = self.in_place(layer, hidden) if hidden is not None else None
        if source is not None:
            # Contiguous chunks of vertices, only those holding requested ones; rows scattered to their places.
            order = torch.argsort(nodes, stable=True)
            ranked = nodes[order]
            n, step = self.graph.num_nodes, self.chunk_size
            cuts = torch.searchsorted(ranked, torch.arange(0, n + step, step).clamp(max=n)).tolist()
            for index, start in enumerate(range(0, n, step)):
                lo, hi = cuts[index], cuts[index + 1]
                if lo < hi:
                    rows = self.contiguous(layer, source, start, min(n, start + step))
                    emit(order[lo:hi], rows[(ranked[lo:hi] - start).to(rows.device)])
                if self.progress is not None:
                    self.progress(layer + 1, hi, nodes.shape[0])
        else:
            emit_chunks(nodes, self.chunk_size, lambda chunk: self.relabelled(layer, hidden, chunk), emit, layer + 1,
                        self.progress)


def sampled_logits(model, graph: Graph, store: FeatureStore, fanouts: list[int], device: torch.device,
                   file_order: bool = False) -> Callable[[torch.Tensor, int], torch.Tensor]:
    """``logits(chunk, key)``: ``model``'s output of the vertices ``chunk`` over their neighbourhoods sampled
    by ``fanouts`` with ``key``, the topology read in file order with ``file_order`` (the same samples)."""
    sampler = NeighborSampler(graph.indptr, graph.indices, fanouts, model.needs_degrees, file_order)

    def logits(chunk: torch.Tensor, key: int) -> torch.Tensor:
        subgraph = sampler.sample(chunk.numpy(), key)
        return model([b.to(device) for b in subgraph.blocks], store.gather(subgraph.input_nodes).to(device))
    return logits


def emit_chunks(nodes: torch.Tensor | np.ndarray, chunk_size: int, compute, emit: Emit, layer: int,
                progress: LayerProgress | None) -> None:
    """The asked vertices' rows, of either kind of graph: ``emit`` of ``compute(chunk)`` for each chunk of
    ``chunk_size`` of ``nodes`` in order, then ``progress(layer, done, total)``."""
    for start in range(0, nodes.shape[0], chunk_size):
        chunk = nodes[start:start + chunk_size]
        emit(slice(start, start + chunk.shape[0]), compute(chunk))
        if progress is not None:
            progress(layer, start + chunk.shape[0], nodes.shape[0])


def emitter(out, transform: Transform | None, check: Callable[[torch.Tensor], None] | None = None) -> Emit:
    """``emit(positions, values)``: chunks of final rows (float32 on the CPU, ``check``ed, then
    ``transform``ed) written into ``out`` at ``positions``."""

    def emit(positions, values: torch.Tensor) -> None:
        values = values.float().cpu()
        if check is not None:
            check(values)
        if transform is not None:
            values = transform(values)
        if isinstance(out, np.ndarray):
            out[positions if isinstance(positions, slice) else positions.numpy()] = values.numpy()
        else:
            out[positions] = values
    return emit


def _scratch(scratch: str | None):
    """A temporary folder in ``scratch`` (None: no folder), removed when the block ends; one that a killed
    process left behind is removed by the next inference there."""
    if scratch is None:
        return contextlib.nullcontext()
    marker = Path(scratch) / "neutronorch-scratch"
    sweep_stale(marker)
    return tempfile.TemporaryDirectory(dir=scratch, prefix=temp_prefix(marker))


def _features_in_place(store: FeatureStore, device: torch.device) -> torch.Tensor | None:
    """The features as a tensor over their own memory, for the input layer to read in place, where that gives
    the rows a gather would (float32 storage, a model on the CPU) and reads them no worse (no host cache, no
    file-ordered map); else None."""
    features = store.features
    if (device.type != "cpu" or store.dtype != torch.float32 or store.host_cache is not None or store.ordered
            or not isinstance(features, np.ndarray) or features.dtype != np.float32
            or not features.flags.c_contiguous):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # read-only memory maps: only read
        return torch.from_numpy(features)


def _buffer(shape: tuple[int, int], device: torch.device, folder: str | None, name: str) -> torch.Tensor:
    """Rows of one layer: on the device, or a float32 memory map ``name``.npy in ``folder``."""
    if folder is None:
        return torch.empty(shape, device=device)
    path = f"{folder}/{name}.npy"
    mapped = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=shape)
    try:
        reserve(path)  # a full disk is an error now, not a SIGBUS mid-layer
    except OSError as exc:
        raise write_error(Path(path), exc, existed=False) from exc
    return torch.from_numpy(mapped)

