"""Checkpoints of a partitioned run (``train --partitions DIR --checkpoint-dir CK``; docs/distributed.md,
"Training on the parts"). ``Run.checkpoint`` writes them as any run's, one file a rank: rank 0 ``last.pt`` (and
``best.pt``), rank r ``last.rank-r.pt`` (``outputs.rank_file``), each holding what its rank continues from (the
weights, the optimizer, the random state, the position, its mode's state) and the partition's identity: its
``id``, the rank's ``part`` and the ``parts``. A resume reads each rank's own file; the ranks first agree that every
file is there, of this partition and part, and at the same step, or every rank refuses, saying why."""

from __future__ import annotations

from pathlib import Path

from neutronorch.errors import CheckpointError
from neutronorch.train.checkpoint import HOMOGENEOUS, load_state
from neutronorch.train.distributed import World
from neutronorch.train.outputs import rank_file
from neutronorch.train.part_states import misfit, position
from neutronorch.train.table_files import sample_crc


def attach_checkpoints(run, part, world: World, fingerprint: dict | None = None, kind: str = HOMOGENEOUS) -> None:
    """Make ``run`` (rank ``world.rank``'s, on ``part``) write checkpoints naming the partition and, with
    ``resume``, continue from this rank's file once every rank has found its own fitting (a collective).
    ``fingerprint``: what identifies the rank's graph (default: the whole graph's sizes and split, as a
    homogeneous part knows them); ``kind``: the checkpoint's (``checkpoint.TYPED`` for a typed graph's)."""
    graph, config = run.graph, run.config
    run.partition = {"id": part.manifest["id"], "part": part.part, "parts": part.parts}
    if config.checkpoint_dir:  # what a rank can say of the whole graph: its sizes, its split and the partition
        run.fingerprint = {**(fingerprint or {
            "name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges, "feature_dim": graph.feature_dim,
            "classes": graph.num_classes, "split_crc": sample_crc(graph.train_idx),
            "val_crc": sample_crc(graph.val_idx), "test_crc": sample_crc(graph.test_idx)}),
            "partition": part.manifest["id"]}
    if config.resume:
        run.resume(*agreed_state(Path(config.checkpoint_dir), run.partition, config.partitions, world, kind))


def agreed_state(folder: Path, identity: dict, partitions: str, world: World, kind: str = HOMOGENEOUS
                 ) -> tuple[Path, dict]:
    """This rank's checkpoint file and state, once every rank's is found present, of the partition and part
    ``identity`` names, and at the same position; else a ``CheckpointError``, the same on every rank, naming
    the first rank whose file does not fit and why."""
    path = folder / rank_file(world.rank)
    state, problem = None, None
    try:
        if not path.is_file():
            problem = (f"{path}: rank {world.rank}'s checkpoint is missing. A partitioned run resumes from every "
                       f"rank's file, each written by its rank into `checkpoint_dir` (last.pt by rank 0, "
                       f"last.rank-R.pt by rank R): put it back, or start a new run in another `checkpoint_dir`.")
        else:
            state = load_state(path, kind)
            problem = misfit(state, identity, path, partitions)
    except CheckpointError as exc:
        problem = str(exc)
    mine = {"problem": problem, "at": None if problem else position(state)}
    ranks = world.all_gather_objects(mine, "agreeing on the checkpoints to resume from") if world.distributed \
        else [mine]
    prefix = (lambda r: f"rank {r}: ") if world.distributed else (lambda r: "")
    for rank, theirs in enumerate(ranks):
        if theirs["problem"]:
            raise CheckpointError(prefix(rank) + theirs["problem"])
    if len({tuple(theirs["at"]) for theirs in ranks}) > 1:
        where = "; ".join(f"rank {r}'s at epoch {at[0]} step {at[1]}" for r, at in
                          enumerate(theirs["at"] for theirs in ranks))
        raise CheckpointError(f"{folder}: the ranks' checkpoints were written at different steps ({where}): the run "
                              f"stopped while its ranks were writing them, or a file is another run's. Resume from "
                              f"files of one step, or start a new run in another `checkpoint_dir`.")
    return path, state
