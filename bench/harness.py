"""The benchmark matrix: our modes against peer systems, over datasets and models, in one run.

For every (dataset, model) the harness trains each of our modes (exact, neutronorch, device) and each
installed peer (DGL 2.1's classic CPU pipeline; PyG once bench/peers/pyg_train.py exists) with the same
model, fanouts, batch size, optimizer, dropout, seed and threads, each run in its own process, interleaved
A B C C B A ... (the order reversed every other round) so that a noisy machine affects all alike. It
prints one markdown table per (dataset, model): median epoch time without each run's first epoch, its
ratio to every peer's, test accuracy, peak RSS and where the epoch's time went.

With --baseline REV it also times an earlier git revision of our own code against the working tree, in the
same run: the revision is checked out once with `git worktree add --detach` into
bench/out/baseline-<short-hash> (reused when it is there), and each of our modes gets a second system,
<mode>@<short-hash>, that runs the same command with PYTHONPATH=<worktree>/src, so that `python -m
neutronorch` imports that revision's package instead of the installed (editable) one; before any run the
harness checks which copy each side imports (and when the working tree's package does not import, as midway
through a refactor, the datasets are named and generated with the baseline's code; the current systems' runs
then fail and are reported as such). The baseline systems run interleaved with the current ones in every
round (exact, exact@<hash>, neutronorch, neutronorch@<hash>, ..., peers), and under each table a line per
mode gives current / baseline: the ratio of the median epoch times, and the per-round ratios with their
median.

    python bench/harness.py                                      # synthetic 1M / 20M edges, all modes, DGL
    python bench/harness.py --datasets synthetic:20000,synthetic:40000 --modes exact,device --epochs 2 \\
        --rounds 1 --eval-every 1 --fanouts 5,5 --hidden 32 --batch-size 256 --plot-dir bench/out/plots
    python bench/harness.py --datasets amazon_computers,synthetic:100000:10 --models sage,gcn \\
        --eval-every 1 --out-md bench/out/harness.md --out-json bench/out/harness.json
    python bench/harness.py --datasets synthetic:1000000 --epochs 3 --rounds 2 --eval-every -1 --peers '' \\
        --baseline HEAD~3                                        # this working tree against HEAD~3

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
import os
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


def resolve_datasets(specs: list[str], args, baseline) -> list[Dataset]:
    """The datasets to run. Naming and generating synthetic graphs imports our package; when the working
    tree's does not import (a refactor under way) and a baseline is given, the baseline's code does it."""
    try:
        return [d for d in (resolve_dataset(spec, args) for spec in specs) if d]
    except ImportError as exc:
        if baseline is None:
            raise
        print(f"warning: the working tree's neutronorch does not import ({exc}); naming and generating the "
              f"datasets with the baseline's code ({baseline.src})", file=sys.stderr, flush=True)
    for name in [m for m in sys.modules if m == "neutronorch" or m.startswith("neutronorch.")]:
        del sys.modules[name]
    saved = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(baseline.src))
    os.environ["PYTHONPATH"] = child_env(str(baseline.src))["PYTHONPATH"]  # for `neutronorch generate/convert`
    try:
        return [d for d in (resolve_dataset(spec, args) for spec in specs) if d]
    finally:
        sys.path.remove(str(baseline.src))
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


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


# ------------------------------------------------------------------------------------------------ baseline


class Baseline:
    """An earlier revision of our code, checked out as a git worktree (``rev`` as given, ``commit`` in full)."""

    def __init__(self, rev: str, commit: str, short: str, worktree: Path):
        self.rev, self.commit, self.short, self.worktree = rev, commit, short, worktree
        self.src = worktree / "src"
        self.neutronorch_file = None  # what `import neutronorch` finds with PYTHONPATH=src (check_imports)

    def as_dict(self) -> dict:
        return {"rev": self.rev, "commit": self.commit, "short": self.short, "worktree": str(self.worktree),
                "pythonpath": str(self.src), "neutronorch_file": self.neutronorch_file}


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=False)


def materialise_baseline(rev: str) -> Baseline:
    """``rev`` checked out (detached) in bench/out/baseline-<short-hash>; an existing checkout there is reused."""
    found = git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if found.returncode:
        sys.exit(f"--baseline: {rev!r} is not a commit of the repository at {ROOT}")
    commit = found.stdout.strip()
    short = git("rev-parse", "--short", commit).stdout.strip() or commit[:10]
    worktree = OUT / f"baseline-{short}"
    if worktree.exists():
        # a checkout of its own (not just a folder inside ours, which git would resolve to our repository)
        top = git("rev-parse", "--show-toplevel", cwd=worktree).stdout.strip()
        head = git("rev-parse", "HEAD", cwd=worktree).stdout.strip()
        if not top or Path(top).resolve() != worktree.resolve() or head != commit:
            sys.exit(f"--baseline: {worktree} exists but is not a worktree of {commit[:12]} (HEAD {head[:12] or '?'})"
                     f"; remove it (`git worktree remove --force {worktree}`, or delete it and `git worktree "
                     f"prune`) and run again")
        changed = git("status", "--porcelain", "--untracked-files=no", cwd=worktree).stdout.strip()
        if changed:
            print(f"warning: the baseline worktree {worktree} has local changes to tracked files:\n{changed}",
                  file=sys.stderr)
        print(f"baseline {rev} = {short}: reusing {worktree}", file=sys.stderr, flush=True)
    else:
        OUT.mkdir(parents=True, exist_ok=True)
        git("worktree", "prune")  # forget worktrees whose folders were deleted
        print(f"baseline {rev} = {short}: git worktree add --detach {worktree} {commit}", file=sys.stderr, flush=True)
        added = git("worktree", "add", "--detach", str(worktree), commit)
        if added.returncode:
            sys.exit(f"--baseline: `git worktree add --detach {worktree} {commit}` failed:\n"
                     f"{added.stderr.strip()}")
    if not (worktree / "src" / "neutronorch" / "__init__.py").is_file():
        sys.exit(f"--baseline: {worktree} has no src/neutronorch/__init__.py: {short} is not a revision of this "
                 f"package's src layout")
    return Baseline(rev, commit, short, worktree)


def child_env(pythonpath: str | None) -> dict:
    """This process's environment, with ``pythonpath`` put first on PYTHONPATH when given."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([pythonpath] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def imported_file(pythonpath: str | None) -> tuple[str | None, str]:
    """Where `import neutronorch` resolves in a child like the runs (same interpreter, working directory and
    environment): (the package's __init__.py, or None when it does not import; the error's last line)."""
    done = subprocess.run([sys.executable, "-c", "import neutronorch; print(neutronorch.__file__)"],
                          capture_output=True, text=True, env=child_env(pythonpath), check=False)
    if done.returncode:
        return None, (done.stderr.strip().splitlines() or ["(no stderr)"])[-1]
    return done.stdout.strip().splitlines()[-1], ""


def check_imports(baseline: Baseline) -> None:
    """Make sure the baseline systems import the worktree's package, and say which copy each side imports."""
    path, error = imported_file(str(baseline.src))
    if path is None:
        sys.exit(f"--baseline: `import neutronorch` fails with PYTHONPATH={baseline.src}: {error}")
    if not Path(path).resolve().is_relative_to(baseline.src.resolve()):
        sys.exit(f"--baseline: with PYTHONPATH={baseline.src}, `import neutronorch` still finds {path}; the "
                 f"baseline would run the wrong code")
    baseline.neutronorch_file = path
    print(f"baseline systems (@{baseline.short}) import {path}", file=sys.stderr)
    path, error = imported_file(None)
    if path is None:
        print(f"warning: current systems: `import neutronorch` fails ({error}); their runs will fail",
              file=sys.stderr)
    else:
        print(f"current systems import {path}", file=sys.stderr)
        if Path(path).resolve().is_relative_to(baseline.worktree.resolve()) \
                or not Path(path).resolve().is_relative_to((ROOT / "src").resolve()):
            print(f"warning: current systems import {path}, not this working tree's src/", file=sys.stderr)


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


def systems_for(data: Dataset, model: str, args, peers: dict[str, Path], baseline: Baseline | None = None) -> dict:
    """System name -> function of the summary path returning the command line (run through run_one). With a
    baseline, each of our modes is followed by <mode>@<short-hash>, the same command on the baseline's code."""
    common = ["--model", model, "--fanouts", args.fanouts, "--hidden", str(args.hidden),
              "--batch-size", str(args.batch_size), "--epochs", str(args.epochs), "--lr", str(args.lr),
              "--dropout", str(args.dropout), "--weight-decay", str(args.weight_decay), "--seed", str(args.seed)]

    def guarded(command: list[str], out, pythonpath: Path | None = None) -> list[str]:
        env = ["--pythonpath", str(pythonpath)] if pythonpath else []
        return [sys.executable, __file__, "--run-one", str(out)] + env + ["--"] + command

    def ours(mode: str, out) -> list[str]:
        return [sys.executable, "-m", "neutronorch", "train", "--dataset", str(data.path), "--mode", mode,
                "--device", args.device, "--threads", str(args.threads), "--eval-every", str(args.eval_every),
                "--no-progress", "--no-stage-table", "--overwrite", "--summary-json", str(out)] + common

    systems = {}
    for mode in args.modes:
        systems[mode] = lambda out, mode=mode: guarded(ours(mode, out), out)
        if baseline is not None:
            systems[f"{mode}@{baseline.short}"] = lambda out, mode=mode: guarded(ours(mode, out), out, baseline.src)
    if args.eval_every < 0:
        peer_eval = ["--eval", "none"]
    else:
        peer_eval = ["--eval", "full"] + (["--eval-every", str(args.eval_every)] if args.eval_every else [])
    for name, runner in peers.items():
        systems[name] = lambda out, runner=runner: guarded(
            [str(PEER_PYTHON), str(runner), "--dataset", str(data.path), "--threads", str(args.threads),
             "--summary-json", str(out)] + peer_eval + common, out)
    return systems


def run_one(summary: str, command: list[str], pythonpath: str | None = None) -> int:
    """Run one system (``command``, with ``pythonpath`` first on PYTHONPATH when given), its stdout sent to
    stderr; when it fails, write a summary that says so (exit status, last lines of stderr) instead, so that
    one failing system does not stop the matrix."""
    path = Path(summary)
    path.unlink(missing_ok=True)
    tail = collections.deque(maxlen=12)
    try:
        proc = subprocess.Popen(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, errors="replace",
                                env=child_env(pythonpath))
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
              rounds: int, baseline: Baseline | None = None) -> list[dict]:
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
    if baseline is not None:
        by_name = {row["system"]: row for row in rows}
        for row in rows:
            if row["kind"] == "ours":
                row["revision"] = baseline.short if row["system"].endswith("@" + baseline.short) else "working tree"
        for mode in [r["system"] for r in rows if r.get("revision") == "working tree"]:
            base = f"{mode}@{baseline.short}"
            if base in by_name:
                by_name[mode]["vs_baseline"] = versus(mode, base, results, by_name)
    return rows


def versus(current: str, base: str, results: dict[str, list[dict]], by_name: dict[str, dict]) -> dict:
    """current / baseline: the ratio of the two median epoch times, and per round (the two runs of one round,
    each its median without the first epoch) with the median of those."""
    cur, old = by_name[current].get("epoch_s"), by_name[base].get("epoch_s")
    per_round = []
    for a, b in zip(results[current], results[base]):
        if a.get("failed") or b.get("failed") or not a["epochs"] or not b["epochs"]:
            per_round.append(None)
            continue
        per_round.append(steady_median([e["seconds"] for e in a["epochs"]])
                         / steady_median([e["seconds"] for e in b["epochs"]]))
    measured = [r for r in per_round if r is not None]
    return {"baseline": base, "ratio": cur / old if cur is not None and old else None,
            "per_round": [round(r, 4) if r is not None else None for r in per_round],
            "per_round_median": statistics.median(measured) if measured else None}


def baseline_lines(rows: list[dict], baseline: Baseline) -> list[str]:
    """One line per mode: current / baseline, e.g. `exact: 1.012x (rounds 1.008x, 1.015x; median 1.012x)`."""
    lines = []
    for r in rows:
        if r.get("revision") != "working tree":
            continue
        v = r.get("vs_baseline")
        if v is None:
            lines.append(f"- {r['system']}: – (no baseline run)")
            continue
        if v["ratio"] is None:
            failed = [name for name in (r["system"], v["baseline"]) if not any(
                x["system"] == name and x.get("epoch_s") is not None for x in rows)]
            lines.append(f"- {r['system']}: – ({' and '.join(failed)} failed)")
            continue
        rounds = ", ".join(f"{x:.3f}x" if x is not None else "failed" for x in v["per_round"])
        median = f"{v['per_round_median']:.3f}x" if v["per_round_median"] is not None else "–"
        lines.append(f"- {r['system']}: {v['ratio']:.3f}x (rounds {rounds}; median {median})")
    if not lines:
        return []
    return ["", f"current / baseline {baseline.short} ({baseline.rev}), median epoch time (per round; their "
                f"median):"] + lines


def table(rows: list[dict], model: str, peer_names: list[str], baseline: Baseline | None = None) -> str:
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
    if baseline is not None:
        lines.extend(baseline_lines(rows, baseline))
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
BASELINE_NOTE = ("<mode>@<hash>: the same mode run on the baseline revision's code (its git worktree's src/ first "
                 "on PYTHONPATH), interleaved with the current code in every round; current / baseline: ratio of "
                 "the median epoch times (above 1 = the working tree is slower), then each round's ratio of the "
                 "two runs' medians and the median of those.")


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
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run each of our modes on this git revision (e.g. HEAD~3, a commit hash), "
                             "checked out into bench/out/baseline-<short-hash>, interleaved with the working "
                             "tree's, and report current / baseline")
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

    baseline = None
    if args.baseline:
        if not args.modes:
            parser.error("--baseline compares our modes: give at least one in --modes")
        baseline = materialise_baseline(args.baseline)
        check_imports(baseline)
    peers, skipped = available_peers(comma_list(args.peers))
    for message in skipped:
        print(message + ": skipped", file=sys.stderr)
    datasets = resolve_datasets(comma_list(args.datasets), args, baseline)
    if not datasets:
        print("no dataset to run", file=sys.stderr)
        return 1
    if not args.modes and not peers:
        print("no system to run", file=sys.stderr)
        return 1

    settings = (f"fanouts {args.fanouts}, hidden {args.hidden}, batch {args.batch_size}, lr {args.lr}, "
                f"dropout {args.dropout}, seed {args.seed}, {args.threads} threads, our device {args.device}, "
                f"{args.epochs} epochs x {args.rounds} rounds, eval every {args.eval_every}"
                + (f", baseline {baseline.short} ({args.baseline})" if baseline else ""))
    rows, tables = [], []
    for data in datasets:
        for model in args.models:
            prefix = f"harness-{data.label}-{model}"
            results = alternate(systems_for(data, model, args, peers, baseline), args.rounds, prefix,
                                args.threads)
            group = summarise(data, model, results, peers, prefix, args.rounds, baseline)
            rows.extend(group)
            tables.append(table(group, model, list(peers), baseline))

    notes = NOTES + (" " + BASELINE_NOTE if baseline else "")
    text = "\n".join([settings + "\n"] + tables + [notes + "\n"]
                     + ([f"Skipped: {'; '.join(skipped)}.\n"] if skipped else []))
    print("\n" + text)
    if args.out_md:
        Path(args.out_md).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_md).write_text(text)
    out = Path(args.out_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("out_md", "out_json", "plot_dir")}
    document = {"settings": config, "skipped": skipped, "rows": rows}
    if baseline:
        document["baseline"] = baseline.as_dict()
        document["vs_baseline"] = [{"dataset": r["dataset"], "model": r["model"], "system": r["system"],
                                    **r["vs_baseline"]} for r in rows if r.get("vs_baseline")]
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"rows written to {out}", file=sys.stderr)
    if args.plot_dir:
        plot(rows, Path(args.plot_dir))
    return 0 if all(r.get("epoch_s") is not None for r in rows) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run-one"]:  # internal: one system's run, started by alternate (see run_one)
        argv, pythonpath = sys.argv[2:], None
        if len(argv) >= 3 and argv[1] == "--pythonpath":
            pythonpath, argv = argv[2], argv[:1] + argv[3:]
        if len(argv) < 3 or argv[1] != "--":
            sys.exit("usage: harness.py --run-one SUMMARY [--pythonpath DIR] -- COMMAND ...")
        sys.exit(run_one(argv[0], argv[2:], pythonpath))
    sys.exit(main())
