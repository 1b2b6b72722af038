"""The embedding tables' gradients on several ranks: ``reduce_tables``, which ``distributed.py``'s
``GradientSync`` calls before it reduces the dense gradients.

Every rank's (row ids, gradient rows) of every table are gathered, each rank's rows scaled by its loss
terms, rows several ranks hold summed, all divided by the global batch's terms: the global batch's
mean-loss gradient, coalesced. Every rank computes it from the same gathered bytes in the same order, so
tables and moments stay identical on every rank, bit for bit. A table no rank looked up has no gradient.
"""

from __future__ import annotations

import torch


def reduce_tables(world, tables: list[torch.Tensor], weight: float, apart: list | None = None) -> None:
    """Every table's gradient (``world``: a ``distributed.World``): the rows of every rank, weighted, summed
    and divided (``combine_rows``), in two all-gathers: each rank's weight and row counts, then its rows.
    ``apart``: per table a sparse gradient (or None) reduced instead of the table's and added to it (with
    ``weight`` 1: their mean over the ranks)."""
    widths = [table.shape[1] for table in tables]
    parts = ([own_rows(table) for table in tables] if apart is None
             else [own_rows(grad, width) for grad, width in zip(apart, widths)])
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
        grad = (combine_rows([rows[k] for rows in received], weights, tuple(table.shape)).to(table.device)
                if present and sum(weights) > 0 else None)
        if apart is None:
            table.grad = grad
        elif grad is not None:
            table.grad = grad if table.grad is None else (table.grad + grad).coalesce()


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


def own_rows(table: torch.Tensor | None, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """A table's gradient on this rank (or, given its ``width``, the sparse gradient ``table``) as (row ids int64,
    rows float32, whether there is one), on the CPU."""
    grad = table.grad if width is None else table
    if grad is None:
        return torch.zeros(0, dtype=torch.int64), torch.zeros(0, table.shape[1] if width is None else width), False
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
