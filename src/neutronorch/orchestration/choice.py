"""``mode="auto"``: which of the three modes a run takes, from a stated cost model and, where the model
cannot settle it, a short measured probe (``train/mode_choice.py``). The rules and the measurements behind
them: ``docs/gpu.md``, "Choosing a mode".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from neutronorch.config import TrainConfig
from neutronorch.data.graph import Graph
from neutronorch.features.placement import GiB, placement_for, workspace_bytes
from neutronorch.nn.precision import precision_dtype

MARGIN = 0.10  # NeutronOrch must measure this much faster than device mode to be chosen
SMALL_CACHE = 0.25  # share of the features on the GPU below which NeutronOrch may pay unmeasured
WIDE_ROW = 512  # bytes of a feature row from which the bottom hop counts as heavy
LARGE_FANOUT = 10  # bottom fanout from which the bottom hop counts as heavy

CPU_ADVICE = "; give --mode neutronorch to use it anyway"
CPU_REASON = ("training on the CPU: exact mode by rule, not measured. There the host does all the work, so NeutronOrch's "
              "reuse only moves it between threads of one processor (0.89-1.03x exact's epoch on the 1M-vertex "
              "benchmark graph: never reliably faster, and its rows are stale), and device mode's torch sampler took "
              "1.23x" + CPU_ADVICE)


@dataclass(frozen=True)
class ModeFacts:
    """What the cost model reads: where device mode's placement puts the data, and the bottom hop's size."""

    device: str  # the training device's type: cpu or cuda
    topology: str = "device"  # device mode's placement of the topology: device, uva
    features: str = "device"  # and of the features: device (every row), cache (the hottest rows), host
    cached_share: float = 1.0  # share of the feature bytes on the GPU
    feature_gib: float = 0.0
    budget_gib: float | None = None
    row_bytes: int = 0  # bytes of one feature row on the device
    bottom_fanout: int = 0
    distributed: bool = False

    @property
    def fits(self) -> bool:
        return self.features == "device" and self.topology == "device"

    @property
    def heavy_bottom(self) -> bool:
        return self.row_bytes >= WIDE_ROW or self.bottom_fanout < 0 or self.bottom_fanout >= LARGE_FANOUT


@dataclass
class ModeChoice:
    """The summary's ``mode_choice``."""

    chosen: str
    reason: str
    measured: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def mode_facts(config: TrainConfig, graph: Graph, device: torch.device, distributed: bool = False) -> ModeFacts:
    """The facts of a run (``config`` resolved) on ``device``."""
    if device.type != "cuda":
        return ModeFacts(device.type, distributed=distributed)
    dtype = precision_dtype(config.precision)
    workspace = workspace_bytes(graph.num_nodes, graph.feature_dim, config.hidden, graph.num_classes,
                                config.fanouts, config.batch_size, config.heads if config.model == "gat" else 1)
    placement = placement_for(graph, config.placement, device, True, workspace, dtype)
    return ModeFacts(device.type, placement.topology, placement.features, round(placement.cached_share, 4),
                     round(placement.feature_bytes / GiB, 3), None if placement.budget is None
                     else round(placement.budget / GiB, 3), dtype.itemsize * graph.feature_dim,
                     int(config.fanouts[-1]), distributed)


def probe_candidates(facts: ModeFacts) -> tuple[str, ...]:
    """The modes a short measured probe should compare (none where the rules decide alone)."""
    return () if facts.device != "cuda" or facts.fits or facts.distributed else ("device", "neutronorch")


def choose_mode(facts: ModeFacts, timings: dict[str, dict] | None = None) -> ModeChoice:
    """The mode by the rules above; ``timings``: per candidate, ``{"step_s": seconds per mini-batch}`` (and
    whatever else the probe measured, recorded as it is)."""
    if facts.device != "cuda":
        return ModeChoice("exact", CPU_REASON, {"device": facts.device})
    measured = {**asdict(facts), "probe": timings}
    budget = f"the GPU budget ({facts.budget_gib:.1f} GiB)"
    if facts.fits:
        return ModeChoice("device", f"the topology and every feature row ({facts.feature_gib:.2f} GiB) fit {budget}: "
                                    f"device mode samples and gathers on the GPU, the fastest mode there", measured)
    held = f"{100 * facts.cached_share:.0f}% of the {facts.feature_gib:.2f} GiB of features fit {budget}"
    if timings and "device" in timings and "neutronorch" in timings:
        device_s, orch_s = timings["device"]["step_s"], timings["neutronorch"]["step_s"]
        pace = f"{1e3 * orch_s:.1f} ms per mini-batch against device mode's {1e3 * device_s:.1f} ms"
        if orch_s < (1 - MARGIN) * device_s:
            return ModeChoice("neutronorch", f"{held}; measured NeutronOrch at {pace}", measured)
        return ModeChoice("device", f"{held}; measured NeutronOrch at {pace}, not {100 * MARGIN:.0f}% faster",
                          measured)
    if facts.cached_share < SMALL_CACHE and facts.heavy_bottom:
        return ModeChoice("neutronorch", f"{held} and the bottom hop is heavy ({facts.row_bytes}-byte rows, fanout "
                                         f"{facts.bottom_fanout}): NeutronOrch reuses hot rows instead of reading "
                                         f"them from host memory", measured)
    return ModeChoice("device", f"{held}; device mode reads the others from pinned host memory (with a quarter of "
                                f"the features on the GPU it took 0.6x NeutronOrch's epoch)", measured)
