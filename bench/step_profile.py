"""Where a training step's time goes, the plain step (exact mode) against the spliced step (NeutronOrch mode),
on the same seeds, with the producers out of the way.

Each mode's mini-batches (and NeutronOrch's hot rows) are produced first; then the steps run interleaved, the
same batches again in every round (forward, loss and backward; no optimizer step, so the weights stay put).
Forward hooks on the layers and gradient hooks on the tensors between them split a step into parts:

- forward: ``bottom`` (the bottom layer: aggregation and product; in NeutronOrch mode of the cold rows only),
  ``act`` (what lies between the bottom layer and the next: ReLU + dropout, and in NeutronOrch mode the splice
  fused with them on CPU), ``upper`` (the layers above), ``loss``;
- backward: ``loss_bwd``, ``upper_bwd`` (down to the next layer's input), ``act_bwd`` (down to the bottom
  layer's output: ReLU + dropout, and the splice with the hot rows' gradient accumulation) and ``bottom_bwd``
  (the bottom layer's backward pass and the weight gradients' accumulation).

``bottom part`` = bottom + act + act_bwd + bottom_bwd, the work that scales with the bottom-layer rows; it is
reported per bottom-layer row computed (the cold rows in NeutronOrch mode) and per row of the next layer's
input (the spliced rows, as many in both modes). Variants: ``neutronorch-torch`` runs the splice through its
torch ops (the path CUDA takes) instead of the CPU kernels; with ``--splice-before``, ``-before`` variants
splice with another version of ``nn/splice.py``, step by step in turn with the current one. ``--ops``
counts, with every kernel switched off (the torch ops a GPU runs), the ATen operations per step that would
launch a device kernel.

    python bench/step_profile.py --nodes 300000 --variants exact,neutronorch,neutronorch-torch --rounds 5
    python bench/step_profile.py --nodes 300000 --ops --rounds 1
    git show 8e81e4a:src/neutronorch/nn/splice.py > /tmp/splice_8e81e4a.py
    python bench/step_profile.py --nodes 300000 --splice-before /tmp/splice_8e81e4a.py --rounds 4
    python bench/step_profile.py --device cuda --dataset GRAPH --variants device,neutronorch --hot-grad stop
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from contextlib import ExitStack, contextmanager

import torch
from torch.nn import functional as F

from common import add_graph_arguments, ensure_graph
from neutronorch import TrainConfig
from neutronorch.data import load_dataset
from neutronorch.nn import activation, aggregation, models, splice
from neutronorch.nn.models import GNN
from neutronorch.nn.precision import Precision
from neutronorch.orchestration.factory import build_mode
from neutronorch.train.resources import keep_freed_memory

PARTS = ["bottom", "act", "upper", "loss", "loss_bwd", "upper_bwd", "act_bwd", "bottom_bwd"]
# Leaf ATen operations that launch no device kernel (views, allocations, metadata).
NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::view", "aten::as_strided", "aten::slice", "aten::t",
             "aten::transpose", "aten::detach", "aten::alias", "aten::select", "aten::unsqueeze", "aten::squeeze",
             "aten::expand", "aten::reshape", "aten::narrow", "aten::resolve_conj", "aten::resolve_neg",
             "aten::_unsafe_view", "aten::lift_fresh", "aten::to", "aten::contiguous", "aten::numel",
             "aten::new_empty", "aten::new_empty_strided", "aten::empty_like", "aten::result_type", "aten::item",
             "aten::_local_scalar_dense", "aten::is_nonzero", "aten::size", "aten::stride", "aten::split",
             "aten::unbind", "aten::permute", "aten::expand_as", "aten::view_as", "aten::chunk"}


class Clock:
    """Marks on a step's timeline, from forward hooks on the layers and gradient hooks on the tensors
    between them; with CUDA, each mark waits for the device first."""

    def __init__(self, model: GNN, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: dict[str, float] = {}
        model.layers[0].register_forward_pre_hook(lambda *_: self.mark("bottom_start"))
        model.layers[0].register_forward_hook(self._bottom_output)
        model.layers[1].register_forward_pre_hook(self._upper_input)

    def mark(self, name: str) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        self.marks[name] = time.perf_counter()

    def _bottom_output(self, module, inputs, output) -> None:
        self.mark("bottom_end")
        # Registered before the in-place activation: it sees the pre-activation output's gradient.
        output.register_hook(lambda _: self.mark("act_bwd_end"))

    def _upper_input(self, module, inputs) -> None:
        self.mark("upper_start")
        inputs[1].register_hook(lambda _: self.mark("upper_bwd_end"))


def produce(graph, mode_name: str, args, device: torch.device):
    """The model, the mode (still open), and the first ``args.steps`` batches with their step inputs."""
    config = TrainConfig(dataset="given", fanouts=[int(f) for f in args.fanouts.split(",")], hidden=args.hidden,
                         batch_size=args.batch_size, epochs=1, dropout=0.5, mode=mode_name,
                         hot_ratio=args.hot_ratio, super_batch=args.super_batch, hot_grad=args.hot_grad,
                         device=device.type, precision=args.precision, progress=False).validate()
    config.prefetch = args.steps + 2  # a buffer pool deep enough to hold every batch at once
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, args.hidden, graph.num_classes, len(config.fanouts), dropout=0.5)
    model = model.to(device)
    mode = build_mode(config, graph, device)
    mode.start(model)
    with mode.batches(0) as stream:
        batches = [next(stream) for _ in range(args.steps)]
    return model, mode, batches, [mode.step_inputs(b) for b in batches]


@contextmanager
def torch_ops(splice_only: bool, module=splice):
    """The splice's torch ops instead of its CPU kernels; with ``splice_only`` False, every CPU kernel off
    (aggregation, ReLU + dropout too): the operations a GPU runs."""
    saved = module._numba_ok, aggregation._numba_ok, activation.supported
    module._numba_ok = lambda *_: False
    if not splice_only:
        aggregation._numba_ok = lambda *_: False
        activation.supported = lambda *_: False
    try:
        yield
    finally:
        module._numba_ok, aggregation._numba_ok, activation.supported = saved


@contextmanager
def splice_from(module):
    """The model splices with ``module`` (another version of ``nn/splice.py``) instead of its own."""
    saved = models.splice, models.splice_relu_dropout
    models.splice, models.splice_relu_dropout = module.splice, module.splice_relu_dropout
    try:
        yield
    finally:
        models.splice, models.splice_relu_dropout = saved


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("splice_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def variant(name: str, before) -> ExitStack:
    """``mode[-torch][-before]``: the splice's torch ops; the splice of ``--splice-before``."""
    stack = ExitStack()
    module = before if name.endswith("-before") else splice
    if name.endswith("-before"):
        stack.enter_context(splice_from(before))
    if "-torch" in name:
        stack.enter_context(torch_ops(True, module))
    return stack


def step(model: GNN, clock: Clock, inputs, labels, precision: Precision = Precision()) -> dict[str, float]:
    """One forward and backward pass, timed in parts (no optimizer step)."""
    t0 = time.perf_counter()
    with precision.autocast(labels.device):
        logits = model(*inputs)
    clock.mark("forward_end")
    loss = F.cross_entropy(logits.float(), labels)
    clock.mark("loss_end")
    logits.register_hook(lambda _: clock.mark("loss_bwd_end"))
    loss.backward()
    clock.mark("end")
    model.zero_grad(set_to_none=True)
    m = clock.marks
    return {"bottom": m["bottom_end"] - m["bottom_start"], "act": m["upper_start"] - m["bottom_end"],
            "upper": m["forward_end"] - m["upper_start"], "loss": m["loss_end"] - m["forward_end"],
            "loss_bwd": m["loss_bwd_end"] - m["loss_end"], "upper_bwd": m["upper_bwd_end"] - m["loss_bwd_end"],
            "act_bwd": m["act_bwd_end"] - m["upper_bwd_end"], "bottom_bwd": m["end"] - m["act_bwd_end"],
            "step": m["end"] - t0}


def count_ops(model: GNN, inputs, labels, precision: Precision) -> int:
    """Leaf ATen operations of one step that would launch a device kernel."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with precision.autocast(labels.device):
            logits = model(*inputs)
        F.cross_entropy(logits.float(), labels).backward()
    model.zero_grad(set_to_none=True)
    events = prof.events()
    return sum(1 for e in events if launches(e))


def launches(event) -> bool:
    """An ATen operation that launches a kernel itself: none of its own children does."""
    return (event.name.startswith("aten::") and event.name not in NO_KERNEL
            and not any(c.name.startswith("aten::") and c.name not in NO_KERNEL for c in event.cpu_children))


def summarise(samples: list[dict], rows: dict[str, float], rounds: int) -> dict[str, float]:
    out = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    bottom = [s["bottom"] + s["act"] + s["act_bwd"] + s["bottom_bwd"] for s in samples]
    out["bottom part"] = statistics.median(bottom)
    k = len(bottom) // rounds  # samples are in round order
    per_round = [statistics.median(bottom[r * k:(r + 1) * k]) for r in range(rounds)]
    out["spread"] = (min(per_round), max(per_round))
    return {**out, **rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_graph_arguments(parser)
    parser.add_argument("--dataset", default=None, help="a dataset path (default: the synthetic graph)")
    parser.add_argument("--fanouts", default="15,10,5")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--super-batch", type=int, default=16)
    parser.add_argument("--hot-ratio", type=float, default=0.4)
    parser.add_argument("--hot-grad", default="cpu", choices=["cpu", "stop"])
    parser.add_argument("--steps", type=int, default=10, help="batches per mode (the first two warm up)")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the batches, modes interleaved")
    parser.add_argument("--variants", default="exact,neutronorch,neutronorch-torch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--ops", action="store_true", help="count the kernels of a step with the torch ops")
    parser.add_argument("--splice-before", default=None,
                        help="another nn/splice.py: its variants (-before) interleaved with the current ones")
    args = parser.parse_args()
    args.steps = min(args.steps, args.super_batch)  # one super-batch: its hot rows stay valid throughout
    keep_freed_memory()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    precision = Precision(args.precision)
    graph = load_dataset(args.dataset or str(ensure_graph(args.nodes, args.degree, args.features, args.classes)))
    variants = args.variants.split(",")
    before = None
    if args.splice_before:
        before = load_module(args.splice_before)
        variants += [f"{v}-before" for v in variants if v.startswith("neutronorch")]
    runs = {}
    for name in dict.fromkeys(v.split("-")[0] for v in variants):
        model, mode, batches, inputs = produce(graph, name, args, device)
        runs[name] = (model, Clock(model, device), mode, batches, inputs)
    samples: dict[str, list[dict]] = {v: [] for v in variants}
    ops: dict[str, list[int]] = {v: [] for v in variants}
    try:
        for r in range(args.rounds):
            for i in range(args.steps):
                for v in variants:
                    model, clock, _, batches, inputs = runs[v.split("-")[0]]
                    with variant(v, before):
                        sample = step(model, clock, inputs[i], batches[i].labels, precision)
                    if i >= 2:
                        samples[v].append(sample)
                    if args.ops and r == 0 and device.type == "cpu":
                        module = before if v.endswith("-before") else splice
                        with variant(v, before), torch_ops(splice_only=False, module=module):
                            ops[v].append(count_ops(model, inputs[i], batches[i].labels, precision))
        rows = {v: {"bottom rows": statistics.median(b.blocks[0].num_dst for b in runs[v.split("-")[0]][3]),
                    "spliced rows": statistics.median(b.blocks[1].num_src for b in runs[v.split("-")[0]][3])}
                for v in variants}
    finally:
        for _, _, mode, _, _ in runs.values():
            mode.close()
    report(graph, args, {v: summarise(samples[v], rows[v], args.rounds) for v in variants}, ops)
    return 0


def report(graph, args, results: dict[str, dict], ops: dict[str, list[int]]) -> None:
    layers = len(args.fanouts.split(","))
    print(f"\n{graph.name}: {layers}-layer SAGE {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, "
          f"{args.threads} threads, {args.device}, {args.precision}; neutronorch P={args.super_batch}, "
          f"r={args.hot_ratio}, hot grad {args.hot_grad}; medians of {args.rounds} rounds x {args.steps - 2} steps, "
          "ms\n")
    print("| variant | " + " | ".join(PARTS) + " | step | bottom rows | spliced rows | bottom part (round range) "
          "| us / bottom row | us / spliced row |")
    print("|---|" + "---:|" * (len(PARTS) + 6))
    for v, res in results.items():
        low, high = res["spread"]
        print(f"| {v} | " + " | ".join(f"{1000 * res[k]:.1f}" for k in PARTS + ["step"]) +
              f" | {res['bottom rows']:.0f} | {res['spliced rows']:.0f} | {1000 * res['bottom part']:.1f} "
              f"({1000 * low:.1f}-{1000 * high:.1f}) | {1e6 * res['bottom part'] / res['bottom rows']:.3f} "
              f"| {1e6 * res['bottom part'] / res['spliced rows']:.3f} |")
    if any(ops.values()):
        print("\nkernels per step with the torch ops (median): " +
              ", ".join(f"{v} {statistics.median(n):.0f}" for v, n in ops.items() if n))


if __name__ == "__main__":
    raise SystemExit(main())
