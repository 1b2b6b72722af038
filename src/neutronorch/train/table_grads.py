"""A typed model's embedding tables' sparse gradients across data-parallel ranks, which ``GradientSync``
(``distributed.py``) reduces first: every rank's (row ids, gradient rows) gathered, weighted and added up
(``reduce_tables``), and the sum of one table's rows from several ranks (``combine_rows``), which a typed graph's
parts reduce too (``part_tables.py``)."""

from __future__ import annotations

import torch


def reduce_tables(world, tables: list[torch.Tensor], weight: float, apart: list | None = None) -> None:
    """Every table's gradient (``world``: the run's ``distributed.World``): every rank's (row ids, rows),
    weighted by its loss terms, summed where ranks share rows and divided by the global batch's terms
    (``combine_rows``), in two all-gathers: each rank's weight and row counts, then its rows. Every rank
    computes it from the same gathered bytes in the same order, so tables and moments stay identical on every rank, bit for bit. ``apart``: per table a sparse
    gradient (or None) reduced instead of the table's and added to it (with ``weight`` 1: their mean)."""
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
    # One float32 buffer: per table its ids' bytes (two float32 words an int64 id, copied, never computed
    # with), then its rows.
    packed = torch.cat([torch.zeros(0), *[x for ids, rows, _ in parts for x in (ids.view(torch.float32),
                                                                                 rows.reshape(-1))]])
    gathered = (world.gather_padded(packed, sizes, world.host_group, "the embedding tables' gradient rows")
                if max(sizes) else [packed] * world.size)
    received = []  # per rank, its tables' (row ids, copied to be read as int64, and rows) from its buffer
    for flat, mine in zip(gathered, counts):
        unpacked, at = [], 0
        for n, w in zip(mine, widths):
            ids, at = flat[at:at + 2 * n].clone().view(torch.int64), at + 2 * n
            unpacked.append((ids, flat[at:at + n * w].view(n, w)))
            at += n * w
        received.append(unpacked)
    weights = [m[0] for m in metas]
    for k, table in enumerate(tables):
        present = any(m[1 + 2 * k] for m in metas)
        grad = (combine_rows([rows[k] for rows in received], weights, tuple(table.shape)).to(table.device)
                if present and sum(weights) > 0 else None)
        if apart is None:
            table.grad = grad
        elif grad is not None:
            table.grad = grad if table.grad is None else (table.grad + grad).coalesce()


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
