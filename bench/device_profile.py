"""Where device mode's time goes on a GPU: its sampler, its gather, and one training step, each alone.

The first GPU check found device mode bound by its sampler thread (busy 99% of the epoch, the trainer
82%). This script takes ``--batches`` mini-batches of a graph's training seeds (after two warm-up batches,
over as many epochs as that needs) and runs each stage alone on all of them: sampling (seed ids to the
device included), gathering the input rows and labels of an already sampled batch, sampling and gathering
together, and a training step (forward, backward, optimizer) on a gathered batch. Per mini-batch it prints,
as medians over the batches:

- wall: host time from the call until its device work is done (synchronised before and after);
- device: the stream's elapsed time between CUDA events around the stage (idle gaps included); busy: the
  summed duration of the stage's kernels, copies and memsets (``torch.profiler``); n/a on the CPU;
- launches: kernel launches (CUDA runtime and driver launch calls, ``LAUNCH_CALLS``) counted by
  ``torch.profiler``; on the CPU, which launches nothing, "ops" instead: the ATen operations that would
  launch a kernel on a GPU (leaves of the operator tree that are not views or allocations), and the
  Triton kernels its interpreter runs (``TRITON_INTERPRET=1``: the triton sampler on CPU tensors);
- kernels: the kernels the device ran, a check on the launch calls' names (a note follows the table
  where more ran than launches were counted); copies: memcpy and memset calls; syncs: host
  synchronisations (stream, event and device synchronisations, synchronous copies, ``SYNC_CALLS``); a
  copy to the host the host waits for counts once, as its synchronisation. The three n/a on the CPU.

Counts come from a second pass over the same batches under the profiler, so the times carry none of its
cost. The sampling row shows the target the device sampler is written for (at most 40 launches and one
host synchronisation per mini-batch). ``--sampler`` picks the sampler: ``make_device_sampler``'s torch
or triton backend, or ``auto`` (its choice); where ``neutronorch.sampling.device_sampler`` is missing,
torch and auto run ``TorchNeighborSampler`` and triton is an error. ``--compare`` runs every stage with the
torch and the triton sampler, side by side (the torch one alone, with a note, where triton is not
available). Then a few batches per sampler are sampled and gathered under the profiler once more, and the
operators taking the most device time and the most host time are listed.

    python bench/device_profile.py --dataset /path/to/graph --batches 20 --compare
    python bench/device_profile.py --dataset synthetic:nodes=20000 --device cpu   # a rehearsal
"""

from __future__ import annotations

import argparse
import bisect
import os
import statistics
import sys
import time
from collections import Counter
from contextlib import contextmanager
from typing import Callable

import torch
from torch.autograd import DeviceType

from neutronorch import TrainConfig
from neutronorch.data import load_dataset
from neutronorch.nn.models import GNN
from neutronorch.orchestration.factory import build_mode
from neutronorch.orchestration.seeds import epoch_order
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key
from neutronorch.train.optim import Adam
from neutronorch.train.step import train_step

WARMUP = 2  # batches run first and left out of the medians
TARGET = "target: <= 40 launches, 1 sync per mini-batch"

# CUDA runtime and driver calls as torch.profiler (CUPTI) names them, by what they cost the host. Kept in
# this one place: a new launch path (a library's own launcher, CUDA graphs) is added here.
# - launches: each puts kernels on a stream (a graph launch counts once, however many kernels it holds);
#   torch's own kernels go through cudaLaunchKernel (ExC for some), triton's through cuLaunchKernel(Ex).
LAUNCH_CALLS = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchCooperativeKernel",
                          "cudaLaunchCooperativeKernelMultiDevice", "cudaGraphLaunch", "cuLaunchKernel",
                          "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"})
# - syncs: the host waits for the device. A copy to the host (``.item()``, ``int(t)``, ``nonzero``'s size,
#   ``.cpu()``) is a cudaMemcpyAsync followed by cudaStreamSynchronize: it counts once, as that
#   synchronisation. Plain cudaMemcpy is synchronous itself; freeing device or pinned memory
#   synchronises the device (the caching allocators rarely do it once warm).
SYNC_CALLS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                        "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpyFromSymbol", "cudaFree", "cudaFreeHost",
                        "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH",
                        "cuMemcpyDtoH_v2", "cuMemcpyHtoD", "cuMemcpyHtoD_v2", "cuMemFree", "cuMemFree_v2"})
# - copies: memcpy and memset calls of any direction (synchronous ones are syncs as well).
COPY_PREFIXES = ("cudaMemcpy", "cudaMemset", "cuMemcpy", "cuMemset")
# ATen leaf operations that launch no kernel on a GPU (views, allocations, metadata): the CPU count skips them.
NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::resize_", "aten::set_", "aten::view", "aten::_unsafe_view", "aten::_reshape_alias", "aten::reshape",
    "aten::as_strided", "aten::slice", "aten::select", "aten::narrow", "aten::t", "aten::transpose",
    "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::expand_as", "aten::view_as",
    "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::resolve_conj",
    "aten::resolve_neg", "aten::to", "aten::contiguous", "aten::numel", "aten::size", "aten::stride",
    "aten::result_type", "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::split",
    "aten::unbind", "aten::chunk", "aten::record_stream", "aten::is_pinned"})
MARK = "device_profile:batch"
TRITON_MARK = "triton::"  # an interpreted Triton kernel's launch, as a profiler range (CPU only)


class SamplerUnavailable(Exception):
    pass


def make_sampler(kind: str, indptr: torch.Tensor, indices: torch.Tensor, fanouts: list[int],
                 degrees: bool = False):
    """(sampler, what it is) for ``--sampler kind``: ``make_device_sampler``'s backend, or, without the
    device_sampler module, ``TorchNeighborSampler`` for torch and auto; ``SamplerUnavailable`` for a triton
    sampler that cannot be made here."""
    try:
        from neutronorch.sampling.device_sampler import make_device_sampler
    except ModuleNotFoundError as exc:
        if exc.name != "neutronorch.sampling.device_sampler" and kind != "triton":
            raise
        if kind == "triton":
            raise SamplerUnavailable(f"the triton sampler needs neutronorch.sampling.device_sampler, which "
                                     f"cannot be imported here ({exc})") from None
        return (TorchNeighborSampler(indptr, indices, fanouts, degrees),
                f"{kind}: TorchNeighborSampler (no neutronorch.sampling.device_sampler to choose from)")
    try:
        sampler = make_device_sampler(indptr, indices, fanouts, degrees=degrees, backend=kind)
    except Exception as exc:  # noqa: BLE001 - a triton backend may refuse this device; say so
        if kind != "triton":
            raise
        raise SamplerUnavailable(f"the triton sampler cannot run here: {exc}") from None
    return sampler, f"{kind}: {type(sampler).__name__}"


def seed_batches(train_idx: torch.Tensor, seed: int, batch_size: int, count: int) -> list[torch.Tensor]:
    """``count`` mini-batches of seeds in training order, epoch after epoch as needed; the partial last
    batch of an epoch is skipped unless the training seeds do not fill one batch."""
    batches: list[torch.Tensor] = []
    epoch = 0
    while len(batches) < count:
        split = torch.split(epoch_order(train_idx, seed, epoch), batch_size)
        batches += [b for b in split if b.shape[0] == batch_size] or list(split)
        epoch += 1
    return batches[:count]


def would_launch(event) -> bool:
    """An ATen operation that would launch a kernel itself on a GPU: none of its own children would."""
    return (event.name.startswith("aten::") and event.name not in NO_KERNEL
            and not any(c.name.startswith("aten::") and c.name not in NO_KERNEL for c in event.cpu_children))


def in_triton_kernel(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(TRITON_MARK):
            return True
        parent = parent.cpu_parent
    return False


def classify(event, cuda: bool) -> str | None:
    """What a host-side profiler event counts as: "launches", "syncs", "copies" (a synchronous copy is
    both: see ``per_batch_counts``), "ops" on the CPU (an ATen operation that would launch a kernel, or an
    interpreted Triton kernel, but not the operations the interpreter runs inside one); None when nothing."""
    name = event.name
    if not cuda:
        if name.startswith(TRITON_MARK):
            return "ops"
        return "ops" if would_launch(event) and not in_triton_kernel(event) else None
    if name in LAUNCH_CALLS:
        return "launches"
    if name in SYNC_CALLS:
        return "syncs"
    if name.startswith(COPY_PREFIXES):
        return "copies"
    return None


def per_batch_counts(prof, cuda: bool) -> list[Counter]:
    """Counts of each ``MARK``-ed batch of a profile: host events (on any thread: the backward pass of a
    CUDA step runs in autograd's own) that start within the mark, device activity ("busy", microseconds)
    that starts before the next mark (the device work a batch left running when its call returned)."""
    events = prof.events()
    marks = sorted((e for e in events if e.name == MARK and e.device_type == DeviceType.CPU),
                   key=lambda e: e.time_range.start)
    starts = [m.time_range.start for m in marks]
    counts = [Counter() for _ in marks]
    for event in events:
        at = bisect.bisect_right(starts, event.time_range.start) - 1
        if event.name == MARK or at < 0:
            continue
        if event.device_type != DeviceType.CPU:
            # Kernels, copies and memsets; not the device's copy of a user range (``MARK``'s, say), which
            # spans the others.
            if not getattr(event, "is_user_annotation", False):
                counts[at]["busy"] += event.time_range.elapsed_us()
                if not event.name.startswith(("Memcpy", "Memset")):
                    counts[at]["kernels"] += 1
        elif event.time_range.start <= marks[at].time_range.end:
            kind = classify(event, cuda)
            if kind:
                counts[at][kind] += 1
            if cuda and kind == "syncs" and event.name.startswith(COPY_PREFIXES):
                counts[at]["copies"] += 1
    return counts


@contextmanager
def triton_launches_marked():
    """Under Triton's interpreter (Triton kernels on CPU tensors, ``TRITON_INTERPRET=1``), every kernel
    launch as a profiler range named ``TRITON_MARK`` + the kernel, so the CPU count includes them; nothing
    otherwise (on CUDA the driver's launch calls are counted)."""
    executor = None
    if os.environ.get("TRITON_INTERPRET") == "1" and "triton" in sys.modules:
        try:
            from triton.runtime.interpreter import GridExecutor as executor
        except ImportError:  # another Triton: its interpreted kernels go uncounted
            executor = None
    if executor is None or not callable(getattr(executor, "__call__", None)):
        yield
        return
    original = executor.__call__

    def launch(self, *args, **kwargs):
        with torch.profiler.record_function(TRITON_MARK + getattr(self.fn, "__name__", "kernel")):
            return original(self, *args, **kwargs)

    executor.__call__ = launch
    try:
        yield
    finally:
        executor.__call__ = original


class Stages:
    """Runs a stage over the batches: timed, then counted under the profiler."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            self.activities.append(torch.profiler.ProfilerActivity.CUDA)

    def run(self, fn: Callable, items: list) -> tuple[list, dict]:
        """``fn(i, item)`` for every item: its results, and the medians (without the warm-up items) of wall
        and device time (ms) and of the counts per call."""
        results, wall, device = [], [], []
        for i, item in enumerate(items):
            self.sync()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            t = time.perf_counter()
            results.append(fn(i, item))
            if self.cuda:
                end.record()
            self.sync()
            wall.append(1e3 * (time.perf_counter() - t))
            if self.cuda:
                device.append(start.elapsed_time(end))
        with torch.profiler.profile(activities=self.activities) as prof, triton_launches_marked():
            for i, item in enumerate(items[WARMUP:], WARMUP):
                with torch.profiler.record_function(MARK):
                    fn(i, item)
                self.sync()
        counts = per_batch_counts(prof, self.cuda)
        keys = ("launches", "kernels", "copies", "syncs", "busy") if self.cuda else ("ops",)
        row = {"wall": statistics.median(wall[WARMUP:]),
               "device": statistics.median(device[WARMUP:]) if device else None}
        for key in keys:
            row[key] = statistics.median(c[key] for c in counts) if counts else None
        if row.get("busy") is not None:
            row["busy"] /= 1e3  # ms
        return results, row


def profile_sampler(kind: str, args, graph, mode, model, opt, seeds, stages: Stages, fanouts, degrees):
    """The stage rows of one sampler, the mean input rows of its batches, and the operator tables of a
    few of its batches sampled and gathered."""
    reader, device = mode.loader, stages.device
    sampler, what = make_sampler(kind, reader.indptr, reader.indices, fanouts, degrees)

    def sample(i, s):
        return sampler.sample(s.to(device), batch_key(0, 0, i))

    def sample_and_gather(i, s):
        reader.load(0, i, sample(i, s))  # dropped: only the sampled and the gathered batches are kept

    def step(i, batch):
        train_step(model, opt, mode, batch)

    subgraphs, t_sample = stages.run(sample, seeds)
    batches, t_gather = stages.run(lambda i, subgraph: reader.load(0, i, subgraph), subgraphs)
    _, t_both = stages.run(sample_and_gather, seeds)
    _, t_step = stages.run(step, batches)
    rows = statistics.mean(sg.input_nodes.shape[0] for sg in subgraphs)
    del subgraphs, batches
    with torch.profiler.profile(activities=stages.activities) as prof:
        for i, s in enumerate(seeds[:6]):
            reader.load(0, i, sample(i, s))
        stages.sync()
    averages = prof.key_averages()
    tables = []
    if stages.cuda:
        tables.append(averages.table(sort_by="self_cuda_time_total", row_limit=args.rows, max_name_column_width=48))
    tables.append(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=48))
    return what, rows, {"sample": t_sample, "gather": t_gather, "sample + gather": t_both,
                        "training step": t_step}, tables


def cell(value, width: int, digits: int) -> str:
    return f"{'n/a':>{width}}" if value is None else f"{value:>{width},.{digits}f}"


def print_table(results: dict[str, tuple], cuda: bool) -> None:
    label = "launches" if cuda else "ops"
    kinds = list(results)
    name_width = max(len(f"{stage} [{kind}]") for kind in kinds for stage in results[kind][2])
    print(f"  {'stage':<{name_width}}  {'wall ms':>9}  {'device ms':>9}  {'busy ms':>9}  {label:>8}  "
          f"{'kernels':>7}  {'copies':>6}  {'syncs':>5}")
    unlaunched = []
    for stage in results[kinds[0]][2]:
        for kind in kinds:
            row = results[kind][2][stage]
            name = f"{stage} [{kind}]"
            note = f"  {TARGET}" if stage == "sample" else ""
            print(f"  {name:<{name_width}}  {cell(row['wall'], 9, 2)}  {cell(row['device'], 9, 2)}  "
                  f"{cell(row.get('busy'), 9, 2)}  {cell(row.get(label), 8, 0)}  {cell(row.get('kernels'), 7, 0)}  "
                  f"{cell(row.get('copies'), 6, 0)}  {cell(row.get('syncs'), 5, 0)}{note}")
            if cuda and row["kernels"] is not None and row["kernels"] > (row["launches"] or 0):
                unlaunched.append(name)
    if unlaunched:
        print(f"  note: more kernels ran than launch calls were counted in {', '.join(unlaunched)}: a CUDA graph "
              f"(one launch, many kernels), or a launch call missing from LAUNCH_CALLS")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batches", type=int, default=20, help="mini-batches measured, after two warm-up ones")
    p.add_argument("--sampler", default="auto", choices=["auto", "torch", "triton"],
                   help="the device sampler's backend (default: %(default)s)")
    p.add_argument("--compare", action="store_true", help="the torch and the triton sampler side by side")
    p.add_argument("--rows", type=int, default=15, help="operators listed per table (default: %(default)s)")
    args = p.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    device = torch.device(args.device)
    graph = load_dataset(args.dataset)
    cfg = TrainConfig(dataset="given", mode="device", device=args.device, fanouts=fanouts, hidden=args.hidden,
                      batch_size=args.batch_size, epochs=1).validate()
    mode = build_mode(cfg, graph, device)
    seeds = seed_batches(mode.seeds.train_idx, cfg.sampling.seed, args.batch_size, args.batches + WARMUP)
    model = GNN("sage", graph.feature_dim, args.hidden, graph.num_classes, len(fanouts), dropout=0.5).to(device)
    opt = Adam(model.parameters(), lr=0.003)  # the trainer's optimizer
    stages = Stages(device)
    kinds = ["torch", "triton"] if args.compare else [args.sampler]
    results: dict[str, tuple] = {}
    try:
        for kind in kinds:
            try:
                results[kind] = profile_sampler(kind, args, graph, mode, model, opt, seeds, stages, fanouts,
                                                cfg.sampling.degrees)
            except SamplerUnavailable as exc:
                if not args.compare:
                    raise SystemExit(f"--sampler {kind}: {exc}") from None
                print(f"--compare: {exc}; the torch sampler alone")
    finally:
        mode.close()
    for kind, (what, rows, _, _) in results.items():
        print(f"sampler [{kind}]: {what}; {rows:,.0f} input rows per batch")
    print(f"device {device}; {graph.num_nodes:,} vertices; fanouts {fanouts}, batch {args.batch_size}; per "
          f"mini-batch, medians over {args.batches} batches" + ("" if stages.cuda else
          " (on the CPU: ops = ATen operations that would launch a kernel on a GPU, and interpreted Triton "
          "kernels; no device to time, nothing to synchronise)") + ":")
    print_table(results, stages.cuda)
    for kind, (_, _, _, tables) in results.items():
        print(f"\noperators of {min(6, len(seeds))} batches sampled and gathered [{kind}]:")
        for table in tables:
            print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
