"""The hot-row computer: each super-batch's hot vertices' bottom layer, on the host.

``compute`` is the body of thread ``neutronorch-host``; it owns its sampler and copy of the bottom layer.
Per plan it samples H_s's bottom hop once and gathers its features, waits for the snapshot the schedule
assigns to s, computes the rows with the device layer's own code in training mode (dropout masks keyed by
super-batch and vertex; batch normalisation over the hot rows) and hands the frozen ``HotEmbeddings`` over
on the ``hot`` channel. An empty hot set costs only taking its snapshot.
"""

from __future__ import annotations

import copy

import torch

from neutronorch.config import NeutronOrchConfig
from neutronorch.nn.activation import dropout_keys
from neutronorch.nn.precision import cpu_bf16_units
from neutronorch.observe import Spans
from neutronorch.orchestration.channel import Channel, Closed
from neutronorch.orchestration.neutronorch.node import Exchange, NodeHotSet
from neutronorch.orchestration.neutronorch.planner import Plan
from neutronorch.orchestration.neutronorch.versions import HotEmbeddings, Schedule, Snapshot
from neutronorch.orchestration.pipeline import use_threads
from neutronorch.sampling.neighbor_sampler import NeighborSampler, mix_key

HOST_DROPOUT = 0xD7  # mixed into a super-batch's key for the dropout masks of its hot rows


class HotRowComputer:
    """``kind`` (``mode.py``) gives the graph, its rows, its samplers and, on a typed graph, ``needs``: where
    the ids of the table rows (of ``tables``' types) each hot frontier reads go to the trainer."""

    def __init__(self, kind, config: NeutronOrchConfig, schedule: Schedule, bottom: torch.nn.Module,
                 snapshots: Channel, hot: Channel, spans: Spans, threads: int, node: NodeHotSet | None = None,
                 tables: tuple[str, ...] = ()):
        self.kind, self.store = kind, kind.source
        self.needs, self.tables, self.device = kind.needs, tables, kind.device
        # Hot rows go out in the training precision. The host computes them in bfloat16 where the CPU does
        # it natively; elsewhere it reads float32 rows, computes in float32 and rounds the table once.
        self.table_dtype = torch.float32 if self.needs is not None else self.store.dtype
        self.host_bf16 = self.table_dtype == torch.bfloat16 and bool(cpu_bf16_units())
        if not self.host_bf16 and self.needs is None:
            self.store = self.store.as_dtype(torch.float32)
        self.track_grad = config.hot_grad == "cpu"
        self.schedule = schedule
        self.template = copy.deepcopy(bottom).cpu().train()  # parameters replaced by each snapshot's
        self.snapshots, self.hot = snapshots, hot
        self.spans, self.threads = spans, threads
        self.node = node  # hot_set="node": rows shared with the node's other ranks computed once (node.py)
        self.copy_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # One plan of room: planning stays at most two super-batches ahead (so it reads a recent ratio
        # setting), yet plans s + 1 while s is computed.
        self.planned = Channel("plans", capacity=1)

    def compute(self, start: int = 0) -> None:
        """The hot embeddings of every planned super-batch from ``start`` on, in order."""
        use_threads(self.threads)
        sampler = self.kind.host_sampler()
        try:
            for super_batch_id in range(start, self.schedule.total):
                plan = self.planned.take(super_batch_id)
                if len(plan.hot) == 0 and self.node is None:
                    self._nothing_hot(plan)
                    continue
                self._finish_hot(plan, *self._gather_hot(plan, sampler))
        except Closed:
            return
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer through the hot channel
            self.hot.fail(exc)  # wakes a trainer waiting for hot embeddings
            if self.needs is not None:
                self.needs.fail(exc)  # ... or for the table ids of a typed snapshot

    def close(self) -> None:
        self.planned.close()

    def _gather_hot(self, plan: Plan, sampler: NeighborSampler):
        """The bottom hop of H_s (of the rows this rank computes) and its raw features. It uses the key of
        the super-batch's first mini-batch: with P = 1 the host draws exactly what the device would."""
        exchange = None
        if self.node is not None:
            with self.spans.stage("host_share"):
                exchange = self.node.exchange(plan.hot)
        with self.spans.stage("host_sample"):
            hot = plan.hot if exchange is None else self.node.computed(plan.hot, exchange)
            block, frontier = self.kind.bottom_hop(sampler, hot, plan.batches[0].key, plan.exclude)
        if self.needs is not None:  # the table rows' ids as soon as they are known: the snapshot waits for them
            self.needs.put(plan.super_batch_id, {t: frontier[t].cpu() for t in self.tables if t in frontier})
        with self.spans.stage("host_gather"):
            if self.needs is None:
                return block, self.store.gather(frontier), exchange
            x, _ = self.store(frontier, torch.device("cpu"))
        return block, x, exchange

    def _finish_hot(self, plan: Plan, block, x: torch.Tensor, exchange: Exchange | None) -> None:
        with self.spans.stage("host_wait_weights"):
            snapshot: Snapshot = self.snapshots.take(plan.super_batch_id)
            if snapshot.ready is not None:
                snapshot.ready.synchronize()
        separable = getattr(self.template, "separable", False)
        bf16 = torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.host_bf16)
        masks = dropout_keys(mix_key(plan.batches[0].key, HOST_DROPOUT))
        # A typed graph's featureless types read the snapshot's table rows, leaves of the host's graph.
        rows = {t: r.detach().requires_grad_(self.track_grad) for t, r in snapshot.rows.items()}
        with torch.set_grad_enabled(self.track_grad), bf16, masks:
            # Separable layers (SAGE, GCN): the same two calls that define the device layer, timed apart.
            with self.spans.stage("host_aggregate" if separable else "host_compute"):
                layer, params = layer_holding(self.template, snapshot.params, self.track_grad)
                x = {**x, **rows} if isinstance(x, dict) else x
                output = layer.aggregate(block, x) if separable else layer(block, x)
            if separable:
                with self.spans.stage("host_matmul"):
                    output = layer.transform(block.dst_rows(x), output)
        if isinstance(output, dict):  # a typed graph: one table per hot type, copied to the device here
            return self._hand_over_typed(plan, snapshot, block, {t: y for t, y in output.items() if len(y)}, params,
                                         rows, exchange)
        table = output.detach().to(self.table_dtype)
        if exchange is not None:
            with self.spans.stage("host_share"):
                table = self.node.assemble(table, exchange, plan.hot.shape[0], snapshot.version)
        # Complete before it crosses (frozen); from then on only the trainer writes the float32 accumulator.
        if self.copy_stream is not None:
            with self.spans.stage("host_copy"):
                table, grad_acc, ready, keep = self._copy_to_device(table)
        else:
            grad_acc = torch.zeros(table.shape, dtype=torch.float32) if self.track_grad else None
            ready, keep = None, ()
        self.hot.put(plan.super_batch_id, HotEmbeddings(
            plan.super_batch_id, snapshot.version, table, plan.hot.shape[0], plan.hot, host_edges=block.num_edges,
            exchange=exchange, grad_acc=grad_acc, output=output if self.track_grad else None,
            params=params if self.track_grad else None, ready=ready, keep=keep))

    def _hand_over_typed(self, plan: Plan, snapshot: Snapshot, block, output: dict, params: list,
                         rows: dict, exchange: Exchange | None) -> None:
        """``_finish_hot``'s end on a typed graph: a table per hot type on the device."""
        tables = {t: y.detach() for t, y in output.items()}
        if exchange is not None:
            node, sizes = self.node, self.node.sizes(plan.hot)
            mine = [tables[t] for t in node.offsets if t in tables]
            with self.spans.stage("host_share"):
                table = node.assemble(torch.cat(mine) if mine else torch.zeros((0, self.template.out_dim)), exchange,
                                      sum(sizes), snapshot.version)
            tables = node.by_type(table, sizes)
        tables = {t: y.to(self.device) for t, y in tables.items()}
        track = self.track_grad
        grad_acc = {t: torch.zeros(y.shape, dtype=torch.float32, device=self.device) for t, y in tables.items()
                    } if track else {}
        self.hot.put(plan.super_batch_id, HotEmbeddings(
            plan.super_batch_id, snapshot.version, tables, sum(int(y.shape[0]) for y in tables.values()), plan.hot,
            host_edges=block.num_edges, exchange=exchange, grad_acc=grad_acc, output=output if track else {},
            params=params if track else None, rows=rows if track else {}, ids=snapshot.ids if track else {}))

    def _nothing_hot(self, plan: Plan) -> None:
        """An empty hot set: its rows handed over at once, versioned at the super-batch's first step (within
        the bound at every use); its snapshot taken only to be dropped."""
        if self.needs is not None:
            self.needs.put(plan.super_batch_id, {})  # its snapshot reads no table rows
        table = {} if self.needs is not None else torch.empty((0, self.template.out_dim), dtype=self.table_dtype,
                                                              device=self.device)
        first = self.schedule.first_step(plan.super_batch_id)
        self.hot.put(plan.super_batch_id, HotEmbeddings(plan.super_batch_id, first, table, 0, plan.hot))
        self.snapshots.take(plan.super_batch_id)

    def _copy_to_device(self, table: torch.Tensor) -> tuple:
        """The table on the device through a pinned buffer (to keep alive), its zeroed accumulator there, and
        the event after which both hold their data, on this thread's stream."""
        pinned = torch.empty(table.shape, dtype=table.dtype, pin_memory=True)
        pinned.copy_(table)
        with torch.cuda.stream(self.copy_stream):
            on_device = pinned.to(self.device, non_blocking=True)
            grad_acc = (torch.zeros(table.shape, dtype=torch.float32, device=self.device) if self.track_grad
                        else None)
            ready = torch.cuda.Event()
            ready.record(self.copy_stream)
        self.spans.count("device_bytes", pinned.nbytes)
        return on_device, grad_acc, ready, (pinned,)


def layer_holding(template: torch.nn.Module, values: list[torch.Tensor], track_grad: bool
                  ) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """A copy of ``template`` holding ``values`` as its parameters, and those parameters (tracked by autograd
    when ``track_grad``)."""
    layer = copy.deepcopy(template)
    params = list(layer.parameters())
    with torch.no_grad():
        for p, value in zip(params, values):
            p.copy_(value)
    for p in params:
        p.requires_grad_(track_grad)
    return layer, params
