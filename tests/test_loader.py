"""NeighborLoader: the pipeline's batches for a loop of one's own, in PyG, DGL and neutronorch's own form."""

import itertools
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neutronorch.data import load_dataset
from neutronorch.errors import ConfigError, DataError
from neutronorch.loader import NeighborLoader
from neutronorch.nn.models import GNN
from neutronorch.orchestration.pipeline import Prefetcher
from neutronorch.sampling.block import pyg_form

ROOT = Path(__file__).resolve().parents[1]
SPEC = "synthetic:nodes=2000,degree=8,features=16,classes=4"
PRODUCERS = ("exact-producer", "device-producer")


@pytest.fixture(scope="module")
def graph():
    return load_dataset(SPEC)


def producers():
    return [t.name for t in threading.enumerate() if t.name in PRODUCERS and t.is_alive()]


def snapshot(batch):
    """What a batch is made of, copied (the loader reuses its buffers)."""
    data = batch.to_pyg()
    return (batch.epoch, batch.index, data.n_id.clone(), data.edge_index.clone(), data.x.clone(),
            list(data.num_sampled_nodes), list(data.num_sampled_edges), data.input_id.clone())


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) if torch.is_tensor(x) else x == y for x, y in zip(a, b))


def pyg_reference(graph, seeds, hops):
    """PyG's neighbour sampling with every neighbour taken (torch-sparse's ``neighbor_sample`` with -1):
    seeds first; each hop visits the vertices the hop before added, in order, appends their in-edges in
    CSC order and every vertex not seen yet, in the order it is first reached."""
    indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
    nodes = [int(s) for s in seeds]
    local = {v: i for i, v in enumerate(nodes)}
    rows, cols, counts_nodes, counts_edges = [], [], [len(nodes)], []
    begin = 0
    for _ in range(hops):
        end, edges = len(nodes), 0
        for position in range(begin, end):
            v = nodes[position]
            for u in indices[indptr[v]:indptr[v + 1]]:
                u = int(u)
                if u not in local:
                    local[u] = len(nodes)
                    nodes.append(u)
                rows.append(local[u])
                cols.append(position)
                edges += 1
        counts_nodes.append(len(nodes) - end)
        counts_edges.append(edges)
        begin = end
    return torch.tensor(nodes), torch.tensor([rows, cols]), counts_nodes, counts_edges


# -- the PyG form ---------------------------------------------------------------------------------------

def test_pyg_form_is_pygs_sampling_order_and_edges(graph):
    """With every neighbour taken the draw is fixed, so PyG's sampler and ours must give the same subgraph:
    the same vertices in the same order (seeds, then each hop's new vertices by first appearance), the same
    edges hop by hop, and the same per-hop counts."""
    pytest.importorskip("torch_geometric")
    loader = NeighborLoader(graph, [-1, -1], 32)
    for batch in loader:
        data = batch.to_pyg()
        nodes, edge_index, counts_nodes, counts_edges = pyg_reference(graph, batch.seeds, 2)
        assert torch.equal(data.n_id, nodes)
        assert torch.equal(data.edge_index, edge_index)
        assert data.num_sampled_nodes == counts_nodes and data.num_sampled_edges == counts_edges


def test_pyg_batch_fields(graph):
    pytest.importorskip("torch_geometric")
    labels = torch.from_numpy(np.asarray(graph.labels, dtype=np.int64))
    features = torch.from_numpy(np.asarray(graph.features))
    loader = NeighborLoader(graph, [6, 4, 3], 50)
    for batch in loader:
        data = batch.to_pyg()
        n, bs = data.num_nodes, data.batch_size
        assert bs == batch.seeds.shape[0] and torch.equal(data.n_id[:bs], batch.seeds)
        assert torch.equal(loader.seeds[data.input_id], batch.seeds)
        assert torch.equal(data.x, features[data.n_id]) and torch.equal(batch.x, data.x)
        assert torch.equal(data.y, labels[data.n_id]) and torch.equal(batch.y, labels[batch.seeds])
        assert sum(data.num_sampled_nodes) == n == int(data.n_id.unique().shape[0])
        assert sum(data.num_sampled_edges) == data.edge_index.shape[1] and len(data.num_sampled_edges) == 3
        src, dst = data.edge_index
        assert int(src.max()) < n and torch.all(dst[1:] >= dst[:-1])  # hop by hop, destinations ascending
        # hop h's edges lead into the vertices hop h-1 added, from vertices reached by hop h at the latest
        bounds = np.cumsum([0] + data.num_sampled_nodes)
        start = 0
        for hop, count in enumerate(data.num_sampled_edges):
            part = slice(start, start + count)
            assert torch.all((dst[part] >= bounds[hop]) & (dst[part] < bounds[hop + 1]))
            assert torch.all(src[part] < bounds[hop + 2])
            start += count
        # every edge is an edge of the graph (in-neighbour -> vertex)
        g_src, g_dst = data.n_id[src].numpy(), data.n_id[dst].numpy()
        indptr, indices = np.asarray(graph.indptr), np.asarray(graph.indices)
        assert all(u in indices[indptr[v]:indptr[v + 1]] for u, v in zip(g_src[:200], g_dst[:200]))


def test_pyg_form_keeps_one_draw_per_vertex(graph):
    """Of each block, the PyG form keeps the rows of the vertices the hop before newly reached."""
    loader = NeighborLoader(graph, [5, 5], 40)
    batch = next(iter(loader))
    top, bottom = batch.blocks[-1], batch.blocks[0]
    edge_index, nodes, edges = pyg_form(batch.blocks)
    assert edges[0] == top.num_edges  # every seed's draw
    assert edges[1] == int(bottom.indptr[bottom.num_dst] - bottom.indptr[top.num_dst])


def test_trim_to_layer_gives_the_untrimmed_output(graph):
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GraphSAGE
    from torch_geometric.utils import trim_to_layer

    torch.manual_seed(0)
    model = GraphSAGE(graph.feature_dim, 32, 3, graph.num_classes).eval()
    loader = NeighborLoader(graph, [8, 4, 3], 64)
    with torch.no_grad():
        for batch in loader:
            data = batch.to_pyg()
            full = model(data.x, data.edge_index)[:data.batch_size]
            trimmed = model(data.x, data.edge_index, num_sampled_nodes_per_hop=data.num_sampled_nodes,
                            num_sampled_edges_per_hop=data.num_sampled_edges)[:data.batch_size]
            torch.testing.assert_close(trimmed, full, rtol=1e-5, atol=1e-6)
            x, edge_index = data.x, data.edge_index
            for layer in (1, 2):  # as BasicGNN trims: before each layer, what the layer before left
                x, edge_index, _ = trim_to_layer(layer, data.num_sampled_nodes, data.num_sampled_edges, x,
                                                 edge_index)
                assert x.shape[0] == sum(data.num_sampled_nodes[:4 - layer])
                assert edge_index.shape[1] == sum(data.num_sampled_edges[:3 - layer])


@pytest.mark.parametrize("layers", [1, 2])
def test_pygs_model_on_our_batch_equals_our_model(graph, layers):
    """Where the two forms agree (one layer, or every neighbour taken: no draw to differ in), PyG's own
    GraphSAGE on ``to_pyg()`` computes what neutronorch's GNN computes on the blocks."""
    pytest.importorskip("torch_geometric")
    from neutronorch.nn.pyg import to_pyg_model

    torch.manual_seed(0)
    ours = GNN("sage", graph.feature_dim, 32, graph.num_classes, layers).eval()
    theirs = to_pyg_model(ours).eval()
    fanouts = [7] if layers == 1 else [-1] * layers
    with torch.no_grad():
        for batch in NeighborLoader(graph, fanouts, 100):
            data = batch.to_pyg()
            expected = ours(batch.blocks, batch.x)
            torch.testing.assert_close(theirs(data.x, data.edge_index)[:data.batch_size], expected,
                                       rtol=1e-4, atol=1e-5)


def test_a_pyg_loop_trains_pygs_graphsage(graph):
    """PyG's example loop, unchanged but for the loader, learns the synthetic graph."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    train_loader = NeighborLoader(graph, [10, 5], 64, seeds="train")
    test_loader = NeighborLoader(graph, [10, 5], 512, seeds="test", shuffle=False)
    model = GraphSAGE(graph.feature_dim, 64, 2, graph.num_classes, dropout=0.3)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(6):
        model.train()
        for batch in train_loader:
            batch = batch.to_pyg()
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index)[:batch.batch_size]
            loss = F.cross_entropy(out, batch.y[:batch.batch_size])
            loss.backward()
            optimizer.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in test_loader:
            batch = batch.to_pyg()
            pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
    assert total == len(graph.test_idx)
    assert correct / total > 0.85


def test_our_model_trains_on_the_plain_form(graph):
    torch.manual_seed(0)
    model = GNN("sage", graph.feature_dim, 32, graph.num_classes, 2, dropout=0.2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(4):
        for batch in NeighborLoader(graph, [10, 5], 64):
            loss = F.cross_entropy(model(batch.blocks, batch.x), batch.y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert np.mean(losses[-4:]) < 0.6 * np.mean(losses[:4])


# -- order, determinism and resume ----------------------------------------------------------------------

def test_same_seed_and_epoch_give_the_same_batches_whatever_the_threads(graph):
    pytest.importorskip("torch_geometric")
    one = [snapshot(b) for b in NeighborLoader(graph, [5, 5], 48, sampler_threads=1, epoch=3)]
    two = [snapshot(b) for b in NeighborLoader(graph, [5, 5], 48, sampler_threads=2, epoch=3)]
    assert len(one) == len(two) == 5 and all(same(a, b) for a, b in zip(one, two))
    other = [snapshot(b) for b in NeighborLoader(graph, [5, 5], 48, epoch=4)]
    assert not same(one[0], other[0])


def test_epochs_advance_and_set_epoch_chooses(graph):
    pytest.importorskip("torch_geometric")
    loader = NeighborLoader(graph, [5, 5], 48)
    first = [snapshot(b) for b in loader]
    second = [snapshot(b) for b in loader]
    assert [b[0] for b in first] == [0] * 5 and [b[0] for b in second] == [1] * 5
    assert not same(first[0], second[0])
    loader.set_epoch(0)
    assert all(same(a, snapshot(b)) for a, b in zip(first, loader))


def test_start_and_iter_from_resume_exactly(graph):
    pytest.importorskip("torch_geometric")
    whole = [snapshot(b) for b in NeighborLoader(graph, [5, 5], 48, epoch=2)]
    resumed = [snapshot(b) for b in NeighborLoader(graph, [5, 5], 48, epoch=2, start=3)]
    assert [b[1] for b in resumed] == [3, 4] and all(same(a, b) for a, b in zip(whole[3:], resumed))
    loader = NeighborLoader(graph, [5, 5], 48)
    with loader.iter_from(4, epoch=2) as it:
        assert len(it) == 1
        assert all(same(a, snapshot(b)) for a, b in zip(whole[4:], it))
    assert loader.epoch == 3
    assert list(loader.iter_from(5)) == []  # past the last batch: nothing


def test_unshuffled_seeds_keep_their_order_and_drop_last(graph):
    seeds = torch.from_numpy(np.asarray(graph.test_idx))[:300].flip(0)
    loader = NeighborLoader(graph, [4], 64, seeds=seeds, shuffle=False)
    for _ in range(2):  # every epoch: the given order (new draws)
        order = torch.cat([b.seeds.clone() for b in loader])
        assert torch.equal(order, seeds)
    dropped = NeighborLoader(graph, [4], 64, seeds=seeds, shuffle=False, drop_last=True)
    assert len(dropped) == 4 and [b.batch_size for b in dropped] == [64] * 4
    assert sorted(torch.cat([b.seeds.clone() for b in NeighborLoader(graph, [4], 64, seeds=seeds)]).tolist()) == \
        sorted(seeds.tolist())


def test_seed_sets_and_masks(graph):
    val = NeighborLoader(graph, [3], 1000, seeds="val")
    assert torch.equal(val.seeds, torch.from_numpy(np.asarray(graph.val_idx, dtype=np.int64)))
    mask = torch.zeros(graph.num_nodes, dtype=torch.bool)
    mask[[5, 7, 11]] = True
    assert NeighborLoader(graph, [3], 2, seeds=mask).seeds.tolist() == [5, 7, 11]
    assert len(NeighborLoader(graph, [3], 500, seeds="all")) == 4


def test_device_mode_gives_the_same_batches_on_the_cpu(graph):
    pytest.importorskip("torch_geometric")
    exact = [snapshot(b) for b in NeighborLoader(graph, [5, 3], 64, mode="exact")]
    device = [snapshot(b) for b in NeighborLoader(graph, [5, 3], 64, mode="device")]
    assert all(same(a, b) for a, b in zip(exact, device))


def test_memory_mapped_features_in_file_order_and_a_host_cache(graph, tmp_path):
    """The trainer's read paths come along: a memory-mapped graph read in file order, through a host cache."""
    from neutronorch.data import load_native, save_native

    mapped = load_native(save_native(graph, tmp_path / "g"))
    features = torch.from_numpy(np.asarray(graph.features))
    loader = NeighborLoader(mapped, [5, 5], 64, read_order="file", host_cache_gb=0.00005)
    assert loader.mode.store.ordered and loader.mode.store.host_cache is not None
    for batch in loader:
        assert torch.equal(batch.x, features[batch.n_id])


def test_gcn_blocks_carry_degrees_and_bf16_rows(graph):
    batch = next(iter(NeighborLoader(graph, [5, 5], 64, model="gcn", precision="bf16")))
    assert all(b.src_degree is not None for b in batch.blocks) and batch.x.dtype == torch.bfloat16
    model = GNN("gcn", graph.feature_dim, 16, graph.num_classes, 2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(batch.blocks, batch.x).shape == (64, graph.num_classes)


# -- lifetime -------------------------------------------------------------------------------------------

def test_break_and_exceptions_leave_no_thread(graph):
    loader = NeighborLoader(graph, [5, 5], 16)
    for batch in loader:
        assert producers()  # the producer runs ahead
        break
    assert not producers()
    with pytest.raises(KeyError):
        for batch in loader:
            raise KeyError("in the loop")
    assert not producers()
    with loader.iter_from(0) as it:
        next(it)
    assert not producers()
    for _ in range(8):  # more early stops than the pipeline has buffers: each one hands its buffers back
        for batch in loader:
            break
    assert not producers()
    it = iter(loader)
    next(it)
    iter(loader)  # a new iteration closes the one before
    assert not producers() or producers() == ["exact-producer"]
    with loader:
        next(iter(loader))
    assert not producers()
    with pytest.raises(ConfigError, match="closed"):
        iter(loader)


def test_a_second_thread_is_refused_while_one_iterates(graph):
    """Two threads on one loader: the second is told the loader runs one iteration at a time (a new one
    would close the first's under its loop), never a traceback from inside, a hang or mixed batches."""
    from neutronorch.loader import LinkNeighborLoader
    edges = torch.stack([torch.arange(200), torch.arange(1, 201)])
    for loader in (NeighborLoader(graph, [5], 16), LinkNeighborLoader(graph, [5], 16, edges=edges)):
        started, finish, taken = threading.Event(), threading.Event(), []

        def first():
            it = iter(loader)
            taken.append(next(it).index)
            started.set()
            finish.wait(10)
            taken.extend(b.index for b in it)

        worker = threading.Thread(target=first, name="first")
        worker.start()
        assert started.wait(10)
        for attempt in (lambda: iter(loader), lambda: loader.iter_from(0), loader.close):
            with pytest.raises(ConfigError, match="thread 'first' is iterating it .*epoch 0, 1 of .*"
                                                  "one iteration at a time.*a loader of its own"):
                attempt()
        finish.set()
        worker.join(10)
        assert taken == list(range(len(loader)))  # the first thread's epoch whole
        assert len(list(loader)) == len(loader)  # once it is done, another thread iterates
        it, errors = iter(loader), []

        def share():
            try:
                for _ in it:
                    pass
            except ConfigError as error:
                errors.append(str(error))

        threads = [threading.Thread(target=share) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all("a batch cannot be taken while another is" in e for e in errors)
        loader.close()
    assert not producers()


def test_a_batch_is_valid_until_the_next_unless_buffers_are_not_reused(graph):
    it = iter(NeighborLoader(graph, [5], 16))
    first = next(it)
    next(it)
    with pytest.raises(RuntimeError, match="reused buffer"):
        first.x
    it.close()
    features = torch.from_numpy(np.asarray(graph.features))
    kept = list(NeighborLoader(graph, [5], 16, reuse_buffers=False))
    assert len(kept) == 13 and all(torch.equal(b.x, features[b.n_id]) for b in kept)


def test_an_item_made_as_the_prefetcher_closes_goes_back():
    """What the producer made while its consumer left (blocked on a full channel) is released too, so
    closing a pipeline early never keeps a pooled buffer."""
    made, released = [], []

    class Item:
        def __init__(self, k):
            self.k = k

        def release(self):
            released.append(self.k)

    def produce():
        for k in itertools.count():
            made.append(k)
            yield Item(k)

    prefetcher = Prefetcher(produce, depth=1)
    assert next(prefetcher).k == 0
    deadline = time.monotonic() + 10
    while len(made) < 3 and time.monotonic() < deadline:  # item 1 waits in the channel, item 2 in put
        time.sleep(0.01)
    prefetcher.close()
    assert sorted(released) == made[1:]


# -- errors ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    ({"seeds": "training"}, "name a split"),
    ({"seeds": torch.tensor([0, 5, 2000])}, "out of range"),
    ({"seeds": torch.tensor([-1, 3])}, "out of range"),
    ({"seeds": torch.tensor([], dtype=torch.long)}, "empty"),
    ({"seeds": torch.tensor([3, 4, 3])}, "repeated"),
    ({"seeds": torch.tensor([1.0, 2.0])}, "integers"),
    ({"seeds": torch.zeros(10, dtype=torch.bool)}, "one entry per vertex"),
    ({"seeds": {1, 2}}, "expected a split"),
    ({"fanouts": 5}, "list of neighbours"),
    ({"fanouts": [5.5, 2]}, "integers"),
    ({"fanouts": [5, 0]}, "positive"),
    ({"fanouts": "ten"}, "integers"),
    ({"mode": "neutronorch"}, "train\\(\\)"),
    ({"mode": "fast"}, "exact"),
    ({"batch_size": 0}, "at least 1"),
    ({"batch_size": 2.5}, "whole number"),
    ({"start": 99}, "start at 0..4"),
    ({"lr": 0.1}, "unexpected option"),
    ({"device": "tpu"}, "device"),
])
def test_bad_arguments_get_clear_errors(graph, kwargs, message):
    args = {"fanouts": [5, 5], "batch_size": 64, **kwargs}
    with pytest.raises(ConfigError, match=message):
        NeighborLoader(graph, args.pop("fanouts"), args.pop("batch_size"), **args)


def test_a_dataset_spec_and_a_missing_graph(graph):
    assert NeighborLoader(SPEC, [3], 64).graph.num_nodes == graph.num_nodes
    with pytest.raises(ConfigError, match="Graph or a dataset spec"):
        NeighborLoader(object(), [3], 64)


# -- DGL ------------------------------------------------------------------------------------------------

def test_dgl_blocks(graph):
    dgl = pytest.importorskip("dgl")
    from dgl.nn import SAGEConv

    torch.manual_seed(0)
    ours = GNN("sage", graph.feature_dim, 16, graph.num_classes, 2).eval()
    convs = [SAGEConv(graph.feature_dim, 16, "mean"), SAGEConv(16, graph.num_classes, "mean")]
    with torch.no_grad():
        for mine, conv in zip(ours.layers, convs):
            conv.fc_self.weight.copy_(mine.lin_self.weight)
            conv.fc_neigh.weight.copy_(mine.lin_neigh.weight)
            conv.fc_self.bias.copy_(mine.lin_self.bias)  # DGL 2.x: the bias sits in fc_self for 'mean'
    batch = next(iter(NeighborLoader(graph, [6, 4], 32)))
    blocks = batch.to_dgl_blocks()
    assert len(blocks) == 2 and blocks[-1].num_dst_nodes() == 32
    assert torch.equal(blocks[0].srcdata[dgl.NID], batch.n_id)
    assert torch.equal(blocks[-1].dstdata[dgl.NID], batch.seeds)
    assert [b.num_edges() for b in blocks] == [b.num_edges for b in batch.blocks]
    with torch.no_grad():
        h = F.relu(convs[0](blocks[0], blocks[0].srcdata["feat"]))
        out = convs[1](blocks[1], h)
        torch.testing.assert_close(out, ours(batch.blocks, batch.x), rtol=1e-4, atol=1e-5)


def test_missing_libraries_are_named(graph, monkeypatch):
    batch = next(iter(NeighborLoader(graph, [3], 16)))
    monkeypatch.setitem(sys.modules, "torch_geometric.data", None)
    monkeypatch.setitem(sys.modules, "dgl", None)
    with pytest.raises(ImportError, match="pip install torch-geometric"):
        batch.to_pyg()
    with pytest.raises(ImportError, match="pip install dgl"):
        batch.to_dgl_blocks()


# -- the example ----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_the_example_runs():
    pytest.importorskip("torch_geometric")
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "pyg_sage_loop.py"), "--epochs", "2"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "test accuracy" in done.stdout


def test_switches_and_a_closed_loader_are_refused_with_what_to_do(graph):
    for name in ("shuffle", "drop_last"):
        with pytest.raises(ConfigError, match=f"`{name}` 'no': expected True or False"):
            NeighborLoader(graph, [2], 16, **{name: "no"})
    with pytest.raises(ConfigError, match="`seed` 36893488147419103232: must be a whole number from 0 to"):
        NeighborLoader(graph, [2], 16, seed=2**65)
    loader = NeighborLoader(graph, [2], 16)
    loader.close()
    with pytest.raises(ConfigError, match="NeighborLoader is closed .* make a new one"):
        iter(loader)


def test_a_graph_changed_by_hand_is_checked_before_it_is_sampled(graph):
    import dataclasses

    indices = graph.indices.copy()
    indices[0] = 10**6  # the sampler's kernels would read past the arrays' ends, were it trusted
    with pytest.raises(DataError, match="indices hold vertex id 1000000, out of range"):
        NeighborLoader(dataclasses.replace(graph, indices=indices), [2], 16)
    with pytest.raises(DataError, match="train_idx is a list, expected a numpy array"):
        NeighborLoader(dataclasses.replace(graph, train_idx=list(graph.train_idx)), [2], 16)
