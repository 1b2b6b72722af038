"""What the hot sets did over the run, for the epoch records and the summary (trainer thread only)."""

from __future__ import annotations

from neutronorch.orchestration.neutronorch.planner import PlanStats


class HotStats:
    """Summed over the plans accounted."""

    def __init__(self):
        self.super_batches = self.hot = self.reached = self.appearances = self.hot_appearances = 0
        self.saved_edges = self.host_edges = self.error_capped = self.computed = 0
        self._epoch_shares: dict[int, list[float]] = {}
        self._epoch_served: dict[int, list[int]] = {}  # epoch -> [rows served hot, bottom-layer rows]
        self._epoch_ratios: dict[int, list[float]] = {}  # epoch -> the ratio each of its plans followed

    def account(self, plan: PlanStats, host_edges: int = 0, computed: int | None = None) -> None:
        """Once per super-batch (``computed``: hot rows this rank computed, if not all)."""
        for name in ("hot", "reached", "appearances", "hot_appearances", "saved_edges"):
            setattr(self, name, getattr(self, name) + getattr(plan, name))
        self.super_batches += 1
        self.computed += plan.hot if computed is None else computed
        self.host_edges += host_edges
        self.error_capped += int(plan.error_capped)
        self._epoch_shares.setdefault(plan.epoch, []).append(plan.hot / max(1, plan.reached))
        if plan.ratio is not None:
            self._epoch_ratios.setdefault(plan.epoch, []).append(plan.ratio)
        served = self._epoch_served.setdefault(plan.epoch, [0, 0])
        served[0] += plan.hot_appearances
        served[1] += plan.appearances

    def end_epoch(self, epoch: int) -> tuple[float | None, float | None]:
        """The mean hot ratio of the epoch's super-batches, and the share of its bottom-layer rows served hot
        (None if it had none)."""
        shares = self._epoch_shares.pop(epoch, [])
        hot, rows = self._epoch_served.pop(epoch, [0, 0])
        return (sum(shares) / len(shares) if shares else None), (hot / rows if rows else None)

    def planned_apart(self, epoch: int, ratio: float) -> float | None:
        """The share of the epoch's super-batches planned at another ratio than ``ratio`` (planned ahead before it
        was set), or None where no plan said its ratio."""
        ratios = self._epoch_ratios.pop(epoch, [])
        return sum(r != ratio for r in ratios) / len(ratios) if ratios else None

    def state_dict(self) -> dict:
        return {k: v for k, v in vars(self).items()}

    def load_state_dict(self, state: dict) -> None:
        vars(self).update({"computed": state.get("hot", 0), **state})  # checkpoints before the count: all

    def summary(self, auto: bool) -> dict:
        n = max(1, self.super_batches)
        return {
            "mean_hot_per_super_batch": self.hot / n,
            # This rank's share of them: all, unless the ranks of a node share one hot set.
            "mean_computed_per_super_batch": self.computed / n,
            "mean_reached_per_super_batch": self.reached / n,
            # Share of bottom-layer destination rows served from hot embeddings instead of computed.
            "reuse_rate": self.hot_appearances / max(1, self.appearances),
            "uses_per_hot_embedding": self.hot_appearances / max(1, self.hot),
            "bottom_edges_saved": self.saved_edges,
            "host_bottom_edges": self.host_edges,
            "super_batches": self.super_batches,
            "error_capped_super_batches": self.error_capped if auto else None,
        }
