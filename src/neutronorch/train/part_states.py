"""What a partitioned run's rank files say of themselves, read without the checkpoint module (which reads them
through ``whole_tables``): where a file stands (``position``), whether it fits a rank (``misfit``), and a typed
run's embedding tables made whole from every rank's file (``whole_tables``; docs/distributed.md, "Typed graphs on
parts")."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import torch

from neutronorch.errors import CheckpointError
from neutronorch.train.outputs import rank_file


def position(state: dict) -> tuple[int, int, int]:
    """Where a checkpoint stands: its epoch, the steps of it done and the epoch records so far."""
    return int(state["epoch"]), int(state.get("position", {}).get("step", -1)), len(state["history"])


def misfit(state: dict, identity: dict, path: Path, partitions: str) -> str | None:
    """What makes the checkpoint ``state`` (read from ``path``) no file this rank continues from: one of a
    full-copy run, of another partition or part count, or of another part; None when it fits."""
    saved = state.get("partition")
    if saved is None:
        return (f"{path}: written by a full-copy run (`dataset` {state['config'].get('dataset')}), not a partitioned "
                f"one: resume it without `partitions`, or start a new run in another `checkpoint_dir`.")
    differ = [f"{what} {saved[key]} then, {identity[key]} now" for key, what in (("parts", "part count"),
                                                                                  ("id", "partition id"))
              if saved[key] != identity[key]]
    if differ:
        return (f"{path}: written by a run on another partition: {'; '.join(differ)} ({partitions}). Resume with the "
                f"partition folder the run started with and {saved['parts']} ranks, one a part, or start a new run in "
                f"another `checkpoint_dir`.")
    if saved["part"] != identity["part"]:
        return (f"{path}: holds part {saved['part']}'s state, and this rank trains part {identity['part']}: the "
                f"ranks' files were renamed or mixed up. Put each back as its rank wrote it (last.pt by rank 0, "
                f"last.rank-R.pt by rank R).")
    return None


def whole_tables(path: Path, state: dict, read: Callable[[Path], dict]) -> dict:
    """``state`` (read from ``path``) of a rank of a typed run on several parts, whose embedding tables hold its
    part's rows, with whole tables: every row from the file of its owner's rank, beside it (``last.pt`` and
    ``last.rank-R.pt``, each naming its rows' ids, at the same step). What ``load_checkpoint`` gives prediction;
    a ``CheckpointError`` saying which file is missing or does not fit. ``read(path)``: a typed checkpoint's
    state (``checkpoint.load_state``)."""
    partition, folder = state["partition"], path.parent
    parts = partition["parts"]
    name = f"a typed run on {parts} parts, whose embedding tables each rank's file holds its part's rows of"
    base = next((b for b in ("last.pt", "best.pt") if path.name in {rank_file(r, b) for r in range(parts)}), None)
    if base is None:
        raise CheckpointError(f"{path}: written by rank {partition['part']} of {name}, and not named as its rank "
                              f"wrote it (last.pt or best.pt by rank 0, last.rank-R.pt or best.rank-R.pt by rank R); "
                              f"a model for inference needs every rank's rows. Give {folder / 'last.pt'} with every "
                              f"rank's file beside it, under the names they were written with.")
    states = []
    for rank in range(parts):
        file = folder / rank_file(rank, base)
        if not file.is_file():
            raise CheckpointError(f"{file}: rank {rank}'s checkpoint is missing. {path} is a file of {name}; a model "
                                  f"for inference reads every rank's ({base}, {base.removesuffix('.pt')}.rank-R.pt) "
                                  f"from one folder: put it back beside the others.")
        theirs = state if file == path else read(file)
        problem = misfit(theirs, {**partition, "part": rank}, file, str(state["config"].get("partitions")))
        if problem is None and position(theirs) != position(state):
            problem = (f"{file}: written at another step than {path} (epoch and step {position(theirs)[:2]} against "
                       f"{position(state)[:2]}): the run stopped while its ranks were writing them.")
        if problem is None and "table_rows" not in theirs["partition"]:
            problem = f"{file}: names none of its tables' rows (written before rank files named them); train again."
        if problem:
            raise CheckpointError(problem)
        states.append(theirs)
    model, counts = dict(state["model"]), state["dataset"]["num_nodes"]
    for node_type in partition["table_rows"]:
        key = next(k for k in model if k.endswith(f"embeddings.{node_type}.weight"))
        rows = model[key]
        whole = rows.new_empty((int(counts[node_type]), rows.shape[1]))
        seen = torch.zeros(whole.shape[0], dtype=torch.int32)
        for theirs in states:
            ids = theirs["partition"]["table_rows"][node_type]
            whole[ids] = theirs["model"][key]
            seen.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        if not bool((seen == 1).all()):
            raise CheckpointError(f"{folder}: the ranks' files hold the rows of table {node_type} "
                                  f"{'more than once' if bool((seen > 1).any()) else 'not all'}: they are of "
                                  f"different runs or damaged. Train again.")
        model[key] = whole
    return {**{k: v for k, v in state.items() if k != "partition"}, "model": model}


def table_rows(part, tables) -> dict:
    """What a typed rank's checkpoint names its tables' rows by: their global ids (``whole_tables``)."""
    return {t: torch.from_numpy(np.array(part.ids[t], dtype=np.int64)) for t in tables}  # a copy: the ids are mapped
