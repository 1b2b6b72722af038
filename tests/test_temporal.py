"""Times in the data (docs/temporal.md): edge and vertex times on both kinds of graph, sorted in-edges, the
native format, ``info``, and the clear errors for bad times."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from neutronorch.cli.info import dataset_info
from neutronorch.data import Graph
from neutronorch.data.native import load_native, read_typed, save_native, write_typed
from neutronorch.data.relation import Relation
from neutronorch.data.typed import VERTEX, TypedGraph, collapse
from neutronorch.errors import DataError


ROWS = (np.zeros((10, 2)), np.arange(10) % 2)  # ten vertices: enough for the default split


def timed_graph(n=40, edges=300, seed=0, dtype=np.int64, undirected=True, node_time=True) -> Graph:
    rng = np.random.default_rng(seed)
    times = rng.integers(0, 50, edges).astype(dtype)
    return Graph.from_arrays(rng.integers(0, n, edges), rng.integers(0, n, edges), rng.random((n, 3)),
                             rng.integers(0, 2, n), edge_time=times, undirected=undirected,
                             node_time=rng.random(n) * 10 if node_time else None)


def columns(graph_or_relation):
    indptr = np.asarray(graph_or_relation.indptr)
    return [(v, slice(indptr[v], indptr[v + 1])) for v in range(indptr.shape[0] - 1)]


def test_from_arrays_keeps_an_edge_per_time_sorted_by_time_in_every_column():
    # 0->1 at 5 and at 3 (two events), 2->1 at 4, 1->1 a self loop (dropped), 0->1 at 5 again (a repeat).
    g = Graph.from_arrays([0, 0, 2, 1, 0], [1, 1, 1, 1, 1], *ROWS, undirected=False,
                          edge_time=[5, 3, 4, 9, 5])
    column = slice(g.indptr[1], g.indptr[2])
    assert g.indices[column].tolist() == [0, 2, 0] and g.edge_time[column].tolist() == [3, 4, 5]
    assert g.edge_time.dtype == np.int64 and g.num_edges == 3
    undirected = Graph.from_arrays([0, 2], [1, 1], *ROWS, edge_time=[7.5, 2.0])
    assert undirected.edge_time.dtype == np.float64 and undirected.num_edges == 4
    assert undirected.edge_time[undirected.indptr[0]:undirected.indptr[1]].tolist() == [7.5]  # 1->0 at 7.5


def test_every_column_of_a_random_timed_graph_is_ascending_and_holds_the_given_edges():
    rng = np.random.default_rng(3)
    src, dst, times = rng.integers(0, 30, 400), rng.integers(0, 30, 400), rng.integers(0, 20, 400)
    g = Graph.from_arrays(src, dst, np.zeros((30, 1)), np.arange(30) % 2, edge_time=times, undirected=False)
    kept = {(int(s), int(d), int(t)) for s, d, t in zip(src, dst, times) if s != d}
    stored = set()
    for v, column in columns(g):
        assert np.all(np.diff(g.edge_time[column]) >= 0)
        stored |= {(int(u), v, int(t)) for u, t in zip(g.indices[column], g.edge_time[column])}
    assert stored == kept and g.num_edges == len(kept)


def test_relation_from_edges_permutes_edge_features_with_the_times():
    features = np.arange(8, dtype=np.float32).reshape(4, 2)
    rel = Relation.from_edges([0, 1, 2, 0], [0, 0, 0, 1], 3, 2, features, edge_time=[30, 10, 20, 5])
    assert rel.indices.tolist() == [1, 2, 0, 0] and rel.edge_time.tolist() == [10, 20, 30, 5]
    assert rel.edge_features[:, 0].tolist() == [2, 4, 0, 6]  # each row still its edge's


@pytest.mark.parametrize("times, words", [
    ([1.0, np.nan, 2.0], "nan at position 1"),
    (["a", "b", "c"], "expected numbers"),
    ([1, 2], "expected (3,)"),
    ([True, False, True], "expected numbers"),
    ([[1, 2, 3]], "expected (3,)"),
    ([1.0, np.inf, 2.0], "inf at position 1"),
])
def test_bad_edge_times_are_clear_errors(times, words):
    with pytest.raises(DataError, match="edge times") as error:
        Graph.from_arrays([0, 1, 2], [1, 2, 0], *ROWS, edge_time=times, num_nodes=10)
    assert words in str(error.value)


def test_bad_vertex_times_are_clear_errors():
    with pytest.raises(DataError, match=r"vertex times have shape \(2,\), expected \(10,\)"):
        Graph.from_arrays([0], [1], *ROWS, node_time=[1, 2])
    with pytest.raises(DataError, match="vertex times hold nan"):
        Graph.from_arrays([0], [1], *ROWS, node_time=[1.0, np.nan] + [2.0] * 8)


def test_validate_refuses_unsorted_columns_and_times_of_another_graph():
    g = timed_graph()
    column = next(c for _, c in columns(g) if c.stop - c.start > 1 and len(set(g.edge_time[c])) > 1)
    shuffled = g.edge_time.copy()
    shuffled[column] = shuffled[column][::-1]
    with pytest.raises(DataError, match="in-edges are not ascending"):
        dataclasses.replace(g, edge_time=shuffled).validate("hand-made")
    with pytest.raises(DataError, match=f"hold {g.num_edges - 1} times for {g.num_edges} edges"):
        dataclasses.replace(g, edge_time=g.edge_time[1:]).validate("hand-made")
    with pytest.raises(DataError, match="must be a 1-D int64 or float64 array"):
        dataclasses.replace(g, edge_time=g.edge_time.astype(np.int32)).validate("hand-made")


def test_native_format_round_trips_times_of_both_kinds_of_graph(tmp_path):
    g = timed_graph()
    save_native(g, tmp_path / "flat")
    meta = json.loads((tmp_path / "flat" / "meta.json").read_text())
    assert meta["edge_time_dtype"] == "int64" and meta["node_time_dtype"] == "float64"
    back = load_native(tmp_path / "flat")
    assert np.array_equal(back.edge_time, g.edge_time) and np.array_equal(back.node_time, g.node_time)
    typed = TypedGraph.of(g).with_reverse()
    write_typed(typed, tmp_path / "typed")
    read = read_typed(tmp_path / "typed")
    for key, relation in typed.relations.items():
        assert np.array_equal(read.relations[key].edge_time, relation.edge_time)
    assert np.array_equal(read.node_time[VERTEX], g.node_time)
    assert np.array_equal(TypedGraph.of(g).as_graph().edge_time, g.edge_time)


def test_native_format_refuses_bad_time_files(tmp_path):
    save_native(timed_graph(), tmp_path / "g")
    meta_path = tmp_path / "g" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "edge_time_dtype": "int32"}))
    with pytest.raises(DataError, match="a time dtype is 'int32'"):
        load_native(tmp_path / "g")
    meta_path.write_text(json.dumps({**meta, "edge_time_dtype": "float64"}))
    with pytest.raises(DataError, match="holds int64"):
        load_native(tmp_path / "g")
    meta_path.write_text(json.dumps(meta))
    np.save(tmp_path / "g" / "edge_time.npy", np.zeros(3, np.int64))
    with pytest.raises(DataError, match="holds shape"):
        load_native(tmp_path / "g")


def test_reverse_relations_carry_their_times_sorted():
    g = timed_graph(undirected=False)
    typed = TypedGraph.of(g)
    typed = typed.with_reverse()
    reverse = typed.relations[(VERTEX, "rev_to", VERTEX)]
    typed.validate()  # every column ascending
    forward = {(int(u), v, int(t)) for v, c in columns(g) for u, t in zip(g.indices[c], g.edge_time[c])}
    backward = {(v, int(u), int(t)) for v, c in columns(reverse) for u, t in zip(reverse.indices[c],
                                                                               reverse.edge_time[c])}
    assert forward == backward


def test_info_shows_the_times(tmp_path):
    save_native(timed_graph(), tmp_path / "g")
    info = dataset_info(str(tmp_path / "g"))
    assert info["edge_time"]["in_edges_sorted"] is True and info["edge_time"]["dtype"] == "int64"
    assert 0 <= info["edge_time"]["min"] <= info["edge_time"]["max"] < 50
    assert info["node_time"]["dtype"] == "float64"


def test_collapse_refuses_a_timed_typed_graph():
    with pytest.raises(DataError, match="not yet collapsed"):
        collapse(TypedGraph.of(timed_graph()))


def test_times_from_tensors():
    g = Graph.from_arrays(torch.tensor([0, 1]), torch.tensor([1, 2]), torch.zeros(10, 2), torch.arange(10) % 2,
                          edge_time=torch.tensor([2, 1]), node_time=torch.arange(10) + 0.5)
    assert g.edge_time.dtype == np.int64 and g.node_time[:3].tolist() == [0.5, 1.5, 2.5]


def test_what_does_not_sample_by_time_refuses_a_timed_graph():
    from neutronorch.config import TrainConfig
    from neutronorch.errors import ConfigError
    from neutronorch.loader import NeighborLoader
    from neutronorch.train.trainer import train

    g = timed_graph()
    with pytest.raises(ConfigError, match="temporal sampling: .* would sample it without them"):
        NeighborLoader(g, [2], 4)
    with pytest.raises(ConfigError, match="temporal sampling: .* the node task \\(by vertex times\\) of the built-in "
                                          "models, on either"):
        train(TrainConfig(fanouts=[2], epochs=1, hidden=4), timed_graph(node_time=False))
    static = dataclasses.replace(g, edge_time=None, node_time=None)
    assert next(iter(NeighborLoader(static, [2], 4))).batch_size == 4  # the fix the message gives works


def test_pyg_times_round_trip_and_are_read_by_length():
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data, HeteroData

    from neutronorch.data.interop import from_pyg, from_pyg_hetero, to_pyg, to_pyg_hetero

    g = timed_graph(undirected=False)
    data = to_pyg(g)
    assert torch.equal(data.edge_time, torch.from_numpy(g.edge_time)) and data.time.shape == (g.num_nodes,)
    back = from_pyg(data, undirected=False)
    assert np.array_equal(back.edge_time, g.edge_time) and np.array_equal(back.node_time, g.node_time)
    edge_index = torch.tensor([[0, 1, 2], [1, 2, 3]])
    as_edges = from_pyg(Data(x=torch.zeros(10, 2), y=torch.arange(10) % 2, edge_index=edge_index,
                             time=torch.tensor([3, 1, 2])), undirected=False)  # 3 entries: one per edge
    assert as_edges.edge_time.tolist() == [3, 1, 2] and as_edges.node_time is None
    with pytest.raises(DataError, match="`time` holds 4 entries"):
        from_pyg(Data(x=torch.zeros(10, 2), y=torch.arange(10) % 2, edge_index=edge_index, time=torch.zeros(4)))
    typed = TypedGraph.of(g).with_reverse()
    hetero = to_pyg_hetero(typed)
    read = from_pyg_hetero(hetero, target=VERTEX)
    for key, relation in typed.relations.items():
        assert np.array_equal(read.relations[key].edge_time, relation.edge_time)
    assert np.array_equal(read.node_time[VERTEX], g.node_time)
    assert isinstance(hetero, HeteroData)


def test_dgl_times_round_trip():
    pytest.importorskip("dgl")
    from neutronorch.data.interop import from_dgl, from_dgl_hetero, to_dgl, to_dgl_hetero

    g = timed_graph(undirected=False)
    dg = to_dgl(g)
    assert torch.equal(dg.edata["timestamp"], torch.from_numpy(g.edge_time))
    back = from_dgl(dg, undirected=False)
    assert np.array_equal(back.edge_time, g.edge_time) and np.array_equal(back.node_time, g.node_time)
    dg.edata["time"] = dg.edata["timestamp"]
    with pytest.raises(DataError, match="holds both timestamp and time"):
        from_dgl(dg)
    typed = TypedGraph.of(g).with_reverse()
    read = from_dgl_hetero(to_dgl_hetero(typed), target=VERTEX)
    for key, relation in typed.relations.items():
        assert np.array_equal(read.relations[key].edge_time, relation.edge_time)
    assert np.array_equal(read.node_time[VERTEX], g.node_time)


JODIE = """user_id,item_id,timestamp,state_label,comma_separated_list_of_features
0,0,0.0,0,0.1,0.2
1,0,36.0,0,0.3,0.4
0,1,77.0,1,0.5,0.6
2,1,77.0,0,0.7,0.8
"""


def test_jodie_interactions_convert_to_a_typed_graph_with_times(tmp_path):
    from neutronorch.cli.app import main
    from neutronorch.data.jodie import RELATION, load_jodie

    source = tmp_path / "wiki.csv"
    source.write_text(JODIE)
    g = load_jodie(source)
    relation = g.relations[RELATION]
    assert g.num_nodes == {"user": 3, "item": 2} and relation.edge_time.dtype == np.int64
    assert relation.indices.tolist() == [0, 1, 0, 2] and relation.edge_time.tolist() == [0, 36, 77, 77]
    assert relation.edge_features[:, 0].tolist() == pytest.approx([0.1, 0.3, 0.5, 0.7])
    assert main(["convert", str(source), str(tmp_path / "out")]) == 0
    read = read_typed(tmp_path / "out")
    assert np.array_equal(read.relations[RELATION].edge_time, relation.edge_time)
    assert dataset_info(str(tmp_path / "out"))["relations"][0]["edge_time"]["in_edges_sorted"] is True


@pytest.mark.parametrize("text, words", [
    (JODIE.replace("77.0,1", "7.0,1"), "line 4 has timestamp 7.0, before the line above's 36.0"),
    (JODIE.replace("1,0,36.0", "1.5,0,36.0"), "line 3 has user_id 1.5"),
    (JODIE.replace("36.0", "nan"), "line 3 has timestamp nan"),
    (JODIE.replace("0.3,0.4", "0.3"), "not a table of numbers of one width"),
    (JODIE.split("\n")[0] + "\n", "holds a header and no interaction"),
])
def test_bad_jodie_files_are_clear_errors(tmp_path, text, words):
    from neutronorch.data.jodie import load_jodie

    source = tmp_path / "bad.csv"
    source.write_text(text)
    with pytest.raises(DataError) as error:
        load_jodie(source)
    assert words in str(error.value)


def test_ogb_years_are_read_as_times_when_asked(tmp_path):
    from test_ogb import N, _write_csv, make_arxiv_like
    from test_ogb_link import make_collab_like

    from neutronorch.data.ogb import load_ogb
    from neutronorch.data.ogb_link import load_ogb_link

    make_arxiv_like(tmp_path / "ogbn_arxiv")
    assert load_ogb(tmp_path / "ogbn_arxiv").node_time is None  # only when asked: a static graph otherwise
    with pytest.raises(DataError, match="node_year.csv.gz: missing"):
        load_ogb(tmp_path / "ogbn_arxiv", times=True)
    years = np.arange(N) % 30 + 1990
    _write_csv(tmp_path / "ogbn_arxiv" / "raw" / "node_year.csv.gz", years, "{}")
    assert np.array_equal(load_ogb(tmp_path / "ogbn_arxiv", times=True).node_time, years)
    make_collab_like(tmp_path / "ogbl_collab")
    raw = tmp_path / "ogbl_collab" / "raw"
    edges = np.loadtxt(raw / "edge.csv.gz", delimiter=",", dtype=np.int64)
    edge_years = np.loadtxt(raw / "edge_year.csv.gz", dtype=np.int64)
    g = load_ogb_link(tmp_path / "ogbl_collab", times=True)
    stored = {(int(u), v, int(t)) for v, c in columns(g) for u, t in zip(g.indices[c], g.edge_time[c])}
    given = {(int(s), int(d), int(t)) for (s, d), t in zip(edges, edge_years) if s != d}
    assert stored == given | {(d, s, t) for s, d, t in given}  # each year's collaboration both ways
    assert load_ogb_link(tmp_path / "ogbl_collab").edge_time is None


def test_convert_keeps_an_ogb_node_datasets_years_on_request_and_the_folder_trains_by_them(tmp_path, capsys):
    from test_ogb import N, _write_csv, make_arxiv_like

    from neutronorch import TrainConfig, train
    from neutronorch.cli.app import main
    from neutronorch.data import load_dataset

    make_arxiv_like(tmp_path / "ogbn_arxiv")
    years = np.arange(N) % 30 + 1990
    _write_csv(tmp_path / "ogbn_arxiv" / "raw" / "node_year.csv.gz", years, "{}")
    assert main(["convert", str(tmp_path / "ogbn_arxiv"), str(tmp_path / "plain")]) == 0
    assert load_native(tmp_path / "plain").node_time is None  # static unless asked
    assert main(["convert", str(tmp_path / "ogbn_arxiv"), str(tmp_path / "timed"), "--times"]) == 0
    timed = load_native(tmp_path / "timed")
    assert np.array_equal(timed.node_time, years)
    assert np.array_equal(load_dataset(str(tmp_path / "ogbn_arxiv"), times=True).node_time, years)
    summary = train(TrainConfig(dataset=str(tmp_path / "timed"), fanouts=[3, 3], hidden=8, epochs=1, progress=False))
    assert summary["status"] == "completed" and summary["mode"] == "exact"  # a node task by vertex times
    with pytest.raises(DataError, match="reading its times was asked for, but it is no OGB folder"):
        load_dataset(str(tmp_path / "timed"), times=True)
    (tmp_path / "wiki.csv").write_text(JODIE)
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "wiki.csv"), str(tmp_path / "wiki"), "--times"]) == 2
    assert "--times: " in capsys.readouterr().err and not (tmp_path / "wiki").exists()


def test_an_ogb_link_dataset_read_with_its_years_trains_a_temporal_link_task(tmp_path):
    """ogbl-collab's links carry years, and its shared negatives are scored at their set's one year."""
    from test_ogb_link import make_collab_like

    from neutronorch import TrainConfig, train
    from neutronorch.data import load_dataset
    from neutronorch.data.links import SHARED
    from neutronorch.data.ogb_link import load_ogb_link

    parts = make_collab_like(tmp_path / "ogbl_collab")
    graph = load_ogb_link(tmp_path / "ogbl_collab", times=True)
    links = graph.links
    assert links.timed and links.negative_kind == SHARED
    assert np.array_equal(links.train_time, parts["train"]["year"]) and set(links.test_time) == {2019}
    assert np.array_equal(load_dataset(str(tmp_path / "ogbl_collab"), times=True).links.val_time, links.val_time)
    config = dict(dataset=str(tmp_path / "ogbl_collab"), task="link", times=True, epochs=1, fanouts=[3, 3],
                  hidden=8, batch_size=64, threads=1, progress=False)
    summary = train(TrainConfig(**config))
    assert summary["metric"] == "hits@50" and summary["mode"] == "exact"
    epoch = summary["epochs"][-1]
    assert 0 <= epoch["test_hits_50"] <= 1 and 0 <= epoch["test_rocauc"] <= 1 and "test_ap" not in epoch
    spread = dataclasses.replace(links, val_time=links.val_time - np.arange(links.val_time.shape[0]) % 2)
    with pytest.raises(DataError, match=r"span 2017..2018, and the split's negatives are shared pairs"):
        train(TrainConfig(**{**config, "dataset": "synthetic", "times": False}),
              graph=dataclasses.replace(graph, links=spread))
    with pytest.raises(DataError, match="reading its times was asked for, but it is no OGB folder"):
        load_dataset("synthetic", times=True)


def test_a_random_edge_split_of_a_timed_graph_is_refused():
    from neutronorch.data.edge_split import split_edges

    with pytest.raises(DataError, match="a chronological split is not yet offered"):
        split_edges(timed_graph(), 0.8, 0.1)


def test_a_loaded_graphs_time_files_are_among_its_files(tmp_path):
    save_native(timed_graph(), tmp_path / "g")
    files = list(map(str, load_native(tmp_path / "g").files()))
    assert str(tmp_path / "g" / "edge_time.npy") in files and str(tmp_path / "g" / "node_time.npy") in files
