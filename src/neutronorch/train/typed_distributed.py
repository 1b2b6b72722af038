"""Data-parallel typed runs: ``train_typed`` on several ranks, launched as homogeneous runs are (``torchrun``, or
a process group the caller made; ``train/distributed.py``), in exact or device mode.

What a homogeneous data-parallel run promises, for typed graphs:

- **Batches.** Mini-batch ``k`` of an epoch is global: ``batch_size * world`` target seeds of the epoch's order,
  rank ``r`` training part ``r`` of it (``orchestration/seeds.py``'s ``NodeSeeds``: sizes differ by at most
  one, a rank may have none of a last batch). Each part is sampled with the global batch's key, and the typed
  sampler keys a vertex's draws by (key, hop, relation, vertex), so the ranks together draw exactly the
  neighbourhoods one process draws for the global batch.
- **Dropout** (``step_masks``): a training forward draws its dropout keys from a stream of the global batch's
  key, not from torch's generator. A mask is keyed by (that key, the call, the row's vertex), so a vertex's
  mask is the one process's whichever rank holds it; and a rank whose part reaches fewer types (none at all:
  an empty part) makes fewer calls without moving anything the next steps draw.
- **Gradients** (``TypedSync``): the dense weights' are reduced by ``GradientSync`` (each rank weighted by its
  loss terms, in one all-reduce). An embedding table's gradient is sparse and its rows differ per rank: every
  rank's (row ids, gradient rows) of every table are gathered (one all-gather of their sizes and weights, one
  of the rows), each rank's rows scaled by its loss terms, rows several ranks hold summed, all divided by the
  global batch's loss terms: the global batch's mean-loss gradient, coalesced. Every rank computes it from
  the same gathered bytes in the same order and takes the same ``RowAdam`` (or SparseAdam) step, so tables and
  their moments stay identical on every rank, bit for bit, and equal one process's on the global batch up to
  the order of float sums. A table no rank looked up has no gradient (its step count waits, as in one process).
- **Identical weights**: rank 0's initial weights, tables included, are broadcast (the same seed made them
  equal already); every rank then takes the same steps.
- **Evaluation** (``shared_logits``): each rank computes a contiguous share of the validation and test
  vertices (sampled with the one evaluation key, so a vertex's logits do not depend on its share) and the
  logits are gathered in order: every rank scores all of them, so every rank reports the same scores and
  agrees on the best epoch and on early stopping.
- **Stopping**: a stop request on any rank is agreed on after the step it came in (``GradientSync``'s
  all-reduce), so every rank stops after the same step.
- **Files** (``rank_settings``, ``distributed.py``'s ``join_ranks``): rank 0 alone holds the checkpoint
  folder and writes checkpoints, the summary and the metric logs; every rank resumes from rank 0's ``last.pt``.

Typed NeutronOrch mode is refused on several ranks (``capabilities.py``'s table): its hot sets per rank and
the hot rows' gradient averaged over the ranks are not there yet.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import Callable

import torch

from neutronorch.config import TrainConfig
from neutronorch.nn.activation import dropout_keys
from neutronorch.sampling.neighbor_sampler import batch_key, mix_key
from neutronorch.train.distributed import GradientSync, World, launched_rank

logger = logging.getLogger("neutronorch")

TRAINING_DROPOUT = 0x7479_7065_645F_6470  # mixed into a batch's key: its training forward's dropout key stream


def step_masks(seed: int, epoch: int, index: int) -> contextlib.AbstractContextManager:
    """Within it, this thread's dropout keys come from global batch ``index`` of ``epoch``'s stream (see the
    module docstring): what a training forward runs in, on every rank and in one process alike."""
    return dropout_keys(mix_key(batch_key(seed, epoch, index), TRAINING_DROPOUT))


def rank_settings(config: TrainConfig) -> TrainConfig:
    """The settings this rank runs with: ``config`` on rank 0 (and in one process), which writes every output;
    on the other ranks the same less the summary and metric logs (they read ``checkpoint_dir``, to resume, and
    write nothing). Known before the ranks join (the launcher's ``RANK``, or the caller's process group), so
    another rank never checks outputs that rank 0 may have begun to write."""
    if launched_rank() == 0:
        return config
    quiet = dataclasses.replace(config)
    quiet.summary_json = quiet.log_jsonl = quiet.log_csv = quiet.tensorboard = None
    return quiet


def data_parallel(run, world: World) -> None:
    """Make ``run`` (``train_typed``'s) rank ``world.rank`` of the ranks: its batches global (``batch_size`` per
    rank), rank 0's weights on every rank, the step's reduction (``run.sync``) and the stop agreed on by every
    rank (``run.stop``). One rank: only ``run.world`` is set. Before the run resumes or opens its mode."""
    run.world = world
    if not world.distributed:
        return
    batch = run.config.batch_size
    run.num_batches = -(-run.train_idx.shape[0] // (batch * world.size))
    world.broadcast_module(run.model, "the initial weights' broadcast")
    run.sync = TypedSync(world, run.model, run.stop)
    run.stop = run.sync.agreed  # every rank stops after the same step
    logger.info(f"data parallel: {world.describe()}; batch size {batch} per rank, {batch * world.size} per global "
                f"batch, {run.num_batches} global batches per epoch")


def shared_logits(world: World, compute: Callable[[torch.Tensor], torch.Tensor], nodes: torch.Tensor
                  ) -> torch.Tensor:
    """``compute(nodes)`` (CPU logits, a row per vertex in order), each rank computing a contiguous share of
    ``nodes`` and every rank getting all the rows."""
    if not world.distributed:
        return compute(nodes)
    mine = compute(torch.tensor_split(nodes, world.size)[world.rank])
    return world.all_gather_rows(mine.contiguous(), "gathering the evaluation's logits")


class TypedSync:
    """A data-parallel typed step's reduction, after the backward pass and before the optimizers' steps:
    the embedding tables' sparse gradients made the global batch's, then the dense ones (``GradientSync``,
    which also agrees on stopping: ``agreed``)."""

    def __init__(self, world: World, model: torch.nn.Module, request):
        self.world = world
        self.tables = model.embedding_parameters()
        self.dense = GradientSync(world, model.dense_parameters(), request)
        self.agreed = self.dense.agreed

    def __call__(self, weight: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """Reduce every gradient (this rank's loss averaged ``weight`` terms); returns the global batch's mean
        loss."""
        if self.tables:
            self.reduce_tables(float(weight))
        return self.dense(weight, loss)

    def reduce_tables(self, weight: float) -> None:
        """Every table's gradient: the rows of every rank, weighted, summed and divided (``combine_rows``), in
        two all-gathers: each rank's weight and row counts, then its rows."""
        world, tables = self.world, self.tables
        widths = [table.shape[1] for table in tables]
        parts = [own_rows(table) for table in tables]
        # Per rank: its weight, then per table whether it has a gradient and its row count.
        meta = torch.tensor([[weight, *[x for ids, _, present in parts for x in (present, ids.shape[0])]]],
                            dtype=torch.float64)
        metas = [m[0].tolist() for m in world.gather_padded(meta, [1] * world.size, world.host_group,
                                                            "the embedding tables' gradient sizes")]
        counts = [[int(n) for n in m[2::2]] for m in metas]
        sizes = [sum(n * (2 + w) for n, w in zip(mine, widths)) for mine in counts]
        packed = pack([(ids, rows) for ids, rows, _ in parts])
        gathered = (world.gather_padded(packed, sizes, world.host_group, "the embedding tables' gradient rows")
                    if max(sizes) else [packed] * world.size)
        received = [unpack(flat, mine, widths) for flat, mine in zip(gathered, counts)]
        weights = [m[0] for m in metas]
        for k, table in enumerate(tables):
            present = any(m[1 + 2 * k] for m in metas)
            table.grad = (combine_rows([rows[k] for rows in received], weights, tuple(table.shape)).to(table.device)
                          if present and sum(weights) > 0 else None)


def pack(tables: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """Tables' (row ids, rows) in one float32 buffer: per table its ids' bytes (two float32 words an int64 id,
    copied, never computed with), then its rows."""
    words = [x for ids, rows in tables for x in (ids.view(torch.float32), rows.reshape(-1))]
    return torch.cat([torch.zeros(0), *words])


def unpack(flat: torch.Tensor, counts: list[int], widths: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``pack``'s tables back from its buffer, given each table's row count and width."""
    tables, at = [], 0
    for n, width in zip(counts, widths):
        ids = flat[at:at + 2 * n].clone().view(torch.int64)
        tables.append((ids, flat[at + 2 * n:at + n * (2 + width)].view(n, width)))
        at += n * (2 + width)
    return tables


def own_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A table's gradient on this rank as (row ids int64, rows float32, whether there is one), on the CPU."""
    grad = table.grad
    if grad is None:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, table.shape[1]), False
    if not grad.is_sparse:
        raise RuntimeError("typed data-parallel training reduces the sparse gradients of embedding tables "
                           "(nn.Embedding(sparse=True)); this table's gradient is dense")
    ids, rows = grad._indices()[0], grad._values()
    return ids.to("cpu", torch.int64).contiguous(), rows.detach().to("cpu", torch.float32).contiguous(), True


def combine_rows(ranks: list[tuple[torch.Tensor, torch.Tensor]], weights: list[float], shape: tuple[int, int]
                 ) -> torch.Tensor:
    """The global batch's gradient of one table from every rank's (row ids, gradient rows of its mean loss):
    ``sum_r weights[r] * rows_r`` per row id (a row several ranks or lookups hold, summed), divided by the
    weights' sum; a coalesced sparse tensor of ``shape`` on the CPU. Deterministic: the same inputs give the
    same bits."""
    unique, inverse = torch.unique(torch.cat([ids for ids, _ in ranks]), sorted=True, return_inverse=True)
    summed = torch.zeros((unique.shape[0], shape[1]))
    for (ids, rows), w, where in zip(ranks, weights, torch.split(inverse, [ids.shape[0] for ids, _ in ranks])):
        summed.index_add_(0, where, rows, alpha=w)  # rank by rank: w * rows added where each row's id is
    summed.div_(sum(weights))
    return torch.sparse_coo_tensor(unique.unsqueeze(0), summed, shape, is_coalesced=True, check_invariants=False)
