"""The cost model of partitioned training's bytes between ranks (``orchestration/partition_cost.py``) against
the bytes ``Exchange`` counts when the ranks (threads of one process) sample, fetch rows and evaluate across the
parts: an epoch of seeds dealt by position and by owner, random and METIS parts, and full-neighbour
evaluation."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from neutronorch.data import load_dataset
from neutronorch.data.partition_files import load_partition
from neutronorch.errors import ConfigError
from neutronorch.nn.models import GNN
from neutronorch.orchestration.neutronorch.parts import OwnerHotSet
from neutronorch.orchestration.neutronorch.planner import Planner
from neutronorch.orchestration.partition_cost import (CostInputs, Degrees, empty_batch_bytes, epoch_seconds,
                                                      evaluation_bytes, frontier, machine_memory, of_partition,
                                                      rank_batches, training_bytes)
from neutronorch.orchestration.partition_cost_hot import neutronorch_bytes
from neutronorch.orchestration.remote_rows import RemoteRows
from neutronorch.sampling.exchange import Lane, ThreadExchange
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key, layer_key
from neutronorch.sampling.partitioned import PartitionedSampler
from neutronorch.train.distributed import World
from neutronorch.train.part_eval import PartEvaluation
from test_partitioned_sampling import partition_folders, run_threads

SPEC = "synthetic:nodes=20000,degree=8,features=8"
FANOUTS, BATCH, TOLERANCE = [6, 4], 96, 0.08


@pytest.fixture(scope="module")
def graph():
    return load_dataset(SPEC)


@pytest.fixture(scope="module")
def folders(graph, tmp_path_factory):
    return partition_folders(graph, SPEC, (("random", 2), ("metis", 2), ("metis", 4)), 0, tmp_path_factory)


def epoch_batches(folder, parts: int) -> list[np.ndarray]:
    """The epoch's global batches (the training vertices shuffled, cut into batches of ``BATCH * parts``)."""
    train = np.asarray(load_partition(folder, 0, verify=False).global_splits["train_idx"], np.int64)
    order = np.random.default_rng(3).permutation(train)
    return [order[i:i + BATCH * parts] for i in range(0, order.shape[0], BATCH * parts)]


def epoch_shares(folder, parts: int, dealing: str) -> list[list[np.ndarray]]:
    """Per rank, its seeds of each global batch of one epoch (the training vertices shuffled, cut into batches
    of ``BATCH * parts``): split by position, or the seeds its part owns (as ``orchestration/seeds.py`` deals
    them)."""
    part_of = np.asarray(load_partition(folder, 0, verify=False).part_of)
    batches = epoch_batches(folder, parts)
    if dealing == "position":
        return [[np.array_split(batch, parts)[r] for batch in batches] for r in range(parts)]
    return [[batch[part_of[batch] == r] for batch in batches] for r in range(parts)]


@pytest.mark.parametrize("dealing", ["position", "owner"])
@pytest.mark.parametrize("method,parts", [("random", 2), ("metis", 2), ("metis", 4)])
def test_an_epochs_training_bytes_are_the_models(folders, method, parts, dealing):
    folder = folders[method, parts]
    shares = epoch_shares(folder, parts, dealing)

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        sampler, fetcher = PartitionedSampler(part, exchange, FANOUTS), RemoteRows(part, exchange)
        for k, seeds in enumerate(shares[r]):
            sub = sampler.sample(seeds, batch_key(5, 0, k))
            fetcher.fetch(sub.frontiers[0].numpy(), labelled=seeds.shape[0])
        return exchange.traffic()

    measured = run_threads(rank, parts)
    inputs = of_partition(folder, FANOUTS, BATCH, dealing=dealing)
    for r, traffic in enumerate(measured):
        model = training_bytes(inputs, r)["total"]
        assert traffic["exchanges"] == len(shares[r]) * (3 * len(FANOUTS) + 2)
        for direction in ("sent_bytes", "received_bytes"):
            assert abs(traffic[direction] / model - 1) < TOLERANCE, (r, direction, traffic, model)


@pytest.mark.parametrize("method,parts", [("random", 2), ("metis", 4)])
def test_an_evaluations_bytes_are_the_models(graph, folders, method, parts):
    folder, chunk = folders[method, parts], 1500
    torch.manual_seed(0)
    net = GNN("sage", graph.feature_dim, 16, graph.num_classes, 2).eval()
    nodes = np.concatenate([graph.val_idx, graph.test_idx]).astype(np.int64)

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        PartEvaluation(part, exchange, World()).logits(net, nodes[np.asarray(part.part_of[nodes]) == r],
                                                       torch.device("cpu"), chunk)
        return exchange.traffic()

    measured = run_threads(rank, parts)
    inputs = of_partition(folder, FANOUTS, BATCH, hidden=16, eval_batch_size=chunk)
    for r, traffic in enumerate(measured):
        model = evaluation_bytes(inputs, r)["total"]
        for direction in ("sent_bytes", "received_bytes"):
            assert abs(traffic[direction] / model - 1) < TOLERANCE, (r, direction, traffic, model)


def test_the_frontier_is_the_whole_graph_samplers_and_needs_the_degrees(graph, folders):
    """A batch's frontier per hop, its vertices de-duplicated: the model by degree class is within a few per
    cent of what the sampler draws; every vertex at the mean degree overcounts the last hop by far more."""
    inputs = of_partition(folders["random", 2], [10, 10], 512)
    sampler = NeighborSampler(graph.indptr, graph.indices, [10, 10])
    order = np.random.default_rng(0).permutation(np.asarray(graph.train_idx, np.int64))
    sizes = np.mean([[f.shape[0] for f in sampler.sample(order[i * 512:(i + 1) * 512], batch_key(1, 0, i)).frontiers]
                     for i in range(3)], axis=0)[::-1]
    model = [h["own"] + h["remote"] for h in frontier(inputs, 0, 512)]
    flat = [h["own"] + h["remote"] for h in frontier(replace(inputs, degrees=Degrees.uniform(
        inputs.nodes, inputs.edges, inputs.train)), 0, 512)]
    assert abs(model[-1] / sizes[-1] - 1) < 0.05 and abs(model[1] / sizes[1] - 1) < 0.05, (model, sizes)
    assert flat[-1] / sizes[-1] > 1.15, (flat, sizes)


def test_a_batch_without_seeds_costs_exactly_the_announced_sizes_and_seed_counts(folders):
    """Every rank takes part in every exchange, also with nothing to ask: what it then sends is the model's
    fixed cost of a batch (per hop the ids' sizes; the rows' request sizes and its count of seeds per rank)."""
    folder = folders["metis", 4]

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        sampler, fetcher = PartitionedSampler(part, exchange, FANOUTS), RemoteRows(part, exchange)
        sub = sampler.sample(np.zeros(0, np.int64), batch_key(5, 0, 0))
        fetcher.fetch(sub.frontiers[0].numpy(), labelled=0)
        return exchange.traffic()

    expected = sum(empty_batch_bytes(of_partition(folder, FANOUTS, BATCH)).values())
    for traffic in run_threads(rank, 4):
        assert traffic["sent_bytes"] == traffic["received_bytes"] == expected


def toy(**options) -> CostInputs:
    values = dict(nodes=100_000, edges=1_000_000, train=10_000, eval_nodes=20_000, ranks=4, fanouts=(5, 5),
                  batch_size=100, feature_dim=32, cut=0.2, hidden=16)
    return CostInputs(**{**values, **options})


def test_neutronorch_at_ratio_0_costs_exact_modes_bytes_and_the_lanes_agreements():
    """Nothing hot: the cold sampler draws and fetches what exact mode does; what is added is each lane unit's
    agreement (a byte to every other rank), per super-batch the host's sizes, seed count and version, and each
    lane's last agreement."""
    for inputs in (toy(), toy(ranks=2, fanouts=(5, 5, 5))):
        exact, none = training_bytes(inputs, 0), neutronorch_bytes(replace(inputs, hot_ratio=0.0), 0)
        batches = sum(count for seeds, count in rank_batches(inputs, 0))
        super_batches = -(-batches // inputs.super_batch)
        others = inputs.ranks - 1
        units = batches * (len(inputs.fanouts) + 1) + super_batches * 3 + 3
        assert none["gradient"] == none["hot"] == none["computed"] == 0
        assert none["total"] == pytest.approx(exact["total"] + others * (units + super_batches * (8 + 16 + 8)))


def assert_the_ratio_moves_bytes_to_the_host(got: list[dict]) -> None:
    """``got``: a NeutronOrch model's bytes at ratios 0, 0.2, 0.5 and 1. The cold lane moves less and the host's
    and gradient's more as the ratio grows; the upper hops are sampled whatever is hot; the hot set is the
    ratio's share of the distinct destinations (per type on a typed graph), at ratio 1 all but the seeds."""
    assert all(a["cold"] > b["cold"] for a, b in zip(got, got[1:]))
    assert all(a["host"] < b["host"] and a["gradient"] < b["gradient"] for a, b in zip(got, got[1:]))
    assert all(a["reuse_rate"] < b["reuse_rate"] for a, b in zip(got, got[1:]))
    assert got[0]["plan"] == got[-1]["plan"]
    assert got[1]["hot"] == pytest.approx(0.2 * got[1]["reached"])
    assert 0.8 * got[-1]["reached"] < got[-1]["hot"] < got[-1]["reached"]


def test_a_higher_hot_ratio_moves_cold_bytes_to_the_host():
    got = [neutronorch_bytes(toy(hot_ratio=ratio), 0) for ratio in (0.0, 0.2, 0.5, 1.0)]
    assert_the_ratio_moves_bytes_to_the_host(got)
    # A hot row moves hidden floats: in bfloat16 the host's rows back cost half.
    half = neutronorch_bytes(toy(hot_ratio=0.5, hot_row_bytes=2), 0)
    assert half["host"] < got[2]["host"] and half["cold"] == got[2]["cold"]


SUPER_BATCH = 4


@pytest.mark.parametrize("ratio", [0.25, 0.6])
@pytest.mark.parametrize("method,parts", [("random", 2), ("metis", 4)])
def test_neutronorchs_lanes_move_the_models_bytes(graph, folders, method, parts, ratio):
    """The lanes of NeutronOrch mode on the parts, each over an exchange of its own, as the planner, the cold
    sampler, the host and the trainer use them (their collectives in one thread per rank): an epoch's bytes
    per lane are the model's."""
    folder = folders[method, parts]
    shares, batches = epoch_shares(folder, parts, "owner"), epoch_batches(folder, parts)
    groups = [ThreadExchange.group(parts, timeout=60) for _ in range(3)]
    hidden, key = 16, lambda index: batch_key(5, 0, index)  # noqa: E731

    def rank(r, gradients):
        part = load_partition(folder, r, verify=False)
        lanes = {name: Lane(group[r], name) for name, group in zip(("plan", "cold", "host"), groups)}
        upper, cold = PartitionedSampler(part, lanes["plan"], FANOUTS), PartitionedSampler(part, lanes["cold"], FANOUTS)
        own, rows, hot_rows = PartitionedSampler(part, None, FANOUTS), RemoteRows(part, lanes["cold"]), RemoteRows(
            part, lanes["host"])
        owner, planner = OwnerHotSet(part, lanes["host"], gradients, lambda t: t), Planner(graph, FANOUTS[-1])
        for first in range(0, len(shares[r]), SUPER_BATCH):
            indices = range(first, min(first + SUPER_BATCH, len(shares[r])))
            uppers = [(i, key(i), upper.sample(shares[r][i], key(i), FANOUTS[:-1])) for i in indices]
            plan = planner.plan(first, 0, uppers, ratio, fresh=[batches[i] for i in indices])
            for item in plan.batches:
                dst = item.upper.frontiers[0].numpy()[item.cold_pos]
                _, frontier = cold.sample_hop(dst, FANOUTS[-1], layer_key(item.key, len(FANOUTS) - 1))
                rows.fetch(frontier.numpy(), labelled=shares[r][item.index].shape[0])
            asks = owner.exchange(plan.hot)
            _, frontier = own.sample_hop(asks.computed, FANOUTS[-1], layer_key(plan.batches[0].key, len(FANOUTS) - 1))
            hot_rows.fetch(frontier.numpy())
            owner.assemble(torch.zeros((asks.computed.shape[0], hidden)), asks, plan.hot.shape[0], 0)
            owner.gradient_by_type({None: torch.zeros((plan.hot.shape[0], hidden))}, asks, {}, hidden)
        for lane in lanes.values():
            lane.finish()
        return {**{name: lane.traffic() for name, lane in lanes.items()}, "gradient": gradients.traffic()}

    measured = run_threads(rank, parts)
    inputs = of_partition(folder, FANOUTS, BATCH, hidden=hidden, hot_ratio=ratio, super_batch=SUPER_BATCH)
    for r, lanes in enumerate(measured):
        model = neutronorch_bytes(inputs, r)
        total = sum(lane["sent_bytes"] for lane in lanes.values())
        assert abs(total / model["total"] - 1) < TOLERANCE, (r, lanes, model)
        assert lanes["plan"]["sent_bytes"] == pytest.approx(model["plan"], rel=TOLERANCE)
        # The gradient lane carries a rank's few remote hot rows (about 100 in an epoch of 4 ranks at 0.25).
        for lane, within in (("cold", 0.15), ("host", 0.15), ("gradient", 0.25)):
            assert abs(lanes[lane]["sent_bytes"] / model[lane] - 1) < within, (r, lane, lanes, model)


def test_owner_dealing_moves_fewer_bytes_the_smaller_the_cut():
    by_position = training_bytes(toy(dealing="position"), 0)["total"]
    owner = [training_bytes(toy(dealing="owner", cut=cut), 0)["total"] for cut in (0.05, 0.2, 0.5)]
    assert owner[0] < owner[1] < owner[2] < by_position
    # Dealt by position, the cut does not change a rank's frontier: its seeds are any part's.
    assert training_bytes(toy(dealing="position", cut=0.05), 0)["total"] == pytest.approx(by_position)


def test_a_machines_memory_counts_its_part_and_the_whole_graphs_maps():
    memory = machine_memory(toy())
    assert memory["features"] == 25_000 * 32 * 4
    assert memory["topology"] == 8 * 25_001 + 4 * 250_000
    assert memory["id_maps"] == 100_000 * 8 + 8 * 30_000
    # The vertex maps are sized to a batch's and a chunk's frontiers, not to the graph.
    assert memory["vertex_maps"] == pytest.approx(machine_memory(toy(nodes=1_000_000, edges=10_000_000))["vertex_maps"],
                                                  rel=0.05)
    assert memory["vertex_maps"] < 16 * 100_000
    assert memory["total"] == pytest.approx(sum(v for k, v in memory.items() if k != "total"))


@pytest.mark.parametrize("bad", [dict(dealing="rank"), dict(hot_ratio=1.5), dict(cut=-0.1), dict(batch_size=0),
                                 dict(super_batch=0)])
def test_inputs_out_of_range_are_refused_saying_what_to_give(bad):
    with pytest.raises(ConfigError, match="give"):
        toy(**bad)


def test_exact_modes_model_refuses_a_hot_ratio_saying_where_neutronorchs_is():
    with pytest.raises(ConfigError, match="neutronorch_bytes"):
        training_bytes(toy(hot_ratio=0.2), 0)
    with pytest.raises(ConfigError, match="neutronorch_bytes"):
        epoch_seconds(toy(hot_ratio=0.2), 10.0)
    hot = toy(hot_ratio=0.2)
    assert epoch_seconds(hot, 10.0, train=neutronorch_bytes(hot, 0))["train_network"] < epoch_seconds(toy(), 10.0)[
        "train_network"]
