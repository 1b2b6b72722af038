"""Typed graphs: construction, validation messages, reverse relations, the native layout, the synthetic
generator (and that its labels need typed paths), and the PyG round trip."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from neutronorch.data import checks, typed
from neutronorch.data.dtypes import bfloat16
from neutronorch.data.native import load_native
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.data.typed import TYPED_FORMAT, Relation, TypedGraph
from neutronorch.data.native import is_typed_dir, read_typed, write_typed
from neutronorch.errors import DataError

BUYS = ("user", "buys", "item")
FOLLOWS = ("user", "follows", "user")


def small() -> TypedGraph:
    """5 users (the target: features, labels), 3 items (no features); users buy items (a weight per edge,
    one purchase repeated) and follow users."""
    buys = Relation.from_edges([0, 1, 1, 4, 2, 1], [0, 0, 2, 1, 2, 2], 5, 3,
                               edge_features=np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    follows = Relation.from_edges([1, 2, 3, 4, 0], [0, 0, 1, 1, 4], 5, 5)
    return TypedGraph(name="shop", num_nodes={"user": 5, "item": 3}, relations={BUYS: buys, FOLLOWS: follows},
                      features={"user": np.arange(10, dtype=np.float32).reshape(5, 2)}, target="user",
                      labels=np.array([0, 1, 0, 1, -1]), train_idx=np.array([0, 1]), val_idx=np.array([2]),
                      test_idx=np.array([3]), num_classes=2)


def pairs(relation: Relation) -> list[tuple[int, int]]:
    src, dst = relation.edges()
    return list(zip(src.tolist(), dst.tolist()))


# --- construction -------------------------------------------------------------------------------------------

def test_from_edges_builds_a_csc_over_the_destination_type():
    buys = small().relations[BUYS]
    assert buys.indptr.tolist() == [0, 2, 3, 6] and buys.indptr.dtype == np.int64
    assert buys.indices.tolist() == [0, 1, 4, 1, 1, 2] and buys.indices.dtype == np.int32
    # repeated purchases (user 1 -> item 2) are kept, in their input order, with their own weights
    assert buys.edge_features[:, 0].tolist() == [1.0, 2.0, 4.0, 3.0, 6.0, 5.0]
    assert buys.edge_features.dtype == np.float32
    once = Relation.from_edges([1, 1, 0], [2, 2, 2], 5, 3, edge_features=[[1.0], [2.0], [3.0]], deduplicate=True)
    assert pairs(once) == [(0, 2), (1, 2)] and once.edge_features[:, 0].tolist() == [3.0, 1.0]
    with pytest.raises(DataError, match="source id 7 is out of range for 5"):
        Relation.from_edges([7], [0], 5, 3)
    with pytest.raises(DataError, match="num_src is 5.0, expected the number of source vertices"):
        Relation.from_edges([1], [0], 5.0, 3)
    with pytest.raises(DataError, match="num_dst is -3, expected the number of destination vertices"):
        Relation.from_edges([1], [0], 5, -3)


def test_properties_count_types_relations_edges_and_widths():
    graph = small()
    graph.validate()
    assert graph.node_types == ("user", "item") and graph.relation_types == (BUYS, FOLLOWS)
    assert graph.num_edges == 11
    assert graph.relations[BUYS].num_edges == 6 and graph.relations[FOLLOWS].num_edges == 5
    assert graph.feature_dim("user") == 2 and graph.feature_dim("item") == 0
    assert graph.in_degrees("buys").tolist() == [2, 1, 3] == graph.in_degrees(BUYS).tolist()
    with pytest.raises(DataError, match="no vertex type 'shop'"):
        graph.feature_dim("shop")
    with pytest.raises(DataError, match="no relation is named 'likes'"):
        graph.in_degrees("likes")
    text = graph.describe()
    for part in ("shop: 2 vertex types, 2 relations, 11 edges", "target user (2 classes, split 2/1/1)",
                 "user", "2 features", "item", "no features", "user -buys-> item: 6 edges, 1 edge feature",
                 "user -follows-> user: 5 edges"):
        assert part in text, (part, text)


def test_with_reverse_adds_transposed_relations_once():
    graph = small()
    both = graph.with_reverse()
    assert both.relation_types == (BUYS, FOLLOWS, ("item", "rev_buys", "user"), ("user", "rev_follows", "user"))
    rev = both.relations[("item", "rev_buys", "user")]
    assert sorted(pairs(rev)) == sorted((d, s) for s, d in pairs(graph.relations[BUYS]))
    assert rev.indptr.shape == (6,)  # a CSC over users now
    weight = {}
    for (s, d), w in zip(pairs(graph.relations[BUYS]), graph.relations[BUYS].edge_features[:, 0]):
        weight.setdefault((s, d), []).append(w)
    for (s, d), w in zip(pairs(rev), rev.edge_features[:, 0]):
        assert w in weight[(d, s)]  # each reversed edge keeps its weight
    both.validate()
    assert both.with_reverse().relation_types == both.relation_types  # every relation has its reverse now
    assert graph.relation_types == (BUYS, FOLLOWS)  # the original is unchanged


# --- validation -------------------------------------------------------------------------------------------

def _relation(graph, key, **changes):
    graph.relations[key] = replace(graph.relations[key], **changes)


BROKEN = {
    "missing type": (lambda g: g.relations.update({("user", "likes", "shop"): g.relations[BUYS]}),
                     ["(user, likes, shop)", "'shop'"]),
    "indptr length": (lambda g: _relation(g, BUYS, indptr=np.array([0, 2, 6])), ["(user, buys, item)", "indptr"]),
    "indptr decreasing": (lambda g: _relation(g, BUYS, indptr=np.array([0, 4, 3, 6])),
                          ["(user, buys, item)", "non-decreasing"]),
    "indptr end": (lambda g: _relation(g, FOLLOWS, indptr=np.array([0, 2, 4, 4, 4, 4])),
                   ["(user, follows, user)", "len(indices)=5"]),
    "id too large": (lambda g: _relation(g, BUYS, indices=np.array([0, 1, 9, 1, 1, 2], dtype=np.int32)),
                     ["(user, buys, item)", "id 9", "source type user"]),
    "negative id": (lambda g: _relation(g, FOLLOWS, indices=np.array([1, -2, 3, 4, 0])),
                    ["(user, follows, user)", "id -2"]),
    "feature rows": (lambda g: g.features.update(user=np.zeros((4, 2), np.float32)), ["type user: features", "(4, 2)"]),
    "features of no type": (lambda g: g.features.update(shop=np.zeros((4, 2), np.float32)), ["type 'shop'"]),
    "edge feature rows": (lambda g: _relation(g, BUYS, edge_features=np.zeros((5, 1), np.float32)),
                          ["(user, buys, item): edge_features", "(5, 1)"]),
    "no labels": (lambda g: setattr(g, "labels", None), ["type user", "without labels"]),
    "split out of range": (lambda g: setattr(g, "val_idx", np.array([7])), ["type user", "val_idx", "id 7"]),
    "unlabelled in split": (lambda g: setattr(g, "test_idx", np.array([4])),
                            ["type user", "test_idx", "unlabelled", "first: 4"]),
    "train in val": (lambda g: setattr(g, "val_idx", np.array([1, 2])),
                     ["type user", "1 training vertices are also in val_idx (first: 1), of 2 training and 2"]),
    "val in test": (lambda g: setattr(g, "test_idx", np.array([2, 3])),
                    ["type user", "1 validation vertices are also in test_idx (first: 2), of 1 validation and 2 test",
                     "disjoint"]),
    "no target": (lambda g: setattr(g, "target", "shop"), ["no target type", "'shop'"]),
    "name": (lambda g: g.num_nodes.update({"shop front": 1}), ["vertex type 'shop front'"]),
}


@pytest.mark.parametrize("case", BROKEN)
def test_validate_names_the_type_and_relation(case):
    graph = small()
    breaking, expected = BROKEN[case]
    breaking(graph)
    with pytest.raises(DataError) as raised:
        graph.validate()
    for part in expected:
        assert part in str(raised.value), (part, str(raised.value))
    assert str(raised.value).startswith("shop: ")


def test_validate_reads_large_arrays_in_chunks(monkeypatch):
    monkeypatch.setattr(checks, "_CHUNK", 2)  # every array spans several chunks
    graph = small()
    graph.validate()
    _relation(graph, FOLLOWS, indices=np.array([1, 2, 3, 4, 5]))  # the bad id is in the last chunk
    with pytest.raises(DataError, match=r"\(user, follows, user\): indices hold vertex id 5"):
        graph.validate()


# --- native layout ------------------------------------------------------------------------------------------

def test_native_round_trip_is_memory_mapped(tmp_path):
    graph = small()
    graph.features["item"] = np.arange(12, dtype=np.float32).reshape(3, 4).astype(bfloat16())  # kept as its bits
    graph.relations[BUYS].edge_features = graph.relations[BUYS].edge_features.astype(np.float16)
    folder = write_typed(graph, tmp_path / "shop")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["format"] == TYPED_FORMAT and meta["target"] == "user" and is_typed_dir(folder)
    assert meta["node_types"][1] == {"name": "item", "count": 3, "feature_dim": 4, "feature_dtype": "bfloat16"}
    for path in ("nodes/user/features.npy", "nodes/item/features.npy", "nodes/user/labels.npy",
                 "relations/user___buys___item/indptr.npy", "relations/user___buys___item/edge_features.npy",
                 "relations/user___follows___user/indices.npy"):
        assert (folder / path).is_file(), path
    assert not (folder / "relations/user___follows___user/edge_features.npy").exists()
    back = read_typed(folder)
    assert isinstance(back.relations[BUYS].indices, np.memmap) and isinstance(back.features["user"], np.memmap)
    assert back.node_types == graph.node_types and back.relation_types == graph.relation_types
    for key, relation in graph.relations.items():
        for name in ("indptr", "indices", "edge_features"):
            a, b = getattr(relation, name), getattr(back.relations[key], name)
            assert (a is None and b is None) or (np.array_equal(a, b) and a.dtype == b.dtype), (key, name)
    for node_type, features in graph.features.items():
        assert np.array_equal(back.features[node_type], features) and back.features[node_type].dtype == features.dtype
    for name in ("labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(getattr(back, name), getattr(graph, name))
    assert back.describe() == graph.describe()
    assert not isinstance(read_typed(folder, mmap=False).features["user"], np.memmap)



def test_a_graph_without_labels_is_written_and_read_back_without_them(tmp_path):
    empty = np.empty(0, np.int64)
    graph = replace(small(), labels=None, train_idx=empty, val_idx=empty, test_idx=empty, num_classes=0)
    folder = write_typed(graph, tmp_path / "shop")
    assert not (folder / "nodes/user/labels.npy").exists()
    back = read_typed(folder)
    assert back.labels is None and back.num_classes == 0 and back.describe() == graph.describe()

def test_writing_refuses_before_it_writes(tmp_path):
    graph = small()
    folder = write_typed(graph, tmp_path / "shop")
    with pytest.raises(DataError, match="exists and is not empty"):
        write_typed(graph, folder)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="no typed dataset"):
        write_typed(graph, other, overwrite=True)
    assert (other / "notes.txt").read_text() == "mine"
    graph.labels = None
    with pytest.raises(DataError, match="without labels"):
        write_typed(graph, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_overwrite_replaces_a_typed_graph_even_the_one_read_from_it(tmp_path):
    folder = write_typed(small(), tmp_path / "shop")
    mapped = read_typed(folder)  # memory-mapped from the folder it is written back over
    mapped.notes.append("again")
    write_typed(mapped.with_reverse(), folder, overwrite=True)
    back = read_typed(folder)
    assert len(back.relations) == 4 and back.notes == ["again"]
    assert pairs(back.relations[BUYS]) == pairs(small().relations[BUYS])


def test_a_folder_without_meta_or_with_a_damaged_array_is_refused(tmp_path):
    folder = write_typed(small(), tmp_path / "shop")
    np.save(folder / "relations/user___buys___item/indices.npy", np.zeros(4, np.int32))
    with pytest.raises(DataError, match=r"indices.npy: holds shape \(4,\), but meta.json says \(6,\)"):
        read_typed(folder)
    (folder / "meta.json").unlink()  # as a folder killed mid-write would be
    with pytest.raises(DataError, match="meta.json: file is missing"):
        read_typed(folder)


@pytest.mark.parametrize("extra, message", [
    ("relations/user___likes___item/indptr.npy", "user___likes___item: a relation folder that meta.json does not "
                                                 "list; list it in meta.json's relations"),
    ("nodes/shop/features.npy", "nodes/shop: a vertex type folder that meta.json does not list; list it in "
                                "meta.json's node_types"),
    ("nodes/item/features.npy", "item/features.npy: an array that meta.json does not account for (type item's "
                                "feature_dim is 0)"),
    ("nodes/item/labels.npy", "labels and splits belong to the target type, user"),
    ("relations/user___follows___user/edge_features.npy", "the relation's edge_feature_dim is 0"),
    ("relations/user___buys___item/weights.npy", "not an array of the typed layout"),
])
def test_arrays_meta_json_does_not_list_are_refused(tmp_path, extra, message):
    """A relation, a vertex type or an array on disk that meta.json leaves out is refused (as the ogbn-mag
    reader refuses a relation folder its list leaves out), never silently left unread."""
    folder = write_typed(small(), tmp_path / "shop")
    read_typed(folder)
    made = not (folder / extra).parent.exists()
    (folder / extra).parent.mkdir(parents=True, exist_ok=True)
    np.save(folder / extra, np.zeros(3, np.int64))
    with pytest.raises(DataError, match=re.escape(message)):
        read_typed(folder)
    (folder / extra).unlink()
    if made:
        (folder / extra).parent.rmdir()
    (folder / ".hidden").mkdir()  # hidden entries (a file manager's) are not the layout's
    read_typed(folder)


def test_the_homogeneous_reader_names_a_typed_folder(tmp_path):
    folder = write_typed(small(), tmp_path / "shop")
    with pytest.raises(DataError, match="holds a typed graph.*not as a homogeneous graph"):
        load_native(folder)


# --- the synthetic generator --------------------------------------------------------------------------------

def test_generator_is_deterministic_and_sized():
    graph = synthetic_typed(nodes=3000, degree=8, seed=3)
    graph.validate()
    assert graph.node_types == ("paper", "author", "institution", "field") and graph.target == "paper"
    assert set(graph.relation_types) == {("author", "writes", "paper"), ("paper", "cites", "paper"),
                                         ("author", "affiliated_with", "institution"), ("paper", "has_topic", "field")}
    assert sum(graph.num_nodes.values()) == 3000 and 0.85 * 24000 < graph.num_edges < 1.1 * 24000
    assert graph.feature_dim("paper") == 64 and graph.feature_dim("author") == 0 and graph.num_classes == 16
    again, other = synthetic_typed(nodes=3000, degree=8, seed=3), synthetic_typed(nodes=3000, degree=8, seed=4)
    for key, relation in graph.relations.items():
        assert np.array_equal(relation.indices, again.relations[key].indices)
    assert np.array_equal(graph.features["paper"], again.features["paper"])
    assert not np.array_equal(graph.labels, other.labels)
    topics = graph.in_degrees("has_topic")
    assert topics.max() > 5 * topics.mean()  # popular fields: a power-law tail
    assert synthetic_typed(nodes=3000, field_features=8).feature_dim("field") == 8


def _mean(relation: Relation, rows: np.ndarray) -> np.ndarray:
    """Each destination's mean over its in-neighbours' rows (zeros without any)."""
    degree = relation.in_degrees()
    sums = np.zeros((degree.shape[0], rows.shape[1]))
    np.add.at(sums, np.repeat(np.arange(degree.shape[0]), degree), rows[np.asarray(relation.indices)])
    return sums / np.maximum(degree, 1)[:, None]


def _typed_propagation(graph: TypedGraph, hops: int) -> np.ndarray:
    """Paper rows: own features, then per hop one neighbour mean per relation, concatenated."""
    rows = {t: np.asarray(graph.features.get(t, np.zeros((n, 0))), np.float64) for t, n in graph.num_nodes.items()}
    blocks = [rows["paper"]]
    for _ in range(hops):
        rows = {t: np.concatenate([np.zeros((n, 0))] + [_mean(r, rows[k[0]]) for k, r in graph.relations.items()
                                                        if k[2] == t and rows[k[0]].shape[1]], axis=1)
                for t, n in graph.num_nodes.items()}
        blocks.append(rows["paper"])
    return np.concatenate(blocks, axis=1)


def _blind_propagation(graph: TypedGraph, hops: int) -> np.ndarray:
    """The same with types ignored: one graph, zero features for featureless types, all neighbours averaged."""
    offsets = dict(zip(graph.num_nodes, np.cumsum([0, *graph.num_nodes.values()])))
    total = sum(graph.num_nodes.values())
    ends = [(r.edges(), k) for k, r in graph.relations.items()]
    src, dst = zip(*((s + offsets[k[0]], d + offsets[k[2]]) for (s, d), k in ends))
    merged = Relation.from_edges(np.concatenate(src), np.concatenate(dst), total, total)
    rows = np.zeros((total, graph.feature_dim("paper")))
    rows[offsets["paper"]:offsets["paper"] + graph.num_nodes["paper"]] = graph.features["paper"]
    blocks = [rows]
    for _ in range(hops):
        blocks.append(_mean(merged, blocks[-1]))
    return np.concatenate(blocks, axis=1)[offsets["paper"]:offsets["paper"] + graph.num_nodes["paper"]]


def _same_graph(read: TypedGraph, made: TypedGraph) -> None:
    assert (read.name, read.num_nodes, read.target, read.num_classes) == (made.name, made.num_nodes, made.target,
                                                                          made.num_classes)
    assert read.relation_types == made.relation_types and read.notes == made.notes
    for key, relation in made.relations.items():
        np.testing.assert_array_equal(read.relations[key].indptr, relation.indptr)
        np.testing.assert_array_equal(read.relations[key].indices, relation.indices)
    assert list(read.features) == list(made.features)
    for array in ("labels", "train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(read, array), getattr(made, array))


def test_generate_typed_writes_the_synthetic_typed_graph_and_guards_its_output(tmp_path, capsys):
    from neutronorch.cli import main

    out = tmp_path / "mag-like"
    args = ["generate", "synthetic", "--typed", "--nodes", "500", "--degree", "4", "--features", "8", "--seed", "3",
            "--homophily", "0.6"]
    assert main([*args, "--out", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote synthetic-typed-n500-d4-f8-ff0-t4-p0.6-h0.6-x0.5-s3: 4 vertex "
                                              f"types, 4 relations")
    made = synthetic_typed(nodes=500, degree=4, features=8, seed=3, homophily=0.6)
    read = read_typed(out)
    _same_graph(read, made)
    np.testing.assert_array_equal(read.features["paper"], made.features["paper"])
    # Options not given take synthetic_typed's defaults, not the homogeneous generator's.
    assert main(["generate", "synthetic", "--typed", "--nodes", "500", "--out", str(tmp_path / "defaults")]) == 0
    _same_graph(read_typed(tmp_path / "defaults"), synthetic_typed(nodes=500))
    # An existing folder is refused without --overwrite, and with it one that holds anything but a typed graph.
    before = sorted(p.name for p in out.rglob("*"))
    assert main([*args, "--out", str(out)]) == 2
    assert "exists and is not empty" in capsys.readouterr().err and sorted(p.name for p in out.rglob("*")) == before
    assert main(["generate", "synthetic", "--nodes", "300", "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--out", str(tmp_path / "plain"), "--overwrite"]) == 2
    assert "holds files but no typed dataset" in capsys.readouterr().err
    assert main([*args, "--classes", "4", "--out", str(tmp_path / "classes")]) == 2
    err = capsys.readouterr().err
    assert "--classes does not apply to --typed" in err and "Traceback" not in err
    assert not (tmp_path / "classes").exists()
    # --overwrite replaces a typed graph, here with halved features.
    assert main([*args, "--out", str(out), "--overwrite", "--float16"]) == 0
    halved = read_typed(out)
    assert halved.features["paper"].dtype == np.float16
    np.testing.assert_array_equal(halved.features["paper"], made.features["paper"].astype(np.float16))
    big = read_typed(out, mmap=False)
    big.features["paper"] = big.features["paper"].astype(np.float32) * 1e6  # beyond float16's range
    write_typed(big, tmp_path / "big")
    assert main(["convert", str(tmp_path / "big"), str(tmp_path / "big16"), "--float16"]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'big'}: type paper: " in err and "lie beyond float16's range" in err, err
    assert not (tmp_path / "big16").exists()


def _accuracy(rows: np.ndarray, graph: TypedGraph) -> float:
    """Test accuracy of a ridge least-squares classifier on standardised rows, fitted on the training set."""
    train = graph.train_idx
    rows = (rows - rows[train].mean(0)) / (rows[train].std(0) + 1e-6)
    rows = np.concatenate([rows, np.ones((rows.shape[0], 1))], axis=1)
    a = rows[train]
    weights = np.linalg.solve(a.T @ a + np.eye(a.shape[1]), a.T @ np.eye(graph.num_classes)[graph.labels[train]])
    return float((np.argmax(rows[graph.test_idx] @ weights, axis=1) == graph.labels[graph.test_idx]).mean())


def test_generator_labels_need_typed_paths():
    """Relation-aware propagation beats type-blind propagation and the features alone by a clear margin
    (measured, seeds 0-3 at this size: typed 0.93-0.96, blind 0.83-0.87, features 0.26-0.30)."""
    graph = synthetic_typed(nodes=10_000, train=0.6, val=0.1, seed=0).with_reverse()
    features = _accuracy(np.asarray(graph.features["paper"], np.float64), graph)
    typed = _accuracy(_typed_propagation(graph, 2), graph)
    blind = _accuracy(_blind_propagation(graph, 2), graph)
    assert typed >= blind + 0.05 and typed >= features + 0.3, (typed, blind, features)


# --- PyG ----------------------------------------------------------------------------------------------------

def test_pyg_round_trip():
    pytest.importorskip("torch_geometric")
    from neutronorch.data.interop import from_pyg_hetero, to_pyg_hetero

    graph = small()
    graph.labels[4] = 0
    data = to_pyg_hetero(graph)
    assert data["user"].x.shape == (5, 2) and "x" not in data["item"] and data["item"].num_nodes == 3
    assert data[BUYS].edge_index.shape == (2, 6) and data[BUYS].edge_attr.shape == (6, 1)
    assert data["user"].train_mask.sum() == 2 and data["user"].y.tolist() == [0, 1, 0, 1, 0]
    back = from_pyg_hetero(data, target="user", name="shop")
    assert back.relation_types == graph.relation_types and back.num_nodes == graph.num_nodes
    for key, relation in graph.relations.items():
        assert pairs(back.relations[key]) == pairs(relation)
    assert np.array_equal(back.relations[BUYS].edge_features, graph.relations[BUYS].edge_features)
    assert np.array_equal(back.features["user"], graph.features["user"]) and "item" not in back.features
    assert back.train_idx.tolist() == [0, 1] and back.num_classes == 2
    with pytest.raises(DataError, match="no target type: 'shop'"):
        from_pyg_hetero(data, target="shop")
    with pytest.raises(DataError, match="type user carries y, train_mask"):
        from_pyg_hetero(data, target="item")
    data["item"].x = data["user"].x[:2]  # PyG takes rows that do not fit; the typed graph's check does not
    with pytest.raises(DataError, match=r"shop: type item: features have shape \(2, 2\), expected \(3, width\)"):
        from_pyg_hetero(data, target="user", name="shop")
    del data["item"].x
    del data["user"].train_mask, data["user"].val_mask, data["user"].test_mask
    drawn = from_pyg_hetero(data, target="user", split="ratio:0.4,0.2")
    assert drawn.notes and sorted([*drawn.train_idx, *drawn.val_idx, *drawn.test_idx]) == [0, 1, 2, 3, 4]


# --- DGL ----------------------------------------------------------------------------------------------------

def test_dgl_round_trip():
    pytest.importorskip("dgl")
    from neutronorch.data import from_dgl_hetero, to_dgl_hetero

    graph = small()
    graph.labels[4] = 0
    g = to_dgl_hetero(graph)
    assert g.num_nodes("user") == 5 and g.num_nodes("item") == 3 and "feat" not in g.nodes["item"].data
    assert g.nodes["user"].data["feat"].shape == (5, 2) and g.edges[BUYS].data["feat"].shape == (6, 1)
    assert g.num_edges(BUYS) == 6 and g.num_edges(FOLLOWS) == 5
    assert g.nodes["user"].data["train_mask"].sum() == 2 and g.nodes["user"].data["label"].tolist() == [0, 1, 0, 1, 0]
    back = from_dgl_hetero(g, target="user", name="shop")
    # DGL keeps types and relations in name order: the same graph, listed in another order.
    assert back.num_nodes == graph.num_nodes and set(back.relation_types) == set(graph.relation_types)
    for key, relation in graph.relations.items():
        assert pairs(back.relations[key]) == pairs(relation)
        np.testing.assert_array_equal(back.relations[key].indptr, relation.indptr)
    np.testing.assert_array_equal(back.relations[BUYS].edge_features, graph.relations[BUYS].edge_features)
    assert back.relations[FOLLOWS].edge_features is None
    np.testing.assert_array_equal(back.features["user"], graph.features["user"])
    assert "item" not in back.features
    np.testing.assert_array_equal(back.labels, graph.labels)
    for split in ("train_idx", "val_idx", "test_idx"):
        np.testing.assert_array_equal(getattr(back, split), getattr(graph, split))
    assert back.num_classes == 2 and back.target == "user" and not back.notes


def test_dgl_heterograph_read_as_a_typed_graph():
    dgl = pytest.importorskip("dgl")
    import torch

    from neutronorch.data import from_dgl_hetero

    def heterograph():
        g = dgl.heterograph({("paper", "cites", "paper"): ([1, 2, 2, 3], [0, 0, 1, 1]),
                             ("author", "writes", "paper"): ([0, 1, 1], [3, 3, 2])},
                            num_nodes_dict={"paper": 4, "author": 2, "venue": 1})
        g.nodes["paper"].data["x"] = torch.arange(12, dtype=torch.float64).reshape(4, 3)
        g.nodes["paper"].data["y"] = torch.tensor([2, 0, -1, 1])
        g.edges["writes"].data["w"] = torch.tensor([0.5, 1.0, 2.0])
        return g

    graph = from_dgl_hetero(heterograph(), target="paper", name="hand", split="ratio:0.4,0.3", seed=3)
    assert graph.num_nodes == {"author": 2, "paper": 4, "venue": 1}
    writes, cites = ("author", "writes", "paper"), ("paper", "cites", "paper")
    assert graph.relation_types == (writes, cites)  # DGL's order: by relation name
    assert pairs(graph.relations[cites]) == [(1, 0), (2, 0), (2, 1), (3, 1)]
    assert pairs(graph.relations[writes]) == [(1, 2), (0, 3), (1, 3)]
    assert graph.relations[writes].edge_features[:, 0].tolist() == [2.0, 0.5, 1.0]  # in CSC order
    assert graph.features["paper"].dtype == np.float32 and graph.features["paper"][3].tolist() == [9, 10, 11]
    assert graph.feature_dim("author") == 0 and graph.num_classes == 3
    assert sorted([*graph.train_idx, *graph.val_idx, *graph.test_idx]) == [0, 1, 3]  # paper 2 has no label
    assert graph.notes == ["no stored split: labelled vertices split by ratio:0.4,0.3 (seed 3)"]
    assert graph.relation(writes) == writes and graph.describe().startswith("hand: 3 vertex types, 2 relations")

    with pytest.raises(DataError, match=r"hand: no target type: 'venues' is not a node type of the DGL graph "
                                        r"\(author, paper, venue\)"):
        from_dgl_hetero(heterograph(), target="venues", name="hand")
    with pytest.raises(DataError, match="type paper carries y, but the target is author"):
        from_dgl_hetero(heterograph(), target="author")
    g = heterograph()
    del g.nodes["paper"].data["y"]
    with pytest.raises(DataError, match="the target type paper has no label or y; give its labels"):
        from_dgl_hetero(g, target="paper")
    g = heterograph()
    g.nodes["author"].data["feat"] = torch.ones(2)  # a row per vertex, but one number each
    with pytest.raises(DataError, match=r"type author: feat has dtype float32 and shape \(2,\), expected a 2-D"):
        from_dgl_hetero(g, target="paper")
    g = heterograph()
    g.nodes["paper"].data["train_mask"] = torch.tensor([True, True, False, False])
    with pytest.raises(DataError, match="the target type has no val_mask, test_mask, but other split masks"):
        from_dgl_hetero(g, target="paper")
    g = heterograph()
    with pytest.raises(dgl.DGLError, match="match number of nodes"):  # DGL itself refuses rows that do not fit
        g.nodes["paper"].data["feat"] = torch.ones(3, 2)
    g.nodes["paper"].data["y"] = torch.tensor([2.0, 0.0, -1.0, 1.0])
    with pytest.raises(DataError, match="type paper: y has dtype float32, expected integer class ids"):
        from_dgl_hetero(g, target="paper")



def test_type_names_too_long_for_their_folders_are_refused_before_writing(tmp_path):
    """A relation's folder joins three names, and the file system takes at most 255 bytes per name."""
    from neutronorch.errors import OutputError

    graph = small()
    fits, too_long = ("user", "buys" * 60, "item"), ("user", "buys" * 70, "item")  # folders of 254 and 294 bytes
    graph.relations = {fits: graph.relations[BUYS], FOLLOWS: graph.relations[FOLLOWS]}
    write_typed(graph, tmp_path / "fits")
    graph.relations = {too_long: graph.relations[fits], FOLLOWS: graph.relations[FOLLOWS]}
    with pytest.raises(OutputError, match=r"of relations would be 294 bytes long in UTF-8.*at most 255 bytes"):
        write_typed(graph, tmp_path / "too-long")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fits"]


@pytest.mark.parametrize("change, message", [
    (lambda g: {"relations": {**g.relations, BUYS: replace(g.relations[BUYS], indices=[0, 1, 1, 4, 2, 1])}},
     "indices is a list, expected a numpy array"),
    (lambda g: {"relations": {**g.relations, BUYS: (g.relations[BUYS].indptr, g.relations[BUYS].indices)}},
     "is a tuple, expected a Relation"),
    (lambda g: {"relations": {("user", "item"): g.relations[BUYS], FOLLOWS: g.relations[FOLLOWS]}},
     "not a .src_type, name, dst_type. triple"),
    (lambda g: {"num_nodes": list(g.num_nodes.items())}, "num_nodes is a list, expected a dict"),
    (lambda g: {"num_nodes": {"user": 5.0, "item": 3}}, "count 5.0 is not a whole number"),
    (lambda g: {"labels": list(g.labels)}, "labels is a list, expected a numpy array"),
    (lambda g: {"train_idx": np.isin(np.arange(5), [0, 1])}, "train_idx must be a 1-D integer array, got bool"),
    (lambda g: {"num_classes": "2"}, "num_classes '2' is not a whole number"),
    (lambda g: {"features": {**g.features, "shop": np.zeros((2, 2), np.float32)}}, "type 'shop', which the graph"),
    (lambda g: {"target": "shop"}, "no target type"),
])
def test_a_typed_graph_built_by_hand_is_checked_where_it_is_given(change, message):
    import torch

    from neutronorch.config import TrainConfig
    from neutronorch.loader import TypedNeighborLoader
    from neutronorch.train.predict import embed
    from neutronorch.train.trainer import train

    graph = replace(small(), **change(small()))
    with pytest.raises(DataError, match=message):
        train(TrainConfig(model="rgcn", fanouts=[2], epochs=1, hidden=8), graph=graph)
    with pytest.raises(DataError, match=message):
        TypedNeighborLoader(graph, [2], 2, seeds=torch.tensor([0]))
    with pytest.raises(DataError, match=message):
        embed("no-checkpoint.pt", graph)


def test_a_loaded_graph_is_not_checked_again_unless_it_changed(monkeypatch, tmp_path):
    write_typed(small(), tmp_path / "shop")
    graph = read_typed(tmp_path / "shop")
    calls = []
    monkeypatch.setattr(typed, "check_typed_graph", lambda *args: calls.append(args))
    graph.check_given()
    assert calls == []
    graph.labels = np.array([0, 1, 0, 1, 1])  # a field replaced: checked again
    graph.check_given()
    assert len(calls) == 1
    changed = replace(graph)  # a new graph: checked
    changed.check_given()
    assert len(calls) == 2
