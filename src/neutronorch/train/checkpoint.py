"""Checkpoints: the trained model written safely after every epoch, and read back for prediction.

A checkpoint is one ``torch.save`` file holding a format version, the configuration, a fingerprint of the
dataset, the epoch, the metric history, the model's constructor arguments and weights, and the
optimizer's state. It is written to a temporary file in the same folder, flushed to disk and renamed into
place, so a crash or a full disk mid-write leaves the previous checkpoint intact.

Reading one (``load_checkpoint``) needs no training state: it rebuilds the ``GNN`` from its stored
arguments and loads its weights; unreadable, truncated or newer-format files get a clear error.
"""

from __future__ import annotations

import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.errors import CheckpointError
from neutronorch.nn.models import GNN
from neutronorch.train.outputs import write_atomically

# 2: GCN's normalisation became a setting (``gcn_norm``, default symmetric); format 1 files trained the mean.
FORMAT_VERSION = 2


def dataset_fingerprint(graph: Graph) -> dict:
    """What identifies a dataset cheaply: its sizes and a checksum of strided samples of its arrays."""
    def sample(array) -> int:
        array = np.asarray(array)
        step = max(1, array.shape[0] // 4096)
        return zlib.crc32(np.ascontiguousarray(array[::step]).tobytes())

    return {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
            "feature_dim": graph.feature_dim, "classes": graph.num_classes,
            "topology_crc": sample(graph.indices), "split_crc": sample(graph.train_idx)}


# Settings a resumed run may change: where its outputs go, how it reports, how long it trains, how many
# threads it uses (results do not depend on them) and where it runs. Any other difference changes the
# model or the training and is refused.
RESUME_MAY_CHANGE = frozenset({
    "dataset", "epochs", "patience", "eval_every", "eval_fanouts", "eval_batch_size", "eval_max_nodes", "summary_json",
    "timeline", "timeline_steps", "log_jsonl", "log_csv", "tensorboard", "log_every", "progress", "stage_table",
    "checkpoint_dir", "checkpoint_every", "resume", "threads", "sampler_threads", "host_threads", "prefetch", "device",
    "precision", "dist_timeout"})


def save_checkpoint(path: str | os.PathLike, *, config: TrainConfig, graph: Graph, model: GNN,
                    optimizer: torch.optim.Optimizer, epoch: int, history: list[dict],
                    position: dict, best: dict | None = None, mode_state: dict | None = None,
                    world_size: int = 1) -> Path:
    """Write a checkpoint atomically (temporary file, fsync, rename). It holds the random state, so a run
    resumed from it draws the dropout masks the uninterrupted run would have drawn."""
    device = next(model.parameters()).device
    state = {
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "dataset": dataset_fingerprint(graph),
        "epoch": epoch,
        "history": history,
        "model_args": dict(model.arguments),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "best": best,
        "mode_state": mode_state or {},  # what the mode carries across the boundary (NeutronOrch's snapshots)
        "world_size": world_size,  # data-parallel ranks (mode_state then holds each rank's under "ranks")
        # Steps of ``epoch`` done and the float32 sum of their losses; all of them when the epoch is complete.
        "position": position,
        "rng": {"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
    }
    return write_atomically(path, lambda f: torch.save(state, f))


@dataclass
class Checkpoint:
    model: GNN  # in eval mode, on the CPU
    config: TrainConfig
    epoch: int
    dataset: dict  # the fingerprint of the data it was trained on
    history: list[dict]
    optimizer: dict


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read a checkpoint written by training: the model (ready for inference) and what produced it."""
    state = load_state(path)
    model = GNN(**state["model_args"])
    model.load_state_dict(state["model"])
    model.eval()
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in TrainConfig.keys()})
    return Checkpoint(model, config, int(state["epoch"]), state["dataset"], state["history"], state["optimizer"])


def load_state(path: str | os.PathLike) -> dict:
    """The raw contents of a checkpoint file, checked to be one this neutronorch can read."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file.")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file fails in many ways
        raise CheckpointError(f"{path}: cannot be read as a neutronorch checkpoint ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0] if str(exc) else ''}). The file is truncated or not a "
                              f"checkpoint; use last.pt or best.pt of a --checkpoint-dir.") from None
    if not isinstance(state, dict) or "format_version" not in state:
        raise CheckpointError(f"{path}: not a neutronorch checkpoint (no format version).")
    if state["format_version"] > FORMAT_VERSION:
        raise CheckpointError(f"{path}: written in checkpoint format {state['format_version']} by a newer "
                              f"neutronorch; this one reads format {FORMAT_VERSION}. Upgrade neutronorch.")
    if state["format_version"] < 2:  # before the setting existed, GCN normalised by the mean
        state["model_args"].setdefault("gcn_norm", "mean")
        state["config"].setdefault("gcn_norm", "mean")
    return state


def check_resumable(state: dict, config: TrainConfig, graph: Graph, source: str, world_size: int = 1) -> None:
    """A run may continue from ``state`` only on the same data with the same model and training settings."""
    if state["dataset"] != dataset_fingerprint(graph):
        differ = [k for k, v in dataset_fingerprint(graph).items() if state["dataset"].get(k) != v]
        raise CheckpointError(f"{source}: written for another dataset ({', '.join(differ)} differ: "
                              f"{state['dataset']['name']} then, {graph.name} now); resume on the same data.")
    if int(state.get("world_size", 1)) != world_size:
        raise CheckpointError(f"{source}: written by a run of {state.get('world_size', 1)} data-parallel rank(s); "
                              f"resume with the same number (now {world_size}): torchrun --nproc-per-node and "
                              f"--nnodes as before.")
    # A setting added after the checkpoint was written had its default then.
    saved, now, defaults = state["config"], config.to_dict(), TrainConfig().to_dict()
    differ = [f"`{k}` {saved.get(k, defaults[k])!r} then, {now[k]!r} now" for k in sorted(now)
              if k not in RESUME_MAY_CHANGE and saved.get(k, defaults[k]) != now[k]]
    if differ:
        raise CheckpointError(f"{source}: the run it continues had other settings: {'; '.join(differ)}. Resume "
                              f"with the same settings (only outputs, epochs, evaluation, threads, device and precision may "
                              f"change), or start a new run in another `checkpoint_dir`.")
    if state.get("rng") is None:
        raise CheckpointError(f"{source}: holds no random state to resume from.")


def check_fits(checkpoint: Checkpoint, graph: Graph, source: str) -> None:
    """The model's input width and classes must match the data it is applied to."""
    found = dataset_fingerprint(graph)
    differ = [f"{key} {checkpoint.dataset[key]} (checkpoint) vs {found[key]} (data)"
              for key in ("feature_dim", "classes") if checkpoint.dataset[key] != found[key]]
    if differ:
        raise CheckpointError(f"{source}: the checkpoint's model does not fit this dataset: {'; '.join(differ)}.")
