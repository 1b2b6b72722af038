"""neutronorch: sample-based GNN training on CPU and GPU together (NeutronOrch, PVLDB 2024).

Public API::

    from neutronorch import TrainConfig, train, load_dataset
    summary = train(TrainConfig(dataset="synthetic:nodes=100000", model="sage", epochs=3))
"""

import os

# numba's OpenMP threading layer is safe to call from several Python threads (the training loop and the
# background producer); the default workqueue layer is not. Set before numba compiles anything.
os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")

from neutronorch.config import TrainConfig  # noqa: E402
from neutronorch.data import (Graph, from_dgl, from_pyg, load_dataset, load_native, save_native,  # noqa: E402
                              to_dgl, to_pyg)
from neutronorch.errors import (CheckpointError, ConfigError, DataError, Interrupted, NeutronorchError,  # noqa: E402
                                TrainingError)
from neutronorch.nn.models import GNN  # noqa: E402
from neutronorch.nn.pyg import to_pyg_model  # noqa: E402
from neutronorch.sampling.neighbor_sampler import NeighborSampler, TorchNeighborSampler  # noqa: E402
from neutronorch.train.checkpoint import load_checkpoint  # noqa: E402
from neutronorch.train.predict import embed, predict  # noqa: E402
from neutronorch.train.trainer import train  # noqa: E402

__version__ = "0.1.0"
__all__ = ["TrainConfig", "train", "load_dataset", "load_native", "save_native", "Graph", "GNN",
           "NeighborSampler", "TorchNeighborSampler", "NeutronorchError", "ConfigError", "DataError", "TrainingError", "CheckpointError", "Interrupted", "load_checkpoint",
           "predict", "embed", "to_pyg_model", "from_pyg", "to_pyg", "from_dgl", "to_dgl"]
