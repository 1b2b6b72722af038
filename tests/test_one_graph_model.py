"""One graph model: a homogeneous graph is the typed graph of one vertex type and one relation.

``TypedGraph.of`` shares the graph's arrays (no copy), and the typed samplers over it draw exactly the blocks
and frontiers the homogeneous samplers draw: the same keys, the same kernels, the same relabelling order."""

import numpy as np
import pytest
import torch

from neutronorch.data.csc import edges_to_csc
from neutronorch.data.graph import Graph
from neutronorch.data.typed import EDGE, VERTEX, Relation, TypedGraph
from neutronorch.errors import DataError
from neutronorch.sampling.device_sampler import make_device_sampler, triton_available
from neutronorch.sampling.neighbor_sampler import NeighborSampler, TorchNeighborSampler, batch_key
from neutronorch.sampling.typed_device_sampler import TypedDeviceSampler
from neutronorch.sampling.typed_sampler import TypedNeighborSampler

pytestmark = pytest.mark.usefixtures("one_thread")


def _graph(symmetric: bool, n: int = 300) -> Graph:
    rng = np.random.default_rng(11)
    dst = np.repeat(np.arange(n), rng.integers(0, 40, n))
    indptr, indices = edges_to_csc(rng.integers(0, n, dst.shape[0]), dst, n, symmetric=symmetric)
    ids = rng.permutation(n)
    return Graph("small", indptr, indices, rng.random((n, 4), dtype=np.float32), rng.integers(0, 3, n),
                 ids[:100], ids[100:150], ids[150:200], 3, notes=["a note"], metric="accuracy")


def test_a_graph_seen_as_typed_shares_every_array():
    graph = _graph(symmetric=False)
    typed = TypedGraph.of(graph)
    typed.validate()
    assert typed.num_nodes == {VERTEX: graph.num_nodes} and list(typed.relations) == [EDGE]
    assert typed.target == VERTEX and typed.num_classes == 3 and typed.metric == "accuracy"
    relation = typed.relations[EDGE]
    pairs = [(relation.indptr, graph.indptr), (relation.indices, graph.indices),
             (typed.features[VERTEX], graph.features), (typed.labels, graph.labels),
             (typed.train_idx, graph.train_idx), (typed.val_idx, graph.val_idx), (typed.test_idx, graph.test_idx)]
    for seen, own in pairs:
        assert seen is own  # the same array object: the same storage, nothing copied
    relation.indices[0] = relation.indices[0]  # written through the view, visible in the graph
    assert np.shares_memory(relation.indices, graph.indices)
    back = typed.as_graph()
    for name in ("indptr", "indices", "features", "labels", "train_idx", "val_idx", "test_idx"):
        assert getattr(back, name) is getattr(graph, name)
    back.validate("back")


def test_a_memory_mapped_graph_stays_mapped(tmp_path):
    graph = _graph(symmetric=True)
    np.save(tmp_path / "indices.npy", graph.indices)
    graph.indices = np.load(tmp_path / "indices.npy", mmap_mode="r")
    typed = TypedGraph.of(graph)
    assert isinstance(typed.relations[EDGE].indices, np.memmap)
    assert typed.relations[EDGE].indices is graph.indices


def test_only_a_one_type_one_relation_graph_is_a_graph():
    typed = TypedGraph.of(_graph(symmetric=False))
    relation = typed.relations[EDGE]
    with_two = TypedGraph(typed.name, typed.num_nodes, {EDGE: relation, (VERTEX, "cites", VERTEX): relation},
                          typed.features, VERTEX, typed.labels, typed.train_idx, typed.val_idx, typed.test_idx, 3)
    with_weights = TypedGraph(typed.name, typed.num_nodes,
                              {EDGE: Relation(relation.indptr, relation.indices,
                                              np.ones((relation.num_edges, 1), np.float32))},
                              typed.features, VERTEX, typed.labels, typed.train_idx, typed.val_idx, typed.test_idx, 3)
    featureless = TypedGraph(typed.name, typed.num_nodes, typed.relations, {}, VERTEX, typed.labels,
                             typed.train_idx, typed.val_idx, typed.test_idx, 3)
    for graph, why in ((with_two, "one vertex type and one relation"), (with_weights, "edge features"),
                       (featureless, "no features")):
        with pytest.raises(DataError, match=why):
            graph.as_graph()


def _assert_same(typed_sample, sample):
    """A typed sample over the view equals the homogeneous one: frontiers, and each block's topology."""
    assert len(typed_sample.blocks) == len(sample.blocks)
    for typed_frontier, frontier in zip(typed_sample.frontiers, sample.frontiers):
        assert torch.equal(typed_frontier[VERTEX], frontier)
    for tblock, block in zip(typed_sample.blocks, sample.blocks):
        relation_block = tblock.blocks[EDGE]
        assert (relation_block.num_dst, relation_block.num_src) == (block.num_dst, block.num_src)
        assert torch.equal(relation_block.indptr, block.indptr)
        assert torch.equal(relation_block.indices, block.indices)
        assert torch.equal(tblock.src_ids[VERTEX], block.src_ids)
        if block.src_degree is None:
            assert relation_block.src_degree is None
        else:  # out-degrees through the relation: the in-degrees of a symmetric graph
            assert torch.equal(relation_block.src_degree, block.src_degree)


FANOUTS = ([5, 3], [-1, 2], [4, 0, 3], [0], [12, -1])


@pytest.mark.parametrize("degrees", [False, True])
@pytest.mark.parametrize("fanouts", FANOUTS)
def test_the_typed_host_sampler_draws_the_homogeneous_samplers_blocks(fanouts, degrees):
    graph = _graph(symmetric=degrees)  # degrees agree (out = in) on a symmetric graph, as GCN assumes
    typed = TypedNeighborSampler(TypedGraph.of(graph), fanouts, degrees=degrees)
    homogeneous = NeighborSampler(graph.indptr, graph.indices, fanouts, degrees=degrees)
    for seed in range(3):
        seeds = np.random.default_rng(seed).choice(graph.num_nodes, 40, replace=False)
        key = batch_key(seed, 1, 2)
        _assert_same(typed.sample(seeds, key), homogeneous.sample(seeds, key))


@pytest.mark.parametrize("degrees", [False, True])
@pytest.mark.parametrize("fanouts", FANOUTS)
def test_the_typed_device_sampler_draws_the_torch_samplers_blocks(fanouts, degrees):
    graph = _graph(symmetric=degrees)
    typed_graph = TypedGraph.of(graph)
    typed = TypedDeviceSampler(typed_graph, torch.device("cpu"), {EDGE: fanouts}, degrees, backend="torch")
    homogeneous = TorchNeighborSampler(torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices), fanouts,
                                       degrees=degrees)
    host = TypedNeighborSampler(typed_graph, fanouts, degrees=degrees)
    for seed in range(3):
        seeds = torch.from_numpy(np.random.default_rng(seed).choice(graph.num_nodes, 40, replace=False))
        key = batch_key(seed, 0, 5)
        sample = typed.sample(seeds, key)
        _assert_same(sample, homogeneous.sample(seeds, key))
        _assert_same(sample, NeighborSampler(graph.indptr, graph.indices, fanouts, degrees).sample(seeds.numpy(), key))
        assert torch.equal(sample.blocks[0].src_ids[VERTEX], host.sample(seeds.numpy(), key).blocks[0].src_ids[VERTEX])


@pytest.mark.skipif(not triton_available(torch.device("cpu")), reason="Triton is not installed")
@pytest.mark.parametrize("fanouts", [[6, 3], [6, -1, 3]])  # with -1, the Triton sampler runs the torch one
def test_the_typed_device_sampler_on_triton_draws_the_triton_samplers_blocks(fanouts):
    graph = _graph(symmetric=False)
    typed = TypedDeviceSampler(TypedGraph.of(graph), torch.device("cpu"), {EDGE: fanouts}, backend="triton")
    homogeneous = make_device_sampler(torch.from_numpy(graph.indptr), torch.from_numpy(graph.indices), fanouts,
                                      backend="triton")
    seeds = torch.arange(0, graph.num_nodes, 7)
    _assert_same(typed.sample(seeds, batch_key(4, 0, 1)), homogeneous.sample(seeds, batch_key(4, 0, 1)))
