"""Link splits: the seeded edge split of a graph, its message-passing graph, and the checks on a split."""

import dataclasses

import numpy as np
import pytest

from neutronorch import ConfigError, DataError
from neutronorch.data import Graph, load_native, save_native
from neutronorch.data.csc import drop_edges, edge_hygiene, edges_to_csc
from neutronorch.data.edge_split import parse_link_split, split_edges
from neutronorch.data.links import PER_SOURCE, SAMPLED, SHARED, LinkSplit, check_link_split, count_positive_negatives

RNG = np.random.default_rng(3)
N = 400


def is_symmetric(indptr, indices) -> bool:
    return edge_hygiene(indptr, indices)["edges_without_reverse"] == 0


def _graph(undirected=True, edges=3000, self_loops=False):
    src, dst = RNG.integers(0, N, edges), RNG.integers(0, N, edges)
    graph = Graph.from_arrays(src, dst, RNG.standard_normal((N, 4)).astype(np.float32), RNG.integers(0, 3, N),
                              undirected=undirected)
    if self_loops:  # from_arrays drops them; a native folder may hold some
        pairs = {(int(u), int(v)) for u, v in zip(*_edge_list(graph))} | {(v, v) for v in range(0, N, 7)}
        src, dst = np.array(sorted(pairs)).T
        keys = np.sort(dst * N + src)
        graph.indptr = np.concatenate([[0], np.cumsum(np.bincount(keys // N, minlength=N))])
        graph.indices = (keys % N).astype(np.int32)
    return graph


def _csc_of(graph):
    return np.asarray(graph.indptr), np.asarray(graph.indices)


def _edge_list(graph):
    """(src, dst) of every stored edge."""
    indptr, indices = _csc_of(graph)
    return indices.astype(np.int64), np.repeat(np.arange(graph.num_nodes), np.diff(indptr))


def _edge_set(graph):
    return set(zip(*(a.tolist() for a in _edge_list(graph))))


def _pairs(array):
    return set(zip(array[0].tolist(), array[1].tolist()))


def test_parse_link_split_reads_shares_and_says_how_to_fix_a_bad_spec():
    assert parse_link_split("edges:0.85,0.05") == (0.85, 0.05)
    for spec, says in (("ratio:0.8,0.1", "edges:TRAIN,VAL"), ("edges:0.8", "edges:TRAIN,VAL"),
                       ("edges:a,0.1", "must be numbers"), ("edges:0.9,0.1", "sum to less than 1"),
                       ("edges:0,0.1", "lie in (0, 1)"), ("edges:nan,0.1", "lie in (0, 1)")):
        with pytest.raises(ConfigError, match=r"link split .*" + "".join("\\" + c if c in "()." else c for c in says)):
            parse_link_split(spec)


def test_an_undirected_split_puts_each_edge_and_its_reverse_on_one_side_once():
    graph = _graph()
    edges = _edge_set(graph)
    out = split_edges(graph, 0.7, 0.1, seed=5)
    links = out.links
    assert links.undirected and links.negative_kind == SAMPLED
    sets = [_pairs(links.train), _pairs(links.val), _pairs(links.test)]
    undirected = {(min(u, v), max(u, v)) for u, v in edges}
    # Each undirected edge exactly once, stored source < target, on exactly one side.
    assert sum(map(len, sets)) == len(undirected) == links.train.shape[1] + links.val.shape[1] + links.test.shape[1]
    assert set().union(*sets) == undirected and all(u < v for s in sets for u, v in s)
    assert links.train.shape[1] == round(0.7 * len(undirected)) and links.val.shape[1] == round(0.1 * len(undirected))
    for array in (links.train, links.val, links.test):
        assert array.dtype == np.int64 and array.shape[0] == 2


def test_evaluation_edges_leave_message_passing_both_ways_and_training_edges_stay():
    graph = _graph()
    out = split_edges(graph, 0.7, 0.1, seed=5)
    kept = _edge_set(out)
    held_out = _pairs(out.links.val) | _pairs(out.links.test)
    assert not any((u, v) in kept or (v, u) in kept for u, v in held_out)
    assert all((u, v) in kept and (v, u) in kept for u, v in _pairs(out.links.train))
    assert kept == _edge_set(graph) - held_out - {(v, u) for u, v in held_out}
    assert out.num_edges == graph.num_edges - 2 * len(held_out)
    indptr, indices = _csc_of(out)
    assert all(np.all(np.diff(indices[indptr[v]:indptr[v + 1]]) > 0) for v in range(N))  # columns stay sorted
    out.validate("split")
    assert is_symmetric(*_csc_of(out))


def test_the_split_keeps_features_labels_and_node_splits_and_the_same_seed_gives_the_same_split():
    graph = _graph()
    first, again, other = (split_edges(graph, 0.8, 0.1, seed=s) for s in (1, 1, 2))
    assert first.features is graph.features and first.labels is graph.labels
    assert first.train_idx is graph.train_idx and first.num_classes == graph.num_classes
    for name in ("train", "val", "test"):
        assert np.array_equal(getattr(first.links, name), getattr(again.links, name))
    assert not np.array_equal(first.links.val, other.links.val)
    assert graph.links is None and any("link split" in note for note in first.notes)
    assert "links" in first.describe() and "classes" in first.describe()


def test_a_directed_graph_splits_directed_edges_and_keeps_reverses_of_held_out_ones():
    graph = _graph(undirected=False)
    assert not is_symmetric(*_csc_of(graph))
    out = split_edges(graph, 0.6, 0.2, seed=0)
    assert not out.links.undirected
    edges = _edge_set(graph)
    assert _pairs(out.links.train) | _pairs(out.links.val) | _pairs(out.links.test) == edges
    held_out = _pairs(out.links.val) | _pairs(out.links.test)
    assert _edge_set(out) == edges - held_out
    kept_reverse = [(v, u) for u, v in held_out if (v, u) in edges and (v, u) in _pairs(out.links.train)]
    assert all(edge in _edge_set(out) for edge in kept_reverse)


def test_self_loops_are_no_links_and_stay_in_message_passing():
    graph = _graph(self_loops=True)
    assert is_symmetric(*_csc_of(graph))
    out = split_edges(graph, 0.7, 0.1, seed=0)
    links = np.concatenate([out.links.train, out.links.val, out.links.test], axis=1)
    assert not np.any(links[0] == links[1])
    assert all((v, v) in _edge_set(out) for v in range(0, N, 7))


def test_a_memory_mapped_graph_is_split_without_copying_its_features(tmp_path):
    save_native(_graph(), tmp_path / "g")
    graph = load_native(tmp_path / "g")
    out = split_edges(graph, 0.8, 0.1)
    assert out.features is graph.features and isinstance(out.features, np.memmap)
    assert out.num_edges < graph.num_edges
    with pytest.raises(DataError, match="does not store a link split"):
        save_native(out, tmp_path / "h")


def test_symmetry_is_detected_for_unsorted_columns_and_one_missing_reverse():
    indptr, indices = edges_to_csc(np.array([0, 1, 2, 0]), np.array([1, 2, 3, 3]), 4)
    assert is_symmetric(indptr, indices)
    shuffled = indices.copy()
    for v in range(4):
        shuffled[indptr[v]:indptr[v + 1]] = shuffled[indptr[v]:indptr[v + 1]][::-1]
    assert not np.array_equal(shuffled, indices) and is_symmetric(indptr, shuffled)
    one_way, kept = drop_edges(indptr, indices, np.array([3 * 4 + 0]))  # drop 0 -> 3, keep 3 -> 0
    assert kept.shape[0] == indices.shape[0] - 1 and not is_symmetric(one_way, kept)
    for v in range(4):
        kept[one_way[v]:one_way[v + 1]] = kept[one_way[v]:one_way[v + 1]][::-1]
    assert not is_symmetric(one_way, kept)


def test_symmetry_with_repeated_edges_and_self_loops_agrees_with_a_set_of_pairs():
    # 0 -> 1 twice and 1 -> 0 once balance 3 -> 2, which has no reverse: counting alone would say symmetric.
    assert not is_symmetric(np.array([0, 1, 3, 4, 4]), np.array([1, 0, 0, 3], np.int32))
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 7))
        m = int(rng.integers(0, 12))
        src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
        if rng.random() < 0.5:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        order = np.lexsort((src, dst)) if rng.random() < 0.7 else rng.permutation(src.shape[0])  # sorted or not
        src, dst = src[order], dst[order]
        by_column = np.argsort(dst, kind="stable")  # each column keeps that order
        indptr = np.concatenate([[0], np.cumsum(np.bincount(dst, minlength=n))])
        pairs = set(zip(src.tolist(), dst.tolist()))
        assert is_symmetric(indptr, src[by_column]) == all((v, u) in pairs for u, v in pairs)


def test_a_split_that_leaves_a_set_empty_or_splits_twice_is_refused():
    tiny = Graph.from_arrays(np.array([0, 1]), np.array([1, 2]), np.zeros((3, 2), np.float32),
                             np.array([0, 1, 0]), splits=([0], [1], [2]))
    with pytest.raises(ConfigError, match="leave the .* set empty"):
        split_edges(tiny, 0.5, 0.3)
    with pytest.raises(ConfigError, match="sum to less than 1"):
        split_edges(tiny, 0.8, 0.3)
    out = split_edges(_graph(), 0.8, 0.1)
    with pytest.raises(DataError, match="already carries a link split"):
        split_edges(out, 0.8, 0.1)


def _split(**changes):
    base = LinkSplit(train=np.array([[0, 1, 2], [1, 2, 3]]), val=np.array([[3, 4, 1], [4, 5, 5]]),
                     test=np.array([[5, 6, 0], [6, 7, 7]]), undirected=True)
    return dataclasses.replace(base, **changes)


def test_check_link_split_names_the_set_the_vertex_and_the_count_out_of_range():
    check_link_split(_split(), 8)
    with pytest.raises(DataError, match=r"test names vertex 7, outside 0\.\.6, and 2 entries"):
        check_link_split(_split(), 7)
    with pytest.raises(DataError, match=r"val names vertex -1.* 1 entries"):
        check_link_split(_split(val=np.array([[3, -1, 1], [4, 5, 5]])), 8)


def test_check_link_split_refuses_empty_sets_and_wrong_shapes_or_dtypes():
    with pytest.raises(DataError, match="the val set holds no edges"):
        check_link_split(_split(val=np.empty((2, 0), np.int64)), 8)
    with pytest.raises(DataError, match=r"train has shape \(3, 2\), expected \(2, E\).*Transpose"):
        check_link_split(_split(train=np.array([[0, 1], [1, 2], [2, 3]])), 8)
    with pytest.raises(DataError, match="test has dtype int32, expected int64"):
        check_link_split(_split(test=np.array([[5], [6]], np.int32)), 8)
    with pytest.raises(DataError, match=r"test_neg has shape \(4, 4\), expected \(3, K\) negative targets"):
        check_link_split(_split(val_neg=np.zeros((3, 4), np.int64), test_neg=np.zeros((4, 4), np.int64),
                                negatives=PER_SOURCE), 8)


def test_negatives_are_read_as_shared_or_per_source_from_their_shapes():
    shared = _split(val_neg=np.array([[0, 2, 3], [5, 6, 7]]), test_neg=np.array([[1, 2], [4, 6]]))
    assert shared.negative_kind == SHARED
    check_link_split(shared, 8)
    per_source = _split(val=np.array([[3, 4], [4, 5]]), val_neg=np.array([[7, 6, 2], [0, 1, 2]]),
                        test_neg=np.array([[2, 3]] * 3))
    assert per_source.negative_kind is None  # val has 2 positives: a (2, K) array is ambiguous
    with pytest.raises(DataError, match="say neither form"):
        check_link_split(per_source, 8)
    per_source = dataclasses.replace(per_source, negatives=PER_SOURCE)
    check_link_split(per_source, 8)
    with pytest.raises(DataError, match="val_neg is given but negatives is \"sampled\""):
        check_link_split(_split(val_neg=np.zeros((2, 3), np.int64), negatives=SAMPLED), 8)


def test_negatives_that_are_positives_of_their_own_set_are_counted_and_kept():
    # val positives 3-4, 4-5 and 1-5 (undirected); shared negatives 4-3 (a positive reversed), 5-4 and 0-7.
    split = _split(val_neg=np.array([[4, 5, 0], [3, 4, 7]]), test_neg=np.array([[1, 2], [4, 6]]))
    assert count_positive_negatives(split, "val", 8) == 2 and count_positive_negatives(split, "test", 8) == 0
    check_link_split(split, 8)
    # Per source, directed: a negative target 7 for test positive 0 -> 7 is that positive itself.
    directed = _split(undirected=False, val_neg=np.array([[0, 1], [2, 3], [0, 2]]),
                      test_neg=np.array([[1, 2], [4, 3], [0, 1]]), negatives=PER_SOURCE)
    assert count_positive_negatives(directed, "test", 8) == 0
    directed.test_neg[2, 0] = 7
    assert count_positive_negatives(directed, "test", 8) == 1


def test_a_link_only_graph_validates_without_labels_and_a_bad_split_does_not():
    graph = _graph()
    link_only = dataclasses.replace(graph, labels=np.full(N, -1, np.int64), num_classes=0,
                                    train_idx=np.empty(0, np.int64), val_idx=np.empty(0, np.int64),
                                    test_idx=np.empty(0, np.int64), links=_split())
    link_only.validate("g")
    assert "classes" not in link_only.describe() and "links 3/3/3 undirected" in link_only.describe()
    # No links and no split either: a graph without labels, for a link task to split as it trains.
    assert "no labels" in dataclasses.replace(link_only, links=None).validate("g").describe()
    with pytest.raises(DataError, match="num_classes is 0"):  # no links and a split: a node task, which needs classes
        dataclasses.replace(link_only, links=None, train_idx=np.arange(3)).validate("g")
    with pytest.raises(DataError, match="test names vertex"):
        dataclasses.replace(link_only, links=_split(test=np.array([[0], [N]]))).validate("g")


def _one_way(graph, count):
    """``graph`` without one direction of ``count`` of its edges (a symmetric graph with a few one-way edges)."""
    src, dst = _edge_list(graph)
    forward = np.flatnonzero(src < dst)[:count]
    indptr, indices = drop_edges(*_csc_of(graph), np.sort(dst[forward] * N + src[forward]))
    return dataclasses.replace(graph, indptr=indptr, indices=indices)


def test_a_few_one_way_edges_leave_a_symmetric_graph_undirected_and_no_held_out_pair_leaks(caplog):
    graph = _one_way(_graph(), 25)
    assert not is_symmetric(*_csc_of(graph))
    with caplog.at_level("INFO", logger="neutronorch"):
        out = split_edges(graph, 0.7, 0.1, seed=2)
    links = out.links
    assert links.undirected and "have their reverse (at least 50%)" in links.direction
    assert "links split as undirected" in caplog.text and "of the edges have their reverse" in out.notes[-1]
    kept, train = _edge_set(out), _pairs(links.train)
    held_out = _pairs(links.val) | _pairs(links.test)
    # Neither direction of a held-out pair carries messages or is a training positive; each pair once.
    assert not any((u, v) in kept or (v, u) in kept or (u, v) in train or (v, u) in train for u, v in held_out)
    undirected = {(min(u, v), max(u, v)) for u, v in _edge_set(graph)}
    assert train | held_out == undirected and all(u < v for u, v in train | held_out)


def test_link_direction_forces_either_way_and_auto_calls_a_sparse_reciprocity_directed():
    graph = _one_way(_graph(), 25)
    directed = split_edges(graph, 0.7, 0.1, seed=2, direction="directed").links
    assert not directed.undirected and "`link_direction` directed" in directed.direction
    assert _pairs(directed.train) | _pairs(directed.val) | _pairs(directed.test) == _edge_set(graph)
    one_way = _graph(undirected=False)  # a few reverses by chance only
    assert not split_edges(one_way, 0.7, 0.1).links.undirected
    forced = split_edges(one_way, 0.7, 0.1, direction="undirected")
    held_out = _pairs(forced.links.val) | _pairs(forced.links.test)
    assert forced.links.undirected and not any((v, u) in _edge_set(forced) for u, v in held_out)
    with pytest.raises(ConfigError, match="`link_direction` 'sideways': choose one of auto, undirected, directed"):
        split_edges(graph, 0.7, 0.1, direction="sideways")


def test_a_split_given_with_its_graph_that_leaks_is_refused_with_the_counts_and_oddities_are_kept(caplog):
    from neutronorch import TrainConfig
    from neutronorch.train.link_task import link_graph

    split = split_edges(_graph(), 0.7, 0.1, seed=1)
    links = split.links
    config = TrainConfig(task="link")
    leaky = dataclasses.replace(links, test=np.concatenate([links.train[:, :4], links.test], axis=1))  # checked again
    with pytest.raises(DataError, match=r"the link split leaks: 4 test edges .* are in the graph's edges .*; 4 "
                                         r"test edges \(first \d+ -> \d+\) are training positives too \(either "
                                         r"direction\) \(of \d+\)"):
        link_graph(dataclasses.replace(split, links=leaky), config)
    with pytest.raises(DataError, match="the link split leaks"):  # refused again: a refusal marks nothing checked
        link_graph(dataclasses.replace(split, links=leaky), config)
    reverse = links.val[::-1, :1]  # a held-out pair's reverse direction back in message passing
    passing = Graph.from_arrays(*np.concatenate([np.stack(_edge_list(split)), reverse], axis=1), split.features,
                                split.labels, undirected=False)
    with pytest.raises(DataError, match=r"1 val edges \(first \d+ -> \d+\) are in the graph's edges \(either "):
        link_graph(dataclasses.replace(passing, links=links), config)  # the same split, another graph
    odd = dataclasses.replace(links, val=np.concatenate([links.val, [[5], [5]], links.val[:, :1]], axis=1))
    with caplog.at_level("WARNING", logger="neutronorch"):
        out = link_graph(dataclasses.replace(split, links=odd), config)
    assert out.links.issues == {"val_self_loops": 1, "val_repeated": 1}
    assert "1 val edges (first 5 -> 5) are self loops" in caplog.text and "(kept)" in out.notes[-1]


def _pyg_like_stages(graph, links):
    """Three objects laid out as RandomLinkSplit's Data (duck-typed: PyG itself is not needed)."""
    from types import SimpleNamespace

    import torch

    edge_index = torch.from_numpy(np.stack(_edge_list(graph)))
    x = torch.from_numpy(np.asarray(graph.features))

    def stage(positives):
        negatives = RNG.integers(0, graph.num_nodes, positives.shape)
        return SimpleNamespace(x=x, num_nodes=graph.num_nodes, edge_index=edge_index,
                               edge_label_index=torch.from_numpy(np.concatenate([positives, negatives], 1)),
                               edge_label=torch.cat([torch.ones(positives.shape[1]), torch.zeros(positives.shape[1])]))
    return stage(links.train), stage(links.val), stage(links.test)


def test_a_pyg_split_is_undirected_by_measure_and_one_stray_edge_is_a_leak_not_a_directed_split():
    from neutronorch import from_pyg_link

    base = _graph()
    undirected = split_edges(base, 0.7, 0.1, seed=4)
    read = from_pyg_link(*_pyg_like_stages(undirected, undirected.links))
    assert read.links.undirected and read.links.direction.startswith("undirected: 100.0% of train_data.edge_index")
    directed = split_edges(base, 0.7, 0.1, seed=4, direction="directed")  # RandomLinkSplit(is_undirected=False)
    read = from_pyg_link(*_pyg_like_stages(directed, directed.links))
    assert not read.links.undirected and "of the validation and test positives' reverses are in it" in read.notes[0]
    val = undirected.links.val
    stray = Graph.from_arrays(*np.concatenate([np.stack(_edge_list(undirected)), val[::-1, :1]], axis=1),
                              undirected.features, undirected.labels, undirected=False)  # one reverse back in
    with pytest.raises(DataError, match=r"the link split leaks: 1 val edges \(first \d+ -> \d+\) are in "
                                         r"train_data.edge_index \(either direction\)"):
        from_pyg_link(*_pyg_like_stages(stray, undirected.links))
