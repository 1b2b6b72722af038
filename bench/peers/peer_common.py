"""What the peer runners (dgl_train.py, pyg_train.py) share: their command line, reading our native
dataset format into private arrays, and process measurements. numpy and the standard library only, so
``parse_args`` runs before torch is imported (thread counts must be fixed first)."""
import argparse
import json
import mmap
import os
import resource
import time

import numpy as np


def parse_args(description, loader, argv=None, extra=None):
    """The command line every peer runner shares (``loader``: the peer's data loader, for the help);
    ``extra(parser)`` adds a runner's own options."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--dataset", required=True, help="native dataset directory (meta.json, indptr.npy, ...)")
    p.add_argument("--model", choices=["sage", "gcn", "gat"], default="sage")
    p.add_argument("--fanouts", default="15,10,5", help="per hop, seed hop first, as ours")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.003)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--dropout", type=float, default=0.5)
    p.add_argument("--heads", type=int, default=4, help="GAT heads of the hidden layers (last layer: 1)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--num-workers", type=int, default=0, help=f"{loader} worker processes (default 0)")
    p.add_argument("--summary-json", default=None, help="write the JSON summary here (also printed to stdout)")
    p.add_argument("--eval", choices=["none", "full"], default="none",
                   help="full: layer-wise full-neighbour inference for val/test accuracy after training")
    p.add_argument("--eval-every", type=int, default=0,
                   help="with --eval full: evaluate after every N epochs (and after the last) and store the "
                        "accuracy in that epoch's record; 0 = only after training (default: 0)")
    p.add_argument("--eval-batch-size", type=int, default=4096, help="batch size of layer-wise inference")
    p.add_argument("--sampler-only", action="store_true",
                   help="only iterate the loader (no gather, no training) and report sampled edges/s")
    p.add_argument("--max-batches", type=int, default=0, help="stop each epoch after this many batches (0: all)")
    if extra is not None:
        extra(p)
    args = p.parse_args(argv)
    args.fanouts_list = [int(x) for x in args.fanouts.split(",") if x.strip()]
    if not args.fanouts_list:
        p.error("--fanouts needs at least one hop")
    if args.model == "gat" and args.hidden % args.heads:
        p.error("--hidden must be divisible by --heads for gat")
    if args.eval_every < 0:
        p.error("--eval-every must be 0 or more (use --eval none for no evaluation)")
    return args




def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def peak_rss_mb():
    """This process's peak RSS: VmHWM where /proc has it, which starts afresh at exec. ru_maxrss (the
    fallback) keeps the high-water mark of the process image before exec, so a runner started by a parent
    holding a graph (a launcher, a harness) would report the parent's memory as its own."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ----------------------------------------------------------------------------------------------- data


def load_copy(mm, dtype=None, chunk_bytes=64 << 20):
    """Copy a read-only memmap into a private, writable array, chunk by chunk, dropping each copied chunk's
    file pages from this process's mapping so the peak RSS is not inflated by the mapping (which counts in
    ru_maxrss) on top of the copy."""
    out = np.empty(mm.shape, dtype=dtype or mm.dtype)
    flat_in = mm.reshape(-1) if mm.ndim else mm
    flat_out = out.reshape(-1)
    mmap_obj = getattr(mm, "_mmap", None)
    base_off = None
    if mmap_obj is not None and hasattr(mmap_obj, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        # np.memmap maps from the allocation-granularity-aligned start below its data offset
        base_off = mm.offset % mmap.ALLOCATIONGRANULARITY
    step = max(1, chunk_bytes // max(mm.itemsize, 1))
    for lo in range(0, flat_in.shape[0], step):
        hi = min(lo + step, flat_in.shape[0])
        flat_out[lo:hi] = flat_in[lo:hi]
        if base_off is not None:
            a = base_off + lo * mm.itemsize
            b = base_off + hi * mm.itemsize
            a -= a % mmap.PAGESIZE
            try:
                mmap_obj.madvise(mmap.MADV_DONTNEED, a, b - a)
            except (OSError, ValueError):
                base_off = None
    return out


def read_native(path):
    """Our native dataset directory as private numpy arrays: (meta, indptr, src, feats, labels, splits,
    num_classes). CSC: ``src[indptr[v]:indptr[v+1]]`` are the in-neighbours of v; features keep their stored
    dtype (float32 or float16)."""
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)

    def arr(name):
        return np.load(os.path.join(path, name), mmap_mode="r")

    indptr = load_copy(arr("indptr.npy"), np.int64)
    indices = arr("indices.npy")
    n = int(meta.get("num_nodes", indptr.shape[0] - 1))
    if indptr.shape[0] != n + 1:
        raise ValueError(f"indptr has {indptr.shape[0]} entries, expected num_nodes+1 = {n + 1}")
    m = int(indptr[-1])
    if indices.shape[0] != m:
        raise ValueError(f"indices has {indices.shape[0]} entries, indptr[-1] = {m}")
    src = load_copy(indices, np.int64)
    del indices
    feats_mm = arr("features.npy")
    if feats_mm.ndim != 2 or feats_mm.shape[0] != n:
        raise ValueError(f"features shape {feats_mm.shape} does not match num_nodes {n}")
    if feats_mm.dtype not in (np.float32, np.float16):
        raise ValueError(f"features dtype {feats_mm.dtype}: expected float32 or float16")
    feats = load_copy(feats_mm)
    del feats_mm
    labels = load_copy(arr("labels.npy"), np.int64)
    splits = {k: load_copy(arr(f"{k}_idx.npy"), np.int64) for k in ("train", "val", "test")}
    num_classes = int(meta.get("num_classes", int(labels.max()) + 1))
    return meta, indptr, src, feats, labels, splits, num_classes


# ----------------------------------------------------------------------------------------------- training


def dgl_measure(item):
    """``train_epochs``' ``measure`` of a DGL loader's (input nodes, output nodes, blocks) item."""
    input_nodes, _, blocks = item
    return sum(int(b.num_edges()) for b in blocks), int(input_nodes.shape[0]), None


def train_epochs(args, loader, model, opt, measure, gather, run_eval, log, server_cpu=None):
    """The timed epoch loop the runners share. Per batch: ``measure(item)`` -> (sampled edges, input
    vertices, extra) counts as sampling (waiting on the loader included); ``gather(item, extra)`` -> (x, y,
    forward) as gathering; ``forward(model, x)`` -> logits, the loss, backward and step as training. With
    ``--eval full`` and ``--eval-every N``, ``run_eval()`` -> (val, test, seconds) runs outside the timing.
    ``server_cpu()``, where given, -> the CPU seconds so far of a process that works for this one (DistDGL's
    graph server); each epoch's record then has its share as ``server_cpu_seconds``.
    Returns (epoch records, sampled edges per second of sampling, val_acc, test_acc, eval_seconds)."""
    import torch.nn.functional as F  # noqa: PLC0415 - torch only after the thread settings

    epochs, total_sample_s, total_edges = [], 0.0, 0
    for epoch in range(args.epochs):
        if model is not None:
            model.train()
        st = {"sample": 0.0, "gather": 0.0, "train": 0.0}
        edges = input_nodes = batches = seen = 0
        loss_sum = 0.0
        t_epoch = time.perf_counter()
        cpu0 = cpu_seconds()
        server0 = server_cpu() if server_cpu else None
        it = iter(loader)
        while True:
            t = time.perf_counter()
            item = next(it, None)
            if item is None:
                st["sample"] += time.perf_counter() - t
                break
            batch_edges, batch_inputs, extra = measure(item)
            st["sample"] += time.perf_counter() - t
            edges += batch_edges
            input_nodes += batch_inputs
            batches += 1
            if model is not None:
                t = time.perf_counter()
                x, y, forward = gather(item, extra)
                t2 = time.perf_counter()
                st["gather"] += t2 - t
                loss = F.cross_entropy(forward(model, x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                st["train"] += time.perf_counter() - t2
                loss_sum += float(loss.item()) * int(y.shape[0])
                seen += int(y.shape[0])
            if args.max_batches and batches >= args.max_batches:
                break
        seconds = time.perf_counter() - t_epoch
        cpu = cpu_seconds() - cpu0
        total_sample_s += st["sample"]
        total_edges += edges
        rec = {
            "epoch": epoch,
            "seconds": seconds,
            "train_loss": (loss_sum / seen) if seen else None,
            "stage_seconds": st,
            # user+sys CPU seconds of this process: well below threads x seconds means the machine was busy
            "cpu_seconds": cpu,
            "batches": batches,
            "sampled_edges": edges,
            "input_nodes_per_batch": input_nodes / max(batches, 1),
        }
        if server_cpu:
            rec["server_cpu_seconds"] = server_cpu() - server0
        epochs.append(rec)
        loss_txt = f"loss {rec['train_loss']:.4f} " if rec["train_loss"] is not None else ""
        log(f"epoch {epoch}: {seconds:.2f} s {loss_txt}(sample {st['sample']:.2f} gather {st['gather']:.2f} "
            f"train {st['train']:.2f}) {batches} batches, {edges / max(batches, 1):.0f} edges/batch, "
            f"{edges / max(st['sample'], 1e-9) / 1e6:.2f} M sampled edges/s, CPU {cpu:.1f} s, "
            f"peak RSS {peak_rss_mb():.0f} MB")
        if (args.eval == "full" and model is not None and args.eval_every > 0
                and ((epoch + 1) % args.eval_every == 0 or epoch == args.epochs - 1)):
            # Outside the epoch's timing: "seconds" stays training time only, as in ours.
            val_acc, test_acc, eval_s = run_eval()
            rec.update(val_acc=val_acc, test_acc=test_acc, eval_seconds=eval_s)
            log(f"epoch {epoch} eval (full-neighbour layer-wise): val_acc {val_acc} test_acc {test_acc} "
                f"in {eval_s:.1f} s")

    val_acc = test_acc = eval_seconds = None
    evaluated = [e for e in epochs if "eval_seconds" in e]
    if evaluated:
        # Top level: the last evaluation's accuracy; eval_seconds: all evaluations together.
        val_acc, test_acc = evaluated[-1]["val_acc"], evaluated[-1]["test_acc"]
        eval_seconds = sum(e["eval_seconds"] for e in evaluated)
    elif args.eval == "full" and model is not None:
        val_acc, test_acc, eval_seconds = run_eval()
        log(f"eval (full-neighbour layer-wise): val_acc {val_acc} test_acc {test_acc} in {eval_seconds:.1f} s")
    rate = (total_edges / total_sample_s) if total_sample_s > 0 else None
    return epochs, rate, val_acc, test_acc, eval_seconds


def write_summary(summary, args, log):
    """Print the summary JSON, and write it to ``--summary-json`` when given."""
    text = json.dumps(summary, indent=2)
    if args.summary_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.summary_json)), exist_ok=True)
        with open(args.summary_json, "w") as f:
            f.write(text + "\n")
        log(f"summary written to {args.summary_json}")
    print(text)
