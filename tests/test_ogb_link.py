"""OGB link-prediction datasets read from the layout the ogb package leaves on disk, built here small: raw/
as CSV, split/<scheme>/{train,valid,test}.pt as dicts of numpy arrays written by torch.save, as OGB ships them."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from test_ogb import _write_csv

from neutronorch import DataError, load_dataset
from neutronorch.data.csc import edge_hygiene
from neutronorch.data.links import PER_SOURCE, SHARED
from neutronorch.data.ogb import is_ogb_dir
from neutronorch.data.ogb_link import is_ogb_link_dir, load_ogb_link

RNG = np.random.default_rng(11)
N, E, P = 150, 700, 40


def _raw(root: Path, edges: np.ndarray, extra: dict[str, np.ndarray]):
    raw = root / "raw"
    _write_csv(raw / "edge.csv.gz", edges, "{}")
    _write_csv(raw / "num-node-list.csv.gz", np.array([N]), "{}")
    _write_csv(raw / "num-edge-list.csv.gz", np.array([edges.shape[0]]), "{}")
    _write_csv(raw / "node-feat.csv.gz", RNG.standard_normal((N, 5)).astype(np.float32), "{:.5f}")
    for name, values in extra.items():
        _write_csv(raw / f"{name}.csv.gz", values, "{}")


def _save(parts: dict, folder: Path, legacy: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    for part, content in parts.items():
        torch.save(content, folder / f"{part}.pt", _use_new_zipfile_serialization=not legacy)


def _pairs(count):
    return np.stack([RNG.integers(0, N, count), RNG.integers(0, N, count)], axis=1).astype(np.int64)


def make_collab_like(root: Path, legacy=False):
    """ogbl-collab: raw/ holds the training edges (repeated collaborations included) with weights and years."""
    train = _pairs(E)
    train[1] = train[0]  # a collaboration repeated in another year
    _raw(root, train, {"edge_weight": RNG.integers(1, 4, E), "edge_year": RNG.integers(1990, 2018, E)})
    parts = {"train": {"edge": train, "weight": RNG.integers(1, 4, E), "year": RNG.integers(1990, 2018, E)}}
    for part, year in (("valid", 2018), ("test", 2019)):
        parts[part] = {"edge": _pairs(P), "weight": np.ones(P, np.int64), "year": np.full(P, year),
                       "edge_neg": _pairs(3 * P)}
    _save(parts, root / "split" / "time", legacy)
    return parts


def make_ppa_like(root: Path):
    train = _pairs(E)
    _raw(root, train, {})
    parts = {"train": {"edge": train}, "valid": {"edge": _pairs(P), "edge_neg": _pairs(2 * P)},
             "test": {"edge": _pairs(P), "edge_neg": _pairs(2 * P)}}
    _save(parts, root / "split" / "throughput")
    return parts


def make_citation2_like(root: Path, negatives=1000):
    """ogbl-citation2: directed citations; valid and test give 1000 negative targets per positive."""
    train = _pairs(E)
    _raw(root, train, {"node_year": RNG.integers(1990, 2020, N)})
    parts = {"train": {"source_node": train[:, 0].copy(), "target_node": train[:, 1].copy()}}
    for part in ("valid", "test"):
        positives = _pairs(P)
        parts[part] = {"source_node": positives[:, 0].copy(), "target_node": positives[:, 1].copy(),
                       "target_node_neg": RNG.integers(0, N, (P, negatives)).astype(np.int64)}
    _save(parts, root / "split" / "time")
    return parts


def _edge_set(graph):
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    dst = np.repeat(np.arange(graph.num_nodes), np.diff(indptr))
    return set(zip(indices.tolist(), dst.tolist()))


def test_collab_loads_as_an_undirected_graph_with_shared_negatives_and_no_node_task(tmp_path):
    root = tmp_path / "ogbl_collab"
    parts = make_collab_like(root)
    assert is_ogb_link_dir(root) and is_ogb_dir(root)  # a link folder satisfies both: the link test runs first
    graph = load_dataset(str(root))
    links = graph.links
    assert graph.name == "ogbl-collab" and links.metric == "hits@50"
    assert links.undirected and links.negative_kind == SHARED
    assert np.array_equal(links.train, parts["train"]["edge"].T)  # as OGB gives them, repeats included
    assert np.array_equal(links.val, parts["valid"]["edge"].T) and np.array_equal(links.test, parts["test"]["edge"].T)
    assert links.val_neg.shape == (2, 3 * P) and np.array_equal(links.test_neg, parts["test"]["edge_neg"].T)
    for array in (links.train, links.val, links.test, links.val_neg, links.test_neg):
        assert array.dtype == np.int64 and array.flags.c_contiguous
    raw = {(int(u), int(v)) for u, v in parts["train"]["edge"] if u != v}
    assert _edge_set(graph) == raw | {(v, u) for u, v in raw}
    assert graph.num_classes == 0 and np.all(graph.labels == -1) and graph.train_idx.size == 0
    assert graph.features.shape == (N, 5) and graph.metric is None
    assert "links 700/40/40 undirected" in graph.describe()


def test_ppa_loads_with_its_metric(tmp_path):
    root = tmp_path / "ogbl_ppa"
    parts = make_ppa_like(root)
    graph = load_ogb_link(root)
    assert graph.links.metric == "hits@100" and graph.links.negative_kind == SHARED
    assert np.array_equal(graph.links.val_neg, parts["valid"]["edge_neg"].T)
    assert edge_hygiene(graph.indptr, graph.indices)["edges_without_reverse"] == 0


def test_citation2_keeps_directed_links_and_per_source_negatives_and_passes_messages_both_ways(tmp_path):
    root = tmp_path / "ogbl_citation2"
    parts = make_citation2_like(root)
    graph = load_dataset(str(root))
    links = graph.links
    assert not links.undirected and links.negative_kind == PER_SOURCE and links.metric == "mrr"
    assert links.val_neg.shape == (P, 1000)
    assert np.array_equal(links.val[0], parts["valid"]["source_node"])
    assert np.array_equal(links.test_neg, parts["test"]["target_node_neg"])
    cited = [(int(s), int(t)) for s, t in zip(parts["train"]["source_node"], parts["train"]["target_node"]) if s != t]
    edges = _edge_set(graph)
    assert all((s, t) in edges and (t, s) in edges for s, t in cited)  # symmetrised, as OGB's examples do
    assert any("both directions" in note for note in graph.notes)


def test_files_written_by_an_older_torch_and_numpy_1_are_read(tmp_path):
    """OGB's files predate torch's zip format and numpy 2: numpy's rebuilder is named numpy.core.multiarray."""
    root = tmp_path / "ogbl_collab"
    parts = make_collab_like(root, legacy=True)
    for path in (root / "split" / "time").glob("*.pt"):
        data = path.read_bytes()
        assert b"numpy._core.multiarray" in data or b"numpy.core.multiarray" in data
        path.write_bytes(data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    graph = load_ogb_link(root)
    assert np.array_equal(graph.links.val_neg, parts["valid"]["edge_neg"].T)


def test_one_split_dict_file_is_read_like_three(tmp_path):
    root = tmp_path / "ogbl_ppa"
    parts = make_ppa_like(root)
    folder = root / "split" / "throughput"
    for part in ("train", "valid", "test"):
        (folder / f"{part}.pt").unlink()
    torch.save(parts, folder / "split_dict.pt")
    assert np.array_equal(load_ogb_link(root).links.test, parts["test"]["edge"].T)


def test_a_missing_split_file_is_named(tmp_path):
    root = tmp_path / "ogbl_ppa"
    make_ppa_like(root)
    (root / "split" / "throughput" / "valid.pt").unlink()
    with pytest.raises(DataError, match=r"valid\.pt: file is missing; the OGB dataset is incomplete"):
        load_dataset(str(root))


SIDE_EFFECT = []


class _Payload:
    """Unpickling this would call _run: a file needing it must never be unpickled."""

    def __reduce__(self):
        return (_run, ("unpickled",))


def _run(what):
    SIDE_EFFECT.append(what)
    return what


def test_a_split_file_that_needs_unsafe_unpickling_is_refused_without_running_it(tmp_path):
    root = tmp_path / "ogbl_ppa"
    make_ppa_like(root)
    unsafe = {"edge": _pairs(P), "edge_neg": _pairs(P), "extra": _Payload()}
    torch.save(unsafe, root / "split" / "throughput" / "test.pt")
    with pytest.raises(DataError, match=r"test\.pt: holds Python objects \(.*_run\) that only full unpickling could "
                                        r"build.*Fetch the dataset again"):
        load_ogb_link(root)
    assert SIDE_EFFECT == []


def test_a_damaged_split_file_is_named(tmp_path):
    root = tmp_path / "ogbl_ppa"
    make_ppa_like(root)
    path = root / "split" / "throughput" / "train.pt"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match=r"train\.pt: not a readable \.pt file .*truncated or damaged"):
        load_ogb_link(root)


@pytest.mark.parametrize("part, key", [("valid", "edge"), ("test", "edge_neg"), ("train", "edge")])
def test_an_empty_array_in_a_split_file_is_said_to_be_empty(tmp_path, part, key):
    """An empty array pickles its data as bytes(): it is read (never called pickled objects) and named empty."""
    root = tmp_path / "ogbl_ppa"
    parts = make_ppa_like(root)
    path = root / "split" / "throughput" / f"{part}.pt"
    torch.save(dict(parts[part], **{key: np.empty((0, 2), np.int64)}), path)
    with pytest.raises(DataError, match=rf"{part}\.pt: '{key}' is empty \(shape \(0, 2\)\)") as error:
        load_ogb_link(root)
    assert "objects" not in str(error.value)


def test_counts_that_disagree_are_refused(tmp_path):
    root = tmp_path / "ogbl_citation2"
    parts = make_citation2_like(root, negatives=20)
    folder = root / "split" / "time"
    valid = dict(parts["valid"], target_node_neg=parts["valid"]["target_node_neg"][:-1])
    torch.save(valid, folder / "valid.pt")
    with pytest.raises(DataError, match=r"valid\.pt: target_node_neg has 39 rows for 40 positives"):
        load_ogb_link(root)
    torch.save(dict(parts["valid"], target_node=parts["valid"]["target_node"][:-2]), folder / "valid.pt")
    with pytest.raises(DataError, match=r"valid\.pt: 40 source nodes but 38 target nodes"):
        load_ogb_link(root)
    torch.save(dict(parts["valid"], target_node=parts["valid"]["target_node"] + N), folder / "valid.pt")
    with pytest.raises(DataError, match=rf"split/time: val names vertex \d+, outside 0\.\.{N - 1}, and 40 entries"):
        load_ogb_link(root)
    torch.save(parts["valid"], folder / "valid.pt")
    _write_csv(root / "raw" / "num-edge-list.csv.gz", np.array([E + 5]), "{}")
    with pytest.raises(DataError, match=rf"edge\.csv\.gz: holds {2 * E} values, but .* says {E + 5} edges"):
        load_ogb_link(root)


def test_a_split_of_another_layout_names_the_keys_it_lacks(tmp_path):
    root = tmp_path / "ogbl_ppa"
    parts = make_ppa_like(root)
    torch.save({"edge": parts["test"]["edge"]}, root / "split" / "throughput" / "test.pt")
    with pytest.raises(DataError, match=r"test\.pt: lacks 'edge_neg'; it holds \['edge'\]"):
        load_ogb_link(root)


def test_a_node_dataset_is_no_link_dataset(tmp_path):
    from test_ogb import make_arxiv_like

    make_arxiv_like(tmp_path / "ogbn_arxiv")
    assert not is_ogb_link_dir(tmp_path / "ogbn_arxiv")
    graph = load_dataset(str(tmp_path / "ogbn_arxiv"))
    assert graph.links is None and graph.num_classes == 4


def test_negatives_that_are_positives_are_kept_and_said(tmp_path):
    root = tmp_path / "ogbl_ppa"
    parts = make_ppa_like(root)
    clash = dict(parts["test"], edge_neg=np.concatenate([parts["test"]["edge"][:3, ::-1], _pairs(5)]))
    torch.save(clash, root / "split" / "throughput" / "test.pt")
    graph = load_ogb_link(root)
    assert graph.links.test_neg.shape == (2, 8)
    assert any(note.startswith("3 of ogbl-ppa's test negatives are also test positives") for note in graph.notes)
    assert dataclasses.replace(graph.links).negative_kind == SHARED


def test_a_stored_split_that_leaks_is_counted_warned_about_and_kept_as_the_benchmark_scores_it(tmp_path, caplog):
    parts = make_ppa_like(tmp_path / "ogbl-ppa")
    parts["test"]["edge"][:3] = parts["train"]["edge"][:3]  # three test positives are message-passing edges
    parts["valid"]["edge"][0] = [7, 7]  # a self loop
    _save(parts, tmp_path / "ogbl-ppa" / "split" / "throughput")
    with caplog.at_level("WARNING", logger="neutronorch"):
        graph = load_ogb_link(tmp_path / "ogbl-ppa")
    issues = graph.links.issues
    assert issues["test_in_message_passing"] >= 3 and issues["test_in_train"] >= 3 and issues["val_self_loops"] == 1
    assert "test edges (first" in caplog.text and "a leak: the benchmark's own split" in caplog.text
    assert any("val edges (first 7 -> 7) are self loops" in note for note in graph.notes)
