"""The exchange of a partitioned run's ranks over ``torch.distributed`` (``sampling.exchange.Exchange``; gloo
on the CPU): one ``all_to_all_single`` of a byte buffer, after one of the sizes when the receiver does not know them.
Each collective has the run's ``dist_timeout`` and fails with a message naming what failed."""

from __future__ import annotations

import contextlib
import datetime

import numpy as np
import torch

from neutronorch.sampling.exchange import Exchange
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

    def _swap(self, send: np.ndarray, send_sizes: list[int], sizes: list[int] | None
              ) -> tuple[np.ndarray, list[int]]:
        world, dist = self.world, torch.distributed
        if sizes is None:
            announced = torch.empty(self.size, dtype=torch.int64)
            with world._collective(f"{self.what} (sizes)"):
                dist.all_to_all_single(announced, torch.tensor(send_sizes, dtype=torch.int64), group=self.group)
            sizes = announced.tolist()
        out = torch.empty(sum(sizes), dtype=torch.uint8)
        with world._collective(self.what):
            dist.all_to_all_single(out, torch.from_numpy(send), list(sizes), list(send_sizes), group=self.group)
        return out.numpy(), list(sizes)
