"""A typed graph's embedding tables split by owner on its parts (docs/distributed.md, "Typed graphs on parts"):
each rank holds the rows of the featureless types' vertices its part owns, and their Adam moments, where a
full-copy rank holds every row.

- **Drawn as one process draws them.** ``draw_owned`` draws a table chunk by chunk as ``nn.Embedding`` draws it
  whole (``typed_tables.drawn_chunks``) and keeps the part's rows, so the global generator ends where the
  full-copy run's does and every later parameter is drawn the same.
- **Rows fetched before the forward.** Before each step (and each evaluation chunk) every rank fetches the rows
  its batch looks up from their owners (``RemoteRows`` over the table, one request and one reply a table), as
  leaves whose gradients the backward fills; ``OwnedTable.forward`` hands the model those rows.
- **Gradients to the owners.** After the backward, each rank sends every owner its looked-up rows' ids and
  gradient rows, with its loss weight and whether it looked the table up at all. Each owner adds them up as a
  full-copy run's table reduction does (``distributed.combine_rows``: rank by rank, weighted, divided by the
  weights' sum), for its own rows only, and its ``RowAdam`` moves them. A row's gradient and update are then
  the full-copy run's bit for bit; a table any rank looked up steps on every rank, as there. In one process the
  gradient rows are the table's gradient as they are (as ``nn.Embedding``'s)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from neutronorch.errors import ConfigError
from neutronorch.orchestration.remote_rows import RemoteRows
from neutronorch.sampling.partitioned import by_owner
from neutronorch.train.table_grads import combine_rows, own_rows
from neutronorch.train.typed_tables import drawn_chunks


def draw_owned(rows: int, width: int, ids: np.ndarray) -> torch.Tensor:
    """The rows ``ids`` (ascending) of the (rows, width) table ``nn.Embedding`` would draw now, drawn chunk by
    chunk, the generator left where that draw leaves it."""
    out = torch.empty((ids.shape[0], width), dtype=torch.float32)
    for start, end in drawn_chunks(rows, width):
        chunk = torch.empty((end - start, width), dtype=torch.float32).normal_()
        lo, hi = np.searchsorted(ids, [start, end])
        out[lo:hi] = chunk[torch.from_numpy(np.asarray(ids[lo:hi], dtype=np.int64) - start)]
    return out


class OwnedTable(nn.Embedding):
    """A featureless type's table on one part: ``weight`` holds the part's rows of the type (local order), and
    ``forward(ids)`` returns the rows ``PartTables.fetch`` fetched for ``ids`` (whole-graph ids of the type)."""

    def __init__(self, weight: torch.Tensor, node_type: str):
        super().__init__(weight.shape[0], weight.shape[1], sparse=True, _weight=weight)
        self.node_type = node_type
        self.fetched: tuple[torch.Tensor, torch.Tensor] | None = None  # (ids, rows) for the next forward
        self.looked_up = False  # whether the last forward read this table

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        given = self.fetched
        if given is None or not (given[0] is ids or torch.equal(given[0], ids)):
            raise RuntimeError(f"the {self.node_type} table on a part read ids whose rows were not fetched first "
                               f"(PartTables.fetch)")
        self.looked_up = True
        return given[1]


class PartTables:
    """The ``OwnedTable``s of a model on ``part`` (``data.typed_parts.TypedPartition``), their rows fetched
    and gradients sent through ``exchange`` (the training thread's)."""

    def __init__(self, part, exchange):
        self.part, self.exchange = part, exchange
        self.tables: dict[str, OwnedTable] = {}
        self._fetchers: dict[tuple[str, int], RemoteRows] = {}  # per table and exchange, made once

    def attach(self, model: nn.Module) -> None:
        """Hold ``model``'s ``OwnedTable``s (made by ``maker``)."""
        self.tables = {m.node_type: m for m in model.modules() if isinstance(m, OwnedTable)}  # a link model's too

    def shapes(self) -> dict[str, tuple[int, int]]:
        return {t: tuple(table.weight.shape) for t, table in self.tables.items()}

    def maker(self):
        """``TypedGNN``'s ``tables``: an ``OwnedTable`` of the part's rows for each featureless type."""
        return lambda node_type, rows, width: OwnedTable(draw_owned(rows, width, np.asarray(self.part.ids[node_type])),
                                                         node_type)

    def fetch(self, ids: dict[str, torch.Tensor], exchange=None, grad: bool = True) -> None:
        """Fetch every table's rows of ``ids`` (per type; a type absent: none) from their owners, for the next
        forward, as leaves with gradients (``grad``). A collective over ``exchange`` (default the tables')."""
        for t, table in self.tables.items():
            wanted = ids.get(t)
            rows = self._rows(t, wanted, exchange).requires_grad_(grad)
            table.fetched, table.looked_up = (wanted, rows) if wanted is not None else None, False

    def rows_of(self, ids: dict[str, torch.Tensor], exchange=None) -> dict[str, torch.Tensor]:
        """Every table's rows of ``ids`` (whole-graph ids per type) as they are now, from their owners, without
        touching what the next forward reads (``fetch``): a NeutronOrch snapshot's. A collective over
        ``exchange`` (default the tables'): every table on every rank, asked for rows or not."""
        rows = {t: self._rows(t, ids.get(t), exchange) for t in self.tables}
        return {t: rows[t] for t in ids if t in rows}

    def _rows(self, t: str, wanted: torch.Tensor | None, exchange) -> torch.Tensor:
        """Table ``t``'s rows of ``wanted`` (None: none) from their owners, a new float32 tensor (a collective)."""
        exchange = exchange or self.exchange
        asked = np.zeros(0, np.int64) if wanted is None else wanted.cpu().numpy()
        fetcher = self._fetchers.get((t, id(exchange)))
        if fetcher is None:
            fetcher = self._fetchers[(t, id(exchange))] = RemoteRows(self.part.view(t), exchange)
        rows, _ = fetcher.fetch(asked, table=self.tables[t].weight.detach().numpy())
        return torch.from_numpy(rows)

    def own_gradients(self) -> None:
        """One process: each table's gradient is its looked-up rows' (``nn.Embedding``'s sparse gradient)."""
        for table in self.tables.values():
            ids, rows, present = self._looked_up(table)
            table.weight.grad = (torch.sparse_coo_tensor(ids.unsqueeze(0), rows, tuple(table.weight.shape),
                                                         check_invariants=False) if present else None)
            table.fetched = None

    def reduce(self, weight: float, apart: dict | None = None) -> None:
        """Several ranks (``GradientSync``'s table reduction, with this rank's loss weight): each owner's tables
        get the weighted mean of every rank's gradient rows of its rows (a collective). ``apart``: gradients the
        mode handed over apart at this step on every rank (``GradientSync``'s, by ``id`` of their parameter):
        NeutronOrch's hot rows' sparse table gradients, rows by whole-graph id; each owner adds every rank's
        mean (equal weights), as a full-copy run's reduction adds them (``table_grads.reduce_tables``)."""
        tables = list(self.tables.values())
        grads = self._reduced([self._looked_up(table) for table in tables], weight)
        if apart is not None:
            handed = self._reduced([own_rows(apart.get(id(table.weight)), table.weight.shape[1]) for table in tables],
                                   1.0)
            grads = [b if a is None else a if b is None else (a + b).coalesce() for a, b in zip(grads, handed)]
        for table, grad in zip(tables, grads):
            table.weight.grad, table.fetched = grad, None

    def _reduced(self, rows: list[tuple[torch.Tensor, torch.Tensor, bool]], weight: float) -> list:
        """Per table, the weighted mean of every rank's (row ids, gradient rows, whether any) of the rows this
        rank owns, each rank weighted by its ``weight`` (None where no rank has any)."""
        exchange, part = self.exchange, self.part
        mine = np.array([weight, *[float(present) for _, _, present in rows]], np.float64)
        metas = exchange.all_to_all([mine] * exchange.size, [mine.shape[0]] * exchange.size)
        weights = [float(m[0]) for m in metas]
        out = []
        for k, (table, (ids, grad_rows, _)) in enumerate(zip(self.tables.values(), rows)):
            order, asks = by_owner(ids.numpy(), part.part_of[table.node_type], part.parts)
            grouped = grad_rows[torch.from_numpy(order)]
            bounds = np.cumsum([0] + [a.shape[0] for a in asks])
            got_ids = exchange.all_to_all(asks)
            got_rows = exchange.all_to_all([grouped[bounds[r]:bounds[r + 1]].numpy() for r in range(part.parts)],
                                           [g.shape[0] for g in got_ids])
            present = any(m[1 + k] for m in metas)
            received = [(torch.from_numpy(part.local(table.node_type, g.reshape(-1))),
                         torch.from_numpy(np.ascontiguousarray(r).reshape(-1, table.weight.shape[1])))
                        for g, r in zip(got_ids, got_rows)]
            out.append(combine_rows(received, weights, tuple(table.weight.shape))
                       if present and sum(weights) > 0 else None)
        return out

    @staticmethod
    def _looked_up(table: OwnedTable) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """The ids the last forward looked up, their gradient rows, and whether there is a gradient (as
        ``distributed.own_rows`` reads an ``nn.Embedding``'s: none where the table was not read)."""
        rows = None if table.fetched is None or not table.looked_up else table.fetched[1].grad
        if rows is None:
            return torch.zeros(0, dtype=torch.int64), torch.zeros(0, table.weight.shape[1]), False
        return table.fetched[0].to(torch.int64).cpu(), rows.detach().float().contiguous(), True


class TableSteps:
    """A mode's steps on a part whose embedding tables are split by owner (mixed in before the mode; ``tables``,
    ``alone`` set by it): once the step's inputs are ready, their table rows are fetched from their owners; in one
    process, after the backward, their gradient rows become the tables' before the mode adds its own (several
    ranks: ``GradientSync`` reduces them, ``PartTables.reduce``). Exact mode's and NeutronOrch mode's."""

    tables: PartTables
    alone: bool

    def step_inputs(self, batch):
        inputs = super().step_inputs(batch)  # NeutronOrch mode's waits for the batch and its hot rows first
        self.tables.fetch(batch.ids)
        return inputs

    def before_step(self, batch) -> None:
        if self.alone:
            self.tables.own_gradients()
        super().before_step(batch)


def check_storage(config) -> None:
    """Tables split by owner live in memory: ``embedding_storage`` mmap is refused on parts, with the reason."""
    if config.embedding_storage == "mmap":
        raise ConfigError("`embedding_storage` mmap: on a typed graph's parts each rank holds its part's rows of "
                          "the embedding tables in memory; memory-mapped tables are not split by owner yet. Leave "
                          "`embedding_storage` out (or give memory).")
