#!/usr/bin/env python
"""Link prediction settings sweep: test MRR of ``--task link`` runs over a small grid, on several graphs and seeds.

    python bench/link_sweep.py --threads 1 --sampler-threads 1 --out bench/out/link-sweep.json

By default Cora and CiteSeer (20 epochs) and DBLP (3 epochs, ``NAME:EPOCHS``): the first round of the sweep
behind a link task's defaults (docs/results/link-defaults-2026-12-06.md, which holds the later rounds'
commands too). Amazon Photo's raw rows make link training collapse with these settings.

One factor at a time around a base (``--base``, default hidden 128, dropout 0.3, lr 0.005, batch size 1024,
fanouts 10,10; 2-layer GraphSAGE, dot head, 1 negative per positive, no weight decay, ``--epochs`` epochs):
each setting in ``--grid`` changes one field of the base (``FIELD=VALUE``; batch_size 0 is the package's
automatic batch size), and ``node-defaults`` is the node task's defaults (hidden 256, dropout 0.7, lr 0.003,
automatic batch size). Every run goes through ``neutronorch.train`` in exact mode with evaluation every epoch;
its score is the test MRR at the best-validation epoch (``summary["test_mrr"]``), and the curve of
validation and test MRR per epoch is kept in the JSON, so that the best number of epochs can be read off the
same runs. The table shows, per graph and setting, the median over seeds, and the median over graphs.

Graphs (``--datasets``) are read from ``--datasets-root`` (default ../shared/datasets next to the repository)
with the package's own edge split (``edges:0.85,0.05``, the split drawn from each run's seed) and features as
the package reads them; missing ones are skipped with a message. A run whose every evaluation collapsed
(every positive tied with its negatives) is marked so.

**Typed graphs** (``--typed``): ``--datasets`` then names typed dataset folders (``neutronorch generate
synthetic --typed``), the link task predicts ``--link-relation``'s edges, and each graph is swept once per
model of ``--models`` (default sage,rgcn), a column ``GRAPH MODEL`` each:

    python bench/link_sweep.py --typed --datasets DIR:3 --link-relation writes --grid defaults,lr=0.003 \
        --base hidden=256,dropout=0.3,lr=0.001 --out bench/out/typed-link-sweep.json

There ``table_lr=F`` sets the featureless types' embedding tables' learning rate to F times the run's lr
(``TypedOptions.table_lr``); ``weight_decay=WD`` (any graph) Adam's weight decay of the dense weights (the
tables have none). ``--tables A.json,B.json`` prints the tables of earlier ``--out`` files together (two
sweeps run side by side, one a core), running nothing; a table of validation MRR per seed (best, its epoch,
and the last) shows runs that peak early and fall.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import time
from pathlib import Path

from neutronorch import TrainConfig, TypedOptions, load_dataset, train
from neutronorch.data import load_typed_dataset
from neutronorch.config import TASK_DEFAULTS

REPO = Path(__file__).resolve().parents[1]

DATASETS = {
    "cora": "cora",
    "citeseer": "citeseer",
    "amazon_photo": "amazon_photo/amazon_photo.npz",
    "coauthor_cs": "coauthor_cs/coauthor_cs.npz",
    "dblp": "dblp/dblp.npz",
    "amazon_computers": "amazon_computers/amazon_cs.npz",
}
BASE = {"hidden": 128, "dropout": 0.3, "lr": 0.005, "batch_size": 1024, "fanouts": "10,10"}
NODE_DEFAULTS = {"hidden": TrainConfig().hidden, "fanouts": "10,10",  # a node task's, weight decay aside
                 **{key: TASK_DEFAULTS["node"][key] for key in ("dropout", "lr", "batch_size")}}
GRID = ("base,hidden=64,hidden=256,dropout=0,dropout=0.5,dropout=0.7,lr=0.001,lr=0.003,lr=0.01,"
        "batch_size=256,batch_size=0,node-defaults")
CASTS = {"hidden": int, "dropout": float, "lr": float, "batch_size": int, "fanouts": str, "weight_decay": float,
         "table_lr": float}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="cora,citeseer,dblp:3",
                   help="comma-separated NAME[:EPOCHS] from %s (default: %%(default)s)" % ",".join(DATASETS))
    p.add_argument("--grid", default=GRID, help="comma-separated settings: base, node-defaults, defaults (the link "
                                                "task's) or FIELD=VALUE "
                                                "(FIELD one of %s) (default: %%(default)s)" % ",".join(CASTS))
    p.add_argument("--base", default=",".join(f"{k}={v}" for k, v in BASE.items() if k != "fanouts"),
                   help="the base's FIELD=VALUE list (default: %(default)s; fanouts 10,10)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=20, help="epochs of every run (default: %(default)s)")
    p.add_argument("--datasets-root", default=str(REPO / ".." / "shared" / "datasets"))
    p.add_argument("--threads", type=int, default=1, help="training threads (default: %(default)s)")
    p.add_argument("--sampler-threads", type=int, default=1, help="sampler threads (default: %(default)s)")
    p.add_argument("--out", default=None, help="write every run and the table here (JSON); rewritten after each run")
    p.add_argument("--typed", action="store_true", help="--datasets names typed dataset folders (module docstring)")
    p.add_argument("--models", default=None, help="comma-separated models (default: sage; --typed: sage,rgcn)")
    p.add_argument("--link-relation", default=None, help="--typed: the relation whose edges are predicted")
    p.add_argument("--tables", default=None, metavar="JSON[,JSON...]",
                   help="run nothing: print the tables of earlier --out files, merged (settings in their order)")
    return p.parse_args(argv)


def setting(name: str, base: dict, typed: bool = False) -> dict:
    """The fields of one grid entry."""
    if name == "base":
        return dict(base)
    if name == "node-defaults":
        return dict(NODE_DEFAULTS)
    if name == "defaults":  # the link task's own defaults
        return {"hidden": TrainConfig().hidden, "fanouts": "10,10",
                **{key: TASK_DEFAULTS["link"][key] for key in ("dropout", "lr", "batch_size")}}
    field, sep, value = name.partition("=")
    if field == "table_lr" and not typed:
        sys.exit(f"--grid entry {name!r}: table_lr (the embedding tables' rate, a multiple of lr) needs --typed")
    if not sep or field not in CASTS:
        sys.exit(f"--grid entry {name!r}: give base, node-defaults, defaults or FIELD=VALUE with FIELD one of "
                 f"{', '.join(CASTS)}")
    return {**base, field: CASTS[field](value)}


def run_one(path: str, fields: dict, seed: int, epochs: int, args, model: str = "sage") -> dict:
    typed = {"link_relation": args.link_relation} if args.typed else {}
    # table_lr: the typed tables' learning rate as a multiple of lr (TypedOptions.table_lr; unset: the package's)
    options = TypedOptions(table_lr=fields["table_lr"] * fields["lr"]) if "table_lr" in fields else None
    config = TrainConfig(dataset=path, task="link", model=model, fanouts=fields["fanouts"], hidden=fields["hidden"],
                         dropout=fields["dropout"], lr=fields["lr"], batch_size=fields["batch_size"], epochs=epochs,
                         weight_decay=fields.get("weight_decay", 0.0), negatives=1, link_head="dot",
                         split="edges:0.85,0.05", seed=seed, mode="exact", threads=args.threads,
                         sampler_threads=args.sampler_threads, progress=False, eval_every=1, **typed)
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(io.StringIO()):
        summary = train(config, graph=load_typed_dataset(path) if args.typed else load_dataset(path), options=options)
    epochs_ = summary["epochs"]
    curve = [(e.get("val_mrr"), e.get("test_mrr")) for e in epochs_]
    return {"seed": seed, "test_mrr": summary["test_mrr"], "val_mrr": summary["val_mrr"],
            "best_epoch": summary["best_epoch"], "batch_size": summary["config"]["batch_size"],
            "final_test_mrr": summary.get("final_test_mrr"),
            "losses": [e["train_loss"] for e in epochs_], "curve": curve,
            "collapsed": all(e.get("collapsed") for e in epochs_ if "collapsed" in e) and
            any("collapsed" in e for e in epochs_),
            "wall_seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.tables:
        return print_saved(args.tables.split(","))
    base = setting("base", BASE)
    for item in args.base.split(","):
        field, _, value = item.partition("=")
        if field not in CASTS:
            sys.exit(f"--base entry {item!r}: FIELD one of {', '.join(CASTS)}")
        base[field] = CASTS[field](value)
    grid = {name: setting(name, base, args.typed) for name in args.grid.split(",")}
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path(args.datasets_root)
    results: dict = {"base": base, "seeds": seeds, "epochs": args.epochs, "threads": args.threads,
                     "sampler_threads": args.sampler_threads, "grid": grid, "runs": {}}
    graphs = []
    models = (args.models or ("sage,rgcn" if args.typed else "sage")).split(",")
    for entry in args.datasets.split(","):
        name, _, epochs = entry.partition(":")
        if args.typed:
            if not Path(name).is_dir():
                sys.exit(f"--typed: {name} is not a typed dataset folder")
            graphs += [(f"{Path(name).name} {model}", name, int(epochs) if epochs else args.epochs, model)
                       for model in models]
            continue
        if name not in DATASETS:
            sys.exit(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")
        path = root / DATASETS[name]
        if not path.exists():
            print(f"skipping {name}: {path} not found", file=sys.stderr)
            continue
        graphs += [(name if model == "sage" else f"{name} {model}", str(path), int(epochs) if epochs else args.epochs,
                    model) for model in models]
    for name, path, epochs, model in graphs:
        for label, fields in grid.items():
            runs = []
            for seed in seeds:
                run = run_one(path, fields, seed, epochs, args, model)
                runs.append(run)
                print(f"  {name} {label} seed {seed}: test MRR {run['test_mrr']:.4f} (best epoch {run['best_epoch']}, "
                      f"batch {run['batch_size']}, last loss {run['losses'][-1]:.4f}, {run['wall_seconds']} s)",
                      file=sys.stderr, flush=True)
            results["runs"][f"{name}|{label}"] = {"graph": name, "setting": label, "epochs": epochs, "runs": runs,
                                                  "median": statistics.median(r["test_mrr"] for r in runs)}
            if args.out:
                out = Path(args.out)
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(results, indent=1) + "\n")
    print_all(results, [g[0] for g in graphs], list(grid))
    return 0


def print_saved(paths: list[str]) -> int:
    """The tables of earlier runs' JSON files (``--out``), their runs merged: graphs and settings in the order
    the files first name them; one graph and setting's runs of other seeds in several files (sweeps run side by
    side, a seed each) go into one cell."""
    merged: dict = {"runs": {}, "seeds": []}
    for path in paths:
        saved = json.loads(Path(path).read_text())
        merged["seeds"] += [seed for seed in saved["seeds"] if seed not in merged["seeds"]]
        for key, cell in saved["runs"].items():
            if key not in merged["runs"]:
                merged["runs"][key] = dict(cell, runs=[])
            elif merged["runs"][key]["epochs"] != cell["epochs"]:
                sys.exit(f"--tables: {path} ran {key} for {cell['epochs']} epochs, an earlier file for "
                         f"{merged['runs'][key]['epochs']}")
            merged["runs"][key]["runs"] += cell["runs"]
    for cell in merged["runs"].values():
        cell["runs"].sort(key=lambda run: merged["seeds"].index(run["seed"]))
        cell["median"] = statistics.median(run["test_mrr"] for run in cell["runs"])
    names = list(dict.fromkeys(cell["graph"] for cell in merged["runs"].values()))
    labels = list(dict.fromkeys(cell["setting"] for cell in merged["runs"].values()))
    print_all(merged, names, labels)
    return 0


def print_all(results: dict, names: list[str], labels: list[str]) -> None:
    print_table(results, names, labels)
    print_runs(results, names, labels)
    print_validation(results, names, labels)
    for label in labels:
        print_epochs(results, names, label)


def print_runs(results: dict, names: list[str], labels: list[str]) -> None:
    """Every run: per graph and setting, the test MRR of each seed and the best validation epoch."""
    print(f"\nEvery run: test MRR per seed ({', '.join(map(str, results['seeds']))}), best validation epoch in "
          f"brackets\n")
    print(f"| setting | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for label in labels:
        cells = [results["runs"].get(f"{name}|{label}") for name in names]
        text = ["—" if c is None else ", ".join(f"{100 * r['test_mrr']:.2f} ({r['best_epoch']})" for r in c["runs"])
                for c in cells]
        print(f"| {label} | {' | '.join(text)} |")


def print_validation(results: dict, names: list[str], labels: list[str]) -> None:
    """Whether validation peaks early and falls: per seed, the best validation MRR (its epoch), the last one,
    and the first and last epoch's training loss."""
    print("\nValidation MRR per seed: best (epoch) -> last; training loss first -> last\n")
    print(f"| setting | {' | '.join(names)} |")
    print("|---|" + "---|" * len(names))
    for label in labels:
        cells = [results["runs"].get(f"{name}|{label}") for name in names]
        text = ["—" if c is None else "; ".join(
            f"{100 * r['val_mrr']:.2f} ({r['best_epoch']}) -> {100 * r['curve'][-1][0]:.2f}, "
            f"{r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}" for r in c["runs"]) for c in cells]
        print(f"| {label} | {' | '.join(text)} |")


def best_within(curve: list, epochs: int) -> float:
    """The test MRR at the best validation MRR among the first ``epochs`` evaluations (the first best on ties,
    as the trainer keeps it)."""
    head = [(val, test) for val, test in curve[:epochs] if val is not None]
    best = max(range(len(head)), key=lambda i: (head[i][0], -i))
    return head[best][1]


def print_epochs(results: dict, names: list[str], label: str) -> None:
    """The same runs stopped earlier: per graph, the median over seeds of the test MRR at the best validation
    epoch among the first E epochs."""
    cells = {name: results["runs"].get(f"{name}|{label}") for name in names}
    longest = max((c["epochs"] for c in cells.values() if c), default=0)
    counts = {e for e in (2, 3, 5, 10, 20, 30, 40, 50, 75, 100) if e < longest}
    counts = sorted(counts | {c["epochs"] for c in cells.values() if c})  # and each graph's last
    print(f"\n{label}, stopped after E epochs (test MRR at the best validation epoch so far, median over seeds)\n")
    print(f"| graph | {' | '.join(f'E={e}' for e in counts)} |")
    print("|---|" + "---|" * len(counts))
    for name, cell in cells.items():
        if cell:
            values = [f"{100 * statistics.median(best_within(r['curve'], e) for r in cell['runs']):.2f}"
                      if e <= cell["epochs"] else "—" for e in counts]
            print(f"| {name} | {' | '.join(values)} |")


def print_table(results: dict, names: list[str], labels: list[str]) -> None:
    print(f"| setting | {' | '.join(names)} | median over graphs |")
    print("|---|" + "---|" * (len(names) + 1))
    for label in labels:
        cells = [results["runs"].get(f"{name}|{label}") for name in names]
        values = [c["median"] for c in cells if c]
        medians = " | ".join("—" if c is None else f"{100 * c['median']:.2f}" for c in cells)
        overall = f"{100 * statistics.median(values):.2f}" if values else "—"
        print(f"| {label} | {medians} | {overall} |")


if __name__ == "__main__":
    sys.exit(main())
