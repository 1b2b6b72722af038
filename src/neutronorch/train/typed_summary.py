"""A typed run's summary and its timeline: what ``train/typed_task.py`` writes at the end of a run.

The summary has the homogeneous summary's keys where they mean the same (``train/summary.py``), plus the
typed ones (the model's kind and arguments, the types and relations, the fanouts per relation, the tables'
storage, NeutronOrch's part). The timeline is the homogeneous one's picture (``observe/report.py``) of the
stages' spans in the window ``timeline_steps`` of the second epoch, on the lanes of the run's stages (the
trainer's and its mode's).
"""

from __future__ import annotations

import statistics

from neutronorch.data.typed import relation_label
from neutronorch.orchestration.factory import Threads
from neutronorch.train.memory import peak_rss_mb
from neutronorch.train.summary import checkpoints_written, score_fields, write_run_timeline


def typed_summary(run, status: str, started: float, data_seconds: float, threads: Threads) -> dict:
    """The summary of the typed run ``run`` (``typed_task._TypedRun``) as it stands."""
    config, graph, key, best, last = run.config, run.graph, run.task.key, run.best, run.last_eval
    seconds = [e["seconds"] for e in run.history]
    return {
        "status": status,
        "mode": run.mode.name,
        "mode_choice": None if config.mode != "auto" else
        {"chosen": "exact", "reason": "auto picks exact mode for typed graphs", "measured": None},
        **run.mode.summary(),
        "model": {"kind": run.model.kind, "typed": True, "parameters": run.parameters,
                  "arguments": run.model.arguments},
        "config": config.to_dict(),
        "dataset": {"name": graph.name, "nodes": sum(graph.num_nodes.values()), "edges": graph.num_edges,
                    "node_types": dict(graph.num_nodes),
                    "relations": [relation_label(r) for r in graph.relations], "target": graph.target,
                    "feature_dims": {t: graph.feature_dim(t) for t in graph.num_nodes},
                    "classes": graph.num_classes, "train": int(len(graph.train_idx))},
        "fanouts": {relation_label(r): f for r, f in run.sampler.fanouts.items()},
        "embedding_tables": None if run.tables is None else run.tables.summary(),
        "device": str(run.device),
        "precision": {"name": run.precision.name, "reason": run.precision.reason},
        "threads": {"train": threads.train, "sampler": threads.sampler},
        "distributed": run.world.summary(config.batch_size, gather=status in ("completed", "stopped_early")),
        "epochs": run.history,
        "epoch_seconds_median": statistics.median(seconds) if seconds else None,
        "metric": run.task.metric,
        **score_fields(key, best, last),
        "warnings": list(run.health.warnings),  # training that collapsed (train/health.py)
        "checkpoints": checkpoints_written(config.checkpoint_dir),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "startup": {"data_seconds": round(data_seconds, 4),
                    "first_step_seconds": None if run.first_step_at is None
                    else round(run.first_step_at - started, 4)},
    }


def write_typed_timeline(run) -> dict | None:
    """The timeline of ``run``'s window (``write_run_timeline``)."""
    return write_run_timeline(run, f"{run.mode.name} mode, {run.config.model} (typed), epoch {run.window.epoch}, "
                                   f"first {run.config.timeline_steps} steps", run.stages)
