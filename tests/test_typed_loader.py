"""NeighborLoader on a typed graph: the typed pipeline's batches for a loop of one's own (train()'s batches, epochs,
resume, device mode on the CPU), in neutronorch's, PyG's and DGL's form; a PyG heterogeneous model trains on
them and computes what the same model computes on the whole graph; and what the loader refuses."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from neutronorch import TrainConfig, train
from neutronorch.data import synthetic_typed, to_pyg_hetero
from neutronorch.errors import ConfigError
from neutronorch.loader import TypedNeighborLoader
from neutronorch.nn.relational import module_key
from neutronorch.nn.typed_models import TypedGNN, TypedSpec
from neutronorch.sampling.block import TypedBlock

pytestmark = [pytest.mark.usefixtures("one_thread"),  # small tensors (conftest.py)
              pytest.mark.filterwarnings("ignore:There exist node types")]  # a HeteroConv of some types
PRODUCERS = ("exact-producer", "device-producer")


@pytest.fixture(scope="module")
def mag():
    """About 1,500 vertices of 4 types (paper with features; author, institution, field without), one way."""
    return synthetic_typed(nodes=1500, degree=6, features=16, train=0.3, val=0.1, seed=0)


@pytest.fixture(scope="module")
def tiny():
    """About 400 vertices, small enough to take every neighbour of two hops."""
    return synthetic_typed(nodes=400, degree=4, features=8, topics=2, train=0.3, val=0.1, seed=1)


@pytest.fixture(scope="module")
def weighted():
    """``tiny`` with a weight on every cites edge."""
    return synthetic_typed(nodes=400, degree=4, features=8, topics=2, train=0.3, val=0.1, seed=1, edge_weights=True)


def loader(graph, fanouts=(4, 4), batch_size=32, **settings):
    return TypedNeighborLoader(graph, list(fanouts), batch_size, sampler_threads=1, **settings)


def parts(blocks, features, ids):
    """What a batch is made of: its ids, rows and every relation block's CSC, per layer (copied)."""
    csc = [{r: (b.indptr.clone(), b.indices.clone()) for r, b in tblock.blocks.items()} for tblock in blocks]
    return {t: i.clone() for t, i in ids.items()}, {t: x.clone() for t, x in features.items()}, csc


def snapshot(batch):
    return (*parts(batch.blocks, batch.features, batch.ids), batch.y.clone())


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def epoch_losses(batches, epochs: int, optimizers, loss_of) -> list[float]:
    """A training loop of one's own: every epoch's summed loss."""
    losses = []
    for _ in range(epochs):
        total = 0.0
        for batch in batches:
            loss = loss_of(batch)
            for optimizer in optimizers:
                optimizer.zero_grad()
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            total += float(loss.detach())
        losses.append(total)
    return losses


def producers():
    return [t.name for t in threading.enumerate() if t.name in PRODUCERS and t.is_alive()]


class Recorder(nn.Module):
    """A module of one's own for ``train()`` that keeps every training batch it is given and scores the seeds
    from their own rows."""

    def __init__(self, width: int, classes: int):
        super().__init__()
        self.lin = nn.Linear(width, classes)
        self.seen = []

    def forward(self, blocks, features, ids):
        if self.training:
            self.seen.append(parts(blocks, features, ids))
        return self.lin(features["paper"][:blocks[-1].num_dst["paper"]])


# -- train()'s batches, epochs, resume ----------------------------------------------------------------

def test_the_loaders_batches_are_trains(mag):
    """Same seed, batch size and fanouts: the loader's epoch e is train()'s epoch e, batch for batch (ids, rows,
    every relation's blocks), and each pass over the loader is the next epoch."""
    recorder = Recorder(16, mag.num_classes)
    train(TrainConfig(epochs=2, fanouts=[4, 4], batch_size=64, eval_every=-1, threads=1, sampler_threads=1,
                      device="cpu", seed=3), graph=mag, model=recorder)
    ours = loader(mag, batch_size=64, seed=3)
    assert len(ours) == -(-len(mag.train_idx) // 64) and len(recorder.seen) == 2 * len(ours)
    got = [parts(b.blocks, b.features, b.ids) for epoch in range(2) for b in ours]
    assert ours.epoch == 2 and same(got, recorder.seen)


def test_epochs_reshuffle_and_repeat_from_their_seed(mag):
    ours = loader(mag)
    first, second = ([b.seeds.clone() for b in ours] for _ in range(2))
    assert not same(first, second)
    assert same(sorted(torch.cat(first).tolist()), sorted(np.asarray(mag.train_idx).tolist()))
    ours.set_epoch(0)
    assert same([b.seeds.clone() for b in ours], first)
    again = TypedNeighborLoader(mag, [4, 4], 32, sampler_threads=2)
    assert same([snapshot(b) for b in again], [snapshot(b) for b in loader(mag)])
    for batch in loader(mag):  # input_id names the seeds among the loader's
        assert torch.equal(batch.seeds, torch.as_tensor(np.asarray(mag.train_idx))[batch.input_id])
        assert torch.equal(batch.y, torch.as_tensor(np.asarray(mag.labels))[batch.seeds])


def test_start_and_iter_from_resume_exactly(mag):
    whole = [snapshot(b) for b in loader(mag, epoch=1)]
    assert same([snapshot(b) for b in loader(mag, epoch=1, start=3)], whole[3:])
    ours = loader(mag)
    assert same([snapshot(b) for b in ours.iter_from(5, epoch=1)], whole[5:]) and ours.epoch == 2


def test_unshuffled_seeds_sets_masks_and_drop_last(mag):
    ids = torch.tensor([7, 3, 11, 5, 2])
    ours = loader(mag, seeds=ids, batch_size=2, shuffle=False, drop_last=True)
    assert len(ours) == 2
    for _ in range(2):  # the given order, every epoch
        assert same([b.seeds.clone() for b in ours], [ids[:2], ids[2:4]])
    mask = np.zeros(mag.num_nodes["paper"], dtype=bool)
    mask[[1, 4]] = True
    assert loader(mag, seeds=mask).seeds.tolist() == [1, 4]
    assert torch.equal(loader(mag, seeds="val").seeds, torch.as_tensor(np.asarray(mag.val_idx)))
    assert loader(mag, seeds="all").seeds.shape[0] == mag.num_nodes["paper"]


def test_device_mode_on_the_cpu_gives_exact_modes_batches(mag):
    exact = [snapshot(b) for b in loader(mag)]
    with loader(mag, mode="device", device="cpu") as ours:
        assert same([snapshot(b) for b in ours], exact)
    assert not producers()


def test_break_and_exceptions_leave_no_thread(mag):
    ours = loader(mag)
    for _ in ours:
        break
    assert not producers()
    with pytest.raises(KeyError):
        for _ in ours:
            raise KeyError("in the loop")
    assert not producers()
    kept = next(iter(ours))  # a batch's tensors are its own: it stays valid
    assert kept.features["paper"].shape[0] == kept.ids["paper"].shape[0]
    ours.close()
    assert not producers()
    with pytest.raises(ConfigError, match="closed"):
        iter(ours)


def test_a_second_thread_is_refused_while_one_iterates(mag):
    ours, opened, finish, taken = loader(mag), threading.Event(), threading.Event(), []

    def first():
        it = iter(ours)
        taken.append(next(it).index)
        opened.set()
        finish.wait(10)
        taken.extend(b.index for b in it)

    worker = threading.Thread(target=first, name="first")
    worker.start()
    assert opened.wait(10)
    with pytest.raises(ConfigError, match="NeighborLoader: a new iteration cannot start .*thread 'first' "
                                          "is iterating it .*a loader of its own"):
        iter(ours)
    finish.set()
    worker.join(10)
    assert taken == list(range(len(ours)))
    ours.close()
    assert not producers()


# -- the native form ----------------------------------------------------------------------------------

def test_a_typed_gnn_trains_on_the_native_form(mag):
    graph = mag.with_reverse()
    torch.manual_seed(0)
    model = TypedGNN("sage", TypedSpec.of(graph), 16, graph.num_classes, 2, dropout=0.0)
    optimizers = [torch.optim.Adam(model.dense_parameters(), lr=0.01),
                  torch.optim.SparseAdam(model.embedding_parameters(), lr=0.01)]
    losses = epoch_losses(loader(mag), 3, optimizers,
                          lambda batch: F.cross_entropy(model(batch.blocks, batch.features, batch.ids), batch.y))
    assert losses[-1] < 0.8 * losses[0], losses


# -- the PyG form -------------------------------------------------------------------------------------

def test_pyg_form_fields(weighted):
    """Every type and relation (reverses included) is there; local ids within each type's n_id; the per-hop
    counts add up; edge features and e_id are the graph's (in to_pyg_hetero's edge order)."""
    pytest.importorskip("torch_geometric")
    graph = weighted.with_reverse()
    whole = to_pyg_hetero(graph)
    batch = next(iter(loader(weighted, fanouts=(3, 3), batch_size=8)))
    data = batch.to_pyg()
    assert set(data.node_types) == set(graph.num_nodes) and set(data.edge_types) == set(graph.relations)
    paper = data["paper"]
    assert paper.batch_size == 8 and torch.equal(paper.n_id[:8], batch.seeds)
    assert torch.equal(paper.input_id, batch.input_id)
    assert torch.equal(paper.y, torch.as_tensor(np.asarray(graph.labels))[paper.n_id])
    for t in graph.num_nodes:
        store = data[t]
        assert store.num_nodes == store.n_id.shape[0] == sum(data.num_sampled_nodes_dict[t])
        assert len(data.num_sampled_nodes_dict[t]) == 3
        if graph.feature_dim(t):
            assert torch.equal(store.x, torch.as_tensor(np.asarray(graph.features[t]))[store.n_id])
        else:
            assert "x" not in store
    for r, relation in graph.relations.items():
        store = data[r]
        assert store.edge_index.shape[1] == sum(data.num_sampled_edges_dict[r])
        if store.edge_index.numel():
            assert int(store.edge_index[0].max()) < data[r[0]].num_nodes
            assert int(store.edge_index[1].max()) < data[r[2]].num_nodes
        if relation.edge_feature_dim:
            pairs = whole[r].edge_index[:, store.e_id]
            assert torch.equal(pairs[0], data[r[0]].n_id[store.edge_index[0]])
            assert torch.equal(pairs[1], data[r[2]].n_id[store.edge_index[1]])
            assert torch.equal(store.edge_attr, whole[r].edge_attr[store.e_id])
        else:
            assert "edge_attr" not in store
    cites = data["paper", "cites", "paper"]
    assert cites.edge_attr.shape[0] > 0
    assert data.num_sampled_nodes_dict["paper"][0] == 8 and data.num_sampled_nodes_dict["author"][0] == 0
    assert batch.num_sampled_nodes == data.num_sampled_nodes_dict
    hop0 = data.num_sampled_edges_dict[("author", "writes", "paper")][0]  # the seed hop: edges into the seeds
    assert bool((data["author", "writes", "paper"].edge_index[1, :hop0] < 8).all())


def _hetero_sage(layers, relations_per_layer, widths, hidden, classes):
    """PyG's HeteroConv of SAGEConv per relation (summed), ReLU between layers."""
    from torch_geometric.nn import HeteroConv, SAGEConv

    convs = []
    for index, relations in enumerate(relations_per_layer):
        out = classes if index == layers - 1 else hidden
        dims = widths if index == 0 else dict.fromkeys(widths, hidden)
        convs.append(HeteroConv({r: SAGEConv((dims[r[0]], dims[r[2]]), out) for r in relations}, aggr="sum"))
    return nn.ModuleList(convs)


def _copy_typed_sage(ours: TypedGNN, theirs: nn.ModuleList) -> None:
    """TypedSAGEConv (root per relation) into SAGEConv: neighbour weight to lin_l, root to lin_r, its bias."""
    with torch.no_grad():
        for layer, conv in zip(ours.layers, theirs):
            for r in layer.relations:
                sage = conv.convs[r]
                sage.lin_l.weight.copy_(layer.neigh[module_key(r)].weight)
                sage.lin_r.weight.copy_(layer.root[module_key(r)].weight)
                sage.lin_l.bias.copy_(layer.root[module_key(r)].bias)


def _run_pyg(convs, x, edge_index, counts=None):
    """The layers on a (sub)graph; ``counts``: (nodes, edges) per hop, to trim each layer as PyG's loader
    batches allow (``trim_to_layer``)."""
    from torch_geometric.utils import trim_to_layer

    for index, conv in enumerate(convs):
        if counts is not None:
            x, edge_index, _ = trim_to_layer(index, counts[0], counts[1], x, edge_index)
        x = conv(x, edge_index)
        if index < len(convs) - 1:
            x = {t: rows.relu() for t, rows in x.items()}
    return x["paper"]


def _models(graph, layers, hidden=8):
    torch.manual_seed(0)
    ours = TypedGNN("sage", TypedSpec.of(graph), hidden, graph.num_classes, layers, dropout=0.0).eval()
    widths = {t: graph.feature_dim(t) or hidden for t in graph.num_nodes}
    theirs = _hetero_sage(layers, [layer.relations for layer in ours.layers], widths, hidden, graph.num_classes)
    _copy_typed_sage(ours, theirs)
    return ours, theirs


def _pyg_inputs(data, ours):
    """Each type's rows: its features, or its table's rows looked up by n_id (a featureless type)."""
    return {t: data[t].x if "x" in data[t] else ours.embeddings[t](data[t].n_id) for t in data.node_types
            if "x" in data[t] or t in ours.embeddings}


@pytest.mark.parametrize("layers", [1, 2])
def test_pyg_on_a_batch_with_every_neighbour_equals_pyg_on_the_whole_graph(tiny, layers):
    """With every neighbour taken, PyG's model on to_pyg() gives the seeds the outputs the same model gives
    them on the whole graph (to_pyg_hetero), trimmed or not, and our TypedGNN with the same weights on the
    native form gives them too."""
    pytest.importorskip("torch_geometric")
    graph = tiny.with_reverse()
    ours, theirs = _models(graph, layers)
    whole = to_pyg_hetero(graph)
    x_whole = {t: whole[t].x if "x" in whole[t] else ours.embeddings[t].weight for t in whole.node_types
               if "x" in whole[t] or t in ours.embeddings}
    with torch.no_grad():
        everything = _run_pyg(theirs, x_whole, whole.edge_index_dict)
        for batch in loader(tiny, fanouts=[-1] * layers, batch_size=16, seeds="test"):
            data = batch.to_pyg()
            expected = everything[batch.seeds]
            out = _run_pyg(theirs, _pyg_inputs(data, ours), data.edge_index_dict)[:batch.batch_size]
            trimmed = _run_pyg(theirs, _pyg_inputs(data, ours), data.edge_index_dict,
                               (data.num_sampled_nodes_dict, data.num_sampled_edges_dict))[:batch.batch_size]
            native = ours(batch.blocks, batch.features, batch.ids)
            for got in (out, trimmed, native):
                torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_pyg_on_a_sampled_batch_trims_and_agrees_with_the_blocks_where_the_forms_agree(mag):
    """Sampled: one layer (PyG's form and the blocks are then the same draw) gives our model's outputs; with
    three layers trimming changes no seed's output."""
    pytest.importorskip("torch_geometric")
    graph = mag.with_reverse()
    one, pyg_one = _models(graph, 1)
    three, pyg_three = _models(graph, 3)
    with torch.no_grad():
        batch = next(iter(loader(mag, fanouts=[3], batch_size=32)))
        data = batch.to_pyg()
        torch.testing.assert_close(_run_pyg(pyg_one, _pyg_inputs(data, one), data.edge_index_dict)[:32],
                                   one(batch.blocks, batch.features, batch.ids), rtol=1e-5, atol=1e-5)
        batch = next(iter(loader(mag, fanouts=[4, 3, 2], batch_size=32)))
        data = batch.to_pyg()
        x = _pyg_inputs(data, three)
        counts = (data.num_sampled_nodes_dict, data.num_sampled_edges_dict)
        torch.testing.assert_close(_run_pyg(pyg_three, x, data.edge_index_dict, counts)[:32],
                                   _run_pyg(pyg_three, x, data.edge_index_dict)[:32], rtol=1e-5, atol=1e-5)


def test_a_pyg_loop_trains_to_hetero_graphsage(mag):
    """PyG's own GraphSAGE made heterogeneous (to_hetero), featureless types read from embedding tables by
    n_id, in PyG's loop: the loss falls."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import GraphSAGE, to_hetero

    graph = mag.with_reverse()
    torch.manual_seed(0)

    class Model(nn.Module):
        def __init__(self, metadata):
            super().__init__()
            self.tables = nn.ModuleDict({t: nn.Embedding(n, 16) for t, n in graph.num_nodes.items()
                                         if not graph.feature_dim(t)})
            self.gnn = to_hetero(GraphSAGE((-1, -1), 32, 2, graph.num_classes), metadata, aggr="sum")

        def forward(self, data):
            x = {t: data[t].x if "x" in data[t] else self.tables[t](data[t].n_id) for t in data.node_types}
            return self.gnn(x, data.edge_index_dict)["paper"]

    ours = loader(mag, fanouts=(5, 5), batch_size=64)
    model = Model((list(graph.num_nodes), list(graph.relations)))
    with torch.no_grad():
        model(next(iter(ours)).to_pyg())  # lazy widths

    def loss_of(batch):
        data = batch.to_pyg()  # PyG's loop from here on
        seeds = data["paper"].batch_size
        return F.cross_entropy(model(data)[:seeds], data["paper"].y[:seeds])

    losses = epoch_losses(ours, 4, [torch.optim.Adam(model.parameters(), lr=0.01)], loss_of)
    assert losses[-1] < 0.8 * losses[0], losses


# -- the DGL form -------------------------------------------------------------------------------------

def test_dgl_blocks(weighted):
    dgl = pytest.importorskip("dgl")
    graph = weighted.with_reverse()
    batch = next(iter(loader(weighted, fanouts=(3, 3), batch_size=8)))
    blocks = batch.to_dgl()
    assert len(blocks) == 2 and set(blocks[0].canonical_etypes) == set(graph.relations)
    for g, tblock in zip(blocks, batch.blocks):
        for t in graph.num_nodes:
            assert g.num_src_nodes(t) == tblock.num_src.get(t, 0) and g.num_dst_nodes(t) == tblock.num_dst.get(t, 0)
            if tblock.num_src.get(t, 0):
                assert torch.equal(g.srcnodes[t].data[dgl.NID], tblock.src_ids[t])
        for r, block in tblock.blocks.items():
            src, dst = g.edges(etype=r, order="eid")
            expected = torch.repeat_interleave(torch.arange(block.num_dst), block.indptr[1:] - block.indptr[:-1])
            assert torch.equal(src, block.indices.long()) and torch.equal(dst, expected)
    assert torch.equal(blocks[0].srcnodes["paper"].data["feat"], batch.features["paper"])
    assert torch.equal(blocks[-1].dstnodes["paper"].data["label"], batch.y)
    cites = ("paper", "cites", "paper")
    assert torch.equal(blocks[-1].edges[cites].data["feat"], batch.blocks[-1].edge_features[cites])
    from dgl.nn import HeteroGraphConv, SAGEConv

    conv = HeteroGraphConv({r: SAGEConv((8, 8), 4, "mean") for r in graph.relations if r[2] == "paper"
                            and graph.feature_dim(r[0])}, aggregate="sum")
    out = conv(blocks[-1], ({"paper": batch.features["paper"][:blocks[-1].num_src_nodes("paper")]},
                            {"paper": batch.features["paper"][:8]}))
    assert out["paper"].shape == (8, 4)


# -- refusals -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="neutronorch"), "train()"),
    (dict(mode="fast"), "exact"),
    (dict(seeds="nope"), "name a split"),
    (dict(seeds=[0, 0, 1]), "repeated"),
    (dict(seeds=[10**7]), "out of range for a graph of"),
    (dict(seeds=np.zeros(3, dtype=bool)), "one entry per vertex"),
    (dict(fanouts={"nope": [2]}), "nope"),
    (dict(fanouts=[2, -3]), "-3"),
    (dict(batch_size=0), "batch_size"),
    (dict(start=99), "start"),
    (dict(model="sage"), "torch.nn.Module"),
    (dict(device="tpu"), "device"),
])
def test_bad_arguments_get_clear_errors(mag, kwargs, message):
    settings = dict(fanouts=[2, 2], batch_size=32) | kwargs
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        TypedNeighborLoader(mag, settings.pop("fanouts"), settings.pop("batch_size"), **settings)


def test_one_loader_takes_either_kind_of_graph(mag):
    """NeighborLoader (TypedNeighborLoader is another name for it) yields a typed graph's batches as
    TypedLoaderBatch and a homogeneous graph's as LoaderBatch; link batches of a typed graph are refused."""
    from neutronorch.data import load_dataset
    from neutronorch.loader import LinkNeighborLoader, LoaderBatch, NeighborLoader, TypedLoaderBatch

    assert TypedNeighborLoader is NeighborLoader
    assert isinstance(next(iter(NeighborLoader(mag, [2], 8, sampler_threads=1))), TypedLoaderBatch)
    homogeneous = load_dataset("synthetic:nodes=200,degree=4,features=4,classes=2")
    assert isinstance(next(iter(NeighborLoader(homogeneous, [2], 8, sampler_threads=1))), LoaderBatch)
    with pytest.raises(ConfigError, match="`model` rgcn: a relational model, for typed graphs"):
        NeighborLoader(homogeneous, [2], 8, model="rgcn")
    with pytest.raises(ConfigError, match="LinkNeighborLoader takes a homogeneous graph for now"):
        LinkNeighborLoader(mag, [2], 8, edges=[[0], [1]])
    with pytest.raises(ConfigError, match="from_pyg_hetero"):
        NeighborLoader(42, [2], 8)
    with pytest.raises(ConfigError, match="on a typed graph it takes gpu_memory_gb"):
        NeighborLoader(mag, [2], 8, hidden=16)


def test_a_graph_without_labels_gives_minus_one(mag):
    import dataclasses

    unlabelled = dataclasses.replace(mag, labels=None, train_idx=np.empty(0, np.int64), val_idx=np.empty(0, np.int64),
                                     test_idx=np.empty(0, np.int64))
    batch = next(iter(loader(unlabelled, seeds=[0, 1, 2])))
    assert batch.y.tolist() == [-1, -1, -1]


def test_blocks_are_typed_blocks_and_the_repr_names_the_target(mag):
    ours = loader(mag)
    batch = next(iter(ours))
    assert all(isinstance(b, TypedBlock) for b in batch.blocks) and "paper" in repr(ours) and "nodes" in repr(batch)


def test_fanouts_that_do_not_fit_the_model_and_epochs_without_a_batch_are_refused(mag):
    with pytest.raises(ConfigError, match="`drop_last` with `batch_size` 100000: the .* seeds fill no whole batch"):
        TypedNeighborLoader(mag, [2], 100_000, drop_last=True)
    model = type("TwoLayers", (torch.nn.Module,), {"num_layers": 2})()  # as the built-in models carry it
    with pytest.raises(ConfigError, match="`fanouts` give 3 layer.s. and `model` has 2"):
        TypedNeighborLoader(mag, [2, 2, 2], 16, model=model)
