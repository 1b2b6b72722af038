"""Data-parallel training on ``torch.distributed``: the ranks, their collectives, and what only rank 0 does
(docs/distributed.md says how a run is launched and what it guarantees). Launched by ``torchrun``
(``WORLD_SIZE`` > 1) or inside a process group the caller initialised. Collectives time out after
``dist_timeout`` with a message naming what failed; gradients reduce over NCCL on CUDA, control messages
always go through a gloo host group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import threading

import torch

from neutronorch.config import TrainConfig
from neutronorch.environment import launcher_world_size
from neutronorch.errors import ConfigError, TrainingError
from neutronorch.train.resources import peak_rss_mb, resident_mb
from neutronorch.train.table_grads import reduce_tables


@dataclasses.dataclass
class World:
    """This process's place among the ranks (one rank, world size 1, when not distributed)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1
    backend: str | None = None
    group: object = None  # the process group of gradient reductions (NCCL on CUDA, else gloo)
    host_group: object = None  # a gloo group for host-side messages
    timeout: float = 0.0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @property
    def main(self) -> bool:
        """Whether this rank writes the run's files (rank 0)."""
        return self.rank == 0

    def describe(self) -> str:
        return (f"rank {self.rank} of {self.size} (local rank {self.local_rank} of {self.local_size}), "
                f"backend {self.backend}")

    def summary(self, batch_size: int, gather: bool = True) -> dict | None:
        """The run summary's ``distributed`` entry (None in one process). ``gather`` collects every rank's
        memory use (a collective: every rank must call it; rank 0 gets the lists, the others None)."""
        if not self.distributed:
            return None
        memory = self.gather_objects({"peak_rss": round(peak_rss_mb(), 1), **resident_mb()},
                                     "gathering memory use") if gather else None
        return {"world_size": self.size, "backend": self.backend, "batch_size_per_rank": batch_size,
                "global_batch_size": batch_size * self.size,
                "peak_rss_mb_per_rank": [m["peak_rss"] for m in memory] if memory else None,
                # At the end of the run, per rank: its own memory (anon) and mapped files (file: the page
                # cache that ranks on one machine share).
                "resident_mb_per_rank": memory}

    def _group_of(self, tensor: torch.Tensor):
        """The group for a tensor's collectives: the host group for CPU tensors, else the device's."""
        return self.host_group if tensor.device.type == "cpu" else self.group

    def all_reduce_(self, tensor: torch.Tensor, what: str, group=None, op=None) -> torch.Tensor:
        """Reduce ``tensor`` over ``group``'s members (default: every rank) in place, summed unless ``op``."""
        with self._collective(what):
            torch.distributed.all_reduce(tensor, op=op or torch.distributed.ReduceOp.SUM,
                                         group=group or self._group_of(tensor))
        return tensor

    def broadcast_module(self, module: torch.nn.Module, what: str, buffers_only: bool = False,
                         keep: frozenset = frozenset()) -> None:
        """Rank 0's parameters and buffers (only its buffers) on every rank; ``keep``: the names of parameters
        each rank keeps its own of (a typed graph's parts' rows of the embedding tables)."""
        tensors = (list(module.buffers()) if buffers_only else
                   [tensor for name, tensor in module.state_dict().items() if name not in keep])
        with torch.no_grad():
            for tensor in tensors:
                with self._collective(what):
                    torch.distributed.broadcast(tensor, src=0, group=self._group_of(tensor))

    def share_rows(self, buffer: torch.Tensor, bounds: list[tuple[int, int]], what: str) -> None:
        """Rows ``bounds[r]`` of ``buffer`` computed by rank ``r``: each range broadcast by its rank, in
        place, so every rank ends with all of them."""
        for source, (lo, hi) in enumerate(bounds):
            with self._collective(what):
                torch.distributed.broadcast(buffer[lo:hi], src=source, group=self._group_of(buffer))

    def rows_gatherer(self, what: str):
        """``all_gather_rows`` as a function of the rows, for every rank; in one process, ``[rows]``."""
        return (lambda rows: self.all_gather_rows(rows, what)) if self.distributed else (lambda rows: [rows])

    def all_gather_rows(self, rows: torch.Tensor, what: str, group=None) -> list[torch.Tensor]:
        """Each member of ``group``'s (default: every rank's) CPU tensor, any number of rows each (the same
        trailing shape and dtype), in member order, on every member."""
        group = group or self.host_group
        counts = [torch.zeros(1, dtype=torch.int64) for _ in range(torch.distributed.get_world_size(group))]
        with self._collective(what):
            torch.distributed.all_gather(counts, torch.tensor([rows.shape[0]]), group=group)
        return self.gather_padded(rows, [int(c) for c in counts], group, what)

    def gather_padded(self, rows: torch.Tensor, sizes: list[int], group, what: str) -> list[torch.Tensor]:
        """Each member of ``group``'s ``rows`` (``sizes[i]`` rows on member i, known to all), in member order:
        one all-gather of buffers padded to the largest."""
        padded = rows.new_zeros((max(sizes),) + tuple(rows.shape[1:]))
        padded[:rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        with self._collective(what):
            torch.distributed.all_gather(parts, padded, group=group)
        return [part[:n] for part, n in zip(parts, sizes)]

    def node_link(self) -> "NodeGroups | None":
        """The ranks of this node as NeutronOrch's shared hot rows use them, or None when every node holds
        one rank (or in one process). A collective: every rank calls it, at the same point."""
        if not self.distributed:
            return None
        nodes = [None] * self.size
        node = os.environ.get("GROUP_RANK", str(self.rank // max(1, self.local_size)))
        with self._collective("finding the ranks of each node"):
            torch.distributed.all_gather_object(nodes, node, group=self.host_group)
        members = [[r for r in range(self.size) if nodes[r] == n] for n in dict.fromkeys(nodes)]
        return NodeGroups(self, members) if max(len(m) for m in members) > 1 else None

    def gather_objects(self, value, what: str) -> list | None:
        """Every rank's ``value`` (picklable) on rank 0, in rank order; None on the other ranks."""
        out = [None] * self.size if self.main else None
        with self._collective(what):
            torch.distributed.gather_object(value, out, dst=0, group=self.host_group)
        return out

    def all_gather_objects(self, value, what: str) -> list:
        """Every rank's ``value`` (picklable), in rank order, on every rank."""
        out = [None] * self.size
        with self._collective(what):
            torch.distributed.all_gather_object(out, value, group=self.host_group)
        return out

    @contextlib.contextmanager
    def _collective(self, what: str):
        try:
            yield
        except (RuntimeError, torch.distributed.DistBackendError) as exc:
            # The gist of the backend's error: its first sentence, without the source location it starts with.
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            reason = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0].rstrip(".")
            raise TrainingError(
                f"rank {self.rank} of {self.size}: {what} failed ({reason}). "
                f"Another rank failed or stopped answering within `dist_timeout` ({self.timeout:g} s); its "
                f"log says why.") from exc


class NodeGroups:
    """The ranks of one node (``members``: every node's ranks), with a gloo group per thread that talks
    within the node: NeutronOrch's host compute thread and the trainer each have their own, so that their
    collectives never interleave. Implements ``orchestration.neutronorch.node.NodeLink``."""

    def __init__(self, world: World, members: list[list[int]]):
        dist = torch.distributed
        span = datetime.timedelta(seconds=world.timeout)
        self.world = world
        self._host, self._trainer = (dist.new_subgroups_by_enumeration(members, timeout=span, backend="gloo")[0]
                                     for _ in range(2))
        mine = next(m for m in members if world.rank in m)
        self.local_rank, self.local_size = mine.index(world.rank), len(mine)

    def close(self) -> None:
        """Take both groups down now, after the mode that used them has stopped its threads, rather than
        whenever their last reference goes (as late as the interpreter's exit, when their threads may no
        longer take down cleanly). Local: no rank waits for another."""
        groups, self._host, self._trainer = (self._host, self._trainer), None, None
        for group in groups:
            if group is not None and torch.distributed.is_initialized():
                with contextlib.suppress(ValueError):  # taken down already, with the caller's whole group
                    torch.distributed.destroy_process_group(group)

    def gather_ids(self, ids: torch.Tensor) -> list[torch.Tensor]:
        return self.world.all_gather_rows(ids, "the node's exchange of hot sets", self._host)

    def gather_rows(self, rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
        return torch.cat(self.world.gather_padded(rows, counts, self._host, "the node's exchange of hot rows"))

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.world.all_reduce_(tensor, "the node's hot-row gradient sum", self._trainer)

    def max_(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.world.all_reduce_(tensor, "the node's agreement on the hot ratio and snapshot lead",
                                      self._trainer, torch.distributed.ReduceOp.MAX)


def world_size() -> int:
    """The ranks of a run started here: the caller's process group's, else the launcher's ``WORLD_SIZE``."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else launcher_world_size()


def rank_settings(config: TrainConfig) -> TrainConfig:
    """The settings this rank runs with: ``config`` on rank 0 (and in one process), which writes every output;
    on the other ranks the same less the summary and metric logs (they read ``checkpoint_dir``, to resume, and
    write nothing). Known before the ranks join (the caller's process group's rank, else the launcher's
    ``RANK``), so another rank never checks outputs that rank 0 may have begun to write."""
    dist = torch.distributed
    joined_already = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if joined_already else int(os.environ.get("RANK", "0")) if world_size() > 1 else 0
    if rank == 0:
        return config
    return dataclasses.replace(config, summary_json=None, log_jsonl=None, log_csv=None, tensorboard=None,
                               console_log=None, curves=None)


def shared_logits(world: World, compute, nodes: torch.Tensor) -> torch.Tensor:
    """``compute(nodes)`` (CPU logits, a row per vertex in order), each rank computing a contiguous share of
    ``nodes`` and every rank getting all the rows."""
    if not world.distributed:
        return compute(nodes)
    mine = compute(torch.tensor_split(nodes, world.size)[world.rank])
    return torch.cat(world.all_gather_rows(mine.contiguous(), "gathering the evaluation's logits"))


def rank_device(device: torch.device) -> torch.device:
    """A launched rank's own GPU on CUDA (``LOCAL_RANK`` modulo the GPUs it sees), made current before
    the process group forms (NCCL binds to the current device); ``device`` itself otherwise."""
    if device.type != "cuda" or device.index is not None or world_size() <= 1:
        return device
    here, gpus = int(os.environ.get("LOCAL_WORLD_SIZE", "1")), torch.cuda.device_count()
    if here > gpus:
        raise ConfigError(f"{here} ranks on this machine but {gpus} GPU(s) visible: data parallel on CUDA takes one "
                          f"GPU per rank. Launch with --nproc-per-node {gpus}, or train with --device cpu.")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


@contextlib.contextmanager
def joined(device_kind: str, timeout: float):
    """The run's ``World``: one rank unless launched data-parallel. Initialises the default process group
    from the launcher's environment when it is not initialised yet (and destroys it on leaving); reuses the
    caller's group otherwise. ``device_kind``: "cuda" or "cpu", the training device's kind."""
    dist = torch.distributed
    already = dist.is_available() and dist.is_initialized()
    size = world_size()
    if size <= 1:
        yield World()
        return
    if not dist.is_available():
        raise ConfigError("this PyTorch was built without torch.distributed; train in one process.")
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not already and name not in os.environ]
    if missing:
        raise ConfigError(f"WORLD_SIZE={size} but {', '.join(missing)} is not set: launch with torchrun "
                          f"(torchrun --nproc-per-node {size} -m neutronorch train ...), which sets them.")
    backend = "nccl" if device_kind == "cuda" else "gloo"
    span = datetime.timedelta(seconds=timeout)
    if not already:
        try:
            dist.init_process_group(backend, timeout=span)
        except (RuntimeError, ValueError) as exc:
            raise TrainingError(f"could not join the {size} ranks ({exc}); check MASTER_ADDR, MASTER_PORT "
                                f"and that every rank was started.") from exc
    try:
        backend = dist.get_backend()
        host_group = dist.new_group(backend="gloo", timeout=span) if backend != "gloo" else dist.group.WORLD
        world = World(rank=dist.get_rank(), size=dist.get_world_size(),
                      local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                      local_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), backend=backend,
                      group=dist.group.WORLD, host_group=host_group, timeout=timeout)
        yield world
    finally:
        if not already and dist.is_initialized():
            dist.destroy_process_group()


class GradientSync:
    """After the backward pass, before the optimizer step: the weighted mean of every rank's gradients, and
    the agreement on stopping. Rank r's gradients are those of its mean loss over ``w_r`` terms: summing
    ``w_r * grad_r`` and ``w_r`` in one flat buffer and dividing gives the global batch's mean-loss gradient.
    Gradients the mode hands over apart (``averaged()``: NeutronOrch's hot rows') are averaged with equal
    weights in the same buffer. A parameter with no gradient on any rank keeps none (as in one process).
    ``tables``: a typed model's sparse embedding tables, reduced first (``reduce_tables``), or their own
    reduction, ``tables(weight, apart)`` (a typed graph's parts': ``part_tables.PartTables.reduce``)."""

    def __init__(self, world: World, params: list[torch.Tensor], request: threading.Event | None,
                 averaged=None, tables=()):
        self.world = world
        self.params = params
        self.tables = tables if callable(tables) else list(tables)
        self.request = request  # set by a signal handler on this rank
        self.averaged = averaged  # () -> {parameter: gradient} | None, the same steps on every rank
        self.agreed = threading.Event()  # set on every rank at the same step once any rank was asked to stop

    def __call__(self, weight: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        """Reduce the gradients (this rank's loss averaged ``weight`` terms); returns the global batch's
        mean loss."""
        handed = self.averaged() if self.averaged is not None else None
        extra = {id(p): g for p, g in (handed or {}).items()}
        if callable(self.tables):  # their own reduction, given what the mode handed over apart at this step
            self.tables(float(weight), extra if handed is not None else None)
        elif self.tables:
            reduce_tables(self.world, self.tables, float(weight))
            if handed is not None:  # the same steps on every rank
                reduce_tables(self.world, self.tables, 1.0, [extra.pop(id(t), None) for t in self.tables])
        params = self.params
        device = params[0].device
        apart = [p for p in params if id(p) in extra]
        present = [p.grad is not None or id(p) in extra for p in params]
        # One buffer, one copy: [gradients..., averaged apart..., loss, 1] with the gradients, loss and 1
        # scaled by the weight in place (the 1 becomes the weight), then which parameters had gradients.
        weighted = sum(p.numel() for p in params)
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
                         + [extra[id(p)].reshape(-1).float() for p in apart]
                         + [loss.reshape(1).float(), torch.ones(1, device=device),
                            torch.tensor(present, dtype=torch.float32, device=device)])
        end = len(flat) - len(params)
        flat[:weighted].mul_(weight)
        flat[end - 2:end].mul_(weight)
        self.world.all_reduce_(flat, "the gradient all-reduce")
        meta = flat[end - 1:].cpu().tolist()  # one read of the device: the weight, who had gradients
        total, counts = meta[0], meta[1:]
        flat[:weighted].div_(max(total, 1e-30))  # no loss terms on any rank: the sums were zero
        flat[end - 2:end - 1].div_(max(total, 1e-30))
        offset, extra_at = 0, weighted
        for p, count in zip(params, counts):
            n = p.numel()
            grad = flat[offset:offset + n].view_as(p) if total > 0 else None
            if id(p) in extra:
                apart_grad = flat[extra_at:extra_at + n].view_as(p).div_(self.world.size)
                grad = apart_grad if grad is None else grad.add_(apart_grad)
                extra_at += n
            p.grad = grad.to(p.dtype) if grad is not None and count > 0 else None
            offset += n
        asked = torch.tensor([1 if self.request is not None and self.request.is_set() else 0], dtype=torch.int32)
        if self.world.all_reduce_(asked, "the stop agreement").item():  # asked on any rank: every rank agrees
            self.agreed.set()
        return flat[end - 2].clone()  # the global batch's mean loss
