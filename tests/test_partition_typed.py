"""`neutronorch partition` of a typed graph: the folder read back is, array for array, the parts ``split_typed``
cuts in memory from the graph with its reverse relations; METIS cuts fewer edges than random parts; every way
a folder can be wrong (a damaged or missing file, another part count, a homogeneous folder where a typed one
belongs and the reverse) is a clear error; and a typed full-copy run deals its seeds by the parts (a link task's
by a folder holding its split: tests/test_partitioned_typed_links.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import neutronorch
from neutronorch.cli import main
from neutronorch.data import load_dataset, synthetic_typed, write_typed
from neutronorch.data.partition import TOLERANCE, assign, write_partition
from neutronorch.data.partition_files import dealing_owners, load_partition, partition_summary, read_manifest
from neutronorch.data.partition_typed import STACKED, assign_typed, typed_constraints, write_typed_partition
from neutronorch.data.typed_parts import TypedPartition, split_typed
from neutronorch.errors import ConfigError, DataError
from neutronorch.orchestration.factory import build_mode

SOURCE = "synthetic-typed"


@pytest.fixture(scope="module")
def graph():
    return synthetic_typed(nodes=2000, train=0.3, val=0.1, seed=0).with_reverse()


def _write(graph, folder, parts, method, seed=0):
    assigned = assign_typed(graph, parts, method, seed)
    write_typed_partition(graph, assigned, parts, folder, method, seed, SOURCE)
    return folder, assigned[0]


def _same_part(got: TypedPartition, expected: TypedPartition) -> None:
    assert isinstance(got, TypedPartition)
    assert (got.part, got.parts, got.name, got.num_nodes, got.target) == \
        (expected.part, expected.parts, expected.name, expected.num_nodes, expected.target)
    assert list(got.num_nodes) == list(expected.num_nodes)  # the types' order kept
    for name in ("part_of", "local_index", "ids", "features", "splits", "global_splits"):
        mine, theirs = getattr(got, name), getattr(expected, name)
        assert mine.keys() == theirs.keys(), name
        for key in theirs:
            assert mine[key].dtype == theirs[key].dtype and np.array_equal(mine[key], theirs[key]), (name, key)
    assert list(got.relations) == list(expected.relations)
    for key, relation in expected.relations.items():
        assert np.array_equal(got.relations[key].indptr, relation.indptr), key
        assert np.array_equal(got.relations[key].indices, relation.indices), key
    assert np.array_equal(got.labels, expected.labels)
    assert (got.feature_dims, got.num_classes, got.metric, got.notes) == \
        (expected.feature_dims, expected.num_classes, expected.metric, expected.notes)


@pytest.mark.parametrize("parts", [1, 2, 3])
@pytest.mark.parametrize("method", ["random", "metis"])
def test_written_parts_read_back_as_the_parts_cut_in_memory(graph, tmp_path, parts, method):
    folder, owners = _write(graph, tmp_path / "p", parts, method)
    expected = split_typed(graph, owners, parts)
    for k in range(parts):
        part = load_partition(folder, k, world_size=parts)
        _same_part(part, expected[k])
        assert part.manifest["id"] == read_manifest(folder)["id"]
    manifest = read_manifest(folder)
    assert manifest["kind"] == "typed" and [tuple(r) for r in manifest["graph"]["relations"]] == list(graph.relations)
    assert any(r[1].startswith("rev_") for r in manifest["graph"]["relations"])  # the reverses are written
    assert manifest["graph"]["num_nodes"] == graph.num_nodes and manifest["graph"]["target"] == graph.target
    stats = manifest["part_stats"]
    for t, n in graph.num_nodes.items():
        assert sum(entry["nodes"][t] for entry in stats) == n
    assert sum(entry["edges"] for entry in stats) == graph.num_edges
    assert sum(entry["train"] for entry in stats) == len(graph.train_idx)
    # the cut: in-edges (every relation) whose source another part owns, counted at the destination's part
    cut = np.zeros(parts, dtype=np.int64)
    for (src, _, dst), relation in graph.relations.items():
        dst_part = np.repeat(owners[dst], np.diff(relation.indptr))
        crossing = owners[src][relation.indices] != dst_part
        cut += np.bincount(dst_part[crossing], minlength=parts)
    assert [entry["cut_edges"] for entry in stats] == cut.tolist()
    assert manifest["edge_cut"]["edges"] == int(cut.sum())


def test_random_parts_deal_each_type_from_its_own_stable_stream(graph):
    owners, balanced = assign_typed(graph, 3, "random", seed=4)
    again, _ = assign_typed(graph, 3, "random", seed=4)
    assert balanced == []
    for t, n in graph.num_nodes.items():
        assert owners[t].dtype == np.int32 and owners[t].shape == (n,)
        assert np.array_equal(owners[t], again[t])
        counts = np.bincount(owners[t], minlength=3)
        assert counts.max() - counts.min() <= 1
    # two types of one size dealt from one stream would share their owners
    same = dict(graph.num_nodes, author=graph.num_nodes["paper"])
    both, _ = assign_typed(type(graph)(**{**graph.__dict__, "num_nodes": same}), 3, "random", seed=4)
    assert not np.array_equal(both["author"], both["paper"])
    assert not np.array_equal(assign_typed(graph, 3, "random", seed=5)[0]["paper"], owners["paper"])


@pytest.fixture(scope="module")
def larger():
    return synthetic_typed(nodes=20000, train=0.3, val=0.1, seed=0).with_reverse()


@pytest.mark.parametrize("parts", [2, 3, 4])
def test_metis_cuts_fewer_edges_than_random_parts_balancing_the_types(larger, tmp_path, parts):
    _write(larger, tmp_path / "r", parts, "random")
    folder, owners = _write(larger, tmp_path / "m", parts, "metis")
    random_cut = read_manifest(tmp_path / "r")["edge_cut"]["edges"]
    manifest = read_manifest(folder)
    assert manifest["edge_cut"]["edges"] <= 0.5 * random_cut  # 0.41-0.44 of it, measured
    every = typed_constraints(larger)
    assert set(every) == {*(f"{t} vertices" for t in larger.num_nodes), "training vertices", "in-edges"}
    assert manifest["balance"] in (list(every), [STACKED])
    stacked = np.concatenate([owners[t] for t in larger.num_nodes])
    worst = max(np.bincount(stacked, weights=column, minlength=parts).max() / (column.sum() / parts)
                for column in every.values())
    # METIS leaves several constraints off balance here; the most even of its tries is kept: within 5% on 2
    # parts, 1.15 and 1.09 times the mean at most on 3 and 4 (the field vertices, hubs of has_topic edges)
    assert worst <= (TOLERANCE if parts == 2 else 1.2)
    summary = partition_summary(folder)["balance_max_over_mean"]
    assert summary["in-edges" if "in-edges" in summary else "edges"] <= worst + 1e-4
    assert all(summary[f"{t} vertices"] <= worst + 1e-4 for t in larger.num_nodes)


@pytest.fixture(scope="module")
def folder(graph, tmp_path_factory):
    return _write(graph, tmp_path_factory.mktemp("typed-parts") / "p", 2, "random")[0]


def _copy(folder, tmp_path):
    import shutil  # noqa: PLC0415
    return shutil.copytree(folder, tmp_path / "copy")


def test_a_damaged_or_missing_file_is_named(folder, tmp_path):
    copy = _copy(folder, tmp_path)
    name = "part-1/relations/author___writes___paper/indices.npy"
    data = bytearray((copy / name).read_bytes())
    data[-1] ^= 0xFF
    (copy / name).write_bytes(bytes(data))
    load_partition(copy, 0)  # part 0 reads none of part 1's files
    with pytest.raises(DataError, match=f"{name}: checksum differs.*Partition the graph again"):
        load_partition(copy, 1)
    (copy / "part-0/types/paper/features.npy").unlink()
    with pytest.raises(DataError, match="part-0/types/paper/features.npy: missing"):
        load_partition(copy, 0)
    with pytest.raises(DataError, match="features.npy.*(missing|not found|does not exist)"):
        load_partition(copy, 0, verify=False)
    (copy / "types/paper/part_of.npy").unlink()
    with pytest.raises(DataError, match="types/paper/part_of.npy: missing"):
        dealing_owners(copy, 2, graph_target_count(copy))
    info = partition_summary(copy)
    assert info["checksums"]["state"] == "3 of " + str(info["checksums"]["files"]) + " bad"


def graph_target_count(folder) -> int:
    graph = read_manifest(folder)["graph"]
    return graph["num_nodes"][graph["target"]]


def test_another_part_count_or_graph_is_refused(folder, graph):
    with pytest.raises(ConfigError, match="holds 2 parts, but the run has 3 ranks"):
        load_partition(folder, 0, world_size=3)
    with pytest.raises(ConfigError, match="part 2 is out of range"):
        load_partition(folder, 2)
    owners = dealing_owners(folder, 2, graph.num_nodes["paper"])
    assert np.array_equal(owners, load_partition(folder, 0).part_of["paper"])
    with pytest.raises(ConfigError, match="vertices of its target type paper.*has 5 of its target type"):
        dealing_owners(folder, 2, 5)


def test_a_homogeneous_folder_and_a_typed_one_are_not_mixed_up(folder, tmp_path):
    homogeneous = load_dataset("synthetic:nodes=300")
    plain = tmp_path / "plain"
    write_partition(homogeneous, assign(homogeneous, 2, "random", 0), 2, plain, "random", 0, "synthetic")
    with pytest.raises(ConfigError, match="a partition of a typed graph .* but the run's graph is homogeneous"):
        dealing_owners(folder, 2, 800, typed=False)
    with pytest.raises(ConfigError, match="a partition of a homogeneous graph .* but the run's graph is typed"):
        dealing_owners(plain, 2, 300, typed=True)
    assert dealing_owners(plain, 2, 300, typed=False).shape == (300,)
    manifest = json.loads((plain / "partition.json").read_text())
    (plain / "partition.json").write_text(json.dumps({**manifest, "kind": "tabular"}))
    with pytest.raises(DataError, match="kind 'tabular'"):
        load_partition(plain, 0)


def test_info_and_the_command_line_partition_a_typed_dataset(tmp_path, capsys):
    typed = tmp_path / "typed"
    write_typed(synthetic_typed(nodes=600), typed)
    out = tmp_path / "parts"
    assert main(["partition", str(typed), "--parts", "2", "--out", str(out), "--method", "metis"]) == 0
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parts"] == 2 and info["target"] == "paper" and info["checksums"]["state"] == "ok"
    assert [sum(p["nodes"][t] for p in info["per_part"]) for t in info["nodes"]] == list(info["nodes"].values())
    assert "paper rev_cites paper" in info["relations"] and "paper vertices" in info["balance_max_over_mean"]
    assert info["edge_cut"]["edges"] == sum(p["cut_edges"] for p in info["per_part"]) > 0
    whole = synthetic_typed(nodes=600).with_reverse()
    _same_part(load_partition(out, 1), split_typed(whole, {t: load_partition(out, 0).part_of[t]
                                                           for t in whole.num_nodes}, 2)[1])
    assert main(["partition", str(typed), "--parts", "2", "--out", str(tmp_path / "s"), "--split",
                 "edges:0.8,0.1"]) == 2
    assert "predicts: one of author/writes/paper" in capsys.readouterr().err  # which relation's edges to split
    weighted = tmp_path / "weighted"
    write_typed(synthetic_typed(nodes=600, edge_weights=True), weighted)
    assert main(["partition", str(weighted), "--parts", "2", "--out", str(tmp_path / "w")]) == 2
    assert "has edge features" in capsys.readouterr().err
    assert not (tmp_path / "s").exists() and not (tmp_path / "w").exists()


def test_a_typed_full_copy_run_deals_each_rank_the_training_seeds_its_part_owns(graph, folder):
    owners = load_partition(folder, 0).part_of[graph.target]
    cpu = torch.device("cpu")
    config = neutronorch.TrainConfig(batch_size=40, fanouts=[2, 2], device="cpu", deal_by=str(folder))
    by_rank = [build_mode(config, graph, cpu, shard=(r, 2)).seeds for r in range(2)]
    train = np.asarray(graph.train_idx)
    for rank, seeds in enumerate(by_rank):
        batches = seeds.epoch(0)
        mine = np.concatenate([b.seeds.numpy() for b in batches])
        assert np.array_equal(np.sort(mine), np.sort(train[owners[train] == rank]))
        for batch in batches:  # each global batch's seeds this rank's part owns, in the batch's order
            whole = batch.batch_seeds.numpy()
            assert np.array_equal(batch.seeds.numpy(), whole[owners[whole] == rank])
    # each rank's loss weighted by its share of the global batch's labelled seeds: the shares sum to the ranks
    assert np.allclose(by_rank[0].rank_shares(0) + by_rank[1].rank_shares(0), 2.0)
    with pytest.raises(ConfigError, match="holds 2 parts, but the run has 3 ranks"):
        build_mode(config, graph, cpu, shard=(0, 3))


def test_a_typed_link_task_refuses_deal_by_a_folder_without_its_link_split(folder, tmp_path):
    config = neutronorch.TrainConfig(task="link", link_relation="writes", epochs=1, fanouts=[2, 2], hidden=8,
                                     threads=1, device="cpu", eval_negatives=5, deal_by=str(folder),
                                     checkpoint_dir=str(tmp_path / "ck"))
    with pytest.raises(ConfigError, match="for a node task, no link split; deal a typed link task's seed edges"):
        neutronorch.train(config, graph=synthetic_typed(nodes=600))
