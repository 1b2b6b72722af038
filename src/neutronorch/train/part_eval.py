"""Evaluation across the parts of a partitioned run: the full-neighbour layer-wise inference of
``layerwise.py``, each rank computing every layer for the vertices it owns (docs/distributed.md, "Partitioned
training").

Layer l of a chunk of owned vertices reads all their in-neighbours (the part's own CSC), relabelled as the
whole graph's full-neighbour sampler relabels them, and the previous layer's rows of those neighbours: the
features for the first layer, then the rows each owner computed, fetched from it (``RemoteRows``). Every rank
computes as many chunks as the rank with the most, so that every fetch is a collective of all ranks. The last
layer is computed for the owned validation and test vertices only. Where the metric is a function of the class
counts (accuracy, F1: ``Task.counted``), each rank counts its own vertices by (label, predicted class) chunk by
chunk, holding no logits, and the counts are summed (``SplitCounts``); otherwise the logits, their positions and
labels are gathered and every rank scores all of them, as in a full-copy run. Either gives the full-copy run's
checks (non-finite logits, a collapse)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.data.files import release_pages
from neutronorch.jit import read_only
from neutronorch.orchestration.remote_rows import GrowingBuffer, RemoteRows, rows_bytes
from neutronorch.sampling.block import Block
from neutronorch.sampling.frontier_map import FrontierMap
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.partitioned import PartitionedSampler, sample_rows
from neutronorch.train.distributed import World
from neutronorch.train.evaluate import eval_subset, scored
from neutronorch.train.health import SPLIT_NAMES, EvaluationCheck, counted_collapse, nonfinite_rows, tied
from neutronorch.train.resources import return_freed_memory
from neutronorch.train.task import confusion, counted_score


EVAL_CHUNK_BYTES = 16 << 20  # the most bytes of rows a chunk of full-neighbour evaluation fetches (``_bounded``)
SCAN_BLOCK = 1 << 16  # the evaluated vertices read at a time to find a rank's own (``evaluated``)


class PartEvaluation:
    """The evaluation of a rank holding ``part``, fetching rows through ``exchange`` (which only the trainer's
    thread uses) among the ranks of ``world``."""

    def __init__(self, part, exchange, world: World, degrees: np.ndarray | None = None):
        self.part, self.world, self.degrees = part, world, degrees  # degrees: symmetric GCN's (global_in_degrees)
        self.fetcher = RemoteRows(part, exchange)
        # A chunk's vertex map (sized to its frontier) and fetched rows (``_rows``), let go after an evaluation.
        self._map, self._buffer = FrontierMap(), GrowingBuffer()

    def evaluate(self, run, check: EvaluationCheck, progress=None) -> dict[str, float]:
        """``Run.evaluate``'s scores ({"val": ..., "test": ...}) of a partitioned run."""
        config, part, world = run.config, self.part, self.world
        self.prepare(run.model)
        split, positions, own = self.evaluated(config)
        labels = torch.from_numpy(np.asarray(self.labels_of(own), dtype=np.int64))
        chunks = self.share_rows(run, own, positions, progress)
        if world.distributed and run.task.counted:  # counted chunk by chunk: no logits held
            counts = SplitCounts(run.task.num_classes, self.out_width(run.model), torch.from_numpy(positions),
                                 torch.from_numpy(positions < split), labels)
            for rows in chunks:
                counts.add(rows)
            return counts.scores(world, run.task.metric, check)
        logits = joined(chunks, positions.shape[0], self.out_width(run.model))
        positions = torch.from_numpy(positions)
        if world.distributed:
            positions = torch.cat(world.all_gather_rows(positions, "gathering the evaluation's positions"))
            logits = torch.cat(world.all_gather_rows(logits.contiguous(), "gathering the evaluation's logits"))
            labels = torch.cat(world.all_gather_rows(labels, "gathering the evaluation's labels"))
        order = torch.argsort(positions)
        logits, labels = logits[order], labels[order]
        return scored(run.task, {"val": (logits[:split], labels[:split]), "test": (logits[split:], labels[split:])},
                      check)

    @property
    def owners(self) -> np.ndarray:
        """The owner part of every vertex that may be evaluated."""
        return self.part.part_of

    def labels_of(self, ids: np.ndarray) -> np.ndarray:
        """The labels of ``ids``, vertices this part owns."""
        return self.part.labels[self.part.local(ids)]

    def evaluated(self, config) -> tuple[int, np.ndarray, np.ndarray]:
        """(how many validation vertices are evaluated, the positions of this rank's vertices among the evaluated
        validation then test vertices, those vertices), read a block at a time: the whole graph's evaluated
        vertices are not copied (``evaluated_nodes`` copies them)."""
        positions, own, at, subsets = [], [], 0, self._subsets(config)
        for ids in subsets:
            for start in range(0, ids.shape[0], SCAN_BLOCK):
                block = np.asarray(ids[start:start + SCAN_BLOCK], dtype=np.int64)
                where = np.flatnonzero(np.asarray(self.owners[block]) == self.part.part)
                positions.append(where + (at + start))
                own.append(block[where])
            at += ids.shape[0]
        self._release_splits()
        return subsets[0].shape[0], np.concatenate(positions), np.concatenate(own)

    def evaluated_nodes(self, config) -> np.ndarray:
        """The whole graph's evaluated vertices: validation then test."""
        nodes = np.concatenate([np.asarray(ids, dtype=np.int64) for ids in self._subsets(config)])
        self._release_splits()
        return nodes

    def _release_splits(self) -> None:
        """The whole graph's validation and test vertices are read once an evaluation: their file's pages are
        not kept in this rank's memory (8 bytes a vertex evaluated: 7 MB of the 1M-vertex graph's)."""
        for name in ("val_idx", "test_idx"):
            release_pages(self.part.global_splits[name])

    def _subsets(self, config) -> list[np.ndarray]:
        """The validation and test vertices evaluated (``eval_subset``'s), as stored where all are."""
        out = []
        for offset, name in enumerate(("val_idx", "test_idx")):
            ids = self.part.global_splits[name]
            out.append(eval_subset(ids, config.eval_max_nodes, config.seed + offset)
                       if 0 < config.eval_max_nodes < ids.shape[0] else ids)
        return out

    def share_rows(self, run, own: np.ndarray, positions: np.ndarray, progress=None) -> Iterator[torch.Tensor]:
        """The logits of this rank's evaluated vertices ``own`` (at ``positions`` among all evaluated ones), chunk
        by chunk in order (collectives: to be read to the end)."""
        config = run.config
        if config.eval_fanouts is None:
            return self.last_rows(run.model, own, run.device, config.eval_batch_size, progress)
        return self.sampled(run.model, self.evaluated_nodes(config), positions, config.eval_fanouts, run.device,
                            config.eval_batch_size, config.seed, progress)

    def out_width(self, model) -> int:
        """The width of the rows ``share_rows`` gives."""
        return model.width(model.num_layers - 1)

    def prepare(self, model) -> None:
        """Before an evaluation, a node or a link task's: the heap's free pages handed back (the epoch's batches,
        freed; the layer rows to come are as large), and rank 0's batch normalisation statistics on every rank."""
        return_freed_memory()
        if self.world.distributed:
            self.world.broadcast_module(model, "the buffers' broadcast before evaluation", buffers_only=True)

    def logits(self, model, nodes: np.ndarray, device: torch.device, chunk_size: int, progress=None) -> torch.Tensor:
        """The last layer's rows of ``nodes`` (owned by this part), every layer below computed for every owned
        vertex; float32 on the CPU (a collective)."""
        return joined(self.last_rows(model, nodes, device, chunk_size, progress), nodes.shape[0],
                      model.width(model.num_layers - 1))

    @torch.no_grad()
    def last_rows(self, model, nodes: np.ndarray, device: torch.device, chunk_size: int,
                  progress=None) -> Iterator[torch.Tensor]:
        """``logits`` chunk by chunk (collectives: to be read to the end)."""
        model.eval()
        part, chunk_size = self.part, max(1, chunk_size)
        owned = np.asarray(part.ids)
        hidden = None
        for layer in range(model.num_layers - 1):
            out = torch.empty((owned.shape[0], model.width(layer)))
            for start, end in self._bounded(owned, chunk_size, hidden):
                out[start:end] = self.layer_rows(model, layer, owned[start:end], hidden, device)
                if progress is not None:
                    progress(layer + 1, end, owned.shape[0])
            hidden = out.numpy()
        last = model.num_layers - 1
        for start, end in self._bounded(nodes, chunk_size, hidden):
            yield self.layer_rows(model, last, nodes[start:end], hidden, device)
            if progress is not None:
                progress(last + 1, end, nodes.shape[0])
        self._done()  # nothing held between evaluations

    @torch.no_grad()
    def sampled(self, model, nodes: np.ndarray, positions: np.ndarray, fanouts: list[int], device: torch.device,
                chunk_size: int, seed: int, progress=None) -> Iterator[torch.Tensor]:
        """The last layer's rows of ``nodes[positions]`` (this part's vertices, ``positions`` ascending) over
        neighbourhoods sampled by ``fanouts``: chunk k of ``chunk_size`` of ``nodes`` keyed as the whole graph's
        sampled inference keys it (``evaluate.py``), each rank sampling its own vertices of it, so that every
        vertex draws what it draws there. Every rank takes part in every chunk, also with none of its own (chunk by
        chunk; collectives: to be read to the end)."""
        model.eval()
        sampler = PartitionedSampler(self.part, self.fetcher.exchange, fanouts, self.degrees)  # for this pass
        mine = np.zeros(nodes.shape[0], dtype=bool)
        mine[positions] = True
        for index, start in enumerate(range(0, nodes.shape[0], max(1, chunk_size))):
            chunk = nodes[start:start + chunk_size][mine[start:start + chunk_size]]
            subgraph = sampler.sample(chunk, batch_key(seed, -1, index))
            ids = subgraph.input_nodes.numpy()
            rows, _ = self.fetcher.fetch(ids, into=self._rows(ids.shape[0], None))
            if chunk.shape[0]:
                x = tensor_from_numpy(rows).float().to(device)
                yield model([b.to(device) for b in subgraph.blocks], x).float().cpu()
            if progress is not None:
                progress(0, min(nodes.shape[0], start + chunk_size), nodes.shape[0])
        self._done()

    def _rows(self, count: int, table: np.ndarray | None) -> np.ndarray:
        """The buffer a chunk's fetched rows of ``table`` (None: the features) are written to: one, reused by
        every chunk of an evaluation and grown to the largest (``GrowingBuffer``)."""
        return self._buffer.take(rows_bytes(count, self.part.features if table is None else table))

    def _done(self) -> None:
        """Let go what an evaluation held: its chunks' buffers and vertex map."""
        self._map, self._buffer = FrontierMap(), GrowingBuffer()
        self.fetcher.drop_buffers()

    def _bounded(self, ids: np.ndarray, chunk_size: int, table: np.ndarray | None) -> list[tuple[int, int]]:
        """This rank's chunks of ``ids`` (its own vertices) as (start, end): at most ``chunk_size`` of them, and
        no more than ``EVAL_CHUNK_BYTES`` of rows of ``table`` (None: the features) fetched, counting each
        vertex and its in-neighbours (a vertex alone may take more); then empty ones, as many as the rank with
        the most chunks takes (a collective)."""
        part = self.part
        rows = np.diff(np.asarray(part.indptr))[part.local(ids)] + 1 if ids.shape[0] else np.zeros(0, np.int64)
        budget = max(1, EVAL_CHUNK_BYTES // rows_bytes(1, part.features if table is None else table))
        ends, total, start = [], np.concatenate([[0], np.cumsum(rows)]), 0
        while start < ids.shape[0]:
            end = min(start + chunk_size, int(np.searchsorted(total, total[start] + budget, side="right")) - 1)
            start = max(end, start + 1)
            ends.append(start)
        bounds = list(zip([0, *ends[:-1]], ends))
        return bounds + [(ids.shape[0], ids.shape[0])] * (self._most_chunks(len(bounds)) - len(bounds))

    def _chunks(self, count: int, chunk_size: int) -> range:
        """The starts of this rank's chunks of ``count`` rows, as many as the rank with the most takes (those
        past ``count`` are empty): every rank fetches the same number of times."""
        return range(0, self._most_chunks(-(-count // chunk_size)) * chunk_size, chunk_size)

    def _most_chunks(self, mine: int) -> int:
        """The most chunks any rank takes, this rank's being ``mine`` (a collective)."""
        exchange = self.fetcher.exchange
        counts = exchange.all_to_all([np.array([mine], np.int64)] * exchange.size, [1] * exchange.size)
        return int(max(c[0] for c in counts))

    def layer_rows(self, model, layer: int, ids: np.ndarray, hidden: np.ndarray | None,
                   device: torch.device) -> torch.Tensor:
        """Layer ``layer`` of the owned vertices ``ids`` over all their in-neighbours, reading ``hidden``
        (every part's previous layer by local index; None: the features). A collective (the fetch)."""
        part = self.part
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        ptr, nbrs = sample_rows(read_only(part.indptr), read_only(part.indices), part.local(ids), ids, -1, np.uint64(0))
        self._map.start(ids)
        (local,), frontier = self._map.relabel(ids, [nbrs])
        self._map.clear()
        rows, _ = self.fetcher.fetch(frontier, table=hidden, into=self._rows(frontier.shape[0], hidden))
        if ids.shape[0] == 0:
            return torch.zeros(0, model.width(layer))
        block = Block(ids.shape[0], frontier.shape[0], torch.from_numpy(ptr), torch.from_numpy(local),
                      src_degree=None if self.degrees is None else torch.from_numpy(self.degrees[frontier]),
                      src_ids=torch.from_numpy(frontier))
        x_src = tensor_from_numpy(rows).float()
        return model.layer_forward(layer, block.to(device), x_src.to(device)).float().cpu()


def joined(chunks: Iterable[torch.Tensor], count: int, width: int) -> torch.Tensor:
    """The ``count`` rows of ``width`` that ``chunks`` give in order, written into one tensor as they come (no
    list of chunks to join)."""
    out, at = torch.empty((count, width)), 0
    for rows in chunks:
        out[at:at + rows.shape[0]] = rows
        at += rows.shape[0]
    return out


class SplitCounts:
    """What ranks add up to score a counted metric (``Task.counted``: accuracy, F1), taken from this rank's logits
    chunk by chunk in order (``add``), none of them kept: per split, its counts by (label, predicted class), its
    rows, its rows not finite, and whether its labelled rows all tie with the split's first. For that each rank
    keeps its first labelled row and the least and most of every labelled row's scores: every row ties with a
    reference (``tied``: each score within a tolerance of the reference's) just when those two do, and of the
    rows the ranks offer, the one of the lowest position is the reference."""

    def __init__(self, classes: int, width: int, positions: torch.Tensor, in_val: torch.Tensor,
                 labels: torch.Tensor):
        self.classes, self.width, self.at = classes, width, 0
        self.positions, self.in_val, self.labels = positions, in_val, labels
        self.counts = np.zeros((2, classes, classes), np.int64)
        self.rows, self.bad = [0, 0], [0, 0]
        self.first: list[torch.Tensor | None] = [None, None]  # (position, row) as float64
        self.bounds: list[torch.Tensor | None] = [None, None]  # the least and the most scores (2, width)

    def add(self, rows: torch.Tensor) -> None:
        """Count the next ``rows`` of this rank's logits."""
        end = self.at + rows.shape[0]
        in_val, labels, positions = self.in_val[self.at:end], self.labels[self.at:end], self.positions[self.at:end]
        for index, mask in enumerate((in_val, ~in_val)):
            split_rows, split_labels = rows[mask], labels[mask]
            self.counts[index] += confusion(split_rows.argmax(1).numpy(), split_labels.numpy(), self.classes)
            self.rows[index] += split_rows.shape[0]
            self.bad[index] += nonfinite_rows(split_rows)
            known = split_labels >= 0
            labelled = split_rows[known]
            if labelled.shape[0] == 0:
                continue
            if self.first[index] is None:
                position = positions[mask][known][:1].double()
                self.first[index] = torch.cat([position, labelled[0].double()])
            least, most = labelled.amin(0), labelled.amax(0)
            held = self.bounds[index]
            self.bounds[index] = torch.stack([least, most]) if held is None else torch.stack(
                [torch.minimum(held[0], least), torch.maximum(held[1], most)])
        self.at = end

    def scores(self, world: World, metric: str, check: EvaluationCheck) -> dict[str, float]:
        """Every split's score, from all ranks' counts (collectives), with the full-copy run's checks (non-finite
        logits, a collapse)."""
        firsts = [torch.cat([torch.tensor([float(index)], dtype=torch.float64), first]).unsqueeze(0)
                  for index, first in enumerate(self.first) if first is not None]
        mine = torch.cat(firsts) if firsts else torch.zeros(0, 2 + self.width, dtype=torch.float64)
        offered = torch.cat(world.all_gather_rows(mine, "gathering the evaluation's first rows"))
        square = self.classes * self.classes
        totals = torch.zeros(2, square + 3, dtype=torch.int64)
        for index in range(2):
            split = offered[offered[:, 0] == index]
            reference = split[split[:, 1].argmin(), 2:].float() if split.shape[0] else None
            untied = (reference is not None and self.bounds[index] is not None
                      and not tied(self.bounds[index], reference))
            totals[index] = torch.tensor([*self.counts[index].reshape(-1), self.rows[index], self.bad[index],
                                          int(untied)])
        totals = world.all_reduce_(totals, "adding up the evaluation's counts").numpy()
        out = {}
        for index, name in enumerate(("val", "test")):
            counts, (rows, bad, untied) = totals[index, :square].reshape(self.classes, -1), totals[index, square:]
            check.nonfinite(int(bad), int(rows), SPLIT_NAMES.get(name, name), "logits", "vertices")
            check.collapsed(counted_collapse(counts, untied == 0) if rows >= 2 else None)
            out[name] = counted_score(metric, counts)
        return out
