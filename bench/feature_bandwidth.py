"""Feature reads against the bus's speed: each way of gathering a batch's input rows, as a share of a copy.

Samples ``--batches`` mini-batches of the training seeds with the torch sampler on the device (as device
mode does, the topology on the device; ``device_profile.py``'s seeds) and gathers each batch's input rows
(every row of its bottom frontier) in each of the ways device mode can:

- device: ``index_select`` from the features on the device (every row cached);
- UVA: ``index_select`` on the device from pinned host memory read in place (``features.placement``'s
  ``pin`` and ``uva_view``, the device reader's path for rows not cached);
- host gather + pinned copy: the ids copied to the host, the rows gathered there into a pinned buffer
  (``FeatureStore.gather_into``) and copied to the device (the staged path where UVA is unavailable);
- host gather: that gather alone (on the CPU it is the whole staged path: nothing is copied).

Each is timed per batch (CUDA events for the reads the device makes alone, the wall clock, synchronised,
for those the host takes part in; after one warm-up gather) and reported as medians over the batches: time
per batch, GB/s of rows read (rows x row bytes / time: each byte read once and written once, as in a copy)
and that rate as a share of the matching peak, measured first: a large device-to-device copy
(``torch.empty(...).copy_``) for the device gather, a large pinned host-to-device copy for UVA and the
staged path, a large host memcpy for the host gather. On the CPU the device is host memory: the device copy
is that memcpy, and UVA and the pinned copy are "n/a (no CUDA)". ``--json PATH`` saves the numbers (null
where n/a).

    python bench/feature_bandwidth.py --dataset /path/to/graph --device cuda --batches 20
    python bench/feature_bandwidth.py --device cpu   # a rehearsal on a 200,000-vertex synthetic graph
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from device_profile import seed_batches
from neutronorch.data import load_dataset
from neutronorch.features.placement import pin, unpin, uva_view
from neutronorch.features.store import FeatureStore
from neutronorch.orchestration.device_reader import host_tensor, place
from neutronorch.orchestration.seeds import training_seeds
from neutronorch.sampling.neighbor_sampler import TorchNeighborSampler, batch_key

NO_CUDA = "n/a (no CUDA)"
GB = 1e9


class Clock:
    """Seconds of one call: CUDA events on the current stream (``device=True``: what the device spends,
    the host's launch time aside) or the wall clock, synchronised before and after."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn: Callable[[], object], device: bool) -> float:
        self.sync()
        if self.cuda and device:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        t = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - t


def copy_rate(clock: Clock, src: torch.Tensor, dst: torch.Tensor, repeats: int) -> float:
    """Bytes per second of ``dst.copy_(src)`` (median of ``repeats`` after one warm-up)."""
    copy = lambda: dst.copy_(src, non_blocking=src.is_pinned())  # noqa: E731
    copy()
    return src.nbytes / statistics.median(clock.time(copy, device=True) for _ in range(repeats))


def peaks(device: torch.device, mib: int, repeats: int) -> dict[str, float | None]:
    """The copy rates the reads are compared with (bytes/s): "device" (device to device), "h2d" (pinned host
    to device) and "host" (host memcpy); on the CPU "device" is the host memcpy and "h2d" is None."""
    clock = Clock(device)
    n = mib * 2 ** 20 // 4
    host_src, host_dst = torch.ones(n), torch.empty(n)
    out: dict[str, float | None] = {"host": copy_rate(clock, host_src, host_dst, repeats)}
    del host_dst
    if device.type != "cuda":
        out["device"], out["h2d"] = out["host"], None
        return out
    dev_src, dev_dst = torch.ones(n, device=device), torch.empty(n, device=device)
    out["device"] = copy_rate(clock, dev_src, dev_dst, repeats)
    del dev_src
    out["h2d"] = copy_rate(clock, host_src.pin_memory(), dev_dst, repeats)
    return out


def measure(clock: Clock, read: Callable[[torch.Tensor], object], frontiers: list[torch.Tensor],
            device: bool) -> list[float]:
    """Seconds of ``read(rows)`` for each batch's input rows, after one warm-up read."""
    read(frontiers[0])
    return [clock.time(lambda: read(rows), device) for rows in frontiers]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", default="synthetic:nodes=200000", help="a dataset spec (default: %(default)s)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--fanouts", default="15,10,5")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--batches", type=int, default=10, help="mini-batches gathered (default: %(default)s)")
    p.add_argument("--peak-mib", type=int, default=None,
                   help="size of the peak copies (default: 1024 on CUDA, 256 on the CPU)")
    p.add_argument("--repeats", type=int, default=5, help="timed peak copies (default: %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="save the numbers here")
    args = p.parse_args()
    fanouts = [int(f) for f in args.fanouts.split(",")]
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    graph = load_dataset(args.dataset)

    indptr, indices = place(graph.indptr, device, "topology"), place(graph.indices, device, "topology")
    sampler = TorchNeighborSampler(indptr, indices, fanouts)
    seeds = seed_batches(training_seeds(graph), 0, args.batch_size, args.batches)
    frontiers = [sampler.sample(s.to(device), batch_key(0, 0, i)).input_nodes for i, s in enumerate(seeds)]
    del sampler, indptr, indices

    host_features = host_tensor(graph.features, "features")
    row_bytes = host_features.shape[1] * host_features.element_size()
    rows = statistics.median(f.shape[0] for f in frontiers)
    peak = peaks(device, args.peak_mib or (1024 if cuda else 256), args.repeats)
    clock = Clock(device)
    seconds: dict[str, list[float] | None] = {}
    notes: dict[str, str] = {}

    features = host_features.to(device)
    seconds["device gather"] = measure(clock, lambda r: features.index_select(0, r), frontiers, device=True)
    del features

    # Rows gathered on the host as training reads them: float32 (half-precision storage widened) or bfloat16.
    store = FeatureStore(graph.features, graph.labels,
                         dtype=torch.bfloat16 if host_features.dtype == torch.bfloat16 else torch.float32)
    largest = max(f.shape[0] for f in frontiers)
    buffer = torch.empty((largest, store.width), dtype=store.dtype, pin_memory=cuda)
    host_frontiers = [f.cpu() for f in frontiers]
    seconds["host gather"] = measure(clock, lambda r: store.gather_into(r, buffer), host_frontiers, device=False)
    if cuda:
        seconds["host gather + pinned copy"] = measure(
            clock, lambda r: store.gather_into(r.cpu(), buffer).to(device, non_blocking=True), frontiers,
            device=False)
        pinned, ok = pin(host_features, "features")
        view = uva_view(pinned, device) if ok else None
        if view is None:
            seconds["UVA gather"], notes["UVA gather"] = None, "n/a (no UVA mapping here)"
        else:
            seconds["UVA gather"] = measure(clock, lambda r: view.index_select(0, r), frontiers, device=True)
            del view
        if ok:
            unpin(pinned)
    else:
        seconds["host gather + pinned copy"] = seconds["UVA gather"] = None
        notes["host gather + pinned copy"] = notes["UVA gather"] = NO_CUDA

    paths = [("device gather", "device"), ("UVA gather", "h2d"), ("host gather + pinned copy", "h2d"),
             ("host gather", "host")]
    peak_names = {"device": "device copy", "h2d": "pinned host -> device copy", "host": "host memcpy"}
    if not cuda:
        peak_names["device"] = peak_names["host"] = "memcpy (the device is the host)"
    batch_bytes = [f.shape[0] * row_bytes for f in frontiers]
    reads = {}
    for name, against in paths:
        times = seconds[name]
        rate = statistics.median(b / t for b, t in zip(batch_bytes, times)) if times else None
        reads[name] = {"ms": 1e3 * statistics.median(times) if times else None,
                       "gb_s": rate / GB if rate else None,
                       "of_peak": rate / peak[against] if rate and peak[against] else None, "peak": against}

    device_name = torch.cuda.get_device_name(device) if cuda else "host memory"
    print(f"device {device} ({device_name}); {graph.num_nodes:,} vertices, features {tuple(host_features.shape)} "
          f"{str(host_features.dtype).replace('torch.', '')} ({row_bytes} bytes a row); fanouts {fanouts}, "
          f"batch {args.batch_size}; {rows:,.0f} input rows ({rows * row_bytes / 2 ** 20:,.2f} MiB) per batch; "
          f"medians over {len(frontiers)} batches; {torch.get_num_threads()} threads")
    w = 41
    print(f"| {'read':<{w}} | {'ms / batch':>14} | {'GB/s':>14} | {'of peak':>8} | peak |")
    print(f"|{'-' * (w + 2)}|{'-' * 15}:|{'-' * 15}:|{'-' * 9}:|---|")
    for key in ("device", "h2d", "host") if cuda else ("device", "h2d"):
        gbs = f"{peak[key] / GB:,.2f}" if peak[key] else NO_CUDA
        print(f"| {'peak: ' + peak_names[key]:<{w}} | {'':>14} | {gbs:>14} | {'':>8} |  |")
    for name, _ in paths:
        r = reads[name]
        if r["ms"] is None:
            print(f"| {name:<{w}} | {notes[name]:>14} | {'':>14} | {'':>8} | {peak_names[r['peak']]} |")
            continue
        share = f"{100 * r['of_peak']:.0f}%" if r["of_peak"] is not None else "n/a"
        print(f"| {name:<{w}} | {r['ms']:>14,.3f} | {r['gb_s']:>14,.2f} | {share:>8} | {peak_names[r['peak']]} |")

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "device": str(device), "device_name": device_name, "dataset": args.dataset,
            "vertices": graph.num_nodes, "fanouts": fanouts, "batch_size": args.batch_size,
            "batches": len(frontiers), "input_rows": rows, "row_bytes": row_bytes, "threads": torch.get_num_threads(),
            "peaks_gb_s": {k: (v / GB if v else None) for k, v in peak.items()}, "peak_labels": peak_names,
            "reads": reads}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
