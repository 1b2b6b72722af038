"""The loader's arguments, checked where the user gives them: clear errors instead of failures deep in a
producer thread."""

from __future__ import annotations

import numbers

import numpy as np
import torch

from neutronorch.data import Graph, load_dataset
from neutronorch.errors import ConfigError

SEED_SETS = {"train": "train_idx", "val": "val_idx", "valid": "val_idx", "test": "test_idx", "all": None}
LOADER_MODES = ("exact", "device")
_NEUTRONORCH = ("`mode` 'neutronorch' is not offered by the loader: NeutronOrch reuses bottom-layer outputs that "
                "the host computes from a snapshot of the model's weights taken between optimizer steps, and "
                "checks their staleness against the steps taken, so its batches depend on the model and on every "
                "step, which train() owns and a loader feeding your own loop does not see. Use `mode` exact "
                "(sampling and gathering on the host, pipelined) or device (on the training device), or train() "
                "for NeutronOrch.")


def resolve_graph(graph) -> Graph:
    """A ``Graph`` as given, or the one a dataset spec string names (``load_dataset``)."""
    if isinstance(graph, Graph):
        return graph
    if isinstance(graph, str):
        return load_dataset(graph)
    raise ConfigError(f"`graph`: expected a neutronorch Graph or a dataset spec string (such as "
                      f"'synthetic:nodes=2000'), not a {type(graph).__name__}. Convert a PyG Data with "
                      f"neutronorch.from_pyg(data) or a DGL graph with neutronorch.from_dgl(g).")


def resolve_seeds(graph: Graph, seeds) -> np.ndarray:
    """The seed vertices as unique int64 ids: a split's name (train, val, test, all), ids (a tensor, an
    array or a list), or a boolean mask over the vertices."""
    n = graph.num_nodes
    if isinstance(seeds, str):
        if seeds not in SEED_SETS:
            raise ConfigError(f"`seeds` {seeds!r}: name a split ({', '.join(SEED_SETS)}) or give the vertex ids "
                              f"(a tensor, an array or a list) or a boolean mask over the {n:,} vertices.")
        name = SEED_SETS[seeds]
        ids = np.arange(n, dtype=np.int64) if name is None else np.array(getattr(graph, name), dtype=np.int64)
        if ids.size == 0:
            raise ConfigError(f"`seeds` {seeds!r}: the graph's {seeds} split is empty; give the ids to sample from.")
        return ids
    if isinstance(seeds, torch.Tensor):
        array = seeds.detach().cpu().numpy()
    elif isinstance(seeds, (np.ndarray, list, tuple, range)):
        array = np.asarray(seeds)
    else:
        raise ConfigError(f"`seeds`: expected a split's name or vertex ids (a tensor, an array or a list), not a "
                          f"{type(seeds).__name__}.")
    if array.dtype == np.bool_:
        if array.shape != (n,):
            raise ConfigError(f"`seeds`: a boolean mask must hold one entry per vertex ({n:,}), not shape "
                              f"{tuple(array.shape)}.")
        array = np.flatnonzero(array)
    elif array.size and array.dtype.kind not in "iu":
        raise ConfigError(f"`seeds`: vertex ids must be integers, not {array.dtype}.")
    if array.ndim != 1:
        raise ConfigError(f"`seeds`: expected a 1-D list of vertex ids, not shape {tuple(array.shape)}.")
    if array.size == 0:
        raise ConfigError("`seeds` is empty: give at least one vertex to sample from.")
    ids = array.astype(np.int64)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= n:
        bad = low if low < 0 else high
        raise ConfigError(f"`seeds` holds vertex id {bad}, out of range for a graph of {n:,} vertices "
                          f"(0..{n - 1}).")
    unique = np.unique(ids)
    if unique.shape[0] != ids.shape[0]:
        counts = np.bincount(ids, minlength=0)
        raise ConfigError(f"`seeds` holds {ids.shape[0] - unique.shape[0]} repeated ids (first: "
                          f"{int(np.flatnonzero(counts > 1)[0])}); each vertex may be a seed once per epoch "
                          f"(deduplicate with torch.unique).")
    return ids


def check_mode(mode) -> str:
    if mode == "neutronorch":
        raise ConfigError(_NEUTRONORCH)
    if mode not in LOADER_MODES:
        raise ConfigError(f"`mode` {mode!r}: the loader runs mode exact (sampling and gathering on the host, in a "
                          f"background thread) or device (on the training device).")
    return mode


def check_count(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"`{name}` {value!r}: expected a whole number, not a {type(value).__name__}.")
    if value < low:
        raise ConfigError(f"`{name}` {value}: must be at least {low}.")
    return int(value)


def check_device(device) -> torch.device:
    try:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" \
            else torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"`device` {device!r}: give cpu, cuda, cuda:N or auto.") from None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"`device` {device}: the loader places batches on the CPU or a CUDA device.")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"`device` {device}: no CUDA device is available to this PyTorch (torch "
                          f"{torch.__version__}); use cpu.")
    return device
