"""Evaluation across the parts of a partitioned run: the full-neighbour layer-wise inference of
``layerwise.py``, each rank computing every layer for the vertices it owns (docs/distributed.md, "Partitioned
training").

Layer l of a chunk of owned vertices reads all their in-neighbours (the part's own CSC), relabelled as the
whole graph's full-neighbour sampler relabels them, and the previous layer's rows of those neighbours: the
features for the first layer, then the rows each owner computed, fetched from it (``RemoteRows``). Every rank
computes as many chunks as the rank with the most, so that every fetch is a collective of all ranks. The last
layer is computed for the owned validation and test vertices only. Where the metric is a function of the class
counts (accuracy, F1: ``Task.counted``), each rank counts its own vertices by (label, predicted class) and the
counts are summed; otherwise the logits, their positions and labels are gathered and every rank scores all of
them, as in a full-copy run. Either gives the full-copy run's checks (non-finite logits, a collapse)."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
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


EVAL_CHUNK_BYTES = 64 << 20  # the most bytes of rows a chunk of full-neighbour evaluation fetches (``_bounded``)


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
        val = eval_subset(part.global_splits["val_idx"], config.eval_max_nodes, config.seed)
        test = eval_subset(part.global_splits["test_idx"], config.eval_max_nodes, config.seed + 1)
        nodes = np.concatenate([val, test])
        positions = np.flatnonzero(np.asarray(self.owners[nodes]) == part.part)
        logits = self.share_logits(run, nodes, positions, progress)
        labels = torch.from_numpy(np.asarray(self.labels_of(nodes[positions]), dtype=np.int64))
        positions = torch.from_numpy(positions)
        if world.distributed and run.task.counted:
            return self.counted(run.task, logits, labels, positions < val.shape[0], check)
        if world.distributed:
            positions = torch.cat(world.all_gather_rows(positions, "gathering the evaluation's positions"))
            logits = torch.cat(world.all_gather_rows(logits.contiguous(), "gathering the evaluation's logits"))
            labels = torch.cat(world.all_gather_rows(labels, "gathering the evaluation's labels"))
        order = torch.argsort(positions)
        logits, labels, split = logits[order], labels[order], val.shape[0]
        return scored(run.task, {"val": (logits[:split], labels[:split]), "test": (logits[split:], labels[split:])},
                      check)

    @property
    def owners(self) -> np.ndarray:
        """The owner part of every vertex that may be evaluated."""
        return self.part.part_of

    def labels_of(self, ids: np.ndarray) -> np.ndarray:
        """The labels of ``ids``, vertices this part owns."""
        return self.part.labels[self.part.local(ids)]

    def share_logits(self, run, nodes: np.ndarray, positions: np.ndarray, progress=None) -> torch.Tensor:
        """The logits of ``nodes[positions]``, this rank's share of the evaluated ``nodes`` (a collective)."""
        config = run.config
        if config.eval_fanouts is None:
            return self.logits(run.model, nodes[positions], run.device, config.eval_batch_size, progress)
        return self.sampled(run.model, nodes, positions, config.eval_fanouts, run.device, config.eval_batch_size,
                            config.seed, progress)

    def prepare(self, model) -> None:
        """Before an evaluation, a node or a link task's: the heap's free pages handed back (the epoch's batches,
        freed; the layer rows to come are as large), and rank 0's batch normalisation statistics on every rank."""
        return_freed_memory()
        if self.world.distributed:
            self.world.broadcast_module(model, "the buffers' broadcast before evaluation", buffers_only=True)

    def counted(self, task, logits: torch.Tensor, labels: torch.Tensor, in_val: torch.Tensor,
                check: EvaluationCheck) -> dict[str, float]:
        """The scores of this rank's ``logits`` of validation (``in_val``) and test vertices, and every other
        rank's, from the counts all ranks add up: per split its (label, predicted class) counts, its rows, its
        rows not finite, and whether its labelled rows all tie with the split's first (by position; each rank
        offers its first labelled row, and the one of the lowest position is the reference)."""
        splits = {"val": in_val, "test": ~in_val}
        firsts = []
        for index, mask in enumerate(splits.values()):
            known = labels[mask] >= 0
            position = torch.nonzero(mask).reshape(-1)[known][:1].double().unsqueeze(1)
            first = logits[mask][known][:1].double()
            firsts.append(torch.cat([torch.full_like(position, index), position, first], 1))
        firsts = torch.cat(self.world.all_gather_rows(torch.cat(firsts), "gathering the evaluation's first rows"))
        width = task.num_classes * task.num_classes
        totals = torch.zeros(len(splits), width + 3, dtype=torch.int64)
        for index, mask in enumerate(splits.values()):
            rows, known = logits[mask], labels[mask] >= 0
            offered = firsts[firsts[:, 0] == index]
            reference = offered[offered[:, 1].argmin(), 2:].float() if offered.shape[0] else None
            counts = confusion(rows.argmax(1).numpy(), labels[mask].numpy(), task.num_classes)
            untied = reference is not None and not tied(rows[known], reference)
            totals[index] = torch.tensor([*counts.reshape(-1), rows.shape[0], nonfinite_rows(rows), int(untied)])
        totals = self.world.all_reduce_(totals, "adding up the evaluation's counts").numpy()
        scores = {}
        for index, name in enumerate(splits):
            counts, (rows, bad, untied) = totals[index, :width].reshape(task.num_classes, -1), totals[index, width:]
            check.nonfinite(int(bad), int(rows), SPLIT_NAMES.get(name, name), "logits", "vertices")
            check.collapsed(counted_collapse(counts, untied == 0) if rows >= 2 else None)
            scores[name] = counted_score(task.metric, counts)
        return scores

    @torch.no_grad()
    def logits(self, model, nodes: np.ndarray, device: torch.device, chunk_size: int, progress=None) -> torch.Tensor:
        """The last layer's rows of ``nodes`` (owned by this part), every layer below computed for every owned
        vertex; float32 on the CPU."""
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
        logits = torch.empty((nodes.shape[0], model.width(last)))  # filled chunk by chunk: no list to join
        for start, end in self._bounded(nodes, chunk_size, hidden):
            logits[start:end] = self.layer_rows(model, last, nodes[start:end], hidden, device)
            if progress is not None:
                progress(last + 1, end, nodes.shape[0])
        self._done()  # nothing held between evaluations
        return logits

    @torch.no_grad()
    def sampled(self, model, nodes: np.ndarray, positions: np.ndarray, fanouts: list[int], device: torch.device,
                chunk_size: int, seed: int, progress=None) -> torch.Tensor:
        """The last layer's rows of ``nodes[positions]`` (this part's vertices, ``positions`` ascending) over
        neighbourhoods sampled by ``fanouts``: chunk k of ``chunk_size`` of ``nodes`` keyed as the whole graph's
        sampled inference keys it (``evaluate.py``), each rank sampling its own vertices of it, so that every
        vertex draws what it draws there. Every rank takes part in every chunk, also with none of its own."""
        model.eval()
        sampler = PartitionedSampler(self.part, self.fetcher.exchange, fanouts, self.degrees)  # for this pass
        mine = np.zeros(nodes.shape[0], dtype=bool)
        mine[positions] = True
        outputs = [torch.zeros(0, model.width(model.num_layers - 1))]
        for index, start in enumerate(range(0, nodes.shape[0], max(1, chunk_size))):
            chunk = nodes[start:start + chunk_size][mine[start:start + chunk_size]]
            subgraph = sampler.sample(chunk, batch_key(seed, -1, index))
            ids = subgraph.input_nodes.numpy()
            rows, _ = self.fetcher.fetch(ids, into=self._rows(ids.shape[0], None))
            if chunk.shape[0]:
                x = tensor_from_numpy(rows).float().to(device)
                outputs.append(model([b.to(device) for b in subgraph.blocks], x).float().cpu())
            if progress is not None:
                progress(0, min(nodes.shape[0], start + chunk_size), nodes.shape[0])
        self._done()
        return torch.cat(outputs)

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
        ptr, nbrs = sample_rows(part.indptr, part.indices, part.local(ids), ids, -1, np.uint64(0))
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
