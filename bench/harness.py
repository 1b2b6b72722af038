"""The benchmark matrix: our modes against peer systems, over datasets and models, in one run.

For every (dataset, model) the harness trains each of our modes (exact, neutronorch, device) and each
installed peer (DGL 2.1's classic CPU pipeline; PyG once bench/peers/pyg_train.py exists) with the same
model, fanouts, batch size, optimizer, dropout, seed and threads, each run in its own process, interleaved
A B C A B C ... so that a noisy machine affects all alike. It prints one markdown table per (dataset,
model): median epoch time without each run's first epoch, its ratio to every peer's, test accuracy, peak
RSS and where the epoch's time went.

    python bench/harness.py                                      # synthetic 1M / 20M edges, all modes, DGL
    python bench/harness.py --datasets synthetic:20000,synthetic:40000 --modes exact,device --epochs 2 \\
        --rounds 1 --eval-every 1 --fanouts 5,5 --hidden 32 --batch-size 256 --plot-dir bench/out/plots
    python bench/harness.py --datasets amazon_computers,synthetic:100000:10 --models sage,gcn \\
        --eval-every 1 --out-md bench/out/harness.md --out-json bench/out/harness.json

--datasets takes a comma list of
  synthetic:NODES[:DEGREE]  a synthetic power-law graph (100 features, 16 classes, degree 20 by default),
                            generated into bench/out on first use;
  a native dataset directory (meta.json + .npy arrays), used as it is;
  a name under --datasets-root (default ../shared/datasets), e.g. amazon_computers: the folder's .npz,
                            Planetoid files or SNAP edge list, converted once into bench/out/<name> with
                            `neutronorch convert` (--split for data without a split of its own; delete
                            bench/out/<name> to convert again); missing ones are skipped with a message;
  any other source `neutronorch convert` reads (a .npz file, a Planetoid folder ...), converted likewise.

--peers names runner scripts bench/peers/<peer>_train.py (the CLI of dgl_train.py), run with
.venv-peers/bin/python; a peer whose runner is absent or whose library does not import there is reported
and skipped. --eval-every N goes to every system: ours as --eval-every N, peers as --eval full
--eval-every N (N = 0: one evaluation after training; N = -1: ours --eval-every -1, peers --eval none).

--plot-dir DIR (needs matplotlib) draws, per (dataset, model), time to accuracy (test accuracy at each
evaluated epoch against cumulative training seconds, evaluation excluded; first round's runs) and, with
several synthetic sizes, epoch time against the number of edges (log-log) per model.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import OUT, PEER_PYTHON, ROOT, add_model_arguments, alternate, ensure_graph, steady_median

OUR_MODES = ("exact", "neutronorch", "device")
MODELS = ("sage", "gcn", "gat")
# peer name -> the Python module its runner needs in the peers environment (default: the peer's name)
PEER_MODULES = {"dgl": "dgl", "pyg": "torch_geometric"}
LANES = ("host", "sampler", "copy", "trainer")
SYNTHETIC = {"degree": 20.0, "features": 100, "classes": 16}


# ------------------------------------------------------------------------------------------------ datasets


class Dataset:
    def __init__(self, label: str, path: Path, synthetic: bool):
        self.label, self.path, self.synthetic = label, path, synthetic


def resolve_dataset(spec: str, args) -> Dataset | None:
    """The native directory that ``spec`` names (generated or converted on first use), or None (skipped)."""
    if spec.startswith("synthetic:"):
        parts = spec.split(":")[1:]
        if not 1 <= len(parts) <= 2:
            sys.exit(f"--datasets: {spec!r}: write synthetic:NODES or synthetic:NODES:DEGREE")
        try:
            nodes = int(parts[0])
            degree = float(parts[1]) if len(parts) == 2 else SYNTHETIC["degree"]
        except ValueError:
            sys.exit(f"--datasets: {spec!r}: NODES must be an integer and DEGREE a number")
        path = ensure_graph(nodes, degree, SYNTHETIC["features"], SYNTHETIC["classes"])
        return Dataset(path.name, path, True)
    path = Path(spec).expanduser()
    if (path / "meta.json").is_file():
        return Dataset(path.name, path, False)
    if path.exists():
        return convert(path, path.name.split(".")[0], args.split)
    folder = Path(args.datasets_root) / spec
    if not folder.is_dir():
        print(f"skipping {spec}: neither synthetic:NODES, a native directory, a file or folder, nor a "
              f"dataset under {args.datasets_root}", file=sys.stderr)
        return None
    source = shared_source(folder)
    if source is None:
        print(f"skipping {spec}: {folder} holds no .npz, Planetoid (ind.<name>.*) or SNAP edge list file",
              file=sys.stderr)
        return None
    return convert(source, spec, args.split)


def shared_source(folder: Path) -> Path | None:
    """What `neutronorch convert` reads in one of ../shared/datasets' folders."""
    npz = sorted(folder.glob("*.npz"))
    if npz:
        return npz[0]
    if any(folder.glob("ind.*.graph")):
        return folder
    edges = sorted(folder.glob("*.txt.gz")) + sorted(folder.glob("*.txt"))
    return edges[0] if edges else None


def convert(source: Path, name: str, split: str) -> Dataset | None:
    """``source`` converted into bench/out/<name> once (into a temporary folder first, then renamed)."""
    target = OUT / name
    if not (target / "meta.json").is_file():
        tmp = OUT / f".{name}.converting"
        shutil.rmtree(tmp, ignore_errors=True)
        OUT.mkdir(parents=True, exist_ok=True)
        print(f"converting {source} into {target} ...", file=sys.stderr, flush=True)
        done = subprocess.run([sys.executable, "-m", "neutronorch", "convert", str(source), str(tmp),
                               "--split", split], check=False)
        if done.returncode != 0:
            print(f"skipping {name}: `neutronorch convert {source}` failed (exit {done.returncode})",
                  file=sys.stderr)
            shutil.rmtree(tmp, ignore_errors=True)
            return None
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return Dataset(name, target, False)


# ------------------------------------------------------------------------------------------------ systems


def available_peers(names: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The peers that can run (name -> runner script), and a message for each one that cannot."""
    runnable, skipped = {}, []
    for name in names:
        runner = ROOT / "bench" / "peers" / f"{name}_train.py"
        module = PEER_MODULES.get(name, name)
        if not runner.is_file():
            skipped.append(f"{name}: runner not present ({runner.relative_to(ROOT)})")
        elif not PEER_PYTHON.exists():
            skipped.append(f"{name}: not installed (no {PEER_PYTHON.relative_to(ROOT)}; see bench/peers/README.md)")
        elif subprocess.run([str(PEER_PYTHON), "-c", f"import {module}"], capture_output=True, check=False).returncode:
            skipped.append(f"{name}: not installed (`import {module}` fails in "
                           f"{PEER_PYTHON.relative_to(ROOT)}; see bench/peers/README.md)")
        else:
            runnable[name] = runner
    return runnable, skipped


def systems_for(data: Dataset, model: str, args, peers: dict[str, Path]) -> dict:
    """System name -> function of the summary path returning the command line (run through run_one)."""
    common = ["--model", model, "--fanouts", args.fanouts, "--hidden", str(args.hidden),
              "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--lr", str(args.lr),
              "--dropout", str(args.dropout), "--weight-decay", str(args.weight_decay), "--seed", str(args.seed)]

    def guarded(command: list[str], out) -> list[str]:
        return [sys.executable, __file__, "--run-one", str(out), "--"] + command

    systems = {}
    for mode in args.modes:
        systems[mode] = lambda out, mode=mode: guarded(
            [sys.executable, "-m", "neutronorch", "train", "--dataset", str(data.path), "--mode", mode,
             "--device", args.device, "--threads", str(args.threads), "--eval-every", str(args.eval_every),
             "--no-progress", "--no-stage-table", "--summary-json", str(out)] + common, out)
    if args.eval_every < 0:
        peer_eval = ["--eval", "none"]
    else:
        peer_eval = ["--eval", "full"] + (["--eval-every", str(args.eval_every)] if args.eval_every else [])
    for name, runner in peers.items():
        systems[name] = lambda out, runner=runner: guarded(
            [str(PEER_PYTHON), str(runner), "--dataset", str(data.path), "--threads", str(args.threads),
             "--summary-json", str(out)] + peer_eval + common, out)
    return systems


def run_one(summary: str, command: list[str]) -> int:
    """Run one system (``command``), its stdout sent to stderr; when it fails, write a summary that says so
    (exit status, last lines of stderr) instead, so that one failing system does not stop the matrix."""
    path = Path(summary)
    path.unlink(missing_ok=True)
    tail = collections.deque(maxlen=12)
    try:
        proc = subprocess.Popen(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, errors="replace")
    except OSError as exc:
        returncode, tail = None, [str(exc)]
    else:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line.rstrip())
        returncode = proc.wait()
        if returncode == 0 and path.is_file():
            return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"failed": True, "returncode": returncode, "stderr_tail": list(tail)}) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------ results


def final_accuracy(summary: dict, key: str):
    """The last evaluation's accuracy (ours keep the best-validation epoch's in val_acc/test_acc)."""
    return summary.get(f"final_{key}", summary.get(key))


def curve(summary: dict) -> list[dict]:
    """(cumulative training seconds, accuracy) at each evaluated epoch; the final evaluation when only that."""
    points, elapsed = [], 0.0
    for record in summary["epochs"]:
        elapsed += record["seconds"]
        if record.get("test_acc") is not None:
            points.append({"epoch": record["epoch"], "train_seconds": round(elapsed, 4),
                           "val_acc": record.get("val_acc"), "test_acc": record["test_acc"]})
    if not points and final_accuracy(summary, "test_acc") is not None and summary["epochs"]:
        points.append({"epoch": summary["epochs"][-1]["epoch"], "train_seconds": round(elapsed, 4),
                       "val_acc": final_accuracy(summary, "val_acc"),
                       "test_acc": final_accuracy(summary, "test_acc")})
    return points


def shares(epochs: list[dict], ours: bool) -> dict[str, float]:
    """Ours: median share of the epoch each lane was busy (lanes overlap). Peers: median share of the epoch
    in each (sequential) stage."""
    if ours:
        lanes = [lane for lane in LANES if any(lane in e.get("lane_busy", {}) for e in epochs)]
        return {lane: statistics.median(e.get("lane_busy", {}).get(lane, 0.0) for e in epochs) for lane in lanes}
    stages = list(dict.fromkeys(k for e in epochs for k in e["stage_seconds"]))
    return {k: statistics.median(e["stage_seconds"].get(k, 0.0) / e["seconds"] if e["seconds"] else 0.0
                                 for e in epochs) for k in stages}


def shares_text(values: dict[str, float], ours: bool) -> str:
    items = sorted(values.items(), key=lambda kv: -kv[1]) if ours else list(values.items())
    return ", ".join(f"{k} {100 * v:.0f}%" for k, v in items if v >= 0.005) or "–"


def summarise(data: Dataset, model: str, results: dict[str, list[dict]], peers: dict, prefix: str,
              rounds: int) -> list[dict]:
    rows = []
    for name, runs in results.items():
        ours = name not in peers
        ok = [r for r in runs if not r.get("failed")]
        row = {"dataset": data.label, "dataset_dir": str(data.path), "synthetic": data.synthetic, "model": model,
               "system": name, "kind": "ours" if ours else "peer",
               "summaries": [str(OUT / f"{prefix}-{name}-{i}.json") for i in range(rounds)],
               "failed": [r for r in runs if r.get("failed")] or None}
        if ok:
            steady = [s for r in ok for s in ([e["seconds"] for e in r["epochs"]][1:]
                                              or [e["seconds"] for e in r["epochs"]])]
            accs = [final_accuracy(r, "test_acc") for r in ok]
            row.update(
                nodes=ok[0]["dataset"]["nodes"], edges=ok[0]["dataset"]["edges"],
                epoch_s=statistics.median(steady) if steady else None,
                per_run=[round(steady_median([e["seconds"] for e in r["epochs"]]), 4) for r in ok if r["epochs"]],
                test_acc=statistics.mean(accs) if None not in accs else None,
                val_acc=final_accuracy(ok[-1], "val_acc"),
                peak_rss_mb=max(r["peak_rss_mb"] for r in ok),
                shares=shares([e for r in ok for e in (r["epochs"][1:] or r["epochs"])], ours),
                curve=curve(runs[0]) if not runs[0].get("failed") else [])
            row["shares_text"] = shares_text(row["shares"], ours)
        rows.append(row)
    for row in rows:
        row["ratios"] = {p["system"]: row["epoch_s"] / p["epoch_s"] for p in rows
                         if p["kind"] == "peer" and p.get("epoch_s") and row.get("epoch_s") is not None}
    return rows


def table(rows: list[dict], model: str, peer_names: list[str]) -> str:
    first = next((r for r in rows if "nodes" in r), None)
    size = f" ({first['nodes']:,} vertices, {first['edges']:,} edges)" if first else ""
    peer_columns = [p for p in peer_names if any(r["system"] == p and r.get("epoch_s") for r in rows)]
    lines = [f"### {rows[0]['dataset']}{size}, {model}", "",
             "| system | epoch s (median) | " + "".join(f"/ {p} | " for p in peer_columns)
             + "test acc | peak RSS MB | stage shares |",
             "|---|---:|" + "---:|" * len(peer_columns) + "---:|---:|---|"]
    for r in rows:
        if r.get("epoch_s") is None:
            failed = r["failed"][0] if r["failed"] else {}
            lines.append(f"| {r['system']} | failed (exit {failed.get('returncode')}) |"
                         + " – |" * len(peer_columns) + " – | – | – |")
            continue
        ratios = "".join(f" {r['ratios'][p]:.3f} |" if p in r["ratios"] else " – |" for p in peer_columns)
        acc = f"{r['test_acc']:.4f}" if r["test_acc"] is not None else "–"
        lines.append(f"| {r['system']} | {r['epoch_s']:.3f} |{ratios} {acc} | {r['peak_rss_mb']:.0f} | "
                     f"{r['shares_text']} |")
    for r in rows:
        for failure in r["failed"] or []:
            lines.append("")
            lines.append(f"{r['system']} failed (exit {failure.get('returncode')}); last lines of its stderr:")
            lines.append("```")
            lines.extend(failure.get("stderr_tail") or ["(nothing)"])
            lines.append("```")
            break
    return "\n".join(lines) + "\n"


NOTES = ("epoch s: median over all rounds' epochs without each run's first (JIT compilation, cold caches), "
         "evaluation excluded; / peer: that ratio to the peer's median (below 1 = faster than the peer); test acc: "
         "the last evaluation, mean over rounds; peak RSS includes evaluation; stage shares: ours = share of the "
         "epoch each lane (host, sampler, copy, trainer) was busy, lanes overlap; peers = share of the epoch in "
         "each stage, sequential.")


# ------------------------------------------------------------------------------------------------ plots


def plot(rows: list[dict], plot_dir: Path) -> None:
    try:
        import matplotlib
    except ImportError:
        print("plots skipped: matplotlib is not installed in this environment (pip install matplotlib, or the "
              "project's [plot] extra)", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plot_dir.mkdir(parents=True, exist_ok=True)
    written = []
    groups = list(dict.fromkeys((r["dataset"], r["model"]) for r in rows))
    for dataset, model in groups:
        group = [r for r in rows if (r["dataset"], r["model"]) == (dataset, model) and r.get("curve")]
        if not group:
            print(f"no time-to-accuracy plot for {dataset}, {model}: no evaluated epoch", file=sys.stderr)
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in group:
            ax.plot([p["train_seconds"] for p in r["curve"]], [p["test_acc"] for p in r["curve"]], marker="o",
                    label=r["system"])
        ax.set_xlabel("cumulative training seconds (evaluation excluded)")
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{dataset}, {model}: time to accuracy (first round)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = plot_dir / f"tta-{dataset}-{model}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    for model in dict.fromkeys(r["model"] for r in rows):
        scaled = [r for r in rows if r["model"] == model and r["synthetic"] and r.get("epoch_s")]
        if len({r["dataset"] for r in scaled}) < 2:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for system in dict.fromkeys(r["system"] for r in scaled):
            points = sorted((r["edges"], r["epoch_s"]) for r in scaled if r["system"] == system)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=system)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("graph edges")
        ax.set_ylabel("median epoch seconds")
        ax.set_title(f"synthetic graphs, {model}: epoch time against size", fontsize=9)
        ax.grid(alpha=0.3, which="both")
        ax.legend()
        fig.tight_layout()
        path = plot_dir / f"scaling-{model}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    for path in written:
        print(f"plot: {path}", file=sys.stderr)


# ------------------------------------------------------------------------------------------------ main


def comma_list(text: str) -> list[str]:
    return list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", default="synthetic:1000000",
                        help="comma list: synthetic:NODES[:DEGREE], native directories, names under "
                             "--datasets-root (default: %(default)s)")
    parser.add_argument("--datasets-root", default=str(ROOT / ".." / "shared" / "datasets"))
    parser.add_argument("--split", default="ratio:0.6,0.2",
                        help="split given to `neutronorch convert` for data without its own (default: %(default)s)")
    parser.add_argument("--modes", default="exact,neutronorch,device", help="our modes (default: %(default)s)")
    parser.add_argument("--models", default=None, help="comma list of models (default: --model, sage)")
    parser.add_argument("--peers", default="dgl", help="peer systems, bench/peers/<peer>_train.py; '' for none "
                                                       "(default: %(default)s)")
    add_model_arguments(parser)
    parser.add_argument("--weight-decay", type=float, default=5e-3, help="Adam weight decay, the same for every "
                        "system (default: ours, 5e-3)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per run (the first is excluded)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the interleaved runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"],
                        help="our training device (peers run on the CPU) (default: %(default)s)")
    parser.add_argument("--eval-every", type=int, default=0,
                        help="evaluate every N epochs; 0 = after the last only, -1 = never (default: 0)")
    parser.add_argument("--out-md", default=None, help="write the tables here too (markdown)")
    parser.add_argument("--out-json", default=str(OUT / "harness.json"), help="all rows (default: %(default)s)")
    parser.add_argument("--plot-dir", default=None, help="write the plots here (PNG; needs matplotlib)")
    args = parser.parse_args()

    args.modes = comma_list(args.modes)
    args.models = comma_list(args.models) if args.models else [args.model]
    for mode in args.modes:
        if mode not in OUR_MODES:
            parser.error(f"--modes: {mode!r}: choose from {', '.join(OUR_MODES)}")
    for model in args.models:
        if model not in MODELS:
            parser.error(f"--models: {model!r}: choose from {', '.join(MODELS)}")
    if args.epochs < 1 or args.rounds < 1:
        parser.error("--epochs and --rounds must be at least 1")
    if args.batch_size < 1:
        parser.error("--batch-size must be at least 1 (every system gets the same explicit batch size)")

    peers, skipped = available_peers(comma_list(args.peers))
    for message in skipped:
        print(message + ": skipped", file=sys.stderr)
    datasets = [d for d in (resolve_dataset(spec, args) for spec in comma_list(args.datasets)) if d]
    if not datasets:
        print("no dataset to run", file=sys.stderr)
        return 1
    if not args.modes and not peers:
        print("no system to run", file=sys.stderr)
        return 1

    settings = (f"fanouts {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, lr {args.lr}, "
                f"dropout {args.dropout}, seed {args.seed}, {args.threads} threads, our device {args.device}, "
                f"{args.epochs} epochs x {args.rounds} rounds, eval every {args.eval_every}")
    rows, tables = [], []
    for data in datasets:
        for model in args.models:
            prefix = f"harness-{data.label}-{model}"
            results = alternate(systems_for(data, model, args, peers), args.rounds, prefix, args.threads)
            group = summarise(data, model, results, peers, prefix, args.rounds)
            rows.extend(group)
            tables.append(table(group, model, list(peers)))

    text = "\n".join([settings + "\n"] + tables + [NOTES + "\n"]
                     + ([f"Skipped: {'; '.join(skipped)}.\n"] if skipped else []))
    print("\n" + text)
    if args.out_md:
        Path(args.out_md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_md).write_text(text)
    out = Path(args.out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("out_md", "out_json", "plot_dir")}
    out.write_text(json.dumps({"settings": config, "skipped": skipped, "rows": rows}, indent=2) + "\n")
    print(f"rows written to {out}", file=sys.stderr)
    if args.plot_dir:
        plot(rows, Path(args.plot_dir))
    return 0 if all(r.get("epoch_s") is not None for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-one"]:  # internal: one system's run, started by alternate (see run_one)
        if len(sys.argv) < 5 or sys.argv[3] != "--":
            sys.exit("usage: harness.py --run-one SUMMARY -- COMMAND ...")
        sys.exit(run_one(sys.argv[2], sys.argv[4:]))
    sys.exit(main())
