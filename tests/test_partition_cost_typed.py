"""The cost model of a typed graph's parts (``orchestration/partition_cost_typed.py``) against the bytes
``Exchange`` counts when the ranks (threads of one process) sample across the parts, fetch each featured type's
rows, fetch the embedding tables' rows and send their gradient rows back (``train/part_tables.py``), per lane
as a run's summary counts them, for an epoch's batches dealt by owner and for the sampled evaluation; and the
bytes of a batch without seeds exactly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from test_partitioned_sampling import run_threads

from neutronorch.data.partition_files import load_partition
from neutronorch.data.partition_typed import assign_typed, write_typed_partition
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.errors import ConfigError
from neutronorch.orchestration.partition_cost_typed import (TypedCostInputs, evaluation_bytes, fixed_bytes,
                                                            of_typed_partition, training_bytes)
from neutronorch.sampling.exchange import ThreadExchange
from neutronorch.sampling.neighbor_sampler import batch_key
from neutronorch.sampling.partitioned_typed import PartitionedTypedSampler
from neutronorch.train.part_tables import OwnedTable, PartTables
from neutronorch.train.part_typed import TypedRemoteRows

pytestmark = pytest.mark.usefixtures("one_thread")
FANOUTS, BATCH, WIDTH, CHUNK, TOLERANCE = [5, 3], 64, 8, 512, 0.06


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    graph = synthetic_typed(nodes=12000, degree=6, features=8, train=0.1, val=0.05, seed=2).with_reverse()
    out = tmp_path_factory.mktemp("typed-cost") / "p2"
    write_typed_partition(graph, assign_typed(graph, 2, "random", 0), 2, out, "random", 0, "synthetic-typed")
    return out


def tables_of(part) -> PartTables:
    """The part's rows of a table of ``WIDTH`` floats for each featureless type, split by owner."""
    tables = PartTables(part, None)
    tables.tables = {t: OwnedTable(torch.zeros(part.ids[t].shape[0], WIDTH), t) for t in part.node_types
                     if not part.feature_dims.get(t)}
    return tables


def step(part, sampler, rows, tables, seeds, key, grads: bool = True) -> None:
    """One batch as a typed part's run exchanges it: sampled, its featured rows and its tables' rows fetched,
    then (``grads``) the tables looked up and their gradient rows sent to their owners."""
    sub = sampler.sample(seeds, key)
    rows.rows(sub.input_nodes)
    tables.fetch(sub.input_nodes, grad=grads)
    if grads:
        looked = [table(table.fetched[0]) for table in tables.tables.values() if table.fetched is not None]
        if looked:
            sum(r.sum() for r in looked).backward()
        tables.reduce(float(seeds.shape[0]))


def measure(folder, parts: int, batches, fanouts, grads: bool = True) -> list[dict]:
    """Per rank, the bytes of its ``batches[rank]`` (seeds, key) on the sampling lane and the tables'."""
    tables_lane = ThreadExchange.group(parts, timeout=60)

    def rank(r, exchange):
        part = load_partition(folder, r, verify=False)
        sampler, rows, tables = PartitionedTypedSampler(part, exchange, fanouts), TypedRemoteRows(part, exchange), \
            tables_of(part)
        tables.exchange = tables_lane[r]
        for seeds, key in batches[r]:
            step(part, sampler, rows, tables, seeds, key, grads)
        return {"sampling": exchange.traffic(), "tables": tables_lane[r].traffic()}

    return run_threads(rank, parts)


def assert_near(measured: dict, model: dict, what: str, tolerance: float = TOLERANCE) -> None:
    for lane in ("sampling", "tables"):
        for direction in ("sent_bytes", "received_bytes"):
            ratio = measured[lane][direction] / model[f"lane_{lane}"]
            assert abs(ratio - 1) < tolerance, (what, lane, direction, ratio, measured, model)


def test_an_epochs_bytes_per_lane_are_the_models(folder):
    part = load_partition(folder, 0, verify=False)
    train, owners = np.asarray(part.global_splits["train_idx"]), np.asarray(part.part_of[part.target])
    order = np.random.default_rng(3).permutation(train)
    batches = [order[i:i + 2 * BATCH] for i in range(0, order.shape[0], 2 * BATCH)]
    dealt = [[(b[owners[b] == r], batch_key(5, 0, k)) for k, b in enumerate(batches)] for r in range(2)]
    measured = measure(folder, 2, dealt, FANOUTS)
    inputs = of_typed_partition(folder, FANOUTS, BATCH, table_width=WIDTH)
    one = replace(inputs, classes=None)
    for r in range(2):
        model = training_bytes(inputs, r)
        assert_near(measured[r], model, f"rank {r}")
        # one class (every vertex at its type's mean degrees) misses by far more: the degrees matter
        assert training_bytes(one, r)["total"] > 1.2 * model["total"]


def test_the_sampled_evaluations_bytes_are_the_models(folder):
    part = load_partition(folder, 0, verify=False)
    owners = np.asarray(part.part_of[part.target])
    evaluated = np.concatenate([part.global_splits["val_idx"], part.global_splits["test_idx"]])
    mine = [evaluated[owners[evaluated] == r] for r in range(2)]
    chunks = max(-(-m.shape[0] // CHUNK) for m in mine)
    batches = [[(m[c * CHUNK:(c + 1) * CHUNK], 7) for c in range(chunks)] for m in mine]
    measured = measure(folder, 2, batches, [4, 4], grads=False)
    inputs = of_typed_partition(folder, FANOUTS, BATCH, table_width=WIDTH, eval_fanouts=(4, 4), eval_batch_size=CHUNK)
    for r in range(2):
        model = evaluation_bytes(inputs, r)
        measured[r]["sampling"] = {d: v + 8 for d, v in measured[r]["sampling"].items()}  # the chunk counts' swap
        assert_near(measured[r], model, f"evaluation, rank {r}", 0.08)  # a few chunks: more spread


def test_a_batch_without_seeds_costs_its_headers_sizes_and_weights_exactly(folder):
    none = np.zeros(0, np.int64)
    measured = measure(folder, 2, [[(none, 1)], [(none, 1)]], FANOUTS)
    fixed = fixed_bytes(of_typed_partition(folder, FANOUTS, BATCH), len(FANOUTS))
    for r in range(2):
        for direction in ("sent_bytes", "received_bytes"):
            assert measured[r]["sampling"][direction] == fixed["sampling"] + fixed["rows"]
            assert measured[r]["tables"][direction] == fixed["tables"]


def test_the_inputs_refuse_what_they_cannot_model(folder, tmp_path):
    given = dict(num_nodes={"a": 10}, relations={("a", "to", "a"): 30}, target="a", train=5, eval_nodes=5, ranks=2,
                 fanouts=(2,), batch_size=4, feature_dims={"a": 4}, cut={("a", "to", "a"): 0.5})
    whole = training_bytes(TypedCostInputs(**given), 0)
    half = training_bytes(TypedCostInputs(**given, feature_bytes={"a": 2}), 0)  # float16 rows
    fixed = fixed_bytes(TypedCostInputs(**given), 1)["rows"]
    assert whole["total"] > 0 and half["sampling"] == whole["sampling"]
    # a remote row's 8-byte id and 4 features of 2 bytes, not 4
    assert (half["rows"] - fixed) / (whole["rows"] - fixed) == pytest.approx((8 + 4 * 2) / (8 + 4 * 4))
    with pytest.raises(ConfigError, match="target"):
        TypedCostInputs(**{**given, "target": "b"})
    with pytest.raises(ConfigError, match="cut"):
        TypedCostInputs(**{**given, "cut": {}})
    manifest = (folder / "partition.json").read_text()
    (tmp_path / "partition.json").write_text(manifest.replace('"kind": "typed"', '"kind": "homogeneous"'))
    with pytest.raises(ConfigError, match="not a typed graph"):
        of_typed_partition(tmp_path, FANOUTS, BATCH)
