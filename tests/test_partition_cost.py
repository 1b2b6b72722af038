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
from neutronorch.data.partition import assign, write_partition
from neutronorch.data.partition_files import load_partition
from neutronorch.errors import ConfigError
from neutronorch.nn.models import GNN
from neutronorch.orchestration.partition_cost import (CostInputs, Degrees, batch_bytes, empty_batch_bytes,
                                                      evaluation_bytes, frontier, machine_memory, of_partition,
                                                      training_bytes)
from neutronorch.orchestration.remote_rows import RemoteRows
from neutronorch.sampling.neighbor_sampler import NeighborSampler, batch_key
from neutronorch.sampling.partitioned import PartitionedSampler
from neutronorch.train.distributed import World
from neutronorch.train.part_eval import PartEvaluation
from test_partitioned_sampling import run_threads

SPEC = "synthetic:nodes=20000,degree=8,features=8"
FANOUTS, BATCH, TOLERANCE = [6, 4], 96, 0.08


@pytest.fixture(scope="module")
def graph():
    return load_dataset(SPEC)


@pytest.fixture(scope="module")
def folders(graph, tmp_path_factory):
    out = {}
    for method, parts in (("random", 2), ("metis", 2), ("metis", 4)):
        folder = tmp_path_factory.mktemp("parts") / f"{method}-{parts}"
        write_partition(graph, assign(graph, parts, method, seed=0), parts, folder, method, 0, SPEC)
        out[method, parts] = folder
    return out


def epoch_shares(folder, parts: int, dealing: str) -> list[list[np.ndarray]]:
    """Per rank, its seeds of each global batch of one epoch (the training vertices shuffled, cut into batches
    of ``BATCH * parts``): split by position, or the seeds its part owns (as ``orchestration/seeds.py`` deals
    them)."""
    part_of = np.asarray(load_partition(folder, 0, verify=False).part_of)
    train = np.asarray(load_partition(folder, 0, verify=False).global_splits["train_idx"], np.int64)
    order = np.random.default_rng(3).permutation(train)
    batches = [order[i:i + BATCH * parts] for i in range(0, order.shape[0], BATCH * parts)]
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


def test_a_hot_share_replaces_the_last_hops_draws_and_rows_with_hidden_rows():
    cold, hot = batch_bytes(toy(), 0, 100), batch_bytes(toy(hot=0.5), 0, 100)
    bottom = frontier(toy(), 0, 100)[-2]
    assert hot["hot"] == pytest.approx(bottom["remote"] * 0.5 * 16 * 4)
    assert hot["rows"] < cold["rows"] and hot["sampling"] < cold["sampling"] and cold["hot"] == 0


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
    assert memory["total"] == pytest.approx(sum(v for k, v in memory.items() if k != "total"))


@pytest.mark.parametrize("bad", [dict(dealing="rank"), dict(hot=1.5), dict(cut=-0.1), dict(batch_size=0)])
def test_inputs_out_of_range_are_refused_saying_what_to_give(bad):
    with pytest.raises(ConfigError, match="give"):
        toy(**bad)
