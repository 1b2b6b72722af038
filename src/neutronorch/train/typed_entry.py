"""Where ``train`` hands a typed graph over: which runs are typed, and starting one.

A run is typed when its graph is a ``TypedGraph``, or when none is given and ``config.dataset`` names a typed
folder (the native typed layout or OGB's ogbn-mag layout: ``is_typed_dataset``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from neutronorch.capabilities import check_run
from neutronorch.config import TrainConfig
from neutronorch.data import Graph, TypedGraph, is_typed_dataset, load_typed_dataset
from neutronorch.data.typed_native import is_typed_dir
from neutronorch.train.outputs import check_outputs
from neutronorch.train.typed_distributed import world_size
from neutronorch.train.typed_own import check_own_model_config
from neutronorch.train.typed_task import train_typed


def is_typed_run(config: TrainConfig, graph: Graph | TypedGraph | None) -> bool:
    """Whether ``train`` trains a typed graph."""
    return isinstance(graph, TypedGraph) or (graph is None and is_typed_dataset(config.dataset))


def train_typed_run(config: TrainConfig, graph: TypedGraph | None, progress, stop: threading.Event | None,
                    model: torch.nn.Module | None) -> dict:
    """``train`` for a typed run: the graph loaded when only named (OGB's layout takes parsing, so the settings
    and outputs are checked first), then ``train_typed``, with ``model`` (your own module: ``train/typed_own.py``)
    when given."""
    if model is not None:
        check_own_model_config(config)  # before the graph is read
    if graph is not None:
        graph.check_given()  # one built or changed by hand is checked as a loaded one is
    if graph is None and not is_typed_dir(Path(config.dataset).expanduser()):
        check_run(config, "typed", world_size())
        check_outputs(config)
        graph = load_typed_dataset(config.dataset)
    return train_typed(config, graph, progress, stop, model=model)
