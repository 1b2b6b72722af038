"""The synthetic temporal graph (data/synthetic_temporal.py): deterministic, shaped and ordered as a graph with
edge times must be, written by `neutronorch generate synthetic --temporal`, and carrying a link signal that
needs the times: interactions close triangles among recent partners, not among stale ones."""

import json

import numpy as np
import pytest

from neutronorch.cli import main
from neutronorch.data import load_native, synthetic_temporal
from neutronorch.data.synthetic_temporal import temporal_events
from neutronorch.errors import ConfigError

SMALL = dict(nodes=500, events=4000, recent=4)


def test_the_same_arguments_give_the_same_graph_and_another_seed_another():
    first, again = synthetic_temporal(**SMALL), synthetic_temporal(**SMALL)
    for name in ("indptr", "indices", "edge_time", "features", "labels", "train_idx", "val_idx", "test_idx"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    other = synthetic_temporal(**SMALL, seed=1)
    assert not np.array_equal(first.indices, other.indices)


def test_shapes_times_and_both_directions_of_every_interaction():
    graph = synthetic_temporal(nodes=500, events=4000, features=5)
    src, dst, closed = temporal_events(nodes=500, events=4000)
    assert graph.num_nodes == 500 and graph.features.shape == (500, 5) and graph.features.dtype == np.float32
    assert graph.num_edges == 8000 and graph.edge_time.dtype == np.int64  # each interaction both ways
    assert set(np.unique(graph.labels)) <= {0, 1} and graph.num_classes == 2
    graph.validate("synthetic temporal")  # among its checks: every column ascending by time
    columns = np.repeat(np.arange(500), np.diff(graph.indptr))
    same_column = columns[1:] == columns[:-1]
    assert np.all(np.diff(graph.edge_time)[same_column] >= 0)
    assert np.all(graph.indices != columns)  # no self loops
    # the stored edges are exactly the events, each at its index's time, from src to dst and back
    order = np.lexsort((graph.indices, graph.edge_time))
    stored = np.stack([graph.indices[order], columns[order], graph.edge_time[order]])
    both = np.stack([np.stack([src, dst]), np.stack([dst, src])], axis=2).reshape(2, -1)
    events = np.repeat(np.arange(4000), 2)
    expected = np.concatenate([both, events[None]])
    expected = expected[:, np.lexsort((expected[0], expected[2]))]
    assert np.array_equal(stored, expected)
    assert 0.5 < closed.mean() < 0.7  # closing 0.7, less the sources without partners yet


def _before(graph, vertex, time):
    """``vertex``'s partners before ``time``, oldest first: the prefix of its column a strict cut takes."""
    lo, hi = graph.indptr[vertex], graph.indptr[vertex + 1]
    return graph.indices[lo:lo + np.searchsorted(graph.edge_time[lo:hi], time, side="left")]


def _hit_shares(closing: float, recent: int = 4) -> tuple[float, float]:
    """For the last 20% of the events, the share whose destination is in the source's recent 2-hop
    neighbourhood (its ``recent`` newest partners' ``recent`` newest partners, before the event: what a sampler
    taking the newest in-edges reaches), and the share in as many vertices drawn from its stale 2-hop
    neighbourhood (the rest of what a static snapshot of the edges before it reaches in two hops)."""
    graph = synthetic_temporal(nodes=1000, events=10_000, recent=recent, closing=closing, features=1)
    src, dst, _ = temporal_events(nodes=1000, events=10_000, recent=recent, closing=closing)
    rng = np.random.default_rng(0)
    recent_hits = stale_hits = counted = 0
    for t in range(8000, 10_000):
        u, v = src[t], dst[t]
        partners = _before(graph, u, t)
        near = {x for w in partners[-recent:] for x in _before(graph, w, t)[-recent:].tolist()} - {u}
        every = {x for w in np.unique(partners) for x in _before(graph, w, t).tolist()}
        stale = np.array(sorted(every - near - {u}), dtype=np.int64)
        if not near or stale.size < len(near):
            continue
        counted += 1
        recent_hits += v in near
        stale_hits += v in set(rng.choice(stale, len(near), replace=False).tolist())
    assert counted > 1900  # nearly every late event has both neighbourhoods
    return recent_hits / counted, stale_hits / counted


def test_links_close_recent_triangles_not_stale_ones():
    """The learnable, temporal signal: measured 0.71 of the late events in the recent 2-hop neighbourhood
    (11.5 vertices on average, of some 380 in two hops of a static snapshot) against 0.005 in as many stale
    ones; without closing (the control) 0.03 against 0.02, so the margin comes from the closing rule."""
    recent, stale = _hit_shares(closing=0.7)
    assert recent > 0.6 and recent > 20 * stale, (recent, stale)
    recent, stale = _hit_shares(closing=0.0)
    assert recent < 0.1 and recent < 3 * max(stale, 0.005), (recent, stale)


@pytest.mark.parametrize("bad, why", [
    (dict(nodes=2), "nodes must be at least 3"), (dict(events=0), "events must be at least 1"),
    (dict(features=0), "features must be at least 1"), (dict(recent=0), "recent must be at least 1"),
    (dict(closing=1.5), r"closing must be a share in \[0, 1\]"), (dict(closing=float("nan")), "closing=nan"),
    (dict(power=-1.0), "power must be >= 0"), (dict(nodes=2.5), "nodes=2.5 is not a whole number"),
    (dict(events=True), "events=True is not a whole number"), (dict(seed=-1), "seed"),
    (dict(features=10**12), "its arrays do not fit in memory")])
def test_arguments_no_graph_can_be_drawn_from_are_refused_with_the_fix(bad, why):
    with pytest.raises(ConfigError, match=why):
        synthetic_temporal(**{**SMALL, **bad})


def test_a_huge_recent_is_the_whole_history_not_a_huge_allocation():
    assert np.array_equal(synthetic_temporal(**{**SMALL, "recent": 10**12}).indices,
                          synthetic_temporal(**{**SMALL, "recent": SMALL["events"]}).indices)


def test_generate_temporal_writes_a_folder_that_loads_with_its_times(tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["generate", "synthetic", "--temporal", "--nodes", "300", "--events", "2000", "--recent", "3",
                 "--closing", "0.5", "--features", "4", "--seed", "7", "--out", str(out)]) == 0
    loaded = load_native(out)
    drawn = synthetic_temporal(nodes=300, events=2000, recent=3, closing=0.5, features=4, seed=7)
    for name in ("indptr", "indices", "edge_time", "features", "labels"):
        assert np.array_equal(getattr(loaded, name), getattr(drawn, name)), name
    capsys.readouterr()
    assert main(["info", str(out)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["edge_time"] == {"dtype": "int64", "min": 0, "max": 1999, "in_edges_sorted": True}


@pytest.mark.parametrize("argv, why", [
    (["--temporal", "--typed"], "--temporal and --typed"),
    (["--temporal", "--degree", "3", "--classes", "2"], "--degree, --classes do not apply to --temporal"),
    (["--temporal", "--homophily", "0.5"], "--homophily does not apply to --temporal"),
    (["--events", "100"], "--events applies only to --temporal"),
    (["--typed", "--recent", "2", "--closing", "0.1"], "--recent, --closing apply only to --temporal"),
    (["--temporal", "--nodes", "2"], "nodes must be at least 3")])
def test_generate_refuses_what_temporal_cannot_honour_before_writing(argv, why, tmp_path, capsys):
    out = tmp_path / "g"
    assert main(["generate", "synthetic", *argv, "--out", str(out)]) == 2
    assert why in capsys.readouterr().err
    assert not out.exists()
