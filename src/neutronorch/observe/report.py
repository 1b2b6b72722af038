"""What a person reads: the per-epoch stage table and the timeline picture (a Gantt chart of lanes)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Callable

from neutronorch.observe.spans import LANES, StageTable


def epoch_table(record: dict, table: StageTable) -> str:
    """A compact per-lane breakdown of one epoch: busy share, then seconds per stage."""
    stages = record["stage_seconds"]
    lines = []
    for lane, share in record.get("lane_busy", {}).items():
        parts = " ".join(f"{s} {v:.2f}" for s, v in stages.items() if table.lane_of(s) == lane and v >= 0.005)
        lines.append(f"    {lane:<8} busy {100 * share:5.1f}%" + (f" | {parts}" if parts else ""))
    util = record.get("utilisation")
    if util:
        line = (f"    cpu      {util['process_cores']:.2f} cores busy "
                f"({100 * util['process_share']:.0f}% of this process's)")
        if util.get("machine_share") is not None:
            line += f", machine {100 * util['machine_share']:.0f}% busy"
        if util.get("gpu_percent") is not None:
            line += f" | gpu {util['gpu_percent']:.0f}%"
        lines.append(line)
    moved = record.get("moved")
    if moved:
        lines.append(f"    data     {moved['feature_rows'] / max(1, record['batches']):,.0f} feature rows per batch, "
                     f"{moved['feature_bytes'] / 2**20:,.0f} MiB gathered, "
                     f"{moved['device_bytes'] / 2**20:,.0f} MiB to the device"
                     + (f", cache hit rate {100 * moved['cache_hits'] / max(1, moved['feature_rows']):.0f}%"
                        if moved.get("cache_hits") else "")
                     + (f", host cache hit rate {100 * moved['host_cache_hits'] / max(1, moved['host_rows']):.0f}%"
                        if moved.get("host_cache_hits") else ""))
    reuse = reuse_line(record)
    if reuse:
        lines.append(f"    reuse    {reuse}")
    return "\n".join(lines)


def reuse_line(record: dict) -> str | None:
    """A NeutronOrch epoch's reuse: whether hot rows were served, at what ratio (the share of reached vertices
    made hot), the share of bottom-layer rows they served, their staleness against its bound, the expected
    error against its budget, and with ``--hot-ratio auto`` the decision for the next epoch and why; None for
    another mode's epoch."""
    if "hot_ratio" not in record:
        return None
    served, staleness = record.get("hot_served"), record.get("staleness") or {}
    if served:
        text = (f"on, r {record['hot_ratio']:.3g}: {100 * served:.1f}% of bottom-layer rows served hot, staleness "
                f"mean {staleness.get('mean')} max {staleness.get('max')} (bound {staleness.get('bound')})")
        if record.get("stale_error") is not None:  # the cap's measure: share served x a reused row's error
            budget = record.get("error_budget")
            text += (f", error {served * record['stale_error']:.4f} (share x row error {record['stale_error']:.3f}"
                     + (f"; budget {budget:g})" if budget else ")"))
    else:
        text = f"off (r {record['hot_ratio']:.3g}): no rows served hot, the epoch trained as without reuse"
    auto = record.get("hot_ratio_auto")
    if auto:
        text += f" | next epoch: {auto['decision']}, r {auto['next']:g} ({auto['reason']})"
    return text


def peak_summary(summary: dict) -> str:
    """The run's peak resident memory: one process's, or, data parallel, the least and the most of the ranks'
    (their parts, or their shares of the work, differ)."""
    ranks = (summary.get("distributed") or {}).get("peak_rss_mb_per_rank") or []
    if len(ranks) > 1:
        low, high = f"{min(ranks):.0f}", f"{max(ranks):.0f}"
        return f"peak RSS {low if low == high else f'{low}-{high}'} MB a rank"
    return f"peak RSS {summary['peak_rss_mb']:.0f} MB"


def reuse_summary(summary: dict) -> str | None:
    """A NeutronOrch run's reuse in a few words for its last line; None for another mode's run."""
    epochs = [e for e in summary.get("epochs", []) if "hot_ratio" in e]
    if not epochs or "hot" not in summary:
        return None
    used = sum(1 for e in epochs if e.get("hot_served"))
    ended = auto_ending(epochs)
    if not used:
        return f"no rows served hot: the run trained as without reuse{ended}"
    staleness = summary.get("staleness", {})
    return (f"hot rows served {100 * summary['hot']['reuse_rate']:.1f}% of bottom-layer rows in {used} of "
            f"{len(epochs)} epochs, staleness max {staleness.get('max_observed')} (bound {staleness.get('bound')})"
            f"{ended}")


def auto_ending(epochs: list[dict]) -> str:
    """Where ``--hot-ratio auto`` ended: reuse on or off by its last verdict (it starts on), and its last decision
    (a bracket's or a walk's step, or an epoch that measured nothing); empty for a fixed ratio."""
    last = epochs[-1].get("hot_ratio_auto")
    if last is None:
        return ""
    verdicts = [(e.get("epoch", k), e["hot_ratio_auto"]["decision"]) for k, e in enumerate(epochs)
                if (e.get("hot_ratio_auto") or {}).get("decision") in ("on", "off")]
    state = (f"reuse {verdicts[-1][1]} by its verdict after epoch {verdicts[-1][0]}" if verdicts
             else "no verdict yet, reuse on while it measures")
    return f"; auto: {state} (last decision: {last['decision']}, r {last['next']:.3g})"


def curves_png(epochs: list[dict], metric: str) -> bytes | None:
    """The training curves (loss; validation and test scores where evaluated) per epoch as a .png's bytes;
    None without matplotlib (it is optional)."""
    try:
        import matplotlib  # noqa: PLC0415 - optional
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    fig, loss = plt.subplots(figsize=(7, 4))
    loss.xaxis.set_major_locator(MaxNLocator(integer=True))
    loss.plot([e["epoch"] for e in epochs], [e["train_loss"] for e in epochs], color="black", label="training loss")
    loss.set_xlabel("epoch")
    loss.set_ylabel("training loss")
    scored = [e for e in epochs if "val_acc" in e]
    if scored:
        score = loss.twinx()
        for key, name, colour in (("val_acc", "validation", "tab:blue"), ("test_acc", "test", "tab:orange")):
            score.plot([e["epoch"] for e in scored], [e[key] for e in scored], color=colour, marker=".",
                       label=f"{name} {metric}")
        score.set_ylabel(metric)
        score.legend(loc="center right")
    loss.legend(loc="upper right")
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def write_timeline(path: str, events: list, samples: list, title: str, table: StageTable,
                   save: Callable[[str, bytes], object] | None = None) -> dict:
    """Draw the spans (and the utilisation samples in their window) as a Gantt chart at ``path`` and write
    the raw data next to it as ``.spans.json``, each made whole in memory and handed to ``save(path, data)``
    (default: written as it is). Returns what was written. A sample is the mean since the one before, so the
    window's are those inside it, the first after it and the last before it, drawn as steps."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    if not events:
        raise ValueError("no spans recorded in the timeline window")
    origin = min(e[1] for e in events)
    end = max(e[2] for e in events)
    lanes = [lane for lane in LANES if any(table.lane_of(e[0]) == lane for e in events)]
    covering = [s for s in samples if origin < s[0] <= end] + [s for s in samples if s[0] > end][:1]
    window_samples = [s for s in samples if s[0] <= origin][-1:] + covering if covering else []
    data = {
        "title": title,
        "lanes": lanes,
        "spans": [{"lane": table.lane_of(s), "stage": s, "start": round(a - origin, 6), "end": round(b - origin, 6),
                   "step": step} for s, a, b, step in events],
        "utilisation": [{"t": round(t - origin, 3), "process_cores": round(c, 3), "machine_share": m,
                         "gpu_percent": g} for t, c, m, g in window_samples],
    }
    json_path = str(Path(path).with_suffix(".spans.json"))
    text = (json.dumps(data) + "\n").encode()

    stages = sorted({e[0] for e in events}, key=table.display_order)
    cmap = plt.get_cmap("tab20")
    colours = {s: cmap(i % 20) for i, s in enumerate(stages)}
    has_util = bool(samples)
    fig, axes = plt.subplots(2 if has_util else 1, 1, figsize=(14, 4.5 if has_util else 3.2), sharex=True,
                             gridspec_kw={"height_ratios": [3, 1]} if has_util else None, squeeze=False)
    ax = axes[0][0]
    for row, lane in enumerate(reversed(lanes)):
        for stage in (stage for stage in stages if table.lane_of(stage) == lane):
            bars = [(a - origin, b - a) for s, a, b, _ in events if s == stage]
            wait = stage in table.waits
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=colours[stage], edgecolor="none",
                           hatch="//" if wait else None, label=stage + (" (wait)" if wait else ""))
    ax.set_yticks(range(len(lanes)), list(reversed(lanes)))
    ax.set_xlim(0, end - origin)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if has_util:
        ux = axes[1][0]
        ux.plot([s[0] - origin for s in window_samples], [s[1] for s in window_samples], label="process cores busy",
                drawstyle="steps-pre")
        gpu = [(s[0] - origin, s[3]) for s in window_samples if s[3] is not None]
        if gpu:
            ux.plot([g[0] for g in gpu], [g[1] / 100 for g in gpu], label="GPU (fraction)", drawstyle="steps-pre")
        if not covering:
            ux.text(0.5, 0.5, "utilisation: window too short to sample", transform=ux.transAxes, ha="center",
                    va="center")
        ux.set_ylim(0, 1.15 * max([s[1] for s in covering] + [1.0]))
        if window_samples:
            ux.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    axes[-1][0].set_xlabel("seconds")
    fig.tight_layout()
    png = io.BytesIO()
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    save = save or (lambda where, whole: Path(where).write_bytes(whole))
    save(json_path, text)
    save(path, png.getvalue())
    return {"png": path, "json": json_path, "spans": len(events)}
