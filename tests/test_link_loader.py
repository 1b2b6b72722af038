"""LinkNeighborLoader: the link task's batches (seed edges, negatives, seed edges out of the sampled graph)
for a loop of one's own, in PyG, DGL and neutronorch's own form."""

import functools
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neutronorch.config import TrainConfig
from neutronorch.data import load_dataset
from neutronorch.errors import ConfigError
from neutronorch.loader import LinkNeighborLoader
from neutronorch.nn.link import LinkModel
from neutronorch.nn.models import GNN
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.train.link_task import LinkTask, link_graph

SPEC = "synthetic:nodes=2000,degree=8,features=16,classes=4"


@pytest.fixture(scope="module")
def plain():
    return load_dataset(SPEC)


@pytest.fixture(scope="module")
def graph(plain):
    return link_graph(plain, TrainConfig(task="link"))


def global_edges(block):
    """(src, dst) global ids of every edge of a block."""
    dst = torch.repeat_interleave(torch.arange(block.num_dst), block.in_degrees(), output_size=block.num_edges)
    return block.src_ids[block.indices.long()], block.dst_ids[dst]


def keys(src, dst, n):
    return set((src * n + dst).tolist()) | set((dst * n + src).tolist())


def snapshot(batch):
    data = batch.to_pyg()
    return (batch.epoch, batch.index, data.n_id.clone(), data.edge_index.clone(), data.x.clone(),
            data.edge_label_index.clone(), data.edge_label.clone(), data.input_id.clone())


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) if torch.is_tensor(x) else x == y for x, y in zip(a, b))


# -- what a batch holds ---------------------------------------------------------------------------------

def test_seed_edges_are_out_of_the_sampled_graph(graph):
    """With every neighbour taken, no sampled edge (a block's or the PyG form's) joins a positive's two
    ends in either direction, although the positives are edges of the graph that messages pass over."""
    n = graph.num_nodes
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    graph_keys = keys(torch.from_numpy(indices.astype(np.int64)),
                      torch.repeat_interleave(torch.arange(n), torch.from_numpy(np.diff(indptr))), n)
    loader = LinkNeighborLoader(graph, [-1, -1], 512)
    for batch in loader:
        P = batch.num_pairs
        positives = loader.edges[:, batch.input_id]
        seed_keys = keys(positives[0], positives[1], n)
        assert seed_keys <= graph_keys  # what would be sampled were it not taken out
        for block in batch.blocks:
            assert not keys(*global_edges(block), n) & seed_keys
        data = batch.to_pyg()
        assert not keys(data.n_id[data.edge_index[0]], data.n_id[data.edge_index[1]], n) & seed_keys
        assert torch.equal(data.n_id[data.edge_label_index[:, :P]], positives)


def test_pairs_labels_and_ids(graph):
    features = torch.from_numpy(np.asarray(graph.features))
    loader = LinkNeighborLoader(graph, [6, 4], 700, negatives=3)
    seen = []
    for batch in loader:
        P, K = batch.num_pairs, batch.negatives
        assert K == 3 and batch.pairs.shape == (P, 5) and P == batch.input_id.shape[0]
        seeds = batch.seeds
        assert torch.equal(seeds, torch.unique(seeds)) and torch.equal(batch.n_id[:batch.batch_size], seeds)
        assert torch.equal(seeds[batch.pairs[:, :2]].t(), loader.edges[:, batch.input_id])
        label_index, label = batch.edge_label_index, batch.edge_label
        assert label_index.shape == (2, P * (1 + K)) and label.dtype == torch.float32
        assert torch.equal(label, torch.cat([torch.ones(P), torch.zeros(P * K)]))
        negative = label_index[:, P:].view(2, P, K)  # each positive's K negatives together, its source first
        assert torch.all(negative[0] == batch.pairs[:, :1]) and torch.equal(negative[1], batch.pairs[:, 2:])
        pos_src, pos_dst, neg_src, neg_dst = batch.pair_ids()
        assert torch.equal(torch.stack([torch.cat([pos_src, neg_src]), torch.cat([pos_dst, neg_dst])]), label_index)
        data = batch.to_pyg()
        assert torch.equal(data.x, features[data.n_id]) and torch.equal(batch.x, data.x)
        assert torch.equal(data.edge_label_index, label_index) and torch.equal(data.edge_label, label)
        assert sum(data.num_sampled_nodes) == data.num_nodes and data.num_sampled_nodes[0] == batch.batch_size
        assert sum(data.num_sampled_edges) == data.edge_index.shape[1]
        assert "y" not in data and int(data.edge_index.max()) < data.num_nodes
        seen.append(batch.input_id.clone())
    assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(graph.links.train.shape[1]))


def test_the_batches_are_the_trainers(graph):
    """The pairs and negatives are ``train()``'s link task's (``LinkSeeds``, same seed and epoch)."""
    loader = LinkNeighborLoader(graph, [3], 1000, negatives=2, seed=7, epoch=4)
    config = TrainConfig(task="link", fanouts=[3], batch_size=1000, seed=7, negatives=2).validate()
    expected = LinkSeeds(graph.links.train, graph.num_nodes, config.sampling, 2).epoch(4)
    for batch, seeds in zip(loader, expected, strict=True):
        assert torch.equal(batch.seeds, seeds.seeds) and torch.equal(batch.pairs, seeds.targets)
        assert torch.equal(loader.edges[:, batch.input_id], seeds.exclude)


def test_a_pyg_link_loop_learns(graph):
    """PyG's link-prediction loop on ``to_pyg()``: a SAGEConv encoder, a dot product over
    ``edge_label_index``, binary cross-entropy against ``edge_label``; the loss goes down in two epochs."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import SAGEConv

    class Encoder(torch.nn.Module):
        def __init__(self, width):
            super().__init__()
            self.conv1, self.conv2 = SAGEConv(graph.feature_dim, width), SAGEConv(width, width)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    torch.manual_seed(0)
    model = Encoder(64)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = LinkNeighborLoader(graph, [10, 5], 256, negatives=1)
    losses = []
    for _ in range(2):
        for batch in loader:
            batch = batch.to_pyg()
            optimizer.zero_grad()
            h = model(batch.x, batch.edge_index)
            score = (h[batch.edge_label_index[0]] * h[batch.edge_label_index[1]]).sum(-1)
            loss = F.binary_cross_entropy_with_logits(score, batch.edge_label)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    epoch = len(loader)
    assert len(losses) == 2 * epoch
    assert np.mean(losses[epoch:]) < np.mean(losses[:epoch]) and np.mean(losses[-10:]) < 0.9 * np.mean(losses[:10])


def test_our_model_trains_on_the_plain_form(graph):
    """neutronorch's encoder on ``blocks``/``x`` and ``train()``'s link loss on ``pairs``."""
    torch.manual_seed(0)
    model = LinkModel(GNN("sage", graph.feature_dim, 32, 32, 2))
    task = LinkTask(model, "mrr")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for batch in LinkNeighborLoader(graph, [10, 5], 256):
        h = model.encoder(batch.blocks, batch.x)
        assert h.shape[0] == batch.batch_size
        loss = task.loss(h, batch.pairs)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < np.mean(losses[:5])


def test_own_edges_on_a_graph_without_links(plain):
    """A (2, E) tensor of one's own supervision edges: the graph needs no link split, the edges still
    leave each batch's sampled graph, and ``input_id`` points into them."""
    n = plain.num_nodes
    indptr, indices = np.asarray(plain.indptr), np.asarray(plain.indices)
    dst = np.repeat(np.arange(n), np.diff(indptr))
    picked = np.arange(0, indices.shape[0], 37)[:300]
    edges = torch.from_numpy(np.stack([indices[picked], dst[picked]]).astype(np.int64))
    loader = LinkNeighborLoader(plain, [-1], 64, edges=edges, shuffle=False)
    assert torch.equal(loader.edges, edges) and len(loader) == 5
    for k, batch in enumerate(loader):
        assert torch.equal(batch.input_id, torch.arange(64 * k, min(64 * (k + 1), 300)))
        positives = edges[:, batch.input_id]
        assert not keys(*global_edges(batch.blocks[0]), n) & keys(positives[0], positives[1], n)


def test_evaluation_sets_and_device_mode(graph):
    val = LinkNeighborLoader(graph, [4, 4], 100, edges="val", shuffle=False)
    assert torch.equal(val.edges, torch.from_numpy(np.asarray(graph.links.val, dtype=np.int64)))
    exact = [snapshot(b) for b in LinkNeighborLoader(graph, [4, 3], 800, edges="test", mode="exact")]
    device = [snapshot(b) for b in LinkNeighborLoader(graph, [4, 3], 800, edges="test", mode="device")]
    assert len(exact) == 1 and all(same(a, b) for a, b in zip(exact, device, strict=True))


# -- determinism and resume -----------------------------------------------------------------------------

def test_the_same_arguments_give_the_same_batches(graph):
    pytest.importorskip("torch_geometric")
    make = functools.partial(LinkNeighborLoader, graph, [5, 5], 1000, negatives=2)
    one, two = ([snapshot(b) for b in make(sampler_threads=threads, epoch=2)] for threads in (1, 2))
    assert len(one) == 7 and all(same(a, b) for a, b in zip(one, two, strict=True))
    loader = make()  # epoch 0, then 1, then (set_epoch) 2 again
    epochs = [[snapshot(b) for b in loader] for _ in range(2)]
    assert not same(epochs[0][0], epochs[1][0]) and [b[0] for b in epochs[1]] == [1] * 7
    loader.set_epoch(2)
    assert all(same(a, snapshot(b)) for a, b in zip(one, loader, strict=True))


def test_start_and_iter_from_resume_exactly(graph):
    """``start=k`` (and ``iter_from(k)``) yields exactly the tail of a whole epoch from batch k."""
    pytest.importorskip("torch_geometric")
    make = functools.partial(LinkNeighborLoader, graph, [5, 5], 1000, epoch=3)
    whole = [snapshot(b) for b in make()]
    for k in (1, 4, 7):  # 7: past the last batch, nothing
        tail = [snapshot(b) for b in make(start=k)]
        assert [b[1] for b in tail] == list(range(k, 7))
        assert all(same(a, b) for a, b in zip(whole[k:], tail, strict=True))
    loader = make(drop_last=True, epoch=0)
    with loader.iter_from(5, epoch=3) as it:
        assert len(loader) == 6 and len(it) == 1
        assert all(same(a, snapshot(b)) for a, b in zip(whole[5:6], it, strict=True))
    assert loader.epoch == 4 and list(loader.iter_from(6)) == []


def test_break_leaves_no_thread_and_close_ends_it(graph):
    loader = LinkNeighborLoader(graph, [5, 5], 256)
    for batch in loader:
        break
    assert batch.x.shape[0] == batch.n_id.shape[0]  # the last batch handed out keeps its rows
    assert not [t for t in threading.enumerate() if t.name == "exact-producer" and t.is_alive()]
    loader.close()
    with pytest.raises(ConfigError, match="LinkNeighborLoader is closed"):
        iter(loader)


# -- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"edges": "training"}, "name a set of the graph's link split"),
    ({"edges": torch.tensor([[0, 1], [2, 2000]])}, "vertex id 2000, out of range"),
    ({"edges": torch.tensor([[0, -1], [2, 3]])}, "out of range"),
    ({"edges": torch.zeros(3, 4, dtype=torch.int64)}, "expected shape \\(2, E\\).* not \\(3, 4\\)"),
    ({"edges": torch.tensor([[0, 1], [2, 3]])}, "2 x 2 array is ambiguous.*layout=\"columns\""),
    ({"edges": torch.tensor([[0, 1, 2], [3, 4, 5]]), "layout": "rows"}, "says a pair per row, but the shape is"),
    ({"edges": np.array([[0, 1, 2], [3, 4, 2 ** 64 - 1]], dtype=np.uint64)}, "vertex id 18446744073709551615, out of"),
    ({"negatives": 2001}, "`negatives` 2,001: more negative destinations per positive than the 2,000 vertices"),
    ({"edges": "val", "layout": "rows"}, "`layout` rows: says how an array of edges holds them"),
    ({"edges": torch.tensor([[0, 1, 2], [3, 4, 5]]), "layout": "diagonal"}, "`layout` 'diagonal': give"),
    ({"edges": torch.tensor([0, 1, 2])}, "shape \\(2, E\\)"),
    ({"edges": torch.zeros(2, 0, dtype=torch.long)}, "empty"),
    ({"edges": torch.tensor([[0.0, 1.0], [2.0, 3.0]])}, "integers"),
    ({"edges": {1, 2}}, "expected a link set's name"),
    ({"negatives": 0}, "at least 1 negative"),
    ({"negatives": -2}, "at least 1 negative"),
    ({"negatives": 1.5}, "whole number"),
    ({"mode": "neutronorch"}, "train\\(\\)"),
    ({"start": 9}, "batches of the 6,502 seed edges .* start at 0..7"),
    ({"lr": 0.1}, "LinkNeighborLoader got unexpected option"),
])
def test_bad_arguments_get_clear_errors(graph, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LinkNeighborLoader(graph, [5, 5], 1000, **kwargs)


def test_one_rule_for_arrays_of_pairs_edge_rows_and_a_said_layout_read_as_columns(plain):
    columns = torch.tensor([[0, 1, 2], [3, 4, 5]])
    for given, layout in ((columns, None), (columns.T, None), (columns.T.numpy().tolist(), None),
                          (columns[:, :2], "columns"), (columns[:, :2].T, "rows")):
        loader = LinkNeighborLoader(plain, [5], 64, edges=given, layout=layout)
        assert torch.equal(loader.edges, columns[:, :loader.edges.shape[1]])


def test_a_split_given_with_the_graph_that_leaks_is_refused_as_train_refuses_it(graph):
    import dataclasses

    from neutronorch.errors import DataError

    links = graph.links
    leaky = dataclasses.replace(links, test=np.concatenate([links.test, links.train[:, :2]], axis=1))
    with pytest.raises(DataError, match=r"the link split leaks: 2 test edges .* are in the graph's edges"):
        LinkNeighborLoader(dataclasses.replace(graph, links=leaky), [5], 64)
    transposed = dataclasses.replace(links, val=links.val.T.copy())
    with pytest.raises(DataError, match=r"val has shape \(\d+, 2\), expected \(2, E\).*Transpose"):
        LinkNeighborLoader(dataclasses.replace(graph, links=transposed), [5], 64)


def test_a_graph_without_links_needs_edges(plain):
    with pytest.raises(ConfigError, match="carries no link split.*link_graph.*\\(2, E\\) tensor"):
        LinkNeighborLoader(plain, [5], 64)


# -- DGL ------------------------------------------------------------------------------------------------

def test_dgl_blocks_and_pair_graphs(graph):
    dgl = pytest.importorskip("dgl")
    batch = next(iter(LinkNeighborLoader(graph, [4, 4], 128, negatives=2)))
    blocks = batch.to_dgl_blocks()
    assert torch.equal(blocks[-1].dstdata[dgl.NID], batch.seeds) and "label" not in blocks[-1].dstdata
    pos_graph, neg_graph = batch.to_dgl_pair_graphs()
    pos_src, pos_dst, neg_src, neg_dst = batch.pair_ids()
    assert pos_graph.num_nodes() == neg_graph.num_nodes() == blocks[-1].num_dst_nodes()
    assert all(torch.equal(a, b) for a, b in zip(pos_graph.edges(), (pos_src, pos_dst)))
    assert all(torch.equal(a, b) for a, b in zip(neg_graph.edges(), (neg_src, neg_dst)))
    assert neg_graph.num_edges() == 2 * pos_graph.num_edges() == 256
    assert torch.equal(pos_graph.ndata[dgl.NID], batch.seeds)
