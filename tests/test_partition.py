"""`neutronorch partition` and its folders: every vertex owned once, each part holding exactly its owned
vertices' in-edges (global column ids), features, labels and splits; METIS cutting fewer edges than random
parts; and a clear error for each way a folder can be wrong."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import types

import numpy as np
import pytest

from neutronorch.cli import main
from neutronorch.data import load_dataset, partition
from neutronorch.data.partition import assign, edge_cut, symmetrised, write_partition
from neutronorch.data.partition_files import load_partition, partition_summary, read_manifest
from neutronorch.errors import ConfigError, DataError

SPEC = "synthetic:nodes=1200,degree=6,homophily=0.9"  # clustered by class: METIS finds the clusters


@pytest.fixture(scope="module")
def graph():
    return load_dataset(SPEC)


def _write(graph, tmp_path, parts, method, name=None):
    assigned = assign(graph, parts, method, seed=0)
    out = tmp_path / (name or f"{method}-{parts}")
    write_partition(graph, assigned, parts, out, method, 0, SPEC)
    return out, assigned[0]


def _edges(src, dst, n):
    return np.sort(np.asarray(dst, dtype=np.int64) * n + np.asarray(src, dtype=np.int64))


@pytest.mark.parametrize("parts", [2, 4])
@pytest.mark.parametrize("method", ["metis", "random"])
def test_parts_cover_the_graph_exactly(graph, tmp_path, parts, method):
    out, part_of = _write(graph, tmp_path, parts, method)
    n = graph.num_nodes
    loaded = [load_partition(out, k, world_size=parts) for k in range(parts)]
    owned = np.concatenate([p.ids for p in loaded])
    assert np.array_equal(np.sort(owned), np.arange(n))  # every vertex exactly once
    src_all, dst_all = [], []
    for k, part in enumerate(loaded):
        assert np.all(np.diff(part.ids) > 0) and np.all(part.part_of[part.ids] == k)
        assert np.array_equal(part.local(part.ids), np.arange(part.ids.shape[0]))
        assert np.array_equal(part.part_of, part_of)
        # the part's CSC is exactly its owned vertices' in-edges, columns as global ids
        for i, v in enumerate(part.ids[:50]):
            mine = np.asarray(part.indices[part.indptr[i]:part.indptr[i + 1]])
            theirs = np.asarray(graph.indices[graph.indptr[v]:graph.indptr[v + 1]])
            assert np.array_equal(np.sort(mine), np.sort(theirs))
        src_all.append(np.asarray(part.indices))
        dst_all.append(np.repeat(part.ids, np.diff(part.indptr)))
        assert np.array_equal(part.features, graph.features[part.ids])
        assert np.array_equal(part.labels, graph.labels[part.ids])
        for split, ids in part.splits.items():
            whole = np.asarray(getattr(graph, split))
            assert np.array_equal(ids, whole[part_of[whole] == k])  # the source's order, owned ones only
            assert np.array_equal(part.global_splits[split], whole)
    whole_dst = np.repeat(np.arange(n), np.diff(graph.indptr))
    assert np.array_equal(_edges(np.concatenate(src_all), np.concatenate(dst_all), n),
                          _edges(graph.indices, whole_dst, n))
    # the edge cut: in-edges whose source another part owns, counted at the destination's part
    cut = part_of[np.asarray(graph.indices)] != part_of[whole_dst]
    manifest = read_manifest(out)
    # what METIS balanced: every constraint, or the vertices alone where it left every constraint off balance
    assert manifest["balance"] in ([["vertices", "training vertices", "in-edges"], ["vertices"]] if method == "metis"
                                   else [[]])
    assert manifest["edge_cut"]["edges"] == int(cut.sum())
    assert [s["cut_edges"] for s in manifest["part_stats"]] == \
        np.bincount(part_of[whole_dst][cut], minlength=parts).tolist()


def test_metis_cuts_fewer_edges_than_random_parts_and_balances(graph):
    cuts = {method: int(edge_cut(graph.indptr, graph.indices, assign(graph, 4, method, 0)[0], 4).sum())
            for method in ("metis", "random")}
    assert cuts["metis"] <= cuts["random"] / 2, cuts
    sizes = np.bincount(assign(graph, 4, "metis", 0)[0], minlength=4)
    assert sizes.max() <= 1.2 * graph.num_nodes / 4, sizes
    assert np.array_equal(assign(graph, 4, "metis", 0)[0], assign(graph, 4, "metis", 0)[0])  # seeded
    random = np.bincount(assign(graph, 4, "random", 3)[0], minlength=4)
    assert random.max() - random.min() <= 1


def test_symmetrised_adjacency():
    indptr, indices = np.array([0, 1, 3, 4]), np.array([1, 0, 2, 1])  # 1->0, 0->1, 2->1, 1->2
    xadj, adjncy = symmetrised(indptr, np.array([1, 0, 1, 1]), 3)  # 1->0, 0->1, 1->1 (a loop), 1->2
    assert xadj.tolist() == [0, 1, 3, 4] and adjncy.tolist() == [1, 0, 2, 1]
    xadj, adjncy = symmetrised(indptr, indices, 3)
    assert xadj.tolist() == [0, 1, 3, 4] and adjncy.tolist() == [1, 0, 2, 1]


def test_command_and_info(tmp_path, capsys):
    out = tmp_path / "parts"
    assert main(["partition", SPEC, "--parts", "2", "--out", str(out), "--method", "random", "--seed", "5"]) == 0
    assert "wrote 2 parts" in capsys.readouterr().out
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parts"] == 2 and info["method"] == "random" and info["seed"] == 5
    assert sum(p["nodes"] for p in info["per_part"]) == 1200 and info["checksums"]["state"] == "ok"
    assert info["balance_max_over_mean"]["nodes"] == 1.0
    assert info["edge_cut"]["edges"] == sum(p["cut_edges"] for p in info["per_part"]) > 0
    # an existing folder is never written over
    assert main(["partition", SPEC, "--parts", "2", "--out", str(out), "--method", "random"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--parts", "0"], "--parts 0: expected a whole number of parts >= 1"),
    (["--parts", "5000"], "more parts than"),
    (["--parts", "2", "--seed", "-1"], "expected a whole number from 0 to 2**31-1"),
])
def test_command_refusals(tmp_path, capsys, argv, message):
    assert main(["partition", SPEC, "--out", str(tmp_path / "p"), "--method", "random", *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_metis_without_pymetis_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "pymetis", None)
    assert main(["partition", SPEC, "--parts", "2", "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "pymetis" in err and "pip install" in err and "--method random" in err
    assert main(["partition", SPEC, "--parts", "2", "--out", str(tmp_path / "r"), "--method", "random"]) == 0


@pytest.fixture(scope="module")
def folders(graph, tmp_path_factory):
    root = tmp_path_factory.mktemp("partitions")
    return {key: _write(graph, root, parts, method)[0] for key, parts, method in
            (("a", 2, "random"), ("b", 2, "metis"))}


def _copy(folder, tmp_path):
    return shutil.copytree(folder, tmp_path / "copy")


def test_missing_part_file(folders, tmp_path):
    out = _copy(folders["a"], tmp_path)
    (out / "part-1" / "indices.npy").unlink()
    load_partition(out, 0)  # the other part is whole
    with pytest.raises(DataError, match=r"part-1/indices.npy: missing"):
        load_partition(out, 1)
    assert "part-1/indices.npy" in partition_summary(out)["checksums"]["bad"]
    shutil.rmtree(out / "part-1")
    with pytest.raises(DataError, match=r"part-1/part.json: file is missing"):
        load_partition(out, 1)


def test_manifest_of_another_partition(folders, tmp_path):
    out = _copy(folders["a"], tmp_path)
    shutil.copy(folders["b"] / "partition.json", out / "partition.json")
    with pytest.raises(DataError, match="belongs to another partition"):
        load_partition(out, 0, verify=False)
    summary = partition_summary(out)
    assert summary["checksums"]["state"] != "ok" and "part-0/part.json" in summary["checksums"]["bad"]


def test_part_folder_of_another_partition(folders, tmp_path):
    out = _copy(folders["a"], tmp_path)
    shutil.rmtree(out / "part-1")
    shutil.copytree(folders["b"] / "part-1", out / "part-1")
    with pytest.raises(DataError, match="belongs to another partition"):
        load_partition(out, 1)


def test_checksum_mismatch(folders, tmp_path):
    out = _copy(folders["a"], tmp_path)
    path = out / "part-0" / "features.npy"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the same size, another value
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"part-0/features.npy: checksum differs"):
        load_partition(out, 0)
    assert partition_summary(out)["checksums"]["bad"] == {"part-0/features.npy": "checksum differs"}
    load_partition(out, 1)


def test_part_out_of_range_and_world_size(folders):
    with pytest.raises(ConfigError, match=r"part 2 is out of range; the folder holds parts 0 to 1"):
        load_partition(folders["a"], 2)
    with pytest.raises(ConfigError, match=r"holds 2 parts, but the run has 4 ranks"):
        load_partition(folders["a"], 0, world_size=4)


def test_missing_or_foreign_manifest(folders, tmp_path):
    out = _copy(folders["a"], tmp_path)
    (out / "partition.json").unlink()
    with pytest.raises(DataError, match="partition.json: file is missing"):
        load_partition(out, 0)
    (out / "partition.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(DataError, match="not a manifest of `neutronorch partition`"):
        load_partition(out, 0)
    manifest = json.loads((folders["a"] / "partition.json").read_text())
    manifest["part_stats"][0]["nodes"] += 1  # a manifest edited by hand
    manifest["files"].pop("part-0/ids.npy")
    (out / "partition.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"part-0/ids.npy: not in the manifest"):
        load_partition(out, 0)
    with pytest.raises(DataError, match=r"features.npy: holds shape \(600, 64\), but partition.json says \(601, 64\)"):
        load_partition(out, 0, verify=False)


def test_bfloat16_features_and_an_empty_part(tmp_path):
    from neutronorch.data.dtypes import is_bfloat16, narrowed
    graph = load_dataset("synthetic:nodes=200,degree=4")
    graph.features = narrowed(graph.features, "bfloat16", "test")
    part_of = np.zeros(graph.num_nodes, dtype=np.int32)
    part_of[::2] = 2  # part 1 owns nothing
    write_partition(graph, (part_of, []), 3, tmp_path / "p", "random", 0, "test")
    parts = [load_partition(tmp_path / "p", k, world_size=3) for k in range(3)]
    assert [p.ids.shape[0] for p in parts] == [100, 0, 100]
    assert parts[1].indices.shape == (0,) and parts[1].features.shape == (0, graph.feature_dim)
    assert is_bfloat16(parts[2].features)
    assert np.array_equal(parts[2].features.view(np.uint16), graph.features[::2].view(np.uint16))
    assert partition_summary(tmp_path / "p")["per_part"][1]["nodes"] == 0


def test_a_graph_with_times_is_refused_with_the_reason(tmp_path, capsys, graph):
    """A partition carries no times yet: parts without them would let training sample the future."""
    import dataclasses

    from neutronorch.data import save_native

    timed = dataclasses.replace(graph, edge_time=np.arange(graph.num_edges, dtype=np.int64))
    save_native(timed, tmp_path / "timed")
    assert main(["partition", str(tmp_path / "timed"), "--parts", "2", "--out", str(tmp_path / "p"),
                 "--method", "random"]) == 2
    assert "times" in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


class _LopsidedMetis:
    """pymetis, but its first ``bad`` answers put two thirds of the vertices in part 0."""

    def __init__(self, bad: int):
        import pymetis  # noqa: PLC0415
        self.real, self.bad, self.calls = pymetis, bad, []
        self.Options, self.CSRAdjacency, self.zero_copy_dtype = pymetis.Options, pymetis.CSRAdjacency, \
            pymetis.zero_copy_dtype

    def part_graph(self, parts, adjacency, vweights, options, recursive):
        result = self.real.part_graph(parts, adjacency, vweights=vweights, options=options, recursive=recursive)
        self.calls.append((vweights.shape[0], recursive))
        if len(self.calls) <= self.bad:
            vertex_part = np.asarray(result.vertex_part)
            vertex_part[: 2 * vertex_part.shape[0] // 3] = 0
            return types.SimpleNamespace(vertex_part=vertex_part, edge_cuts=result.edge_cuts)
        return result


@pytest.mark.parametrize("bad, kept", [(1, ["vertices"]), (2, ["vertices", "training vertices", "in-edges"]),
                                       (3, ["vertices"]), (4, None)])
def test_parts_metis_left_off_balance_are_partitioned_again(monkeypatch, bad, kept):
    pytest.importorskip("pymetis")
    graph = load_dataset("synthetic:nodes=20000,degree=6")  # METIS balances its 3 constraints within 1.05
    fake = _LopsidedMetis(bad)
    monkeypatch.setattr(partition, "metis", lambda: fake)
    said = []
    part_of, balance = assign(graph, 4, "metis", 0, said.append)
    n = graph.num_nodes
    # all three constraints, the vertices alone, then recursive bisection with all three and with the vertices
    # alone: until one is even
    assert fake.calls == [(3 * n, False), (n, False), (3 * n, True), (n, True)][:len(fake.calls)]
    assert sum("off balance" in line for line in said) == bad
    if kept is None:  # none even: the most even kept, with a warning
        assert any(line.startswith("warning: no METIS run balanced") for line in said)
        assert np.bincount(part_of, minlength=4).max() > 1.05 * n / 4
    else:
        assert balance == kept and len(fake.calls) == bad + 1
        assert np.bincount(part_of, minlength=4).max() <= 1.05 * n / 4


def test_a_link_split_is_written_whole_and_checksummed_and_read_back(tmp_path, capsys):
    from neutronorch import TrainConfig  # noqa: PLC0415
    from neutronorch.data.links import row_statistics  # noqa: PLC0415
    from neutronorch.train.link_task import link_graph  # noqa: PLC0415
    out = tmp_path / "links"
    argv = ["partition", SPEC, "--parts", "2", "--out", str(out), "--method", "metis", "--seed", "3"]
    assert main([*argv, "--split", "edges:0.8,0.1"]) == 0
    # The split of `train --task link --split edges:0.8,0.1 --seed 3`, its topology partitioned.
    expected = link_graph(load_dataset(SPEC), TrainConfig(dataset=SPEC, task="link", split="edges:0.8,0.1", seed=3))
    parts = [load_partition(out, k) for k in range(2)]
    for name in ("train", "val", "test"):
        assert np.array_equal(parts[0].links.__getattribute__(name), getattr(expected.links, name))
    assert parts[1].links.undirected == expected.links.undirected and parts[1].links.val_neg is None
    assert sum(p.indices.shape[0] for p in parts) == expected.num_edges  # the held-out edges are out of it
    manifest = read_manifest(out)
    assert manifest["links"]["input_norm"] == row_statistics(expected.features)[0]
    assert manifest["balance"][1] == "training vertices"  # weighted by the training edges each is the source of
    assert sum(s["train_links"] for s in manifest["part_stats"]) == expected.links.train.shape[1]
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["links"]["sets"] == ["train", "val", "test"] and info["checksums"]["state"] == "ok"
    # Another split of the same graph is another partition (its id differs), and a damaged split is found.
    assert main([*argv[:-1], "4", "--out", str(tmp_path / "other"), "--split", "edges:0.8,0.1"]) == 0
    assert read_manifest(tmp_path / "other")["id"] != manifest["id"]
    train = np.load(out / "link_train.npy")
    np.save(out / "link_train.npy", train[:, ::-1])
    with pytest.raises(DataError, match="link_train.npy: checksum differs"):
        load_partition(out, 0)


@pytest.mark.parametrize("split, message", [
    ("ratio:0.5,0.2", "a partition takes a link split, edges:TRAIN,VAL"),
    ("edges:0.9,0.2", "edges:0.9,0.2"),
])
def test_a_split_that_is_no_link_split_is_refused(tmp_path, capsys, split, message):
    assert main(["partition", SPEC, "--parts", "2", "--out", str(tmp_path / "p"), "--method", "random",
                 "--split", split]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p").exists()


def test_a_dataset_with_its_own_link_split_keeps_it_and_refuses_another(graph, tmp_path):
    from neutronorch.data.links import LinkSplit  # noqa: PLC0415
    from neutronorch.data.partition_links import split_for_partition  # noqa: PLC0415
    destinations = np.repeat(np.arange(graph.num_nodes), np.diff(graph.indptr))
    edges = np.stack([np.asarray(graph.indices[:30]), destinations[:30]])
    negatives = np.arange(40, dtype=np.int64).reshape(2, 20)
    links = LinkSplit(edges[:, :20].astype(np.int64), edges[:, 20:25].astype(np.int64),
                      edges[:, 25:].astype(np.int64), negatives, negatives, negatives="shared", metric="hits@5")
    own = dataclasses.replace(graph, links=links)
    with pytest.raises(ConfigError, match="carries its own link split; leave `split` out"):
        split_for_partition(own, "edges:0.8,0.1", 0, SPEC)
    write_partition(own, assign(own, 2, "random", 0), 2, tmp_path / "p", "random", 0, SPEC)
    loaded = load_partition(tmp_path / "p", 1).links
    assert np.array_equal(loaded.test_neg, negatives) and loaded.negative_kind == "shared"
    assert loaded.metric == "hits@5"
