"""The ratio controller (``hot_ratio="auto"``): how many vertices are hot, from measured speed
(``tuner.py``, between epochs) and staleness error (``DriftProbe`` at super-batch boundaries, ``error_cap``
at planning: (share of bottom-layer rows served hot) x (relative error of a stale row) stays within
``hot_error_budget``); ``docs/neutronorch.md`` says how.

The controller lives on the trainer thread. The planning loop reads only ``controller.published``: an
immutable ``RatioSetting`` replaced whole and numbered, so it never sees half an update.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from neutronorch.config import NeutronOrchConfig
from neutronorch.observe import StageTable
from neutronorch.orchestration.batch import each
from neutronorch.orchestration.neutronorch.tuner import HotRatioTuner
from neutronorch.orchestration.neutronorch.versions import Schedule


AUTO_START_RATIO = 0.2


class HostScalar:
    """A scalar measured on the device, copied to pinned memory behind an event: until the copy is done
    ``value()`` gives what ``before`` held, so the planner never waits on the trainer's queued work."""

    def __init__(self, value: torch.Tensor, before: "HostScalar | None" = None):
        self._before = None if before is None else before.value()
        if value.device.type == "cuda":
            self._host = torch.empty((), dtype=value.dtype, pin_memory=True)
            self._host.copy_(value.detach(), non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host, self._ready = value.detach().clone(), None

    def value(self) -> float | None:
        if self._ready is None or self._ready.query():
            return float(self._host)
        return self._before

    def wait(self) -> float:
        """The value, waiting for its copy (for checkpoints)."""
        if self._ready is not None:
            self._ready.synchronize()
        return float(self._host)


@dataclass(frozen=True)
class RatioSetting:
    """What the planner reads: the ratio, and (with ``auto``) the measured relative error of a stale row
    (None: not measured yet, and nothing is hot until it is)."""

    ratio: float
    auto: bool = False
    stale_error: HostScalar | torch.Tensor | float | None = None
    error_budget: float = 0.02

    def cap(self) -> Callable[[np.ndarray], tuple[int, bool]] | None:
        """The planner's cap of a hot set: with ``auto`` the staleness-error cap, else none."""
        return (lambda ranked: error_cap(ranked, self)) if self.auto else None


def error_cap(ranked_counts: np.ndarray, setting: RatioSetting) -> tuple[int, bool]:
    """The most hot vertices (hottest first) whose reuse keeps the expected staleness error within the
    budget, and whether that is below what the ratio gives. Unmeasured: none (weights move fastest early)."""
    error = setting.stale_error
    if isinstance(error, HostScalar):
        error = error.value()
    if error is None:
        return 0, True
    error = float(error)
    if error <= 0:
        return ranked_counts.shape[0], False
    coverage = np.cumsum(ranked_counts) / max(1, ranked_counts.sum())
    cap = int(np.searchsorted(coverage, setting.error_budget / error, side="right"))
    return cap, cap < int(round(setting.ratio * ranked_counts.shape[0]))


class PublishedSetting:
    """The ratio setting, replaced whole by the trainer and numbered. ``read()`` gives (number, setting), a
    consistent pair without a lock (one reference is replaced)."""

    def __init__(self, setting: RatioSetting):
        self._latest = (0, setting)

    def publish(self, setting: RatioSetting) -> None:
        self._latest = (self._latest[0] + 1, setting)

    def read(self) -> tuple[int, RatioSetting]:
        return self._latest


class DriftProbe:
    """The relative change of the bottom-layer output of fixed probe vertices at super-batch boundaries
    (device tensors). ``inputs``: their (block, features), or a function giving them (typed: tables move)."""

    def __init__(self, inputs):
        self.inputs = inputs
        self.drift: torch.Tensor | None = None  # relative change per optimizer step
        self.stale_error: torch.Tensor | None = None  # relative change over the mean staleness
        self._history: list[tuple[torch.Tensor, int]] = []

    def measure(self, bottom: torch.nn.Module, version: int, mean_staleness: float) -> None:
        training = bottom.training
        bottom.eval()
        with torch.no_grad():
            y = bottom(*(self.inputs() if callable(self.inputs) else self.inputs))
        bottom.train(training)
        if isinstance(y, dict):  # a typed graph's bottom layer: one output per vertex type
            y = torch.cat([y[t] for t in sorted(y)])
        # Compare with the boundary closest to the mean staleness of a reused row away, scaled to it (per-step
        # drift times the staleness would overstate it: Adam's steps partly cancel).
        history = [h for h in self._history if h[1] < version]
        if history:
            target = max(1.0, mean_staleness)
            past, past_version = min(history, key=lambda h: abs((version - h[1]) - target))
            distance = version - past_version
            change = (y - past).norm() / y.norm().clamp(min=1e-12)
            self.drift = change / distance
            self.stale_error = change * (target / distance)
        self._history = (self._history + [(y, version)])[-4:]


class RatioController:
    """The hot ratio and the snapshot lead: fixed as configured, or tuned (``auto``). Trainer thread only.
    ``probe_inputs(ids)``: the probe vertices' ``DriftProbe`` inputs. ``lead_adapts=False`` keeps an unset
    lead at 2, so a typed run's losses at a fixed ratio do not depend on measured times."""

    def __init__(self, config: NeutronOrchConfig, schedule: Schedule, shared_cores: bool,
                 probe_inputs: Callable[[np.ndarray], tuple] | None = None, lead_adapts: bool = True):
        self.schedule = schedule
        self.auto = config.hot_ratio == "auto"
        ratio = AUTO_START_RATIO if self.auto else float(config.hot_ratio)
        self.published = PublishedSetting(RatioSetting(ratio, self.auto, None, config.hot_error_budget))
        self.tuner = HotRatioTuner(ratio, shared_cores) if self.auto else None
        self.auto_lead = config.snapshot_lead is None and lead_adapts
        self.lead = min(schedule.max_lead, 2 if config.snapshot_lead is None else config.snapshot_lead)
        self._probe_inputs = probe_inputs
        self._probe_ids: np.ndarray | None = None
        self.probe: DriftProbe | None = None

    @property
    def setting(self) -> RatioSetting:
        return self.published.read()[1]

    def saw_plan(self, probe_ids: np.ndarray | dict[str, np.ndarray]) -> None:
        """The first plan that ranked any vertices gives the drift probe its hottest."""
        if self._probe_ids is None and len(probe_ids) > 0:
            self._probe_ids = probe_ids

    def at_boundary(self, bottom: torch.nn.Module, version: int) -> None:
        """At each super-batch boundary (``auto`` only): measure the drift and publish the stale error."""
        if not self.auto:
            return
        if self.probe is None:
            if self._probe_ids is None or len(self._probe_ids) == 0 or self._probe_inputs is None:
                return
            self.probe = DriftProbe(self._probe_inputs(self._probe_ids))
        # The mean staleness of a reused row: the lead plus half a super-batch.
        self.probe.measure(bottom, version, self.lead + (self.schedule.super_batch - 1) / 2)
        if self.probe.stale_error is not None:
            setting = self.setting
            before = setting.stale_error if isinstance(setting.stale_error, HostScalar) else None
            self.published.publish(replace(setting, stale_error=HostScalar(self.probe.stale_error, before)))

    def measured(self) -> dict:
        """The drift probe's last measurement as numbers (None before the first)."""
        probe = self.probe
        drift, error = (None, None) if probe is None else (probe.drift, probe.stale_error)
        return {"drift_per_step": None if drift is None else float(drift),
                "stale_error": None if error is None else float(error)}

    def end_epoch(self, record: dict, epoch_ratio: float | None, stages: StageTable,
                  agree: Callable[[list[float]], list[float]] | None = None, apart: float | None = None) -> dict:
        """The epoch's controls for its record; then, with ``auto``, the next epoch's lead and ratio.
        ``agree``: the measurements' maximum over ranks that must decide alike (a node sharing hot rows);
        ``apart``: the share of the epoch's super-batches planned at another ratio (None: not known)."""
        out = {"snapshot_lead": self.lead,
               "hot_ratio": round(epoch_ratio if epoch_ratio is not None else self.setting.ratio, 4)}
        drift = self.measured()
        if drift["drift_per_step"] is not None:
            out.update(drift_per_step=round(drift["drift_per_step"], 6),
                       stale_error=round(drift["stale_error"], 5))
        stage = record["stage_seconds"]
        busy = stages.lane_seconds(stage)
        # On shared cores the tuner judges the process's CPU seconds: the work reuse saves or costs, which another
        # program's load swings far less than the wall time (one slow baseline epoch flipped reuse).
        shared = self.tuner is not None and self.tuner.shared_cores
        judged = record.get("cpu_seconds", record["seconds"]) if shared else record["seconds"]
        measured = [record["seconds"], judged, stage.get("wait_hot", 0.0), busy.get("host", 0.0),
                    busy.get("trainer", 0.0), stage.get("hot_grad", 0.0), -1.0 if apart is None else apart]
        seconds, judged, wait_hot, host, trainer, hot_grad, apart = agree(measured) if agree is not None else measured
        apart = None if apart < 0 else apart
        if self.auto_lead and wait_hot > 0.02 * seconds:
            # The trainer waited for hot rows: give the host more steps (the bound still caps the lead).
            self.lead = min(self.schedule.max_lead, self.lead + max(1, self.lead // 2))
        if self.tuner is not None:
            per = max(1, self.schedule.per_epoch)
            # What the hot rows cost the device: on shared cores the host's work, else the trainer's waits;
            # and their gradient either way.
            cost = (host if self.tuner.shared_cores else wait_hot) + hot_grad
            ratio = self.tuner.update(judged, host / per, trainer / per, cost, epoch_ratio, apart)
            self.published.publish(replace(self.setting, ratio=ratio))
            last = self.tuner.history[-1]
            out["hot_ratio_auto"] = {key: last[key] for key in ("next", "decision", "reason")}  # the epoch's reuse line
        if self.auto:
            out["error_budget"] = self.setting.error_budget
        return out

    def state_dict(self) -> dict:
        """Everything the next epochs' decisions depend on (tensors on the CPU)."""
        cpu = lambda t: None if t is None else t.detach().cpu()  # noqa: E731
        probe = self.probe
        published = self.setting.stale_error
        published = published.wait() if isinstance(published, HostScalar) else published
        return {"ratio": self.setting.ratio, "stale_error": None if published is None else float(published),
                "lead": self.lead,
                "tuner": self.tuner.state_dict() if self.tuner else None,
                "probe_ids": None if self._probe_ids is None else each(self._probe_ids, torch.tensor),
                "probe": None if probe is None else {"drift": cpu(probe.drift), "stale_error": cpu(probe.stale_error),
                                                     "history": [(cpu(y), v) for y, v in probe._history]}}

    def load_state_dict(self, state: dict, device: torch.device) -> None:
        on = lambda t: None if t is None else t.to(device)  # noqa: E731
        published = state["stale_error"]
        published = None if published is None else HostScalar(torch.as_tensor(float(published)))
        self.published.publish(replace(self.setting, ratio=state["ratio"], stale_error=published))
        self.lead = state["lead"]
        if self.tuner is not None and state["tuner"] is not None:
            self.tuner.load_state_dict(state["tuner"])
        if state["probe_ids"] is not None:
            self._probe_ids = each(state["probe_ids"], lambda ids: ids.numpy())
        if state["probe"] is not None and self._probe_inputs is not None:
            self.probe = DriftProbe(self._probe_inputs(self._probe_ids))
            self.probe.drift, self.probe.stale_error = on(state["probe"]["drift"]), on(state["probe"]["stale_error"])
            self.probe._history = [(on(y), v) for y, v in state["probe"]["history"]]

    def summary(self) -> dict:
        return {"ratio": round(self.setting.ratio, 4),
                "error_budget": self.setting.error_budget if self.auto else None,
                **self.measured()}

