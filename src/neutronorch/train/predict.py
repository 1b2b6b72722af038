"""Predictions from a trained model: exact full-neighbour inference of chosen vertices (never stale)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.errors import ConfigError
from neutronorch.features.store import FeatureStore
from neutronorch.train.checkpoint import Checkpoint, check_fits, load_checkpoint
from neutronorch.train.evaluate import full_neighbor_logits
from neutronorch.train.outputs import write_atomically

NODE_SETS = ("test", "val", "train", "all")


def select_nodes(graph: Graph, nodes: str) -> np.ndarray:
    """``test``, ``val``, ``train``, ``all``, or a ``.npy`` file of vertex ids."""
    if nodes in ("test", "val", "train"):
        return np.array(getattr(graph, f"{nodes}_idx"), dtype=np.int64)
    if nodes == "all":
        return np.arange(graph.num_nodes, dtype=np.int64)
    path = Path(nodes)
    if path.suffix != ".npy" or not path.is_file():
        raise ConfigError(f"`nodes` {nodes!r}: give one of {', '.join(NODE_SETS)} or an existing .npy file of "
                          f"vertex ids.")
    try:
        ids = np.load(path, allow_pickle=False)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"`nodes` {nodes}: cannot be read as a .npy array ({exc}).") from None
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise ConfigError(f"`nodes` {nodes}: expected a 1-D array of integer vertex ids, got {ids.dtype} "
                          f"{ids.shape}.")
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= graph.num_nodes):
        raise ConfigError(f"`nodes` {nodes}: vertex ids must be in 0..{graph.num_nodes - 1}.")
    return ids.astype(np.int64)


def predict(checkpoint: Checkpoint | str | os.PathLike, graph: Graph, nodes: str = "test",
            probabilities: bool = False, device: str = "cpu", chunk_size: int = 4096) -> np.ndarray:
    """Predicted classes (int64) of ``nodes``, or with ``probabilities`` their class probabilities
    (float32, one row per vertex), from the checkpoint's model over complete neighbourhoods."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint)
    check_fits(checkpoint, graph, graph.name)
    ids = select_nodes(graph, nodes)
    target = torch.device(device)
    model = checkpoint.model.to(target)
    logits = full_neighbor_logits(model, graph, FeatureStore(graph.features, graph.labels), torch.from_numpy(ids),
                                  target, chunk_size)
    if probabilities:
        return torch.softmax(logits.float(), dim=1).numpy()
    return logits.argmax(1).numpy().astype(np.int64)


def embed(checkpoint: Checkpoint | str | os.PathLike, graph: Graph, layer: int, nodes: str = "all",
          device: str = "cpu", chunk_size: int = 4096) -> np.ndarray:
    """The output of layer ``layer`` (1 = the bottom layer, after its activation; the last layer gives the
    logits) of ``nodes``, as float32 rows, over complete neighbourhoods."""
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = load_checkpoint(checkpoint)
    check_fits(checkpoint, graph, graph.name)
    layers = checkpoint.model.num_layers
    if not 1 <= layer <= layers:
        raise ConfigError(f"`layer` {layer}: the model has layers 1..{layers} (1 reads the features).")
    ids = torch.from_numpy(select_nodes(graph, nodes))
    target = torch.device(device)
    out = full_neighbor_logits(checkpoint.model.to(target), graph, FeatureStore(graph.features, graph.labels), ids,
                               target, chunk_size, layers=layer)
    return out.numpy()


def prediction_accuracy(graph: Graph, nodes: str, predicted: np.ndarray) -> float:
    """Accuracy of predicted classes against the graph's labels of ``nodes``."""
    labels = np.asarray(graph.labels)[select_nodes(graph, nodes)]
    return float((predicted == labels).mean()) if labels.size else float("nan")


def save_array_atomically(path: str | os.PathLike, array: np.ndarray) -> None:
    write_atomically(path, lambda f: np.save(f, array))
