"""numba compiles a kernel once per type of its arguments, and an array's type includes whether it is read-only:
a graph mapped from a file is, one built in memory is not. What the kernels only read is passed read-only
wherever it comes from (``jit.read_only``), so both kinds of graph share every compiled kernel (each one a
compile of seconds on a cold cache)."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from neutronorch.data import csc, load_dataset
from neutronorch.data.csc import drop_edges, edge_hygiene
from neutronorch.data.synthetic_typed import synthetic_typed
from neutronorch.features.store import FeatureStore
from neutronorch.jit import read_only
from neutronorch.sampling import hop_pipeline, kernels, temporal_kernels
from neutronorch.sampling.neighbor_sampler import NeighborSampler
from neutronorch.sampling.temporal_sampler import TemporalNeighborSampler, TemporalTypedSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler
from test_temporal_sampler import timed_graph, typed_graph


def test_read_only_is_a_view_of_the_same_memory():
    array = np.arange(6)
    view = read_only(array)
    assert not view.flags.writeable and np.shares_memory(array, view) and array.flags.writeable
    assert read_only(view) is view and read_only(None) is None
    with pytest.raises(ValueError):
        view[0] = 1


@pytest.fixture
def calls(monkeypatch):
    """Records, for each kernel called from Python, whether each argument it only reads was writable."""
    seen = []

    def record(module, name, reads):
        kernel = getattr(module, name)

        def called(*args):
            seen.append((name, [args[i].flags.writeable for i in reads]))
            return kernel(*args)
        monkeypatch.setattr(module, name, called)

    for module, name, reads in ((hop_pipeline, "draw_and_relabel", (0, 1)), (kernels, "sample_neighbors", (0, 1)),
                                (kernels, "sample_neighbor_edges", (0, 1)), (kernels, "_gather", (0,)),
                                (temporal_kernels, "sample_temporal", (0, 1, 2)), (csc, "_count_hygiene", (0, 1)),
                                (csc, "_keep", (0, 1))):
        record(module, name, reads)
    return seen


def test_a_graph_built_in_memory_reaches_the_kernels_read_only(calls):
    graph = load_dataset("synthetic:nodes=300,degree=6")
    assert graph.indptr.flags.writeable and graph.features.flags.writeable
    seeds = np.asarray(graph.train_idx[:20])
    before = numba.get_num_threads()
    try:  # one thread draws then relabels; two draw and relabel at once (where numba has two)
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            NeighborSampler(graph.indptr, graph.indices, [4, 3]).sample(seeds, key=threads)
    finally:
        numba.set_num_threads(before)
    store = FeatureStore(graph.features)
    store.gather(torch.from_numpy(seeds))
    typed = synthetic_typed(400, features=8, seed=1)
    TypedNeighborSampler(typed, [3, 2]).sample(np.asarray(typed.train_idx[:10]), key=1)
    timed = timed_graph(0)
    TemporalNeighborSampler(timed.indptr, timed.indices, timed.edge_time, [3, 2]).sample(
        np.arange(5), np.full(5, 60), key=1)
    timed_typed = typed_graph(0)
    TemporalTypedSampler(timed_typed, [3, 2]).sample(np.arange(5), np.full(5, 40), key=1)
    edge_hygiene(graph.indptr, graph.indices)
    drop_edges(graph.indptr, graph.indices, np.zeros(0, np.int64))
    names = {name for name, _ in calls}
    assert {"_gather", "sample_neighbors", "sample_temporal", "_count_hygiene", "_keep"} <= names, names
    assert [(name, flags) for name, flags in calls if any(flags)] == []
