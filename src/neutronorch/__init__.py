"""neutronorch: sample-based GNN training on CPU and GPU together (NeutronOrch, PVLDB 2024).

Public API::

    from neutronorch import TrainConfig, train, load_dataset
    summary = train(TrainConfig(dataset="synthetic:nodes=100000", model="sage", epochs=3))

    from neutronorch import NeighborLoader           # the same pipeline's batches for your own loop
    for batch in NeighborLoader("synthetic", [10, 10], 1024):
        data = batch.to_pyg()                        # or batch.to_dgl_blocks(), or batch.blocks / batch.x

Names are imported when first used, so ``import neutronorch`` (and commands that need no model, such as
``neutronorch convert`` and ``info``) do not wait for torch to load.
"""

import importlib
import os

# numba's OpenMP threading layer is safe to call from several Python threads (the training loop and the
# background producer); the default workqueue layer is not. Set before numba compiles anything.
os.environ.setdefault("NUMBA_THREADING_LAYER", "omp")

__version__ = "0.1.0"

# public name -> the module that defines it
_WHERE = {
    "TrainConfig": "neutronorch.config",
    **dict.fromkeys(("Graph", "load_dataset", "load_native", "save_native", "load_tables", "from_pyg", "to_pyg",
                     "from_dgl", "to_dgl"), "neutronorch.data"),
    **dict.fromkeys(("from_pyg_link", "to_pyg_link"), "neutronorch.data.interop_links"),
    **dict.fromkeys(("NeutronorchError", "ConfigError", "DataError", "TrainingError", "OutputError",
                     "CheckpointError", "Interrupted"), "neutronorch.errors"),
    "GNN": "neutronorch.nn.models",
    **dict.fromkeys(("NeighborLoader", "LinkNeighborLoader", "TypedNeighborLoader"), "neutronorch.loader"),
    "to_pyg_model": "neutronorch.nn.pyg",
    **dict.fromkeys(("NeighborSampler", "TorchNeighborSampler"), "neutronorch.sampling.neighbor_sampler"),
    **dict.fromkeys(("load_checkpoint", "load_typed_checkpoint"), "neutronorch.train.checkpoint"),
    **dict.fromkeys(("predict", "embed"), "neutronorch.train.predict"),
    "score_pairs": "neutronorch.train.link_predict",
    "train": "neutronorch.train.trainer",
    "TypedOptions": "neutronorch.train.heterogeneous",
}
__all__ = list(_WHERE)

# ``train`` names both a subpackage and the function: the subpackage (its __init__ is empty) is imported now,
# binding the name here, and the name dropped, so ``neutronorch.train`` is the function, loaded on first use.
import neutronorch.train  # noqa: E402

del train  # noqa: F821 - bound by the import above


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'neutronorch' has no attribute {name!r}")
    if _WHERE[name] != "neutronorch.errors":
        # Before the module imports numba, which reads its variables then (NUMBA_NUM_THREADS=0 fails the import).
        from neutronorch.environment import check_environment
        check_environment()
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
