"""Stage spans from every thread, and the tables that put stages on lanes. A span ``(stage, start, end)``
costs a lock and a dict update, a microsecond or so against stages of milliseconds. Per-stage totals are
always kept; the raw spans only while ``keep`` is set (the timeline window)."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Mapping

# In display order: NeutronOrch's planner and host compute, the sampler, host-to-device copies, the trainer
LANES = ("planner", "host", "sampler", "copy", "trainer")


@dataclass(frozen=True)
class StageTable:
    """The lane of each stage, and which stages are waits (a lane blocked, not busy)."""

    lanes: Mapping[str, str] = field(default_factory=dict)
    waits: frozenset[str] = frozenset()

    def __post_init__(self):
        unknown = set(self.lanes.values()) - set(LANES)
        if unknown:
            raise ValueError(f"unknown lanes {sorted(unknown)}; lanes are {LANES}")

    def merge(self, other: "StageTable") -> "StageTable":
        return StageTable({**self.lanes, **other.lanes}, self.waits | other.waits)

    def lane_of(self, stage: str) -> str:
        """A stage's lane; stages nobody declared count as the trainer's."""
        return self.lanes.get(stage, "trainer")

    def lane_seconds(self, stage_seconds: Mapping[str, float]) -> dict[str, float]:
        """Busy seconds per lane (stages that are not waits), for the lanes that recorded anything."""
        busy: dict[str, float] = {}
        for stage, seconds in stage_seconds.items():
            lane = self.lane_of(stage)
            busy[lane] = busy.get(lane, 0.0) + (0.0 if stage in self.waits else seconds)
        return {lane: busy[lane] for lane in LANES if lane in busy}

    def lane_busy(self, stage_seconds: Mapping[str, float], wall: float) -> dict[str, float]:
        """Share of ``wall`` each lane spent in stages that are not waits (lanes that recorded anything)."""
        if wall <= 0:
            return {}
        return {lane: round(seconds / wall, 4) for lane, seconds in self.lane_seconds(stage_seconds).items()}

    def display_order(self, stage: str) -> tuple[int, str]:
        """Sort key: by lane, then by name."""
        return LANES.index(self.lane_of(stage)), stage


class Spans:
    """Stage spans from every thread: totals since the last ``take``, raw spans while ``keep`` is set."""

    MAX_EVENTS = 200_000

    def __init__(self):
        self._lock = threading.Lock()
        self._totals: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self.keep = False
        self.opened = 0.0  # when ``keep`` was set: a span begun before the window is drawn from there
        self.events: list[tuple[str, float, float, int]] = []

    @contextmanager
    def stage(self, name: str, step: int = -1) -> Iterator[None]:
        """Time the ``with`` body as one span of stage ``name`` (recorded even when the body raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, start, time.perf_counter(), step)

    def add(self, stage: str, start: float, end: float, step: int = -1) -> None:
        with self._lock:
            self._totals[stage] = self._totals.get(stage, 0.0) + (end - start)
            if self.keep and len(self.events) < self.MAX_EVENTS:
                self.events.append((stage, max(start, self.opened), end, step))

    def count(self, name: str, value: int) -> None:
        """Add to a counter (rows, bytes) reported with the next ``take``."""
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + int(value)

    def take(self) -> tuple[dict[str, float], dict[str, int]]:
        """Seconds per stage and the counters, since the last call (every lane)."""
        with self._lock:
            totals, self._totals = self._totals, {}
            counts, self._counts = self._counts, {}
        return totals, counts
