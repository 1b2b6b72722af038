"""What the hot sets did over the run, for the epoch records and the summary (trainer thread only):
``HotStats`` on a homogeneous graph, ``HotRecord`` per vertex type on a typed one."""

from __future__ import annotations

from neutronorch.orchestration.neutronorch.planner import PlanStats, TypedPlanStats


class HotStats:
    def __init__(self):
        self.super_batches = self.hot = self.reached = self.appearances = self.hot_appearances = 0
        self.saved_edges = self.host_edges = self.error_capped = self.computed = 0
        self._epoch_shares: dict[int, list[float]] = {}

    def account(self, plan: PlanStats, host_edges: int, computed: int) -> None:
        """Once per super-batch, when the trainer reaches it (``computed``: hot rows this rank computed)."""
        self.super_batches += 1
        self.hot += plan.hot
        self.computed += computed
        self.reached += plan.reached
        self.appearances += plan.appearances
        self.hot_appearances += plan.hot_appearances
        self.saved_edges += plan.saved_edges
        self.host_edges += host_edges
        self.error_capped += int(plan.error_capped)
        self._epoch_shares.setdefault(plan.epoch, []).append(plan.hot_share)

    def epoch_ratio(self, epoch: int) -> float | None:
        """The mean hot ratio of the epoch's super-batches (None if it had none)."""
        shares = self._epoch_shares.pop(epoch, [])
        return sum(shares) / len(shares) if shares else None

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


class HotRecord:
    """What the plans of an epoch (or a run) did, summed from their ``TypedPlanStats``; empty in exact mode."""

    def __init__(self):
        self.plans = 0
        self.hot: dict[str, int] = {}
        self.reached = self.appearances = self.hot_appearances = self.saved_edges = 0

    def add(self, stats: TypedPlanStats | None) -> None:
        if stats is not None:
            self._sum(1, stats.hot, stats.reached, stats.appearances, stats.hot_appearances, stats.saved_edges)

    def merge(self, other: "HotRecord") -> None:
        self._sum(other.plans, other.hot, other.reached, other.appearances, other.hot_appearances, other.saved_edges)

    def _sum(self, plans: int, hot: dict[str, int], reached: int, appearances: int, hot_appearances: int,
             saved_edges: int) -> None:
        self.plans += plans
        for t, count in hot.items():
            self.hot[t] = self.hot.get(t, 0) + count
        self.reached += reached
        self.appearances += appearances
        self.hot_appearances += hot_appearances
        self.saved_edges += saved_edges

    @property
    def hot_ratio(self) -> float | None:
        """The share of the reached destinations made hot (None without plans): what the tuner measured."""
        return sum(self.hot.values()) / max(1, self.reached) if self.plans else None

    def record(self) -> dict:
        """``hot_share``: the bottom-layer destination rows served by hot rows; ``hot_per_super_batch``: the
        mean |H_s| per type; ``saved_edges``: bottom-hop edges not sampled for the mini-batches."""
        if not self.plans:
            return {}
        return {"hot_share": round(self.hot_appearances / max(1, self.appearances), 4),
                "hot_per_super_batch": {t: round(n / self.plans, 1) for t, n in self.hot.items()},
                "saved_edges": self.saved_edges}
