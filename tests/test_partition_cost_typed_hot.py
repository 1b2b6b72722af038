"""The NeutronOrch term of a typed graph's parts' cost model (``orchestration/partition_cost_typed_hot.py``): at
ratio 0 exact mode's bytes and the lanes' fixed bytes exactly, one rank moving nothing, the ratio moving bytes
from the cold sampler to the host, and an epoch's bytes per lane against those ``Exchange`` counts when the ranks
(threads of one process) plan, sample, fetch rows and table rows, and exchange hot rows and their gradients as
NeutronOrch mode's threads do."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_partition_cost import assert_the_ratio_moves_bytes_to_the_host
from test_partition_cost_typed import tables_of
from test_partitioned_sampling import run_threads

from neutronorch.data.partition_files import load_partition
from neutronorch.data.partition_typed import assign_typed, write_typed_partition
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.errors import ConfigError
from neutronorch.orchestration.neutronorch.parts_typed import TypedOwnerHotSet
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.orchestration.partition_cost import rank_batches
from neutronorch.orchestration.partition_cost_typed import TypedCostInputs, of_typed_partition, training_bytes
from neutronorch.orchestration.partition_cost_typed_hot import LANES, neutronorch_bytes
from neutronorch.sampling.exchange import Lane, ThreadExchange
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.partitioned_typed import PartitionedTypedSampler
from neutronorch.train.part_typed import TypedRemoteRows

pytestmark = pytest.mark.usefixtures("one_thread")
FANOUTS, BATCH, WIDTH, HIDDEN, SUPER_BATCH = [5, 3], 64, 8, 16, 4
TYPES = {"paper": 40_000, "author": 50_000, "field": 8_000}
RELATIONS = {("author", "writes", "paper"): 300_000, ("paper", "rev_writes", "author"): 300_000,
             ("paper", "cites", "paper"): 200_000, ("paper", "has_topic", "field"): 250_000,
             ("field", "rev_has_topic", "paper"): 250_000}


def toy(**options) -> TypedCostInputs:
    """Three types, one class a type; the author and field types featureless (tables of ``WIDTH``)."""
    values = dict(num_nodes=TYPES, relations=RELATIONS, target="paper", train=8_000, eval_nodes=2_000, ranks=4,
                  fanouts=(5, 5), batch_size=100, feature_dims={"paper": 32}, cut={r: 0.2 for r in RELATIONS},
                  hidden=HIDDEN, table_width=WIDTH, super_batch=4)
    return TypedCostInputs(**{**values, **options})


def test_at_ratio_0_it_costs_exact_modes_bytes_and_the_lanes_fixed_bytes():
    """Nothing hot: the planner and the cold sampler draw and fetch what exact mode does. What is added: each
    lane unit's agreement (a byte to every other rank: per mini-batch the upper hops, the bottom hop and each
    featured type's rows); per super-batch the host's sizes, each featured type's request and sizes and the
    version, the snapshot's fetch per table and the tables' second reduction (weights, sizes); and each lane's
    last agreement."""
    for inputs in (toy(), toy(ranks=2, fanouts=(5, 5, 5)), toy(tables=False, feature_dims={t: 8 for t in TYPES})):
        exact, none = training_bytes(inputs, 0), neutronorch_bytes(replace(inputs, hot_ratio=0.0), 0)
        batches = sum(count for seeds, count in rank_batches(inputs, 0))
        super_batches = -(-batches // inputs.super_batch)
        others, featured, tables = inputs.ranks - 1, len(inputs.feature_dims), len(inputs.table_types)
        agreements = batches * (len(inputs.fanouts) + featured) + super_batches * (2 + featured) + 3
        host = 8 + 16 * featured + 8
        table_fixed = 16 * tables + (8 * (1 + tables) + 8 * tables if tables else 0)
        assert none["gradient"] == none["hot"] == none["computed"] == 0
        assert none["plan"] + none["cold"] == pytest.approx(exact["lane_sampling"] + others * (
            batches * (len(inputs.fanouts) + featured) + 2))
        assert none["tables"] == pytest.approx(exact["tables"] + others * super_batches * table_fixed)
        assert none["total"] == pytest.approx(exact["total"] + others * (
            agreements + super_batches * (host + table_fixed)))


def test_one_rank_moves_nothing():
    got = neutronorch_bytes(toy(ranks=1, hot_ratio=0.5, cut={r: 0.0 for r in RELATIONS}), 0)
    assert all(got[lane] == 0 for lane in LANES) and got["total"] == 0
    assert got["hot"] > 0 and got["remote_hot"] == 0  # its hot rows are all its own


def test_a_higher_hot_ratio_moves_cold_bytes_to_the_host():
    got = [neutronorch_bytes(toy(hot_ratio=ratio), 0) for ratio in (0.0, 0.2, 0.5, 1.0)]
    assert_the_ratio_moves_bytes_to_the_host(got)
    # A remote hot row's dL/dY is H float32s to its owner, once a super-batch.
    super_batches = -(-sum(count for _, count in rank_batches(toy(), 0)) // SUPER_BATCH)
    assert got[2]["gradient"] == pytest.approx(got[2]["remote_hot"] * super_batches * HIDDEN * 4)
    with pytest.raises(ConfigError, match="hot ratio"):
        toy(hot_ratio=1.5)


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    graph = synthetic_typed(nodes=12000, degree=6, features=8, train=0.3, val=0.05, seed=2).with_reverse()
    out = tmp_path_factory.mktemp("typed-hot-cost") / "p2"
    write_typed_partition(graph, assign_typed(graph, 2, "random", 0), 2, out, "random", 0, "synthetic-typed")
    return graph, out


def epoch(graph, folder, ratio: float, parts: int) -> list[dict]:
    """Per rank, an epoch's bytes per lane of NeutronOrch mode at ``ratio``: the collectives of its planner,
    cold sampler, host and trainer (each lane over an exchange of its own, in one thread per rank)."""
    part0 = load_partition(folder, 0, verify=False)
    train, owners = np.asarray(part0.global_splits["train_idx"]), np.asarray(part0.part_of[part0.target])
    order = np.random.default_rng(3).permutation(train)
    batches = [order[i:i + parts * BATCH] for i in range(0, order.shape[0], parts * BATCH)]
    groups = [ThreadExchange.group(parts, timeout=60) for _ in range(5)]
    key = lambda index: batch_key(5, 0, index)  # noqa: E731

    def rank(r, gradients):
        part = load_partition(folder, r, verify=False)
        lanes = {name: Lane(group[r], name) for name, group in zip(("plan", "cold", "host"), groups)}
        upper, cold = (PartitionedTypedSampler(part, lanes[n], FANOUTS) for n in ("plan", "cold"))
        own, rows, hot_rows = (PartitionedTypedSampler(part, None, FANOUTS), TypedRemoteRows(part, lanes["cold"]),
                               TypedRemoteRows(part, lanes["host"]))
        tables, owner = tables_of(part), TypedOwnerHotSet(part, lanes["host"], groups[3][r], lambda t: t)
        tables.exchange = groups[4][r]
        planner = Planner(graph, {relation: FANOUTS[-1] for relation in graph.relations})
        mine = [b[owners[b] == r] for b in batches]
        for first in range(0, len(mine), SUPER_BATCH):
            indices = range(first, min(first + SUPER_BATCH, len(mine)))
            uppers = [(i, key(i), upper.sample_hops(mine[i], key(i), len(FANOUTS) - 1)) for i in indices]
            plan = planner.plan(first, 0, uppers, ratio, fresh=[{"paper": batches[i]} for i in indices])
            asks = owner.exchange(plan.hot)  # the host: its hot rows' owners compute them
            computed = owner.computed(plan.hot, asks)
            frontier = own.sample_bottom(computed, plan.batches[0].key).src_ids
            hot_rows.rows(frontier)
            snapshot = {t: frontier[t] for t in tables.tables if t in frontier}
            tables.rows_of(snapshot)
            owner.assemble(torch.zeros((asks.computed.shape[0], HIDDEN)), asks, sum(owner.sizes(plan.hot)), 0)
            for item in plan.batches:  # the cold sampler, then the trainer's step
                dst = item.upper.frontiers[0]
                inputs = cold.sample_bottom({t: ids[item.cold_pos[t]] for t, ids in dst.items()}, item.key).src_ids
                rows.rows(inputs)
                tables.fetch(inputs)
                looked = [table(table.fetched[0]) for table in tables.tables.values() if table.fetched is not None]
                if looked:
                    sum(x.sum() for x in looked).backward()
                apart = None
                if item is plan.batches[-1]:  # the hot rows' dL/dY to their owners, their table gradient
                    owner.gradient_by_type({t: torch.zeros((len(v), HIDDEN)) for t, v in plan.hot.items()}, asks,
                                           {t: len(v) for t, v in computed.items()}, HIDDEN)
                    apart = {id(tables.tables[t].weight): torch.sparse_coo_tensor(
                        ids.unsqueeze(0), torch.zeros((ids.shape[0], WIDTH)), tuple(tables.tables[t].weight.shape),
                        check_invariants=False)
                        for t, ids in snapshot.items()}
                tables.reduce(float(mine[item.index].shape[0]), apart)
        for lane in lanes.values():
            lane.finish()
        return {**{name: lane.traffic() for name, lane in lanes.items()}, "gradient": groups[3][r].traffic(),
                "tables": groups[4][r].traffic()}

    return run_threads(rank, parts)


@pytest.mark.parametrize("ratio", [0.0, 0.5])
def test_neutronorchs_lanes_on_typed_parts_move_the_models_bytes(typed, ratio):
    graph, folder = typed
    measured = epoch(graph, folder, ratio, 2)
    inputs = of_typed_partition(folder, FANOUTS, BATCH, hidden=HIDDEN, table_width=WIDTH, hot_ratio=ratio,
                                super_batch=SUPER_BATCH)
    for r, lanes in enumerate(measured):
        model = neutronorch_bytes(inputs, r)
        total = sum(lane["sent_bytes"] for lane in lanes.values())
        assert abs(total / model["total"] - 1) < 0.08, (r, lanes, model)
        assert lanes["plan"]["sent_bytes"] == pytest.approx(model["plan"], rel=0.08)
        within = {"cold": 0.1, "tables": 0.1, "host": 0.15, "gradient": 0.25}
        for lane, tolerance in within.items():
            if model[lane] > 0:
                assert abs(lanes[lane]["sent_bytes"] / model[lane] - 1) < tolerance, (r, lane, lanes, model)
            else:
                assert lanes[lane]["sent_bytes"] == 0, (r, lane, lanes)
