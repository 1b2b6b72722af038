"""The JODIE/TGN interaction CSV that temporal benchmarks ship (Wikipedia, Reddit, MOOC, LastFM; docs/temporal.md,
"Times in the data"): a header ``user_id,item_id,timestamp,state_label,features...``, then one interaction per
line in time order: a user id and an item id (each numbered from 0 on its own), the time, the user's state
label after it, and the interaction's features. Read as a typed graph of two types, ``user`` and ``item``,
and the relation ``(user, interacts, item)`` with the times and features as edge times and edge features
(``neutronorch convert FILE.csv OUT`` writes it in the typed native format)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np

from neutronorch.data.files import reads_files
from neutronorch.data.relation import Relation
from neutronorch.data.typed import TypedGraph
from neutronorch.errors import DataError

HEADER = ("user_id", "item_id", "timestamp", "state_label")  # the first four columns, as the files name them
RELATION = ("user", "interacts", "item")


def is_jodie(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a text file whose first line is a JODIE header (its first four names)."""
    try:
        with open(path, "rb") as file:
            first = file.readline(4096).decode("utf-8", "replace").strip().lower()
    except OSError:
        return False
    return tuple(name.strip() for name in first.split(",")[:4]) == HEADER


@reads_files
def load_jodie(path: str | os.PathLike, name: str | None = None) -> TypedGraph:
    """The typed graph of the JODIE CSV at ``path`` (``is_jodie``): every interaction an edge of ``(user,
    interacts, item)`` at its time, its features the edge's (none when the file has no feature column);
    times int64 when every one is whole, else float64. ``DataError`` naming the file and line for a line of
    other width, text that is not a number, an id that is not a whole number >= 0, a time that is not
    finite, or times out of order (the format promises time order)."""
    path = Path(path)
    if not is_jodie(path):
        raise DataError(f"{path}: not a JODIE/TGN interaction file: its first line must start with "
                        f"{','.join(HEADER)}.")
    try:
        with warnings.catch_warnings():  # an empty table is said below, not warned of
            warnings.simplefilter("ignore", UserWarning)
            table = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64, ndmin=2)
    except ValueError as exc:
        raise DataError(f"{path}: not a table of numbers of one width after the header ({exc}).") from None
    if table.shape[0] == 0:
        raise DataError(f"{path}: holds a header and no interaction.")
    if table.shape[1] < 4:
        raise DataError(f"{path}: lines hold {table.shape[1]} values; each needs at least user, item, timestamp "
                        f"and state label.")
    ids = table[:, :2]
    bad = ~np.isfinite(ids) | (ids < 0) | (ids != np.floor(ids)) | (ids >= 2.0 ** 53)
    if bad.any():
        row, column = map(int, np.argwhere(bad)[0])
        raise DataError(f"{path}: line {row + 2} has {HEADER[column]} {float(ids[row, column])!r}; ids are whole "
                        f"numbers >= 0.")
    times = table[:, 2]
    if not np.isfinite(times).all():
        raise DataError(f"{path}: line {int(np.flatnonzero(~np.isfinite(times))[0]) + 2} has timestamp "
                        f"{times[~np.isfinite(times)][0]}; every interaction needs a finite time.")
    if (falls := np.flatnonzero(np.diff(times) < 0)).size:
        raise DataError(f"{path}: line {int(falls[0]) + 3} has timestamp {float(times[falls[0] + 1])!r}, before "
                        f"the line above's {float(times[falls[0]])!r}; the format lists interactions in time order. "
                        f"Sort the lines by timestamp (keeping the header first).")
    if np.array_equal(times, np.floor(times)) and np.abs(times).max() < 2.0 ** 53:
        times = times.astype(np.int64)
    users, items = ids[:, 0].astype(np.int64), ids[:, 1].astype(np.int64)
    counts = {"user": int(users.max()) + 1, "item": int(items.max()) + 1}
    features = table[:, 4:].astype(np.float32) if table.shape[1] > 4 else None
    labels = table[:, 3]
    relation = Relation.from_edges(users, items, counts["user"], counts["item"], features, source=str(path),
                                   edge_time=times)
    notes = [f"JODIE interactions of {path.name}: {table.shape[0]:,} events, times {times[0]}..{times[-1]}",
             f"state labels ({int((labels != 0).sum()):,} non-zero) not kept: the graph has no per-event labels "
             f"yet (docs/temporal.md)"]
    return TypedGraph(name or path.name.split(".")[0], counts, {RELATION: relation}, {}, "user", None,
                      *(np.empty(0, np.int64),) * 3, 0, notes).validate(str(path))
