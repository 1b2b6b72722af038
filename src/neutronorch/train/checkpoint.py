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

FORMAT_VERSION = 1


def dataset_fingerprint(graph: Graph) -> dict:
    """What identifies a dataset cheaply: its sizes and a checksum of strided samples of its arrays."""
    def sample(array) -> int:
        array = np.asarray(array)
        step = max(1, array.shape[0] // 4096)
        return zlib.crc32(np.ascontiguousarray(array[::step]).tobytes())

    return {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
            "feature_dim": graph.feature_dim, "classes": graph.num_classes,
            "topology_crc": sample(graph.indices), "split_crc": sample(graph.train_idx)}


def save_checkpoint(path: str | os.PathLike, *, config: TrainConfig, graph: Graph, model: GNN,
                    optimizer: torch.optim.Optimizer, epoch: int, history: list[dict]) -> Path:
    """Write a checkpoint atomically (temporary file, fsync, rename)."""
    state = {
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "dataset": dataset_fingerprint(graph),
        "epoch": epoch,
        "history": history,
        "model_args": dict(model.arguments),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
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
    model = GNN(**state["model_args"])
    model.load_state_dict(state["model"])
    model.eval()
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in TrainConfig.keys()})
    return Checkpoint(model, config, int(state["epoch"]), state["dataset"], state["history"], state["optimizer"])


def check_fits(checkpoint: Checkpoint, graph: Graph, source: str) -> None:
    """The model's input width and classes must match the data it is applied to."""
    found = dataset_fingerprint(graph)
    differ = [f"{key} {checkpoint.dataset[key]} (checkpoint) vs {found[key]} (data)"
              for key in ("feature_dim", "classes") if checkpoint.dataset[key] != found[key]]
    if differ:
        raise CheckpointError(f"{source}: the checkpoint's model does not fit this dataset: {'; '.join(differ)}.")
