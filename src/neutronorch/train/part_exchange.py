"""The exchange of a partitioned run's ranks over ``torch.distributed`` (``sampling.exchange.Exchange``; gloo
on the CPU): one ``all_to_all_single`` of a byte buffer, after one of the sizes when the receiver does not know them.
Each collective has the run's ``dist_timeout`` and fails with a message naming what failed."""

from __future__ import annotations

import contextlib
import datetime
from typing import Callable

import numpy as np
import torch

from neutronorch.sampling.exchange import Exchange, received_buffer
from neutronorch.train.distributed import World


class GlooExchange(Exchange):
    """``Exchange`` between the ranks of ``world`` in the gloo ``group`` (default: the world's host group).
    A thread that exchanges while another thread runs collectives needs a group of its own (``new``)."""

    def __init__(self, world: World, group=None, what: str = "the partitioned exchange"):
        super().__init__(world.rank, world.size)
        self.world, self.group, self.what = world, group or world.host_group, what

    @classmethod
    def new(cls, world: World, what: str) -> "GlooExchange":
        """An exchange in a gloo group of its own (a collective: every rank calls it at the same point)."""
        span = datetime.timedelta(seconds=world.timeout)
        return cls(world, torch.distributed.new_group(backend="gloo", timeout=span), what)

    def close(self) -> None:
        """Take down a group ``new`` made, now, after the thread that used it has stopped (not whenever its
        last reference goes, as late as the interpreter's exit). Local: no rank waits for another."""
        group, self.group = self.group, None
        if group is not None and group is not self.world.host_group and torch.distributed.is_initialized():
            with contextlib.suppress(ValueError):  # taken down already, with the caller's whole group
                torch.distributed.destroy_process_group(group)

    def _swap(self, send: np.ndarray, send_sizes: list[int], sizes: list[int] | None,
              into: Callable[[int], np.ndarray] | None = None) -> tuple[np.ndarray, list[int]]:
        world, dist = self.world, torch.distributed
        if sizes is None:
            announced = torch.empty(self.size, dtype=torch.int64)
            with world._collective(f"{self.what} (sizes)"):
                dist.all_to_all_single(announced, torch.tensor(send_sizes, dtype=torch.int64), group=self.group)
            sizes = announced.tolist()
        out = received_buffer(sum(sizes), into)
        with world._collective(self.what):
            dist.all_to_all_single(torch.from_numpy(out), torch.from_numpy(send), list(sizes), list(send_sizes),
                                   group=self.group)
        return out, list(sizes)


class TrafficRecord:
    """The bytes a partitioned run's training exchanges moved, by lane (``lanes``: name -> ``Exchange``; the
    thread each serves): per epoch in its record, every rank's, with every rank's CPU seconds (the ranks' work
    differs with their parts), and over the run in the summary, beside the evaluations' (``evaluation``). A
    record's entry per rank holds the lanes' totals and, with several lanes, each lane's."""

    def __init__(self, world: World, lanes: dict, evaluation: Exchange):
        self.world, self.lanes, self.evaluation, self._last = world, lanes, evaluation, {}

    def summary(self) -> dict:
        """This rank's bytes exchanged over the run: by its training lanes, and by its evaluations."""
        return {"exchange": {"training": self.traffic(), "evaluation": self.evaluation.traffic()}}

    def traffic(self) -> dict:
        lanes = {name: exchange.traffic() for name, exchange in self.lanes.items()}
        total = {key: sum(lane[key] for lane in lanes.values()) for key in next(iter(lanes.values()))}
        return {**total, "lanes": lanes} if len(lanes) > 1 else total

    def end_epoch(self, record: dict) -> None:
        """A collective: rank 0's ``record`` gets every rank's bytes of the epoch and its CPU seconds."""
        now = self.traffic()
        since = since_last(now, self._last)
        self._last = now
        mine = (since, record.get("cpu_seconds"))
        world = self.world
        ranks = world.gather_objects(mine, "gathering the bytes exchanged") if world.distributed else [mine]
        record["exchange"] = None if ranks is None else [bytes_ for bytes_, _ in ranks]  # None: not rank 0
        record["cpu_seconds_per_rank"] = None if ranks is None else [seconds for _, seconds in ranks]


def since_last(now: dict, last: dict) -> dict:
    return {key: since_last(value, last.get(key, {})) if isinstance(value, dict) else value - last.get(key, 0)
            for key, value in now.items()}
