"""A partitioned run's exact mode (``PartitionedMode``, for either kind of graph: ``partitioned.py`` and
``part_typed.py`` hand it the sampler and loader of their kind), and the epoch's batches that close aligned
across the ranks (``AlignedBatches``)."""

from __future__ import annotations

import contextlib

from neutronorch.orchestration.host_loader import HOST_SAMPLING_STAGES
from neutronorch.orchestration.loading import LoadingMode
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.orchestration.remote_rows import PartitionedLoader
from neutronorch.observe import Spans
from neutronorch.orchestration.seeds import NodeSeeds
from neutronorch.train.distributed import World
from neutronorch.train.part_exchange import TrafficRecord


class PartitionedMode(LoadingMode):
    """Exact mode's placement on one part, beside ``ExactMode`` (a sibling: ``LoadingMode``'s producer thread
    samples with the partitioned sampler, ``PartitionedLoader`` or ``part_typed.TypedPartLoader`` fetches the
    rows); its batches close aligned across the ranks (``AlignedBatches``), and each epoch's record holds every
    rank's bytes exchanged (rank 0 gathers them)."""

    name = "exact"
    stages = HOST_SAMPLING_STAGES

    def __init__(self, world: World, evaluation_exchange, seeds: NodeSeeds, new_sampler, loader: PartitionedLoader,
                 sampling, spans: Spans, sampler_threads: int):
        super().__init__(seeds, loader, sampling, spans)
        self.new_sampler, self.threads = new_sampler, {"sampler": sampler_threads}
        self.traffic = TrafficRecord(world, {"sampling": loader.fetcher.exchange}, evaluation_exchange)

    def batches(self, epoch: int, start: int = 0) -> "AlignedBatches":
        limit: dict = {}
        produce = lambda: limited(self._produce(epoch, start), limit)  # noqa: E731
        return AlignedBatches(Prefetcher(produce, depth=self.sampling.prefetch, name=f"{self.name}-producer",
                                         threads=self.threads.get("sampler")), limit, max(1, self.sampling.prefetch))

    def end_epoch(self, record: dict) -> None:
        drop = getattr(self.loader, "drop_buffers", None)  # its batches are done; an evaluation may follow
        if drop is not None:
            drop()
        self.traffic.end_epoch(record)

    def summary(self) -> dict:
        return self.traffic.summary()

    def describe(self) -> str:
        return f"sampler threads {self.threads['sampler']}, partitioned"


def limited(items, limit: dict):
    """``items`` until ``limit["count"]`` of them are yielded (no limit while it is unset): the next item is not
    begun once the limit is reached."""
    for count, item in enumerate(items, start=1):
        yield item
        if count >= limit.get("count", count + 1):
            return


class AlignedBatches:
    """An epoch's batches whose early close (a stop agreed on at the same step on every rank) leaves every
    rank's producer having made the same batches. A producer runs ahead by up to ``depth`` batches and may be
    amid the exchanges of one more, and another rank's producer may be elsewhere: closed there, it would wait
    for exchanges its peers never begin. So a close first sets every rank's limit to the batches taken plus
    ``depth`` plus one, the most any producer can have begun, and takes the batches up to it (released
    unused) before the producer is joined."""

    def __init__(self, prefetcher: Prefetcher, limit: dict, depth: int):
        self._prefetcher, self._limit, self._depth, self._taken = prefetcher, limit, depth, 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._prefetcher)
        self._taken += 1
        return item

    def close(self) -> None:
        self._limit["count"] = self._taken + self._depth + 1
        with contextlib.suppress(Exception):  # a producer's failure: it has stopped, nothing to align
            for item in self._prefetcher:
                item.release()
        self._prefetcher.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
