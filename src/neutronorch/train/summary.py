"""The run summary, for either kind of run (``summarise``: what ``train`` returns and writes to
``summary_json``; README lists its keys), and the run's timeline: the stages' spans in the window
``timeline_steps`` of the second epoch, on the lanes of the run's stage table (``observe/report.py``).
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from neutronorch.data import Graph, TypedGraph, dataset_paths
from neutronorch.data.typed import relation_label
from neutronorch.errors import ConfigError, OutputError
from neutronorch.observe import write_timeline
from neutronorch.train.resources import peak_rss_mb, resident_mb
from neutronorch.atomic import write_atomically

logger = logging.getLogger("neutronorch")
ENDED = ("completed", "stopped_early")  # a summary's statuses when every epoch ran, or patience ran out


def given_dataset(graph, spec: str) -> str:
    """The `dataset` a run records for ``graph``, given to ``train`` in memory (``spec`` as configured; None:
    ``spec``): ``spec`` when the graph's arrays are memory-mapped from the files it names, else
    ``graph:NAME``, so the summary, logs and checkpoints never name a dataset that was not trained."""
    if graph is None:
        return spec
    if not isinstance(graph, (Graph, TypedGraph)):
        raise ConfigError(f"`graph`: expected a neutronorch Graph or TypedGraph (load_dataset, Graph.from_arrays, "
                          f"from_pyg), not a {type(graph).__name__}; a dataset's spec or folder goes in `dataset`.")
    graph.check_given()  # its files are read below: one built by hand is checked first
    files = graph.files()
    roots = [path.expanduser().resolve() for path in dataset_paths(spec)]
    inside = lambda file: any(Path(file).resolve().is_relative_to(root) for root in roots)  # noqa: E731
    return spec if files and all(inside(file) for file in files) else f"graph:{graph.name}"


def moved_totals(epochs: list[dict]) -> dict:
    """The rows and bytes the epochs' records moved (``moved``), summed over the run."""
    return {name: sum(e["moved"].get(name, 0) for e in epochs)
            for name in ("feature_rows", "feature_bytes", "device_bytes", "cache_hits", "host_rows", "host_cache_hits")}


def summarise(run, status: str, timeline: dict | None = None) -> dict:
    """The summary of ``run`` (either kind) as it stands: ``status`` is completed, stopped_early, interrupted
    or failed; an ended run's scores (a stopped or failed one's, none); the keys both kinds have, the kind's
    own (a typed run's: ``TypedParts.summary``) and the mode's (``Mode.summary``). An ended run's summary,
    data parallel, gathers every rank's peak resident memory (a collective: every rank makes it)."""
    config, seconds, ended = run.config, [e["seconds"] for e in run.history], status in ENDED
    last_eval = run.last_eval if ended else {}
    distributed = run.world.summary(config.batch_size, ended)
    return {
        "status": status,
        "mode": run.mode.name,
        "config": config.to_dict(),
        "device": str(run.device),
        "precision": {"name": run.precision.name, "reason": run.precision.reason},
        "epochs": run.history,
        "epoch_seconds_median": statistics.median(seconds) if seconds else None,
        "metric": run.task.metric,
        **score_fields(run.task.key, run.best, last_eval),
        "warnings": list(run.health.warnings),  # training that collapsed (train/health.py)
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "timeline": timeline,
        "checkpoints": checkpoints_written(config.checkpoint_dir),
        "distributed": distributed,  # None in one process
        # Seconds from entering train() to the end of the first optimizer step (None: no step), of which
        # data_seconds loading the dataset (0 when the graph was passed in).
        "startup": {"data_seconds": round(run.data_seconds, 4),
                    "first_step_seconds": None if run.first_step_at is None
                    else round(run.first_step_at - run.started, 4)},
        "mode_choice": run.mode_choice,  # mode auto: {"chosen", "reason", "measured"}; None where it was given
        "moved": moved_totals(run.history),  # a resumed history's records may predate the host cache's keys
        "dataset": _dataset(run),
        **(run.typed.summary(run) if run.typed is not None else _homogeneous(run)),
        **({"link": _link_summary(run, last_eval)} if config.task == "link" else {}),
        **run.mode.summary(),
        **({"error": run.metrics.lost} if run.metrics.lost else {}),  # a log or the timeline lost
    }


def _homogeneous(run) -> dict:
    mode, moved = run.mode, moved_totals(run.history)
    return {
        "threads": {"train": run.threads.train, **mode.threads},
        "resident_mb": resident_mb(),  # at the end: own (anon) and mapped-file (file) memory
        "host_cache": None if mode.store.host_cache is None
        else mode.store.host_cache.summary(moved["host_rows"], moved["host_cache_hits"]),
        "placement": mode.placement.to_dict(),
        # --read-order as resolved: how memory-mapped features and the host samplers' topology were read.
        "read_order": {"features": "file" if mode.store.ordered else "batch",
                       "topology": "file" if topology_in_file_order(mode) else "batch"},
    }


def _dataset(run) -> dict:
    """The graph's sizes (a typed one's per type and relation), and a node task's classes and training
    vertices (a link task's edges are under ``link``)."""
    graph = run.graph
    if run.typed is None:
        entry = {"name": graph.name, "nodes": graph.num_nodes, "edges": graph.num_edges,
                 "feature_dim": graph.feature_dim}
    else:
        entry = {"name": graph.name, "nodes": sum(graph.num_nodes.values()), "edges": graph.num_edges,
                 "node_types": dict(graph.num_nodes),
                 "relations": [relation_label(r) for r in graph.relations],
                 "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes}}
    if run.config.task != "link":
        entry.update({"target": graph.target} if run.typed is not None else {}, classes=graph.num_classes,
                     train=int(len(graph.train_idx)))
    return entry


def _link_summary(run, last_eval: dict) -> dict:
    """A link task's split and every metric it reports, at the best and at the last evaluation (a typed graph's:
    and its relation)."""
    links = run.graph.links
    others = lambda scores: {k: v for k, v in scores.items() if k.startswith(("val_", "test_"))}  # noqa: E731
    relation = {"relation": "/".join(links.ends.relation)} if links.ends is not None else {}
    return {**relation, "edges": {"train": int(links.train.shape[1]), "val": int(links.val.shape[1]),
                                  "test": int(links.test.shape[1])},
            "undirected": links.undirected, "direction": links.direction or None, "issues": links.issues,
            "negatives": links.negative_kind, "head": run.config.link_head,
            "best": others(run.best) if last_eval else None, "final": others(last_eval) if last_eval else None}


def checkpoints_written(directory: str | None) -> dict | None:
    if not directory:
        return None
    return {name: str(Path(directory) / f"{name}.pt") if (Path(directory) / f"{name}.pt").is_file() else None
            for name in ("last", "best")}


def write_run_timeline(run, title: str) -> dict | None:
    """The timeline of ``run``'s window (``timeline``: a .png, the raw spans beside it as .json), each file
    written atomically by the main rank when spans were recorded; what was written, or None. A failure to
    write (a full disk) leaves no partial file and is said at once; the run ends with it once its results are
    saved and summarised (``MetricLog.lose``)."""
    config = run.config
    if not (config.timeline and run.spans.events and run.world.main):
        return None
    try:
        written = write_timeline(config.timeline, run.spans.events, run.util.samples, title, run.stages,
                                 save=lambda path, data: write_atomically(path, lambda f: f.write(data)))
    except (OSError, OutputError) as exc:
        run.metrics.lose(config.timeline, exc)
        return None
    logger.info(f"timeline: {written['png']} ({written['spans']} spans; raw spans in {written['json']})")
    return written


def topology_in_file_order(mode) -> bool:
    """Whether the mode's host samplers read the topology in file order (``--read-order``, as resolved)."""
    sampling = getattr(mode, "sampling", None)
    return bool(sampling is not None and sampling.file_order)


def score_fields(key: str, best: dict, last: dict) -> dict:
    """A summary's scores: the best evaluation's (``best``: val, test, epoch) and the last one's (``last``;
    empty when nothing was evaluated, and then no score is reported), under the metric's ``key`` and again
    under the names they had when accuracy was the only metric."""
    best = best if last else {}
    return {f"val_{key}": best.get("val"), f"test_{key}": best.get("test"), "best_epoch": best.get("epoch"),
            f"final_val_{key}": last.get("val"), f"final_test_{key}": last.get("test"),
            "val_acc": best.get("val"), "test_acc": best.get("test"),
            "final_val_acc": last.get("val"), "final_test_acc": last.get("test")}


def named_scores(task, scores: dict) -> dict:
    """An evaluation as an epoch record holds it: under the metric's name, and (for compatibility) as
    ``val_acc`` and ``test_acc``, which hold the metric too; a link task's other metrics as they are."""
    return {f"val_{task.key}": scores["val"], f"test_{task.key}": scores["test"],
            "val_acc": scores["val"], "test_acc": scores["test"],
            **{key: value for key, value in scores.items() if key not in ("val", "test")}}
