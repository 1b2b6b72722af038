"""The speed half of ``hot_ratio="auto"`` (``controller.py`` publishes its ratio to the planner)."""

from __future__ import annotations


class HotRatioTuner:
    """Re-tune r between epochs from measured times, by the rules of ``docs/neutronorch.md``, ``--hot-ratio
    auto`` (on shared cores a walk in log2(r): x2, then x sqrt 2 once a step made things worse). Each
    ``history`` entry says what was decided and why.

    Whether reuse pays (at first, at a probe, and before reuse goes off) is decided on a bracket of four epochs,
    two with hot rows and two without, alternating; reuse changes state only where every epoch with hot rows
    compares with every one without alike, so that noise or another program's load on one epoch cannot make a
    wrong change (it may delay a right one)."""

    LOW, HIGH = 0.01, 0.8
    MIN_STEP = 0.25  # log2 units: the walk stops refining below a factor of 2 ** 0.25
    PROBE_EVERY = 4  # epochs without hot rows between two probes
    PROBE_RATIO = 0.05
    # Reuse goes off only when epochs with hot rows are slower than without them by more than this share,
    # the first measured one by more than FIRST_MARGIN (why: docs/neutronorch.md).
    MARGIN = 0.03
    FIRST_MARGIN = 0.10
    BRACKET = 4  # epochs that decide whether reuse pays: two with hot rows and two without, alternating
    NOTHING_HOT = 0.001  # an epoch whose mean hot share was below this measured no reuse (the error cap held it)
    # An epoch more than this share of whose super-batches were planned ahead at another ratio measured neither
    # (below it: the lead's few super-batches of a long epoch).
    MIXED = 0.1
    # An epoch whose mean hot share was below this share of its ratio had its hot set held by the error cap: a
    # higher ratio would make no more rows hot, so the walk does not go above it.
    HELD = 0.9

    def __init__(self, start: float, shared_cores: bool):
        self.ratio = start
        self.shared_cores = shared_cores
        # What an epoch's time is: on shared cores the process's CPU seconds (controller.py says why).
        self.unit = "CPU s" if shared_cores else "s"
        self.history: list[dict] = []
        self._direction, self._step = 1.0, 1.0  # walk in log2(r)
        self._best: tuple[float, float] | None = None  # (epoch seconds, ratio > 0) of the fastest epoch with hot rows
        self._zero: float | None = None  # seconds of the latest epoch without hot rows
        self._phase = "start"  # start, measure, bracket, on, off
        self._off = 0  # epochs without hot rows since reuse was turned off (or last probed)
        self._factor = 1.0  # separate processors: the last balance (device / host time, clamped)
        self._warm = False  # an epoch with hot rows ran (the first compiles their path: it decides nothing)
        self._share: float | None = None  # the mean hot share of the epoch being decided on
        self._best_share: float | None = None  # ... and of the fastest epoch with hot rows
        # The epochs of the bracket under way, as (seconds, ratio, hot share), and why it runs: first, probe, recheck.
        self._bracket: list[tuple[float, float, float | None]] = []
        self._kind = "first"

    def update(self, epoch_seconds: float, host_seconds: float, device_seconds: float,
               cost_seconds: float | None = None, hot_share: float | None = None,
               planned_apart: float | None = None) -> float:
        """Record one epoch at the current ratio; return the next epoch's. ``host_seconds``,
        ``device_seconds``: busy seconds per super-batch; ``cost_seconds``: what the hot rows cost the device
        over the epoch; ``hot_share``: the share of reached vertices made hot (the error cap may keep it below
        the ratio); ``planned_apart``: the share of its super-batches planned ahead at another ratio (None: not
        known, taken as none)."""
        entry = {"ratio": round(self.ratio, 4), "epoch_s": round(epoch_seconds, 3),
                 "host_s_per_super_batch": round(host_seconds, 4),
                 "device_s_per_super_batch": round(device_seconds, 4)}
        if cost_seconds is not None and self.ratio > 0:
            entry["cost_s"] = round(cost_seconds, 3)
            if self._zero is not None:
                entry["saved_s"] = round(self._zero - epoch_seconds + cost_seconds, 3)
        if self.ratio > 0:
            self._factor = min(2.0, max(0.5, device_seconds / max(host_seconds, 1e-9)))
        capped = hot_share is not None and hot_share < self.NOTHING_HOT and self.ratio > 0
        # Super-batches planned ahead (the snapshot's lead) at the ratio before: at r 0 after a ratio, or at a ratio
        # after r 0 or another.
        mixed = planned_apart if planned_apart is not None and planned_apart > self.MIXED else None
        self._share = hot_share
        decision, reason = self._decide(epoch_seconds, device_seconds < host_seconds, capped, mixed)
        entry.update(next=round(self.ratio, 4), decision=decision, reason=reason)
        self.history.append(entry)
        return self.ratio

    def _decide(self, seconds: float, host_behind: bool, capped: bool, mixed: float | None) -> tuple[str, str]:
        ratio, phase = self.ratio, self._phase
        served = ratio > 0 and not capped  # hot rows were used (unknown share: taken as used)
        if phase == "start":
            self._phase, self._warm = "measure", served
            return "warm-up", "the first epoch (compilation, cold caches) decides nothing"
        if mixed is not None:  # planned in part at the ratio before: measured neither
            return "mixed", (f"{100 * mixed:.0f}% of its super-batches were planned ahead at the ratio before: this "
                             f"epoch measured neither; one more at r {ratio:.3g}")
        if capped:  # nothing was hot: an epoch without reuse, whatever the ratio
            self._zero = seconds
            return "capped", "next to nothing was hot (the staleness-error cap): an epoch without reuse"
        if served and not self._warm:  # the hot rows' path ran for the first time (compiling): not its speed
            self._warm = True
            return "warm-up", (f"the first epoch with hot rows (their path compiling, its caches cold) decides "
                               f"nothing: one more at r {ratio:.3g}")
        if phase == "bracket":
            return self._bracket_step(seconds, ratio)
        return self._without(seconds, phase) if ratio == 0 else self._with(seconds, ratio, host_behind)

    def _without(self, seconds: float, phase: str) -> tuple[str, str]:
        """An epoch without hot rows, reuse off."""
        self._zero = seconds
        self._off = self._off + 1 if phase == "off" else 1
        self._phase = "off"
        if self._off >= self.PROBE_EVERY:  # the probe's bracket starts with this epoch
            self._open("probe", (seconds, 0.0, None), self.PROBE_RATIO)
            return "probe", (f"{self._off} epochs without hot rows: a probe at r {self.ratio:.3g} "
                             f"(two epochs at it, alternating with two without)")
        return "off", f"no hot rows ({self._off} of {self.PROBE_EVERY} epochs before the next probe)"

    def _with(self, seconds: float, ratio: float, host_behind: bool) -> tuple[str, str]:
        """An epoch with hot rows, outside a bracket."""
        if self._phase == "measure":  # the first bracket starts with this epoch
            self._open("first", (seconds, ratio, self._share), 0.0)
            return "baseline", ("one epoch without hot rows, to measure what they save: two epochs with hot rows "
                                "and two without, alternating, decide")
        slower = self._zero is not None and seconds >= self._zero * (1 + self.MARGIN)
        if not self.shared_cores:
            if slower and not (host_behind and ratio > self.LOW):
                return self._recheck(seconds, ratio)
            self._set(ratio * self._factor)
            return "balance", f"device / host time per super-batch {self._factor:.2f}"
        improved = self._best is None or seconds < self._best[0]
        if improved:
            self._best, self._best_share = (seconds, ratio), self._share
        converged = self._step < self.MIN_STEP
        if slower and (improved or converged or self._best[1] == ratio):  # no faster ratio to return to
            return self._recheck(seconds, ratio)
        if not improved:  # worse: back to the best ratio, turn round, and take smaller steps
            self._direction, self._step = -self._direction, self._step / 2
        held = self._step_from_best(ratio, self._share)
        return "walk", f"fastest so far {self._best[0]:.3f} {self.unit} per epoch at r {self._best[1]:.3g}" + held

    def _recheck(self, seconds: float, ratio: float) -> tuple[str, str]:
        """An epoch with hot rows slower than the last without them: it opens a bracket."""
        self._open("recheck", (seconds, ratio, self._share), 0.0)
        return "baseline", (f"{seconds:.3f} {self.unit} per epoch at {self._at(ratio, self._share)}, "
                            f"{self._zero:.3f} {self.unit} without hot rows when last measured: measured again, "
                            f"alternating, before reuse goes off")

    def _open(self, kind: str, first: tuple, next_ratio: float) -> None:
        self._phase, self._kind, self._bracket = "bracket", kind, [first]
        self.ratio = next_ratio

    def _bracket_step(self, seconds: float, ratio: float) -> tuple[str, str]:
        """One more epoch of a bracket: four epochs, with and without hot rows alternating, at one ratio."""
        self._bracket.append((seconds, ratio, self._share))
        if len(self._bracket) < self.BRACKET:
            at = max(b[1] for b in self._bracket)
            self.ratio = 0.0 if ratio > 0 else at
            side = "without hot rows" if ratio > 0 else f"at r {at:.3g}"
            return ("baseline" if ratio > 0 else "confirm"), (
                f"{seconds:.3f} {self.unit} {'with' if ratio > 0 else 'without'} hot rows; one more {side} "
                f"({len(self._bracket)} of {self.BRACKET} epochs, alternating)")
        hot = [b for b in self._bracket if b[1] > 0]
        (fastest, at, share) = min(hot, key=lambda b: b[0])
        with_, without = [b[0] for b in hot], [b[0] for b in self._bracket if b[1] == 0]
        self._zero = sum(without) / len(without)
        times = lambda seconds: " and ".join(f"{t:.3f}" for t in seconds)  # noqa: E731
        measured = (f"{times(with_)} {self.unit} per epoch with hot rows ({self._at(at, share)}), {times(without)} "
                    f"without")
        # Reuse changes state only where every epoch of the bracket agrees: one disturbed epoch may delay a change
        # (a recheck or the next probe makes it), never make a wrong one.
        if self._kind == "probe":
            on = max(with_) < min(without)
            verdict = ("the probe paid: every epoch with hot rows was faster than every one without" if on else
                       "the probe did not pay: not every epoch with hot rows was faster than every one without")
        else:
            margin = self.FIRST_MARGIN if self._kind == "first" else self.MARGIN
            on = min(with_) < max(without) * (1 + margin)
            verdict = (f"reuse does not pay: every epoch with hot rows was slower than every one without by more "
                       f"than {100 * margin:.0f}%" if not on else
                       "reuse pays: every epoch with hot rows was faster than every one without"
                       if max(with_) < min(without) else
                       f"not every epoch with hot rows was slower than every one without by more than "
                       f"{100 * margin:.0f}%: reuse stays on, later epochs decide")
        if not on:
            self._phase, self._off, self.ratio = "off", 0, 0.0
            return "off", f"{verdict}: {measured}"
        # Every epoch with hot rows slower than every one without (within the margin): fewer hot rows next.
        self._phase, self._direction, self._step = "on", -1.0 if min(with_) > max(without) else 1.0, 1.0
        self._best, self._best_share = (fastest, at), share
        return "on", f"{verdict}: {measured}{self._step_from_best(at, share)}"

    def _step_from_best(self, ratio: float, share: float | None) -> str:
        """Set the walk's next ratio from the best one; where the epoch at ``ratio`` had its hot set held by the
        error cap (its mean hot ``share`` well below the ratio), never above ``ratio``, and say so."""
        step = self._next_positive(self._best[1])
        if share is None or share >= self.HELD * ratio or step <= ratio:
            self._set(step)
            return ""
        self._set(ratio)
        return (f"; the staleness-error cap held the hot rows to {100 * share:.1f}% of the vertices reached, below "
                f"r {ratio:.3g}: a higher ratio would make no more rows hot")

    def _next_positive(self, base: float) -> float:
        if not self.shared_cores:
            return base * self._factor
        if self._step < self.MIN_STEP:
            return base
        return base * 2 ** (self._direction * self._step)

    @staticmethod
    def _at(ratio: float, share: float | None) -> str:
        """The ratio an epoch ran at, and the share of the vertices reached it made hot where known (the
        staleness-error cap may keep it below the ratio)."""
        return f"r {ratio:.3g}" + ("" if share is None else f", a mean {100 * share:.1f}% of the vertices reached hot")

    def state_dict(self) -> dict:
        return {"ratio": self.ratio, "history": self.history, "direction": self._direction, "step": self._step,
                "best": self._best, "zero": self._zero, "phase": self._phase, "off": self._off,
                "factor": self._factor, "warm": self._warm, "best_share": self._best_share,
                "bracket": [list(b) for b in self._bracket], "kind": self._kind}

    def load_state_dict(self, state: dict) -> None:
        self.ratio, self.history = state["ratio"], state["history"]
        self._direction, self._step, self._best = state["direction"], state["step"], state["best"]
        # Written before reuse could be turned off: tuning as it was then.
        self._zero = state.get("zero")
        self._phase = state.get("phase", "on" if len(self.history) > 1 else ("measure" if self.history else "start"))
        self._off, self._factor = state.get("off", 0), state.get("factor", 1.0)
        # Written before the first epoch with hot rows was a warm-up: taken as warm, as it tuned then.
        self._warm, self._best_share = state.get("warm", True), state.get("best_share")
        # Written before decisions took a bracket of epochs: a pending baseline opens one on the best epoch.
        self._bracket, self._kind = [tuple(b) for b in state.get("bracket", [])], state.get("kind", "first")
        if self._phase in ("baseline", "probe"):
            self._bracket = [(*self._best, self._best_share)] if self._phase == "baseline" else \
                [(self._zero, 0.0, None)]
            self._kind, self._phase = ("first" if self._phase == "baseline" else "probe"), "bracket"

    def _set(self, ratio: float) -> None:
        self.ratio = float(min(self.HIGH, max(self.LOW, ratio)))
