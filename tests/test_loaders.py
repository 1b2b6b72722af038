"""Loaders for Planetoid folders, .npz archives and SNAP edge lists, and the shared CSC builder.

Tests marked ``shared_data`` check the published counts of the real datasets in ../shared/datasets (see each
dataset's SOURCE.md) and skip when that folder is absent. The others write small files of each format into a
temporary directory, including damaged ones, and need nothing else.
"""

from __future__ import annotations

import collections
import gzip
import io
import os
import pickle
import sys
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.npz import load_npz
from neutronorch.data.planetoid import load_planetoid
from neutronorch.data.snap import load_snap
from neutronorch.data.sparse_pickle import SparseMatrix, csr_matrix, load_pickle
from neutronorch.errors import DataError

SHARED = Path(os.environ.get("NEUTRONORCH_DATASETS",
                            Path(__file__).resolve().parents[1].parent / "shared" / "datasets"))


def shared(relative: str) -> Path:
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"{path} is absent: put the real datasets there, or point NEUTRONORCH_DATASETS at the "
                    f"folder that holds them")
    return path


def neighbours(graph, vertex: int) -> list[int]:
    return graph.indices[graph.indptr[vertex]:graph.indptr[vertex + 1]].tolist()


def is_symmetric(graph) -> bool:
    destinations = np.repeat(np.arange(graph.num_nodes), graph.in_degrees())
    forward = set(zip(graph.indices.tolist(), destinations.tolist()))
    return forward == {(d, s) for s, d in forward}


# --- real datasets --------------------------------------------------------------------------------------

# (loader, relative path, nodes, directed edges, features, classes, (train, val, test))
REAL = {
    "cora": (load_planetoid, "cora", 2708, 10556, 1433, 7, (140, 500, 1000)),
    "citeseer": (load_planetoid, "citeseer", 3327, 9104, 3703, 6, (120, 500, 1000)),
    "amazon_computers": (load_npz, "amazon_computers/amazon_cs.npz", 13752, 491722, 767, 10, (8251, 2750, 2751)),
    "amazon_photo": (load_npz, "amazon_photo/amazon_photo.npz", 7650, 238162, 745, 8, (4590, 1530, 1530)),
    "cora_ml": (load_npz, "cora_ml/cora_ml.npz", 2995, 16316, 2879, 7, (1797, 599, 599)),
    "coauthor_cs": (load_npz, "coauthor_cs/coauthor_cs.npz", 18333, 163788, 6805, 15, (11000, 3667, 3666)),
    "dblp": (load_npz, "dblp/dblp.npz", 17716, 105734, 1639, 4, (10630, 3543, 3543)),
    "minesweeper": (load_npz, "minesweeper/minesweeper.npz", 10000, 78804, 7, 2, (5000, 2500, 2500)),
    "tolokers": (load_npz, "tolokers/tolokers.npz", 11758, 1038000, 10, 2, (5879, 2939, 2940)),
    "soc-Epinions1": (load_snap, "snap_soc-Epinions1/soc-Epinions1.txt.gz", 75879, 811480, 64, 8,
                      (45527, 15176, 15176)),
    "web-NotreDame": (load_snap, "snap_web-NotreDame/web-NotreDame.txt.gz", 325729, 2180216, 64, 8,
                      (195437, 65146, 65146)),
}


@pytest.mark.shared_data
@pytest.mark.parametrize("dataset", list(REAL))
def test_real_dataset_counts(dataset):
    loader, relative, nodes, edges, features, classes, split = REAL[dataset]
    graph = loader(shared(relative))
    assert (graph.num_nodes, graph.num_edges, graph.feature_dim, graph.num_classes) == (nodes, edges, features,
                                                                                         classes)
    assert (len(graph.train_idx), len(graph.val_idx), len(graph.test_idx)) == split
    assert graph.features.dtype == np.float32 and graph.indptr.dtype == np.int64
    destinations = np.repeat(np.arange(graph.num_nodes), graph.in_degrees())
    assert not np.any(graph.indices == destinations), "self loop"
    for vertex in range(0, graph.num_nodes, max(1, graph.num_nodes // 50)):
        column = neighbours(graph, vertex)
        assert column == sorted(set(column)), "neighbours not sorted and unique"
    assert len(np.intersect1d(graph.train_idx, graph.test_idx)) == 0


@pytest.mark.shared_data
def test_cora_public_split_and_symmetry():
    graph = load_planetoid(shared("cora"), name="cora")
    assert graph.name == "cora"
    np.testing.assert_array_equal(graph.train_idx, np.arange(140))
    np.testing.assert_array_equal(graph.val_idx, np.arange(140, 640))
    np.testing.assert_array_equal(graph.test_idx, np.arange(1708, 2708))
    np.testing.assert_array_equal(np.bincount(graph.labels[graph.train_idx]), [20] * 7)
    assert graph.labels[:10].tolist() == [3, 4, 4, 0, 3, 2, 0, 3, 3, 2]  # as in PyG's Cora
    assert int(graph.features.sum()) == 49216 and graph.in_degrees().min() >= 1
    assert is_symmetric(graph)


@pytest.mark.shared_data
def test_citeseer_isolated_test_vertices_are_padded():
    graph = load_planetoid(shared("citeseer"))
    assert int(graph.features.sum()) == 105165
    padded = np.setdiff1d(np.arange(2312, 3327), graph.test_idx)
    assert len(padded) == 15
    assert not graph.features[padded].any() and not graph.labels[padded].any()
    assert int((graph.in_degrees() == 0).sum()) == 48
    assert any("15 vertices" in note for note in graph.notes)


@pytest.mark.shared_data
def test_pubmed_partial_names_the_missing_file():
    with pytest.raises(DataError, match=r"ind\.pubmed\.allx: file is missing"):
        load_planetoid(shared("pubmed_partial"))


@pytest.mark.shared_data
def test_amazon_computers_class_counts():
    graph = load_npz(shared("amazon_computers/amazon_cs.npz"))
    assert np.bincount(graph.labels).tolist() == [436, 2142, 1414, 542, 5158, 308, 487, 818, 2156, 291]
    assert np.count_nonzero(graph.features) == 3675081
    assert int((graph.in_degrees() == 0).sum()) == 281


@pytest.mark.shared_data
@pytest.mark.slow
def test_coauthor_physics_counts():
    graph = load_npz(shared("coauthor_physics/coauthor_phy.npz"))
    assert (graph.num_nodes, graph.num_edges, graph.feature_dim, graph.num_classes) == (34493, 495924, 8415, 5)


@pytest.mark.shared_data
def test_snap_labels_are_synthetic_and_seeded():
    path = shared("snap_soc-Epinions1/soc-Epinions1.txt.gz")
    graph = load_snap(path, seed=3, feature_dim=16, num_classes=4)
    assert graph.feature_dim == 16 and graph.num_classes == 4
    assert any("synthetic" in note for note in graph.notes)
    assert set(np.unique(graph.labels)) == {0, 1, 2, 3}
    assert np.array_equal(load_snap(path, seed=3, feature_dim=16, num_classes=4).labels, graph.labels)


# --- edges_to_csc ---------------------------------------------------------------------------------------

def test_edges_to_csc_symmetrises_and_dedupes():
    src = np.array([0, 0, 1, 2, 2, 3])
    dst = np.array([1, 1, 0, 2, 0, 1])
    indptr, indices = edges_to_csc(src, dst, 5)
    assert indptr.dtype == np.int64 and indices.dtype == np.int32
    assert indptr.tolist() == [0, 2, 4, 5, 6, 6]
    assert indices.tolist() == [1, 2, 0, 3, 0, 1]


def test_edges_to_csc_directed_keeps_in_neighbours():
    indptr, indices = edges_to_csc(np.array([0, 2, 2, 1]), np.array([1, 1, 1, 1]), 3, symmetric=False)
    assert indptr.tolist() == [0, 0, 2, 2]
    assert indices.tolist() == [0, 2]


def test_edges_to_csc_empty():
    indptr, indices = edges_to_csc(np.empty(0, np.int64), np.empty(0, np.int64), 3)
    assert indptr.tolist() == [0, 0, 0, 0] and indices.size == 0


@pytest.mark.parametrize("bad", [-1, 4])
def test_edges_to_csc_rejects_out_of_range_ids(bad):
    with pytest.raises(DataError, match=rf"edges\.txt: vertex id {bad} is out of range for 4 nodes"):
        edges_to_csc(np.array([0, bad]), np.array([1, 2]), 4, source="edges.txt")


def test_edges_to_csc_matches_a_reference_on_random_edges():
    rng = np.random.default_rng(0)
    src, dst = rng.integers(0, 50, 400), rng.integers(0, 50, 400)
    indptr, indices = edges_to_csc(src, dst, 50)
    expected = collections.defaultdict(set)
    for s, d in zip(src.tolist(), dst.tolist()):
        if s != d:
            expected[d].add(s)
            expected[s].add(d)
    for vertex in range(50):
        assert indices[indptr[vertex]:indptr[vertex + 1]].tolist() == sorted(expected[vertex])


# --- scipy stand-ins ------------------------------------------------------------------------------------

DENSE = np.array([[0, 2, 0], [1, 0, 3]], dtype=np.float32)


@pytest.mark.parametrize("class_name, state", [
    ("csr_matrix", {"_shape": (2, 3), "indptr": np.array([0, 1, 3]), "indices": np.array([1, 0, 2]),
                    "data": np.array([2.0, 1.0, 3.0])}),
    ("csc_array", {"_shape": (2, 3), "indptr": np.array([0, 1, 2, 3]), "indices": np.array([1, 0, 1]),
                   "data": np.array([1.0, 2.0, 3.0])}),
    ("coo_matrix", {"shape": (2, 3), "row": np.array([1, 0, 1]), "col": np.array([0, 1, 2]),
                    "data": np.array([1.0, 2.0, 3.0])}),
    ("coo_array", {"_shape": (2, 3), "coords": (np.array([1, 0, 1]), np.array([0, 1, 2])),
                   "data": np.array([1.0, 2.0, 3.0])}),
    ("lil_matrix", {"_shape": (2, 3), "rows": np.array([[1], [0, 2]], dtype=object),
                    "data": np.array([[2.0], [1.0, 3.0]], dtype=object)}),
])
def test_sparse_stand_ins(fake_scipy, class_name, state):
    matrix = load_pickle(io.BytesIO(pickle.dumps(fake_scipy(class_name, **state), protocol=2)), "test")
    assert isinstance(matrix, SparseMatrix)
    np.testing.assert_array_equal(matrix.toarray("test"), DENSE)


def test_sparse_stand_in_rejects_bad_index():
    matrix = csr_matrix(np.ones(2), np.array([0, 3]), np.array([0, 1, 2]), (2, 3))
    with pytest.raises(DataError, match="m.npz: column id 3 of the sparse matrix is out of range"):
        matrix.to_coo("m.npz")


# --- npz ------------------------------------------------------------------------------------------------

def csr_pieces(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(dense)
    indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=dense.shape[0]))]).astype(np.int32)
    return dense[rows, cols].astype(np.float32), cols.astype(np.int32), indptr


# A directed 6-vertex graph with one self loop (3->3) and one edge stored in both directions (0<->1).
ADJACENCY = np.zeros((6, 6), dtype=np.float32)
for _s, _d in [(0, 1), (1, 0), (1, 2), (3, 3), (3, 4), (5, 4), (2, 5)]:
    ADJACENCY[_s, _d] = 1
FEATURES = np.arange(24, dtype=np.float32).reshape(6, 4) % 5
LABELS = np.array([0, 1, 2, 0, 1, 2], dtype=np.int64)


def write_gnn_benchmark(path: Path, features: bool = True, **overrides) -> Path:
    data, indices, indptr = csr_pieces(ADJACENCY)
    entries = dict(adj_data=data, adj_indices=indices, adj_indptr=indptr, adj_shape=np.array([6, 6]),
                   labels=LABELS)
    if features:
        data, indices, indptr = csr_pieces(FEATURES)
        entries.update(attr_data=data, attr_indices=indices, attr_indptr=indptr, attr_shape=np.array([6, 4]))
    entries.update(overrides)
    np.savez(path, **entries)
    return path


def test_npz_gnn_benchmark_layout(tmp_path):
    graph = load_npz(write_gnn_benchmark(tmp_path / "tiny.npz"), split="ratio:0.5,0.25", seed=1)
    assert graph.name == "tiny"
    assert (graph.num_nodes, graph.num_edges, graph.num_classes) == (6, 10, 3)
    assert [neighbours(graph, v) for v in range(6)] == [[1], [0, 2], [1, 5], [4], [3, 5], [2, 4]]
    np.testing.assert_array_equal(graph.features, FEATURES)
    np.testing.assert_array_equal(graph.labels, LABELS)
    assert (len(graph.train_idx), len(graph.val_idx), len(graph.test_idx)) == (3, 2, 1)
    assert graph.notes == []


def test_npz_dense_attr_matrix(tmp_path):
    path = write_gnn_benchmark(tmp_path / "dense.npz", features=False, attr_matrix=FEATURES)
    np.testing.assert_array_equal(load_npz(path).features, FEATURES)


def test_npz_without_features_gets_random_ones_and_a_note(tmp_path):
    graph = load_npz(write_gnn_benchmark(tmp_path / "bare.npz", features=False))
    assert graph.features.shape == (6, 64) and graph.features.dtype == np.float32
    assert any("no node features" in note for note in graph.notes)


def test_npz_yandex_layout_uses_split_zero(tmp_path):
    masks = np.zeros((3, 3, 6), dtype=bool)  # (train/val/test, split, vertex)
    masks[0, 0, [0, 1, 2]] = masks[1, 0, [3]] = masks[2, 0, [4, 5]] = True
    masks[0, 1, :] = True  # split 1 differs, and must be ignored
    np.savez(tmp_path / "yandex.npz", node_features=FEATURES, node_labels=LABELS,
             edges=np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]),
             train_masks=masks[0], val_masks=masks[1], test_masks=masks[2])
    graph = load_npz(tmp_path / "yandex.npz")
    assert graph.num_edges == 10 and is_symmetric(graph)
    assert graph.train_idx.tolist() == [0, 1, 2] and graph.val_idx.tolist() == [3]
    assert graph.test_idx.tolist() == [4, 5]
    assert any("split 0" in note for note in graph.notes)


def test_npz_stored_masks_that_overlap_are_refused_with_the_counts(tmp_path):
    masks = np.zeros((3, 6), dtype=bool)
    masks[0, [0, 1]] = masks[1, [2, 3]] = masks[2, [3, 4, 5]] = True  # vertex 3: validation and test
    np.savez(tmp_path / "yandex.npz", node_features=FEATURES, node_labels=LABELS,
             edges=np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]),
             train_masks=masks[0], val_masks=masks[1], test_masks=masks[2])
    with pytest.raises(DataError, match=r"yandex\.npz: 1 validation vertices are also in test_idx \(first: 3\), "
                                        r"of 2 validation and 3 test vertices"):
        load_npz(tmp_path / "yandex.npz")


@pytest.fixture
def fake_scipy(monkeypatch):
    """Let pickle write objects that name ``scipy.sparse._<format>.<class name>``, as scipy's do.

    Returns ``make(class_name, **state)``: an object that pickles like a scipy matrix with that state.
    """
    for name in ("scipy", "scipy.sparse"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    def make(class_name: str, **state):
        module_name = f"scipy.sparse._{class_name.split('_')[0]}"
        module = sys.modules.get(module_name)
        if module is None:
            module = types.ModuleType(module_name)
            monkeypatch.setitem(sys.modules, module_name, module)
        if not hasattr(module, class_name):
            fake_class = type(class_name, (), {"__module__": module_name})
            setattr(module, class_name, fake_class)
        matrix = getattr(module, class_name)()
        matrix.__dict__.update(state)
        return matrix

    return make


@pytest.fixture
def make_csr(fake_scipy):
    """A function turning a dense matrix into a pickleable fake ``csr_matrix`` with scipy's state keys."""
    def make(dense: np.ndarray):
        data, indices, indptr = csr_pieces(dense)
        return fake_scipy("csr_matrix", _shape=dense.shape, indptr=indptr, indices=indices, data=data,
                          maxprint=50)

    return make


def object_array(value) -> np.ndarray:
    array = np.empty((), dtype=object)
    array[()] = value
    return array


def test_npz_graphgallery_layout(tmp_path, make_csr):
    np.savez_compressed(tmp_path / "gallery.npz", adj_matrix=object_array(make_csr(ADJACENCY)),
                        node_attr=object_array(make_csr(FEATURES)), node_label=LABELS.astype(np.int32),
                        metadata=object_array({"class_names": np.array(["a", "b", "c"])}))
    graph = load_npz(tmp_path / "gallery.npz")
    assert [neighbours(graph, v) for v in range(6)] == [[1], [0, 2], [1, 5], [4], [3, 5], [2, 4]]
    np.testing.assert_array_equal(graph.features, FEATURES)
    assert graph.labels.dtype == np.int64 and graph.labels.tolist() == LABELS.tolist()


def test_npz_refuses_pickled_code(tmp_path):
    np.savez(tmp_path / "evil.npz", adj_matrix=object_array(os.getcwd), node_attr=FEATURES, node_label=LABELS)
    with pytest.raises(DataError, match=r"evil\.npz \(entry adj_matrix\): the pickle refers to \w+\.getcwd"):
        load_npz(tmp_path / "evil.npz")


def test_npz_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nothing\.npz: file is missing"):
        load_npz(tmp_path / "nothing.npz")


def test_npz_truncated_archive(tmp_path):
    path = write_gnn_benchmark(tmp_path / "cut.npz")
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(DataError, match=r"cut\.npz: not a readable \.npz archive"):
        load_npz(path)


def test_npz_truncated_entry(tmp_path):
    full = tmp_path / "full.npz"
    write_gnn_benchmark(full)
    with zipfile.ZipFile(full) as source, zipfile.ZipFile(tmp_path / "short.npz", "w") as target:
        for name in source.namelist():
            data = source.read(name)
            target.writestr(name, data[:-12] if name == "adj_indices.npy" else data)
    with pytest.raises(DataError, match=r"short\.npz \(entry adj_indices\): cannot be read"):
        load_npz(tmp_path / "short.npz")


def test_npz_corrupt_pickle(tmp_path, make_csr):
    np.savez(tmp_path / "good.npz", adj_matrix=object_array(make_csr(ADJACENCY)), node_attr=FEATURES,
             node_label=LABELS)
    with zipfile.ZipFile(tmp_path / "good.npz") as source, zipfile.ZipFile(tmp_path / "bad.npz", "w") as target:
        for name in source.namelist():
            data = source.read(name)
            target.writestr(name, data[:len(data) // 2] if name == "adj_matrix.npy" else data)
    with pytest.raises(DataError, match=r"bad\.npz \(entry adj_matrix\): cannot be unpickled"):
        load_npz(tmp_path / "bad.npz")


def test_npz_unknown_layout_lists_keys(tmp_path):
    np.savez(tmp_path / "odd.npz", weights=np.ones(3), labels=LABELS)
    with pytest.raises(DataError, match=r"odd\.npz: unknown \.npz layout; it holds \['labels', 'weights'\]"):
        load_npz(tmp_path / "odd.npz")


def test_npz_vertex_id_out_of_range(tmp_path):
    data, indices, indptr = csr_pieces(ADJACENCY)
    indices[-1] = 9
    path = write_gnn_benchmark(tmp_path / "far.npz", adj_indices=indices)
    with pytest.raises(DataError, match=r"far\.npz \(entries adj_\*\): column id 9 .* out of range"):
        load_npz(path)


def test_npz_yandex_edge_out_of_range(tmp_path):
    masks = np.ones((1, 6), dtype=bool)
    np.savez(tmp_path / "far.npz", node_features=FEATURES, node_labels=LABELS, edges=np.array([[0, 1], [2, 6]]),
             train_masks=masks, val_masks=masks, test_masks=masks)
    with pytest.raises(DataError, match=r"far\.npz: vertex id 6 is out of range for 6 nodes"):
        load_npz(tmp_path / "far.npz")


def test_npz_negative_labels(tmp_path):
    path = write_gnn_benchmark(tmp_path / "neg.npz", labels=np.array([0, 1, -2, 0, 1, 2]))
    with pytest.raises(DataError, match=r"neg\.npz: labels range over -2\.\.2"):
        load_npz(path)


def test_unlabelled_vertices_are_left_out_of_the_splits(tmp_path):
    from neutronorch.data import load_dataset

    labels = np.array([0, 1, -1, 0, 1, 2])
    path = write_gnn_benchmark(tmp_path / "some.npz", labels=labels)
    graph = load_dataset(str(path), split="ratio:0.5,0.25")  # vertex 2 is drawn into training
    for idx in (graph.train_idx, graph.val_idx, graph.test_idx):
        assert (labels[idx] >= 0).all()
    assert sorted(np.concatenate([graph.train_idx, graph.val_idx, graph.test_idx]).tolist()) == [0, 1, 3, 4, 5]
    assert "vertices without a label left out of the splits: 1 from train" in graph.notes


def test_npz_label_count_mismatch(tmp_path):
    path = write_gnn_benchmark(tmp_path / "short.npz", labels=LABELS[:5])
    with pytest.raises(DataError, match=r"short\.npz: 5 labels for 6 vertices"):
        load_npz(path)


def test_npz_nan_features(tmp_path):
    features = FEATURES.copy()
    features[4, 2] = np.nan
    path = write_gnn_benchmark(tmp_path / "nan.npz", features=False, attr_matrix=features)
    with pytest.raises(DataError, match=r"nan\.npz: features contain NaN or inf \(first at vertex 4\)"):
        load_npz(path)


# --- Planetoid ------------------------------------------------------------------------------------------

def write_planetoid(directory: Path, make_csr, name: str = "toy") -> Path:
    """A Planetoid folder in the original layout: 10 training vertices, allx of 520, test ids 520..525 with
    523 missing (CiteSeer's quirk), a ring as the graph."""
    rng = np.random.default_rng(0)
    num_classes, width = 3, 5
    allx = (rng.random((520, width)) < 0.3).astype(np.float32)
    ally = np.eye(num_classes, dtype=np.int32)[np.arange(520) % num_classes]
    test_ids = np.array([525, 520, 522, 524, 521])
    tx = (rng.random((5, width)) < 0.3).astype(np.float32) + 2  # distinguishable from allx rows
    ty = np.eye(num_classes, dtype=np.int32)[[1, 2, 0, 1, 2]]
    ring = collections.defaultdict(list)
    for vertex in range(526):
        ring[vertex] += [(vertex + 1) % 526, (vertex - 1) % 526]
    parts = {"x": make_csr(allx[:10]), "y": ally[:10], "allx": make_csr(allx), "ally": ally,
             "tx": make_csr(tx), "ty": ty, "graph": ring}
    directory.mkdir()
    for part, value in parts.items():
        with open(directory / f"ind.{name}.{part}", "wb") as file:
            pickle.dump(value, file, protocol=2)
    (directory / f"ind.{name}.test.index").write_text("\n".join(map(str, test_ids)) + "\n")
    return directory


def test_planetoid_folder(tmp_path, make_csr):
    directory = write_planetoid(tmp_path / "toy", make_csr)
    graph = load_planetoid(directory)
    assert graph.name == "toy"
    assert (graph.num_nodes, graph.num_edges, graph.feature_dim, graph.num_classes) == (526, 1052, 5, 3)
    assert graph.train_idx.tolist() == list(range(10)) and graph.val_idx.tolist() == list(range(10, 510))
    assert graph.test_idx.tolist() == [520, 521, 522, 524, 525]
    # tx row i belongs to vertex test.index[i]; vertex 523 is padding with zero features and label 0.
    assert graph.features[525].min() >= 2 and graph.labels[[525, 520, 522, 524, 521]].tolist() == [1, 2, 0, 1, 2]
    assert not graph.features[523].any() and graph.labels[523] == 0
    assert any("1 vertices missing from test.index" in note for note in graph.notes)
    assert neighbours(graph, 0) == [1, 525]


def test_planetoid_missing_file(tmp_path, make_csr):
    directory = write_planetoid(tmp_path / "toy", make_csr)
    (directory / "ind.toy.ty").unlink()
    with pytest.raises(DataError, match=r"ind\.toy\.ty: file is missing"):
        load_planetoid(directory)


def test_planetoid_truncated_pickle(tmp_path, make_csr):
    directory = write_planetoid(tmp_path / "toy", make_csr)
    path = directory / "ind.toy.allx"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(DataError, match=r"ind\.toy\.allx: cannot be unpickled"):
        load_planetoid(directory)


def test_planetoid_graph_id_out_of_range(tmp_path, make_csr):
    directory = write_planetoid(tmp_path / "toy", make_csr)
    with open(directory / "ind.toy.graph", "wb") as file:
        pickle.dump({0: [1, 600]}, file, protocol=2)
    with pytest.raises(DataError, match=r"ind\.toy\.graph: vertex id 600 is out of range for 526 nodes"):
        load_planetoid(directory)


def test_planetoid_needs_a_name_or_one_dataset(tmp_path):
    (tmp_path / "ind.a.graph").touch()
    (tmp_path / "ind.b.graph").touch()
    with pytest.raises(DataError, match="several Planetoid datasets"):
        load_planetoid(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no ind.<name>.graph"):
        load_planetoid(tmp_path / "empty")


# --- SNAP -----------------------------------------------------------------------------------------------

SNAP_TEXT = """# Directed graph (each unordered pair of nodes is saved once): toy.txt
# Nodes: 12 Edges: 15
# FromNodeId\tToNodeId
10\t20
20\t10
20\t30
30\t30
30\t40
40\t1000
1000\t10
50\t60
60\t70
70\t50
70\t80
80\t90
90\t100
100\t110
110\t50
"""


def test_snap_text_relabels_sparse_ids(tmp_path):
    (tmp_path / "toy.txt").write_text(SNAP_TEXT)
    graph = load_snap(tmp_path / "toy.txt", split="ratio:0.5,0.25", feature_dim=6, num_classes=2)
    assert graph.name == "toy"
    # Sorted ids 10,20,30,40,50,60,70,80,90,100,110,1000 become 0..11; 30->30 is dropped, 10<->20 kept once.
    assert graph.num_nodes == 12 and graph.num_edges == 2 * 13
    assert neighbours(graph, 0) == [1, 11] and neighbours(graph, 11) == [0, 3]
    assert graph.features.shape == (12, 6) and graph.features.dtype == np.float32
    assert set(graph.labels.tolist()) <= {0, 1}
    assert (len(graph.train_idx), len(graph.val_idx), len(graph.test_idx)) == (6, 3, 3)
    assert any("synthetic" in note for note in graph.notes)


def test_snap_gzip_matches_text(tmp_path):
    (tmp_path / "toy.txt").write_text(SNAP_TEXT)
    (tmp_path / "toy.txt.gz").write_bytes(gzip.compress(SNAP_TEXT.encode()))
    plain = load_snap(tmp_path / "toy.txt", num_classes=2)
    packed = load_snap(tmp_path / "toy.txt.gz", num_classes=2)
    assert packed.name == "toy"
    np.testing.assert_array_equal(plain.indices, packed.indices)
    np.testing.assert_array_equal(plain.features, packed.features)


def test_snap_extra_columns_are_ignored(tmp_path):
    (tmp_path / "signed.txt").write_text("# FromNodeId ToNodeId Sign\n0 1 1\n1 2 -1\n2 3 1\n3 4 -1\n4 0 1\n")
    assert load_snap(tmp_path / "signed.txt", num_classes=2).num_edges == 10


def test_snap_weighted_lists_keep_their_edges_and_ignore_the_weights(tmp_path):
    (tmp_path / "weighted.txt").write_text("# src dst weight\n0 1 0.5\n1 2 2.25\n2 3 1e-3\n3 4 7\n4 0 -0.5\n")
    (tmp_path / "plain.txt").write_text("0 1\n1 2\n2 3\n3 4\n4 0\n")
    weighted = load_snap(tmp_path / "weighted.txt", num_classes=2)
    np.testing.assert_array_equal(weighted.indices, load_snap(tmp_path / "plain.txt", num_classes=2).indices)


def test_snap_too_small_for_its_synthetic_classes_says_so(tmp_path):
    (tmp_path / "tiny.txt").write_text("0 1\n1 2\n")
    with pytest.raises(DataError, match="only 3 vertices. An edge list gets 8 synthetic classes"):
        load_snap(tmp_path / "tiny.txt")


def test_snap_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"absent\.txt: file is missing"):
        load_snap(tmp_path / "absent.txt")


def test_a_folder_or_a_named_pipe_where_a_file_is_read_is_named_as_such_never_missing(tmp_path):
    from neutronorch.config_keys import read_config_mapping
    from neutronorch.errors import CheckpointError, ConfigError
    from neutronorch.train.checkpoint import load_checkpoint

    (tmp_path / "folder.txt").mkdir()
    os.mkfifo(tmp_path / "pipe.txt")  # never opened: reading it would wait for a writer
    with pytest.raises(DataError, match=r"folder\.txt: is a folder, not a file"):
        load_snap(tmp_path / "folder.txt")
    with pytest.raises(DataError, match=r"pipe\.txt: is a named pipe, not a regular file"):
        load_snap(tmp_path / "pipe.txt")
    with pytest.raises(ConfigError, match=r"--config .*folder\.txt: is a folder, not a file"):
        read_config_mapping(tmp_path / "folder.txt")
    with pytest.raises(CheckpointError, match=r"is a folder, not a file \(give DIR/best\.pt or DIR/last\.pt"):
        load_checkpoint(tmp_path)


def test_snap_ids_up_to_the_largest_int64_a_byte_order_mark_and_self_loops_only(tmp_path):
    edges = "".join(f"{i} {i + 1}\r\n" for i in range(9))
    (tmp_path / "max.txt").write_text(edges + f"{2**63 - 1} 0\r\n")  # the largest int64 is an id
    assert load_snap(tmp_path / "max.txt").num_nodes == 11
    (tmp_path / "over.txt").write_text(edges + f"{2**63} 0\n")
    with pytest.raises(DataError, match=r"line 10 holds a vertex id beyond the largest int64"):
        load_snap(tmp_path / "over.txt")
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbf" + edges.encode())  # as Windows editors save it
    assert load_snap(tmp_path / "bom.txt").num_nodes == 10
    (tmp_path / "loops.txt").write_text("".join(f"{i} {i}\n" for i in range(20)))
    with pytest.raises(DataError, match=r"every one of its 20 edges is a self loop"):
        load_snap(tmp_path / "loops.txt")


def test_snap_truncated_gzip(tmp_path):
    data = gzip.compress((SNAP_TEXT * 50).encode())
    (tmp_path / "cut.txt.gz").write_bytes(data[:len(data) // 2])
    with pytest.raises(DataError, match=r"cut\.txt\.gz: cannot be read .*truncated"):
        load_snap(tmp_path / "cut.txt.gz")


def test_snap_not_gzip(tmp_path):
    (tmp_path / "plain.txt.gz").write_text(SNAP_TEXT)
    with pytest.raises(DataError, match=r"plain\.txt\.gz: cannot be read"):
        load_snap(tmp_path / "plain.txt.gz")


@pytest.mark.parametrize("text, message", [
    ("# only comments\n", "no edges found"),
    ("1 2\n3 x\n", "line 2 is not an edge: '3 x'"),
    ("# header\n1 2 0.5\n2 3 0.25\nfoo 3 0.1\n", "line 4 is not an edge: 'foo 3 0.1'"),
    ("1 2 0.5\n2.5 3 0.25\n", "line 2 is not an edge"),
    ("1 2\n3 4\n5\n", "different numbers of columns"),
    ("1 2\n-3 4\n", "vertex id -3 is negative"),
])
def test_snap_malformed(tmp_path, text, message):
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(DataError, match=rf"bad\.txt: .*{message}"):
        load_snap(tmp_path / "bad.txt", num_classes=2)


def test_snap_labels_follow_communities(tmp_path):
    # Two cliques joined by one edge: the seeds' communities should make most edges join equal labels.
    clique = [(a, b) for a in range(20) for b in range(a + 1, 20)]
    edges = clique + [(a + 20, b + 20) for a, b in clique] + [(0, 20)]
    (tmp_path / "cliques.txt").write_text("".join(f"{a} {b}\n" for a, b in edges))
    for seed in range(5):
        graph = load_snap(tmp_path / "cliques.txt", num_classes=2, seed=seed)
        destinations = np.repeat(np.arange(graph.num_nodes), graph.in_degrees())
        assert (graph.labels[graph.indices] == graph.labels[destinations]).mean() > 0.6


@pytest.mark.parametrize("text, message", [
    ("1 2\n99999999999999999999 1\n", r"line 2 holds a vertex id beyond the largest int64"),
    ("1 2\n3 4 5 6\n5 6\n", r"lines have different numbers of columns: line 2 has 4"),
    ("1 2 0.5\n3 4\n5 6 7 8\n", r"lines have different numbers of columns: line 2 has 2"),
    ("1 2\n3.0 4\n", r"line 2 is not an edge: '3\.0 4'"),
    ("1 2 0.5\n3 4 x\n", r"line 2 is not an edge: '3 4 x'"),
])
def test_snap_ids_are_never_clamped_and_lines_never_merged(tmp_path, text, message):
    (tmp_path / "bad.txt").write_text(text)
    with pytest.raises(DataError, match=rf"bad\.txt: {message}"):
        load_snap(tmp_path / "bad.txt", num_classes=2)


@pytest.mark.parametrize("kwargs, message", [
    (dict(src=np.array([0.0, 1.5, 2.0])), r"edge sources hold 1\.5, which is not a whole number"),
    (dict(dst=np.array([1, 2, np.nan])), r"edge destinations hold nan"),
    (dict(src=np.array([0, 1, 2 ** 64 - 1], np.uint64)), r"edge sources hold 18446744073709551615, beyond"),
    (dict(labels=np.array([0, 1, 2 ** 64 - 1, 0], np.uint64)), r"labels \(whole class ids, or NaN for none\) hold 18446744073709551615, beyond"),
    (dict(labels=np.array([0, 1.5, 1, 0])), r"labels \(whole class ids, or NaN for none\) hold 1\.5, which is not a whole"),
    (dict(labels=np.array([[0, 1], [1, 257], [0, 0], [1, 1]])), r"multi-label labels hold 0\.\.257"),
    (dict(splits=([0.0, 1.7], [2], [3])), r"the train split's vertex ids hold 1\.7"),
    (dict(num_nodes=4.0), r"num_nodes is 4\.0, expected a whole number"),
    (dict(features=np.ones((4, 2), np.complex64)), r"features have dtype complex64, expected real numbers"),
])
def test_from_arrays_never_truncates_or_wraps_what_it_is_given(kwargs, message):
    from neutronorch.data.graph import Graph

    values = dict(src=np.array([0, 1, 2]), dst=np.array([1, 2, 3]), features=np.ones((4, 2), np.float32),
                  labels=np.array([0, 1, 1, 0]), splits=([0, 1], [2], [3]))
    values.update(kwargs)
    with pytest.raises(DataError, match=message):
        Graph.from_arrays(**values)


def test_npz_labels_that_wrap_are_refused(tmp_path):
    path = write_gnn_benchmark(tmp_path / "g.npz", labels=np.array([0, 1, 2, 0, 1, 2 ** 64 - 1], np.uint64))
    with pytest.raises(DataError, match=r"g\.npz: labels hold 18446744073709551615, beyond the largest int64"):
        load_npz(path)


@pytest.mark.parametrize("spec, message", [
    ("per-class:inf,2", "per-class counts must be whole numbers"),
    ("per-class:nan,2", "per-class counts must be whole numbers"),
    ("per-class:2.5,2", "per-class counts must be whole numbers"),
    ("per-class:3,3", "class 1 has 4 vertices, fewer than the 3 \\+ 3"),
    ("edges:0.8,0.1", "an edge split is drawn as a link task trains \\(train --task link"),
])
def test_a_split_is_never_clamped_to_what_a_class_holds(spec, message):
    from neutronorch.data.splits import make_split
    from neutronorch.errors import ConfigError

    labels = np.array([0] * 10 + [1] * 4 + [2] * 10)
    with pytest.raises(ConfigError, match=message):
        make_split(labels, 3, spec)


@pytest.mark.parametrize("name, text", [
    ("c.yaml", "epochs: 2\nepochs: 3\n"), ("c.json", '{"epochs": 2, "epochs": 3}'),
    ("c.yaml", "batch-size: 64\nbatch_size: 128\n"), ("c.yaml", "progress: true\nno-progress: true\n")])
def test_a_config_file_that_sets_an_option_twice_is_refused(tmp_path, name, text):
    from neutronorch.config_keys import load_config_file
    from neutronorch.errors import ConfigError

    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=rf"--config .*{name}: .*(more than once|earlier key sets too)"):
        load_config_file(tmp_path / name)


@pytest.mark.parametrize("loader, make", [
    (lambda p: load_snap(p, num_classes=2), lambda p: p.write_text("1 2\n2 3\n3 4\n")),
    (load_npz, write_gnn_benchmark),
])
def test_an_unreadable_input_says_permission_denied(tmp_path, monkeypatch, loader, make):
    import builtins

    path = tmp_path / ("g.npz" if loader is load_npz else "g.txt")
    make(path)
    original = builtins.open

    def guarded(file, *args, **kwargs):
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(file))
        return original(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", guarded)
    monkeypatch.setattr(io, "open", guarded)
    with pytest.raises(DataError, match=rf"cannot read {path}: permission denied"):
        loader(path)


def test_a_multi_hot_planetoid_label_row_is_refused(tmp_path):
    from neutronorch.data import planetoid

    labels = np.zeros((3, 2))
    labels[0] = 1  # two classes for one vertex: argmax would pick the first silently
    with pytest.raises(DataError, match=r"a label row holds other than a single 1"):
        planetoid._check_one_hot(labels, "ind.x")
