"""The planning loop: the plans of the super-batches, in order, each also put on the ``plans`` channel to the
hot-row computer. Per super-batch it samples the upper hops of its P mini-batches (exact mode's draws), reads
the controller's published setting and plans H_s; on the host in a thread of its own, or with device
sampling in the cold sampler's thread, one super-batch ahead. It owns the epochs' seed orders; the sampler
and planner it is given belong to its thread.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

import numpy as np
import torch

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans
from neutronorch.orchestration.channel import Channel, Closed
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.neutronorch.controller import PublishedSetting
from neutronorch.orchestration.neutronorch.planner import Plan
from neutronorch.orchestration.neutronorch.versions import Schedule
from neutronorch.orchestration.seeds import NodeSeeds, SeedBatch
from neutronorch.sampling.neighbor_sampler import batch_key


class PlanLoop:
    def __init__(self, seeds: NodeSeeds | LinkSeeds, sampling: SamplingConfig, schedule: Schedule,
                 published: PublishedSetting, planned: Channel, spans: Spans):
        self.seeds, self.sampling, self.schedule = seeds, sampling, schedule
        self.published = published  # the controller's ratio setting (replaced whole by the trainer, numbered)
        self.planned = planned
        self.spans = spans
        self._batches: dict[int, list[SeedBatch]] = {}  # this rank's seeds of an epoch's batches

    def run(self, sampler, planner, start: int = 0, hot: np.ndarray | None = None,
            sample_stage: str = "hot_select") -> Iterator[Plan]:
        """Yields the plans from super-batch ``start`` on (a resumed run's first; ``hot``: its hot set, when
        it was in progress), each also put on ``planned``. ``sample_stage``: the span of the upper hops'
        sampling (on the device it is the sampler lane's work; the plan itself is ``hot_select``)."""
        sampler = self.seeds.sampler(sampler)  # a typed link task's: fed its seeds by type
        try:
            for super_batch_id in range(start, self.schedule.total):
                first = hot if super_batch_id == start else None
                plan = self._plan(super_batch_id, sampler, planner, sample_stage, first)
                self.planned.put(super_batch_id, plan)
                yield plan
        except Closed:
            return
        except BaseException as exc:
            self.planned.fail(exc)  # wakes the hot-row computer, which fails the hot channel
            raise

    def _plan(self, super_batch_id: int, sampler, planner, sample_stage: str, hot: np.ndarray | None) -> Plan:
        with self.spans.stage(sample_stage):
            epoch, first, end = self.schedule.locate(super_batch_id)
            if epoch not in self._batches:
                self._batches = {epoch: self.seeds.epoch(epoch)}
            uppers, batches = [], []
            for index in range(first, end):
                key = batch_key(self.sampling.seed, epoch, index)
                batch = self._batches[epoch][index]
                batches.append(batch)
                seeds = batch.seeds if planner.on_device else batch.seeds.numpy()
                upper = (sampler.sample_hops(seeds, key, sampler.num_layers - 1) if planner.target
                         else sampler.sample(seeds, key, self.sampling.fanouts[:-1]))
                if batch.exclude is not None:
                    upper = self.seeds.exclude(upper, batch.exclude)
                uppers.append((index, key, upper))
        with self.spans.stage("hot_select"):
            number, setting = self.published.read()
            fresh = ([self.seeds.by_type(b.batch_seeds) for b in batches]
                     if any(b.batch_seeds is not None for b in batches) else None)
            plan = planner.plan(super_batch_id, epoch, uppers, setting.ratio, setting.cap(), hot, fresh)
        # A plan is frozen: what the seeds add to it is set by making it anew, before it crosses to another thread.
        exclude = torch.cat([b.exclude for b in batches], 1) if batches and batches[0].exclude is not None else None
        return replace(plan, stats=replace(plan.stats, setting=number, ratio=setting.ratio), exclude=exclude,
                       batches=tuple(replace(item, targets=batch.targets, exclude=batch.exclude)
                                     for item, batch in zip(plan.batches, batches)))


def one_ahead(plans: Iterator[Plan]) -> Iterator[Plan]:
    """``plans``, each yielded once the next one is made: while the batches of super-batch s are loaded,
    the plan of s + 1 is already with the hot-row computer."""
    current = next(plans, None)
    while current is not None:
        upcoming = next(plans, None)
        yield current
        current = upcoming

