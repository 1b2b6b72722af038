"""Where the topology and the features live on a CUDA machine, decided once from a memory budget
(docs/gpu.md, "Placement"): the training workspace first, then the topology where the device samples
(pinned host memory, read in place, when it does not fit), then a device cache of the hottest feature rows
in what is left. ``plan_placement`` is arithmetic only (it runs, and is tested, without a GPU). Where
pinning fails, ``pin`` warns once and the data stay in pageable memory (synchronous copies, same results).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from neutronorch.bfloat16 import tensor_from_numpy
from neutronorch.config import PlacementConfig
from neutronorch.errors import ConfigError
from neutronorch.features.memory import GiB, fits_in_memory

logger = logging.getLogger("neutronorch")

# Headroom for the CUDA context's own allocations, the allocator's fragmentation and cuBLAS workspaces.
CONTEXT_RESERVE = GiB // 2


@dataclass
class Placement:
    """The decision, with the sizes it was made from (bytes)."""

    device: str
    budget: int | None  # None on the CPU: nothing to budget
    workspace: int
    topology: str  # "device" | "uva" (pinned host, read by the device) | "host"
    features: str  # "device" (every row) | "cache" (hottest rows on the device) | "host"
    cache_rows: int
    miss_path: str  # how uncached rows arrive: "uva" | "staged" (host gather, pinned copy) | "none"
    topology_bytes: int
    feature_bytes: int
    cache_bytes: int
    notes: list[str] = field(default_factory=list)

    @property
    def cached_share(self) -> float:
        return self.cache_bytes / self.feature_bytes if self.feature_bytes else 1.0

    def describe(self) -> str:
        parts = [f"topology {self.topology}"]
        if self.features == "cache":
            parts.append(f"features: {self.cache_rows:,} hottest rows cached on the device "
                         f"({self.cache_bytes / GiB:.2f} of {self.feature_bytes / GiB:.2f} GiB, "
                         f"{100 * self.cached_share:.0f}%), the rest {self.miss_path}")
        else:
            parts.append(f"features {self.features}")
        if self.budget is not None:
            parts.append(f"budget {self.budget / GiB:.1f} GiB (workspace {self.workspace / GiB:.2f} GiB)")
        return ", ".join(parts)


def workspace_bytes(num_nodes: int, feature_dim: int, hidden: int, num_classes: int, fanouts: list[int],
                    batch_size: int, heads: int = 1) -> int:
    """An upper estimate of the device memory training needs besides the data: the largest mini-batch's
    frontiers (at most every vertex) with their features and per-layer activations kept for the backward
    pass, the sampled edges, and the model with Adam's two moments."""
    frontier, frontiers, edges = batch_size, [batch_size], 0
    for fanout in fanouts:
        fan = fanout if fanout > 0 else 64  # "all neighbours": a generous mean degree
        edges += frontier * fan
        frontier = min(num_nodes, frontier * (1 + fan))
        frontiers.append(frontier)
    bottom = frontiers[-1]
    activations = bottom * feature_dim * 4  # the input features
    # Each layer keeps its aggregated input, pre-activation, dropout mask and output (about 4 tensors of
    # its width over its destinations); GAT keeps per-edge attention over its heads as well.
    for dst in frontiers[:-1]:
        activations += 4 * dst * max(hidden, feature_dim) * 4
    activations += edges * (16 + 8 * heads)
    params = (feature_dim + hidden * (len(fanouts) - 1) + num_classes) * hidden * 2 * 4
    return int(2 * activations + 4 * params + CONTEXT_RESERVE)  # x2: the batch in flight and the next one


def typed_workspace(graph, fanouts: dict, hidden: int | None, batch_size: int) -> int:
    """``workspace_bytes`` of a typed graph's mini-batches (``fanouts`` per relation): per layer, the largest
    sum of the fanouts over the relations into one type; the widest featured type's rows; the model's
    parameters as its ``hidden`` width (None: the rows' width) gives them."""
    layers = range(len(next(iter(fanouts.values()))))
    per_layer = [max(sum(f[h] if f[h] >= 0 else 64 for r, f in fanouts.items() if r[2] == t)
                     for t in graph.num_nodes) for h in layers]
    width = max([graph.feature_dim(t) for t in graph.num_nodes] + [1])
    return workspace_bytes(sum(graph.num_nodes.values()), width, width if hidden is None else hidden,
                           graph.num_classes, per_layer, batch_size)


def plan_placement(*, device: str, samples_on_device: bool, num_nodes: int, num_edges: int,
                   indices_itemsize: int, feature_dim: int, workspace: int, device_memory: int | None,
                   gpu_memory_gb: float | None, gpu_cache_gb: float | str | None,
                   row_itemsize: int = 4, features_fit: bool = True) -> Placement:
    """Decide the placement (see the module docstring). ``samples_on_device``: whether the mode samples on
    the training device (device mode; NeutronOrch's bottom hop with device sampling). ``device_memory`` is
    the device's total memory (None on the CPU); ``gpu_cache_gb`` is a number, ``"auto"`` (as large as the
    budget allows) or None (no cache). ``row_itemsize``: bytes per feature value on the device (2 in
    bfloat16 runs). ``features_fit``: whether the features can be copied into host memory (memory-mapped
    ones may not)."""
    topology_bytes = 8 * (num_nodes + 1) + indices_itemsize * num_edges
    row_bytes = row_itemsize * feature_dim
    notes: list[str] = []
    table = {"": (num_nodes, row_bytes)}
    if device_memory is None:
        # The "device" is host memory: nothing to budget. Where the device samples, its tensors are the
        # host's (every row "on the device"); a partial cache is made only when asked for explicitly (it
        # then runs the same orchestration as on a GPU, which is how the CPU tests cover it).
        if not features_fit:
            notes.append("memory-mapped features larger than the memory available: rows are read from the file")
        if gpu_memory_gb is not None:
            notes.append("`gpu_memory_gb` has no effect without a GPU")
        budget, workspace, topology = None, 0, "device" if samples_on_device else "host"
        rows = cache_rows(gpu_cache_gb, None, table, samples_on_device and features_fit, notes)[""]
    else:
        budget = device_budget(device_memory, gpu_memory_gb, notes)
        if samples_on_device:
            workspace += 8 * num_nodes  # the device sampler's vertex map (int64 per vertex)
        free = budget - workspace
        if free < 0:
            raise ConfigError(f"`gpu_memory_gb` {budget / GiB:.2f}: training alone needs about "
                              f"{workspace / GiB:.2f} GiB of device memory with this model and batch size "
                              f"(the largest mini-batch's activations, the model and its optimizer state). "
                              f"Raise `gpu_memory_gb`, or lower `batch_size` or `fanouts`.")
        topology = "host"
        if samples_on_device:
            if topology_bytes <= free:
                topology, free = "device", free - topology_bytes
            else:
                topology = "uva"
                notes.append(f"topology ({topology_bytes / GiB:.2f} GiB) exceeds the budget left after the "
                             f"workspace; the device reads it from pinned host memory")
        rows = cache_rows(gpu_cache_gb, free, table, samples_on_device, notes)[""]
    if rows >= num_nodes:
        features, miss = "device", "none"
    else:
        features, miss = "cache" if rows > 0 else "host", "uva" if samples_on_device else "staged"
    return Placement(device, budget, workspace, topology, features, rows, miss, topology_bytes,
                     row_bytes * num_nodes, rows * row_bytes, notes)


def device_budget(device_memory: int, gpu_memory_gb: float | None, notes: list[str]) -> int:
    """The bytes a run may use on a device of ``device_memory`` bytes: ``gpu_memory_gb``, at most the device's
    memory (with a note when more was asked), else the whole device."""
    if gpu_memory_gb is None:
        return device_memory
    budget = int(gpu_memory_gb * GiB)
    if device_memory and budget > device_memory:
        notes.append(f"`gpu_memory_gb` {gpu_memory_gb} is more than the device has "
                     f"({device_memory / GiB:.1f} GiB); using {device_memory / GiB:.1f} GiB")
        return device_memory
    return budget


def cache_rows(gpu_cache_gb: float | str | None, free: int | None, tables: dict, device_lookup: bool,
               notes: list[str]) -> dict:
    """Rows of each feature table (``tables``: key -> (rows, bytes per row on the device)) that the device
    cache holds: a homogeneous graph's one table or a typed graph's featured types. ``free``: the budget's
    bytes left for the cache (None on the CPU: nothing to budget, every row where ``device_lookup``, else
    none, unless ``gpu_cache_gb`` is a number). ``gpu_cache_gb`` None: no cache; ``auto``: every row when
    they fit in ``free``, else ``free`` less the slot maps a cache looked up on the device keeps there (int32
    per row, where ``device_lookup``); a number: at most that. The bytes are shared over the tables in
    proportion to their bytes, so each caches the same share of its rows."""
    total = sum(n * width for n, width in tables.values())
    if free is None:
        if not isinstance(gpu_cache_gb, (int, float)):
            return {key: n if device_lookup else 0 for key, (n, _) in tables.items()}
        held = asked = int(gpu_cache_gb * GiB)
    else:
        room = free if total <= free else max(0, free - (4 * sum(n for n, _ in tables.values())
                                                          if device_lookup else 0))
        asked = room if gpu_cache_gb == "auto" else 0 if gpu_cache_gb is None else int(float(gpu_cache_gb) * GiB)
        held = min(asked, room)
    rows = {key: min(n, held * n * width // max(1, total) // max(1, width)) for key, (n, width) in tables.items()}
    if held < asked and any(min(n, asked * n * width // max(1, total) // max(1, width)) > rows[key]
                            for key, (n, width) in tables.items()):
        notes.append(f"`gpu_cache_gb` {gpu_cache_gb} does not fit the budget; the cache holds "
                     f"{sum(rows[key] * width for key, (_, width) in tables.items()) / GiB:.2f} GiB")
    return rows


def placement_for(graph, config: PlacementConfig, device: torch.device, samples_on_device: bool,
                  workspace: int, dtype: torch.dtype = torch.float32) -> Placement:
    """The placement of one run: ``workspace`` from ``workspace_bytes``, ``samples_on_device`` the mode's,
    feature rows held as ``dtype`` on the device."""
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    cache = None if config.gpu_cache_gb == 0 else config.gpu_cache_gb
    return plan_placement(device=device.type, samples_on_device=samples_on_device, num_nodes=graph.num_nodes,
                          num_edges=graph.num_edges, indices_itemsize=graph.indices.dtype.itemsize,
                          feature_dim=graph.feature_dim, workspace=workspace, device_memory=memory,
                          gpu_memory_gb=config.gpu_memory_gb, gpu_cache_gb=cache,
                          row_itemsize=dtype.itemsize, features_fit=fits_in_memory(graph.features))


# ----- whole arrays on the device ------------------------------------------------------------------------

SLICE_BYTES = 64 << 20  # bytes of an array read and copied at a time by ``to_device_in_slices``


def to_device_in_slices(array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None,
                        as_tensor: Callable[[np.ndarray], torch.Tensor] = tensor_from_numpy) -> torch.Tensor:
    """``array`` on ``device`` as ``dtype`` (default: the type ``as_tensor`` gives its rows), read and copied a
    slice of rows at a time: no whole copy in host memory on the way (a memory map larger than memory), and
    no float32 copy of the whole matrix on the way to bfloat16."""
    step = max(1, SLICE_BYTES // max(1, array.strides[0]))
    out = None
    for start in range(0, max(1, array.shape[0]), step):
        part = as_tensor(np.array(array[start:start + step]))
        if out is None:
            out = torch.empty(array.shape, dtype=dtype or part.dtype, device=device)
        out[start:start + part.shape[0]].copy_(part)
    return out


# ----- pinned host memory and zero-copy views ----------------------------------------------------------

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        logger.warning(message)


# Above this size, pin by registering the tensor's own pages: PyTorch's pinned allocator rounds every
# allocation up to a power of two (100 GiB of features would lock 128 GiB) and copies the data.
REGISTER_IN_PLACE = 256 * 2 ** 20
_REGISTERED: set[int] = set()  # the data pointers of the tensors pinned in place, until ``unpin``


def _clear_cuda_error() -> None:
    """A failed runtime call leaves its error to be reported by the next kernel launch's check; launch one
    here so that the stale error surfaces (and is dropped) now, not in an unrelated place later."""
    try:
        torch.zeros(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except RuntimeError:
        pass


def pin_copy(tensor: torch.Tensor, cudart=None) -> torch.Tensor:
    """Pin ``tensor``: in place (``cudaHostRegister``) when it is large, contiguous and owns its memory;
    else a pinned copy."""
    if tensor.nbytes >= REGISTER_IN_PLACE and tensor.is_contiguous():
        if int((cudart or torch.cuda.cudart()).cudaHostRegister(tensor.data_ptr(), tensor.nbytes, 0)) == 0:
            _REGISTERED.add(tensor.data_ptr())
            return tensor
        _clear_cuda_error()
    return tensor.pin_memory()


def unpin(tensor: torch.Tensor, cudart=None) -> None:
    """Undo an in-place registration (a no-op for pinned copies, which free themselves)."""
    if tensor.data_ptr() in _REGISTERED:
        _REGISTERED.discard(tensor.data_ptr())
        (cudart or torch.cuda.cudart()).cudaHostUnregister(tensor.data_ptr())


def pin(tensor: torch.Tensor, what: str, pinner=pin_copy) -> tuple[torch.Tensor, bool]:
    """``tensor`` in page-locked memory, or (after one clear warning) the tensor itself when the system
    refuses to lock that much memory. Returns (tensor, pinned)."""
    if tensor.is_pinned():
        return tensor, True
    try:
        return pinner(tensor), True
    except (RuntimeError, OSError) as exc:
        _warn_once(f"pin:{what}", f"could not pin the {what} ({tensor.nbytes / GiB:.2f} GiB) in host memory "
                                  f"({str(exc).splitlines()[0]}). Continuing with pageable memory: copies "
                                  f"from it are synchronous, so expect slower epochs. To fix it, raise the "
                                  f"locked-memory limit (ulimit -l unlimited; in Docker, --ulimit "
                                  f"memlock=-1 and a larger --shm-size).")
        return tensor, False


class _CudaArray:
    """The minimal ``__cuda_array_interface__`` that lets torch wrap a device-readable address."""

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: torch.dtype):
        typestr = np.dtype(str(dtype).replace("torch.", "")).str
        self.__cuda_array_interface__ = {"data": (pointer, False), "shape": shape, "typestr": typestr,
                                         "strides": None, "version": 2}


def uva_view(pinned: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """A CUDA tensor over the pinned (``pin``-ned) host tensor's memory (the device reads it through PCIe,
    no copy), or None when this platform cannot map it. Checked: rows read through the view equal the host rows. The
    caller keeps ``pinned`` alive as long as the view."""
    if device.type != "cuda" or not pinned.is_contiguous():
        return None
    try:
        view = torch.as_tensor(_CudaArray(pinned.data_ptr(), tuple(pinned.shape), pinned.dtype), device=device)
        probe = torch.linspace(0, pinned.shape[0] - 1, steps=min(8, pinned.shape[0])).long()
        if not torch.equal(view.index_select(0, probe.to(device)).cpu(), pinned.index_select(0, probe)):
            raise RuntimeError("rows read through the mapping differ from the host rows")
        return view
    except Exception as exc:  # noqa: BLE001 - any failure falls back to staged copies
        _warn_once("uva", f"zero-copy access to pinned host memory is not available ({exc}); rows not on "
                          f"the device are gathered on the host and copied instead.")
        return None
