"""The table and the target checks of bench/gpu_check.sh, from the run summaries it wrote.

    python bench/gpu_table.py RESULTS_DIR GPU_NAME

Reads ``<mode>-<cap>.json`` (mode: exact, device, neutronorch; cap: full, quarter, bf16) and prints a markdown
table (median epoch time without the first epoch, ratios within each cap, accuracy, GPU utilisation from
NVML, the trainer's busy share, the cache hit rate, MiB copied to the device per epoch), then each target
of the CUDA data path with the measured value and PASS / FAIL / MISSING.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

MODES = ("exact", "device", "neutronorch")
CAPS = {"full": "all on the GPU", "quarter": "25% cached", "bf16": "all on the GPU, bf16"}


def load(results: Path) -> dict[tuple[str, str], dict]:
    runs = {}
    for cap in CAPS:
        for mode in MODES:
            path = results / f"{mode}-{cap}.json"
            if path.is_file():
                runs[mode, cap] = json.loads(path.read_text())
    return runs


def measures(summary: dict) -> dict:
    epochs = summary["epochs"][1:] or summary["epochs"]
    util = [e["utilisation"].get("gpu_percent") for e in epochs]
    util = [u for u in util if u is not None]
    moved = summary["moved"]
    return {
        "seconds": statistics.median(e["seconds"] for e in epochs),
        "acc": summary.get("test_acc"),
        "gpu": statistics.mean(util) if util else None,
        "busy": statistics.median(e["lane_busy"].get("trainer", 0.0) for e in epochs),
        "hit": moved.get("cache_hits", 0) / moved["feature_rows"] if moved.get("feature_rows") else None,
        "mib": statistics.median(e["moved"]["device_bytes"] for e in epochs) / 2 ** 20,
    }


def table(runs: dict, gpu: str) -> list[str]:
    lines = [f"GPU: {gpu}", "",
             "| features | mode | epoch s | / exact | / device | test acc | GPU util % | trainer busy | "
             "cache hits | MiB to device / epoch |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cap, label in CAPS.items():
        m = {mode: measures(runs[mode, cap]) for mode in MODES if (mode, cap) in runs}
        for mode, x in m.items():
            ratio = {ref: f"{x['seconds'] / m[ref]['seconds']:.3f}" if ref in m else "-" for ref in ("exact", "device")}
            acc = f"{x['acc']:.4f}" if x["acc"] is not None else "-"
            gpu_util = f"{x['gpu']:.0f}" if x["gpu"] is not None else "n/a"
            hit = f"{100 * x['hit']:.0f}%" if x["hit"] is not None else "-"
            lines.append(f"| {label} | {mode} | {x['seconds']:.3f} | {ratio['exact']} | {ratio['device']} | {acc} | "
                         f"{gpu_util} | {100 * x['busy']:.0f}% | {hit} | {x['mib']:,.0f} |")
    return lines


def targets(runs: dict) -> list[str]:
    """Each target of the CUDA data path: (what, measured, verdict)."""
    m = {key: measures(s) for key, s in runs.items()}
    out = []

    def check(name: str, needed: list, value, ok) -> None:
        if any(key not in m for key in needed):
            out.append(f"- MISSING {name}: runs {', '.join('-'.join(k) for k in needed if k not in m)} absent")
        else:
            out.append(f"- {'PASS' if ok else 'FAIL'} {name}: {value}")

    full = [k for k in m if k[1] == "full"]
    if full:
        best = min(full, key=lambda k: m[k]["seconds"])
        check("best mode at most 1.0 s per epoch", [best], f"{best[0]} {m[best]['seconds']:.3f} s",
              m[best]["seconds"] <= 1.0)
    else:
        check("best mode at most 1.0 s per epoch", [("exact", "full")], None, False)
    n, d, e = ("neutronorch", "quarter"), ("device", "quarter"), ("exact", "quarter")
    if n in m and d in m:
        speed = m[d]["seconds"] / m[n]["seconds"]
        check("25%: neutronorch at least 1.3x faster than device", [n, d], f"{speed:.2f}x", speed >= 1.3)
    else:
        check("25%: neutronorch at least 1.3x faster than device", [n, d], None, False)
    if n in m and e in m:
        speed = m[e]["seconds"] / m[n]["seconds"]
        check("25%: neutronorch at least 3x faster than exact", [n, e], f"{speed:.2f}x", speed >= 3.0)
    else:
        check("25%: neutronorch at least 3x faster than exact", [n, e], None, False)
    accs = {k: m[k]["acc"] for k in (n, d, e) if k in m and m[k]["acc"] is not None}
    if n in accs and len(accs) > 1:
        gap = max(abs(accs[n] - a) for a in accs.values())
        check("25%: equal accuracy (within 1 point)", [n], f"largest gap {100 * gap:.2f} points", gap <= 0.01)
    else:
        check("25%: equal accuracy (within 1 point)", [n, d, e], None, False)
    if n in m:
        util = m[n]["gpu"]
        check("25%: GPU utilisation above 85% in neutronorch mode", [n],
              "n/a (no NVML)" if util is None else f"{util:.0f}%", util is not None and util > 85)
    else:
        check("25%: GPU utilisation above 85% in neutronorch mode", [n], None, False)
    # The GPU path's targets: device mode itself, and bf16 in every mode.
    for cap, limit in (("full", 0.6), ("quarter", 0.8)):
        key = ("device", cap)
        name = f"device mode at most {limit} s per epoch ({'every feature on the GPU' if cap == 'full' else '25% cached'})"
        check(name, [key], key in m and f"{m[key]['seconds']:.3f} s", key in m and m[key]["seconds"] <= limit)
    key = ("device", "full")
    util = m[key]["gpu"] if key in m else None
    check("device mode GPU utilisation at least 85% (every feature on the GPU)", [key],
          "n/a (no NVML)" if util is None else f"{util:.0f}%", util is not None and util >= 85)
    for mode in ("exact", "device", "neutronorch"):
        fp32, bf16 = (mode, "full"), (mode, "bf16")
        both = fp32 in m and bf16 in m and m[fp32]["acc"] is not None and m[bf16]["acc"] is not None
        gap = abs(m[fp32]["acc"] - m[bf16]["acc"]) if both else None
        check(f"bf16 {mode}: accuracy within 0.5 points of fp32", [fp32, bf16],
              None if gap is None else f"{100 * gap:.2f} points", gap is not None and gap <= 0.005)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = load(Path(argv[0]))
    print("\n".join(table(runs, argv[1])))
    print("\nTargets:")
    print("\n".join(targets(runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
