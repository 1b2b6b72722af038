"""Relational layers over typed blocks (``nn/relational.py``): each equals its PyG counterpart with the same
weights on full-neighbour typed blocks (one and two layers, forward and every gradient), the edge-weighted
means equal a dense reference, and only destinations' rows are computed."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from neutronorch.data import Relation, TypedGraph, synthetic_typed
from neutronorch.nn.relational import RGCNConv, TypedSAGEConv, module_key
from neutronorch.nn.relational import RGATConv
from neutronorch.sampling.block import Block, TypedBlock

WIDTHS = {"paper": 12, "author": 8, "institution": 6, "field": 10, "topic": 5}
OUT, HIDDEN, HEADS = 8, 12, 3
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}
DTYPES = [torch.float32, torch.float64]


# ---------------------------------------------------------------------------------------------------- graphs


def _tiny() -> TypedGraph:
    """5 papers, 2 authors, 3 topics: an author frontier smaller than the papers it writes to, papers and a
    topic without in-edges through some relation, a repeated edge, edge features on two relations."""
    writes = Relation.from_edges([0, 1, 1, 1, 0], [0, 0, 2, 2, 3], 2, 5,
                                 edge_features=np.array([0.5, 2.0, 1.0, 1.5, 0.25], np.float32))
    cites = Relation.from_edges([1, 2, 3, 4, 0], [0, 0, 1, 3, 4], 5, 5,
                                edge_features=np.arange(10, dtype=np.float32).reshape(5, 2) / 10)
    about = Relation.from_edges([0, 1, 2], [0, 0, 2], 5, 3)
    graph = TypedGraph(name="tiny", num_nodes={"paper": 5, "author": 2, "topic": 3},
                       relations={("author", "writes", "paper"): writes, ("paper", "cites", "paper"): cites,
                                  ("paper", "about", "topic"): about},
                       features={}, target="paper", labels=None, train_idx=np.empty(0, np.int64),
                       val_idx=np.empty(0, np.int64), test_idx=np.empty(0, np.int64), num_classes=2)
    return graph.with_reverse()


def _synthetic() -> TypedGraph:
    """About 1,000 vertices of 4 types, 8 relations with the reverses, ~11,000 edges; 1-wide positive edge
    features (weights) on writes, 3-wide ones on cites (and their reverses)."""
    graph = synthetic_typed(nodes=1000, degree=6, features=8, topics=2, seed=1)
    rng = np.random.default_rng(0)
    relations = dict(graph.relations)
    for key, width in ((("author", "writes", "paper"), 1), (("paper", "cites", "paper"), 3)):
        rel = relations[key]
        features = rng.uniform(0.2, 2.0, (rel.num_edges, width)).astype(np.float32)
        relations[key] = Relation(rel.indptr, rel.indices, features)
    return replace(graph, relations=relations).with_reverse()


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors (conftest.py)


GRAPHS = {"tiny": _tiny, "synthetic": _synthetic}
_CACHE = {}


def _case(name: str):
    """The graph, its inputs (random rows per type, at ``WIDTHS``) and seeds of three types."""
    if name not in _CACHE:
        graph = GRAPHS[name]()
        gen = torch.Generator().manual_seed(3)
        x = {t: torch.randn(n, WIDTHS[t], generator=gen, dtype=torch.float64) for t, n in graph.num_nodes.items()}
        if name == "tiny":
            seeds = {"paper": np.arange(5), "author": np.array([1]), "topic": np.array([2, 1])}
        else:
            rng = np.random.default_rng(5)
            seeds = {t: np.sort(rng.choice(graph.num_nodes[t], k, replace=False))
                     for t, k in (("paper", 25), ("author", 8), ("field", 5))}
        _CACHE[name] = graph, x, seeds
    return _CACHE[name]


def full_typed_block(graph: TypedGraph, dst: dict[str, np.ndarray]) -> tuple[TypedBlock, dict]:
    """Every in-neighbour of ``dst`` (type -> global ids) through every relation into one of its types: a
    full-neighbour typed layer, each type's frontier its destinations then its new sources (ascending); and
    the relations' edge features in the blocks' edge order."""
    wanted = [r for r in graph.relations if r[2] in dst]
    picked, neighbours = {}, {t: [] for t in graph.node_types}
    for r in wanted:
        rel = graph.relations[r]
        rows = np.asarray(dst[r[2]], np.int64)
        indptr = np.asarray(rel.indptr, np.int64)
        degree = indptr[rows + 1] - indptr[rows]
        ptr = np.concatenate([[0], np.cumsum(degree)])
        position = np.repeat(indptr[rows] - ptr[:-1], degree) + np.arange(ptr[-1])
        picked[r] = ptr, position
        neighbours[r[0]].append(np.asarray(rel.indices, np.int64)[position])
    frontier = {}
    for t in graph.node_types:
        lead = np.asarray(dst.get(t, np.empty(0, np.int64)), np.int64)
        seen = np.concatenate(neighbours[t]) if neighbours[t] else np.empty(0, np.int64)
        frontier[t] = np.concatenate([lead, np.setdiff1d(seen, lead)])
    blocks, attrs = {}, {}
    for r in wanted:
        ptr, position = picked[r]
        lookup = np.full(graph.num_nodes[r[0]], -1, np.int64)
        lookup[frontier[r[0]]] = np.arange(frontier[r[0]].shape[0])
        local = lookup[np.asarray(graph.relations[r].indices, np.int64)[position]]
        blocks[r] = Block(ptr.shape[0] - 1, frontier[r[0]].shape[0], torch.from_numpy(ptr), torch.from_numpy(local),
                          src_ids=torch.from_numpy(frontier[r[0]]))
        features = graph.relations[r].edge_features
        if features is not None:
            attrs[r] = torch.from_numpy(np.asarray(features)[position])
    tblock = TypedBlock({t: len(ids) for t, ids in dst.items()}, {t: f.shape[0] for t, f in frontier.items()},
                        blocks, {t: torch.from_numpy(f) for t, f in frontier.items()})
    return tblock, attrs


def _blocks(graph, seeds, layers):
    """Full-neighbour typed blocks for ``layers`` layers, bottom first, with their edge features."""
    blocks = [full_typed_block(graph, seeds)]
    while len(blocks) < layers:
        top = blocks[0][0]
        blocks.insert(0, full_typed_block(graph, {t: ids.numpy() for t, ids in top.src_ids.items()}))
    return blocks


def _edge_weights(attrs):
    return {r: a for r, a in attrs.items() if a.shape[1] == 1}


def _run_ours(layers, blocks, x, extra=None):
    """The layers over the blocks from the full inputs ``x`` (ReLU between layers); ``extra(attrs)`` gives a
    layer's keyword arguments from its block's edge features."""
    h = {t: x[t].index_select(0, ids) for t, ids in blocks[0][0].src_ids.items()}
    for i, (layer, (tblock, attrs)) in enumerate(zip(layers, blocks)):
        h = layer(tblock, h, **(extra(attrs) if extra else {}))
        if i < len(layers) - 1:
            h = {t: torch.relu(v) for t, v in h.items()}
    return h


def _run_pyg(layers, x, edge_index, **kwargs):
    h = x
    for i, layer in enumerate(layers):
        h = layer(h, edge_index, **kwargs)
        if i < len(layers) - 1:
            h = {t: torch.relu(v) for t, v in h.items()}
    return h


def _edge_index(graph):
    return {r: torch.stack([torch.from_numpy(s), torch.from_numpy(d)]) for r, rel in graph.relations.items()
            for s, d in [rel.edges()]}


def _targets(seeds, out_dim, dtype):
    gen = torch.Generator().manual_seed(11)
    return {t: torch.randn(len(ids), out_dim, generator=gen, dtype=dtype) for t, ids in seeds.items()}


def _leaves(x, dtype):
    return {t: v.detach().to(dtype).clone().requires_grad_() for t, v in x.items()}


def _compare(ours_out, theirs_out, seeds, dtype):
    for t, ids in seeds.items():
        torch.testing.assert_close(ours_out[t], theirs_out[t][torch.from_numpy(ids)], **TOL[dtype])


def _loss(out, seeds, targets, full=False):
    return sum((out[t][torch.from_numpy(ids)] if full else out[t]).mul(targets[t]).sum() for t, ids in seeds.items())


def _check_grads(pairs, dtype):
    """A parameter no seed's output reads has no gradient here and a zero one in PyG (which computes every vertex)."""
    for ours, theirs in pairs:
        mine = ours.grad if ours.grad is not None else torch.zeros_like(ours)
        yours = theirs.grad if theirs.grad is not None else torch.zeros_like(theirs)
        torch.testing.assert_close(mine, yours, **TOL[dtype])


# ------------------------------------------------------------------------------------------- typed SAGE


def _sage_pyg(layer: TypedSAGEConv, weighted: bool):
    """PyG's ``HeteroConv`` of ``SAGEConv`` (``GraphConv(aggr="mean")`` with edge weights) holding ``layer``'s
    weights, and the (ours, theirs) parameter pairs whose gradients agree."""
    from torch_geometric.nn import GraphConv, HeteroConv, SAGEConv

    convs, pairs = {}, []
    into = {t: [r for r in layer.relations if r[2] == t] for t in {r[2] for r in layer.relations}}
    for r in layer.relations:
        dims = (layer.in_dims[r[0]], layer.in_dims[r[2]])
        if weighted:
            conv = GraphConv(dims, layer.out_dim, aggr="mean")
            neigh, root = conv.lin_rel, conv.lin_root
        else:
            conv = SAGEConv(dims, layer.out_dim, root_weight=layer.root_mode is not None)
            neigh, root = conv.lin_l, getattr(conv, "lin_r", None)
        ours = layer.neigh[module_key(r)]
        with torch.no_grad():
            neigh.weight.copy_(ours.weight)
            pairs.append((ours.weight, neigh.weight))
            if layer.root_mode is None:
                neigh.bias.copy_(ours.bias)
                pairs.append((ours.bias, neigh.bias))
            elif layer.root_mode == "relation":
                own = layer.root[module_key(r)]
                root.weight.copy_(own.weight)
                neigh.bias.copy_(own.bias)
                pairs += [(own.weight, root.weight), (own.bias, neigh.bias)]
            else:  # one root per type: each relation's share of it
                own, k = layer.root[r[2]], len(into[r[2]])
                root.weight.copy_(own.weight / k)
                neigh.bias.copy_(own.bias / k)
                pairs += [(own.weight, root.weight), (own.bias, neigh.bias)]
        convs[r] = conv
    return HeteroConv(convs, aggr="sum"), pairs


def _sage_layers(graph, layers, root, dtype):
    torch.manual_seed(0)
    relations = list(graph.relations)
    dims = [WIDTHS, HIDDEN][:layers]
    outs = [HIDDEN, OUT][-layers:]
    return [TypedSAGEConv(d, o, relations, root=root).to(dtype) for d, o in zip(dims, outs)]


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("root", ["relation", "type", None], ids=["relation", "type", "none"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_typed_sage_equals_pyg_hetero_sage(graph_name, root, layers, dtype):
    pytest.importorskip("torch_geometric")
    graph, x, seeds = _case(graph_name)
    ours = _sage_layers(graph, layers, root, dtype)
    theirs, pairs = zip(*[_sage_pyg(layer, weighted=False) for layer in ours])
    theirs = [m.to(dtype) for m in theirs]
    x_ours, x_theirs = _leaves(x, dtype), _leaves(x, dtype)
    out = _run_ours(ours, _blocks(graph, seeds, layers), x_ours)
    ref = _run_pyg(theirs, x_theirs, _edge_index(graph))
    _compare(out, ref, seeds, dtype)
    targets = _targets(seeds, ours[-1].out_dim, dtype)
    _loss(out, seeds, targets).backward()
    _loss(ref, seeds, targets, full=True).backward()
    _check_grads([p for layer_pairs in pairs for p in layer_pairs], dtype)
    _check_grads([(x_ours[t], x_theirs[t]) for t in x], dtype)


# ------------------------------------------------------------------------------------------------- R-GCN


def _stacked(graph, x):
    """The typed graph as one homogeneous graph: types stacked in order, ``edge_type`` the relation's index."""
    offsets = dict(zip(graph.node_types, np.cumsum([0] + [graph.num_nodes[t] for t in graph.node_types])))
    edges, kinds = [], []
    for i, (r, rel) in enumerate(graph.relations.items()):
        src, dst = rel.edges()
        edges.append(np.stack([src + offsets[r[0]], dst + offsets[r[2]]]))
        kinds.append(np.full(src.shape[0], i))
    return (torch.cat([x[t] for t in graph.node_types]), torch.from_numpy(np.concatenate(edges, 1)),
            torch.from_numpy(np.concatenate(kinds)), offsets)


def _rgcn_layers(graph, layers, bases, dtype):
    torch.manual_seed(0)
    dims = [OUT + 2, HIDDEN][:layers]
    outs = [HIDDEN, OUT][-layers:]
    return [RGCNConv(d, o, list(graph.relations), num_bases=bases).to(dtype) for d, o in zip(dims, outs)]


def _same_width(x, width):
    gen = torch.Generator().manual_seed(4)
    return {t: torch.randn(v.shape[0], width, generator=gen, dtype=v.dtype) for t, v in x.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bases", [None, 2], ids=["full", "bases"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_rgcn_equals_pyg_rgcn_on_the_stacked_graph(graph_name, bases, layers, dtype):
    pytest.importorskip("torch_geometric")
    from torch_geometric.nn import RGCNConv as PygRGCN

    graph, x, seeds = _case(graph_name)
    x = _same_width(x, OUT + 2)
    ours = _rgcn_layers(graph, layers, bases, dtype)
    theirs, pairs = [], []
    for layer in ours:
        conv = PygRGCN(layer.in_dim, layer.out_dim, len(layer.relations), num_bases=bases, aggr="mean").to(dtype)
        mine = [layer.weight if bases is None else layer.basis] + ([] if bases is None else [layer.comp])
        mine += [layer.root, layer.bias]
        yours = [conv.weight] + ([] if bases is None else [conv.comp]) + [conv.root, conv.bias]
        with torch.no_grad():
            for a, b in zip(mine, yours):
                b.copy_(a)
        theirs.append(conv)
        pairs += list(zip(mine, yours))
    x_ours, x_theirs = _leaves(x, dtype), _leaves(x, dtype)
    out = _run_ours(ours, _blocks(graph, seeds, layers), x_ours)
    h, edge_index, edge_type, offsets = _stacked(graph, x_theirs)
    for i, conv in enumerate(theirs):
        h = conv(h, edge_index, edge_type)
        if i < layers - 1:
            h = torch.relu(h)
    ref = {t: h[offsets[t]:offsets[t] + n] for t, n in graph.num_nodes.items()}
    _compare(out, ref, seeds, dtype)
    targets = _targets(seeds, OUT, dtype)
    _loss(out, seeds, targets).backward()
    _loss(ref, seeds, targets, full=True).backward()
    _check_grads(pairs, dtype)
    _check_grads([(x_ours[t], x_theirs[t]) for t in x], dtype)


def test_rgcn_refuses_inputs_of_other_widths():
    graph, x, seeds = _case("tiny")
    layer = RGCNConv(WIDTHS["paper"], 4, list(graph.relations))
    tblock, _ = full_typed_block(graph, seeds)
    with pytest.raises(ValueError, match="one input width"):
        layer(tblock, {t: x[t].float().index_select(0, ids) for t, ids in tblock.src_ids.items()})


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_rgcn_folds_a_projection_into_its_weights(graph_name, weighted):
    """Raw rows with ``projections`` give what the projected rows give: outputs, and the gradients of the
    maps, the layer's weights and the raw rows (destinations without edges through a relation included)."""
    graph, x, seeds = _case(graph_name)
    tblock, _ = full_typed_block(graph, seeds)
    torch.manual_seed(0)
    layer = RGCNConv(OUT, 5, list(graph.relations), num_bases=2)
    maps = {t: torch.nn.Linear(WIDTHS[t], OUT) for t in tblock.num_src}
    gen = torch.Generator().manual_seed(3)
    weights = ({r: torch.rand(b.num_edges, generator=gen) + 0.5 for r, b in tblock.blocks.items()}
               if weighted else None)
    raw = {t: x[t].float().index_select(0, ids) for t, ids in tblock.src_ids.items()}
    grads = []
    for fold in (False, True):
        rows = {t: v.clone().requires_grad_() for t, v in raw.items()}
        layer.zero_grad()
        for lin in maps.values():
            lin.zero_grad()
        if fold:
            out = layer(tblock, rows, weights, projections=maps)
        else:
            out = layer(tblock, {t: maps[t](v) for t, v in rows.items()}, weights)
        sum((v * torch.linspace(-1, 1, v.numel()).view_as(v)).sum() for v in out.values()).backward()
        params = [p.grad.clone() for p in [*layer.parameters(), *(q for m in maps.values() for q in m.parameters())]
                  if p.grad is not None]
        grads.append((out, params, [rows[t].grad for t in rows]))
    (plain, plain_params, plain_rows), (folded, folded_params, folded_rows) = grads
    for t in plain:
        torch.testing.assert_close(folded[t], plain[t], **TOL[torch.float32])
    assert len(plain_params) == len(folded_params)
    for a, b in zip(folded_params + folded_rows, plain_params + plain_rows):
        torch.testing.assert_close(a, b, **TOL[torch.float32])


# ------------------------------------------------------------------------------------------------- R-GAT


def _rgat_layers(graph, layers, widths, edges, dtype):
    torch.manual_seed(0)
    edge_dims = None
    if edges:
        edge_dims = {r: rel.edge_feature_dim for r, rel in graph.relations.items() if rel.edge_feature_dim}
    dims = [widths, HIDDEN][:layers]
    outs = [HIDDEN, OUT + 1][-layers:]
    return [RGATConv(d, o, list(graph.relations), heads=HEADS, edge_dims=edge_dims).to(dtype)
            for d, o in zip(dims, outs)]


def _rgat_pyg(layer: RGATConv):
    """The MLPerf reference's construction (``HeteroConv`` of ``GATConv(in, out // heads, heads,
    add_self_loops=False)``, ``aggr`` its default) with ``layer``'s weights, each relation's GATConv loaded
    from its ``RelationAttention``'s state."""
    from torch_geometric.nn import GATConv, HeteroConv

    convs, pairs = {}, []
    for r in layer.relations:
        s, d = layer.in_dims[r[0]], layer.in_dims[r[2]]
        conv = GATConv(s if s == d else (s, d), layer.head_dim, heads=layer.heads, add_self_loops=False,
                       edge_dim=layer.edge_dims.get(r))
        mine = layer.convs[module_key(r)]
        conv.load_state_dict(mine.state_dict())
        theirs = dict(conv.named_parameters())
        pairs += [(p, theirs[name]) for name, p in mine.named_parameters()]
        convs[r] = conv
    return HeteroConv(convs), pairs


@pytest.mark.parametrize("dtype", DTYPES, ids=["float32", "float64"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("edges", [False, True], ids=["plain", "edge-features"])
@pytest.mark.parametrize("widths", ["equal", "per-type"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_rgat_equals_the_mlperf_reference_layer(graph_name, widths, edges, layers, dtype):
    pytest.importorskip("torch_geometric")
    graph, x, seeds = _case(graph_name)
    if widths == "equal":
        x = _same_width(x, 7)
    dims = {t: v.shape[1] for t, v in x.items()}
    ours = _rgat_layers(graph, layers, dims, edges, dtype)
    theirs, pairs = zip(*[_rgat_pyg(layer) for layer in ours])
    theirs = [m.to(dtype) for m in theirs]
    x_ours, x_theirs = _leaves(x, dtype), _leaves(x, dtype)
    extra = (lambda attrs: {"edge_attr": {r: a.to(dtype) for r, a in attrs.items()}}) if edges else None
    out = _run_ours(ours, _blocks(graph, seeds, layers), x_ours, extra)
    kwargs = {}
    if edges:
        kwargs["edge_attr_dict"] = {r: torch.from_numpy(np.asarray(rel.edge_features)).to(dtype)
                                    for r, rel in graph.relations.items() if rel.edge_features is not None}
    ref = _run_pyg(theirs, x_theirs, _edge_index(graph), **kwargs)
    _compare(out, ref, seeds, dtype)
    targets = _targets(seeds, ours[-1].out_dim, dtype)
    _loss(out, seeds, targets).backward()
    _loss(ref, seeds, targets, full=True).backward()
    _check_grads([p for layer_pairs in pairs for p in layer_pairs], dtype)
    _check_grads([(x_ours[t], x_theirs[t]) for t in x], dtype)


def test_rgat_needs_the_edge_features_it_was_built_for():
    graph, x, seeds = _case("tiny")
    layer = RGATConv(WIDTHS, 6, list(graph.relations), heads=2, edge_dims={("paper", "cites", "paper"): 2})
    tblock, attrs = full_typed_block(graph, seeds)
    h = {t: x[t].float().index_select(0, ids) for t, ids in tblock.src_ids.items()}
    with pytest.raises(ValueError, match="edge features"):
        layer(tblock, h)
    with pytest.raises(ValueError, match="without edge features"):
        layer(tblock, h, edge_attr={r: a.float() for r, a in attrs.items()})


# ----------------------------------------------------------------------------------------- edge weights


def _dense_means(graph, weights):
    """Per relation the dense ``(n_dst, n_src)`` matrix of the weighted mean: ``A[v, u] = sum of w over u -> v
    edges / in-degree of v`` (w = 1 for a relation without weights)."""
    means = {}
    for r, rel in graph.relations.items():
        src, dst = rel.edges()
        w = torch.ones(src.shape[0], dtype=torch.float64) if r not in weights else weights[r].reshape(-1)
        a = torch.zeros(graph.num_nodes[r[2]], graph.num_nodes[r[0]], dtype=torch.float64)
        a.index_put_((torch.from_numpy(dst), torch.from_numpy(src)), w, accumulate=True)
        means[r] = a / torch.from_numpy(rel.in_degrees()).clamp(min=1).to(a.dtype).unsqueeze(1)
    return means


def _graph_weights(graph):
    return {r: torch.from_numpy(np.asarray(rel.edge_features)).double() for r, rel in graph.relations.items()
            if rel.edge_feature_dim == 1}


def _dense_sage(layer: TypedSAGEConv, means, x):
    out = {}
    for t in {r[2] for r in layer.relations}:
        y = 0
        if layer.root_mode == "type":
            y = x[t] @ layer.root[t].weight.double().T + layer.root[t].bias.double()
        for r in (r for r in layer.relations if r[2] == t):
            y = y + means[r] @ x[r[0]] @ layer.neigh[module_key(r)].weight.double().T
            if layer.root_mode == "relation":
                root = layer.root[module_key(r)]
                y = y + x[t] @ root.weight.double().T + root.bias.double()
        out[t] = y
    return out


def _dense_rgcn(layer: RGCNConv, means, x):
    weights = layer.relation_weights().double()
    out = {t: v @ layer.root.double() + layer.bias.double() for t, v in x.items()}
    for i, r in enumerate(layer.relations):
        out[r[2]] = out[r[2]] + means[r] @ x[r[0]] @ weights[i]
    return out


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("kind", ["sage", "sage-type", "rgcn"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_edge_weighted_means_equal_a_dense_reference(graph_name, kind, layers):
    graph, x, seeds = _case(graph_name)
    if kind == "rgcn":
        x = _same_width(x, OUT + 2)
        ours = _rgcn_layers(graph, layers, 2, torch.float32)
        dense = _dense_rgcn
    else:
        ours = _sage_layers(graph, layers, "relation" if kind == "sage" else "type", torch.float32)
        dense = _dense_sage
    weights = _graph_weights(graph)
    assert weights, "the graph has weighted relations"
    out = _run_ours(ours, _blocks(graph, seeds, layers), {t: v.float() for t, v in x.items()},
                    lambda attrs: {"edge_weight": _edge_weights(attrs)})
    means = _dense_means(graph, weights)
    with torch.no_grad():
        h = x
        for i, layer in enumerate(ours):
            h = dense(layer, means, h)
            if i < layers - 1:
                h = {t: torch.relu(v) for t, v in h.items()}
    _compare({t: v.double() for t, v in out.items()}, h, seeds, torch.float32)


@pytest.mark.parametrize("root", ["relation", "type"])
def test_edge_weighted_sage_equals_pyg_graphconv_mean(root):
    """PyG's ``GraphConv(aggr="mean")`` takes edge weights the same way: ``sum w x / count``."""
    pytest.importorskip("torch_geometric")
    graph, x, seeds = _case("synthetic")
    ours = _sage_layers(graph, 2, root, torch.float32)
    theirs, pairs = zip(*[_sage_pyg(layer, weighted=True) for layer in ours])
    x_ours, x_theirs = _leaves(x, torch.float32), _leaves(x, torch.float32)
    out = _run_ours(ours, _blocks(graph, seeds, 2), x_ours, lambda attrs: {"edge_weight": _edge_weights(attrs)})
    weights = {r: w.float().reshape(-1) for r, w in _graph_weights(graph).items()}
    ref = _run_pyg(theirs, x_theirs, _edge_index(graph), edge_weight_dict=weights)
    _compare(out, ref, seeds, torch.float32)
    targets = _targets(seeds, OUT, torch.float32)
    _loss(out, seeds, targets).backward()
    _loss(ref, seeds, targets, full=True).backward()
    _check_grads([p for layer_pairs in pairs for p in layer_pairs], torch.float32)
    _check_grads([(x_ours[t], x_theirs[t]) for t in x], torch.float32)


# ------------------------------------------------------------------------------ only destinations' rows


def _padded(tblock: TypedBlock, extra: int) -> TypedBlock:
    """The same layer with ``extra`` rows appended to every type's frontier that no edge reads."""
    blocks = {r: Block(b.num_dst, b.num_src + extra, b.indptr, b.indices) for r, b in tblock.blocks.items()}
    return TypedBlock(dict(tblock.num_dst), {t: n + extra for t, n in tblock.num_src.items()}, blocks)


@pytest.mark.parametrize("kind", ["sage", "sage-none", "rgcn", "rgat"])
@pytest.mark.parametrize("graph_name", list(GRAPHS))
def test_only_destination_rows_are_computed(graph_name, kind):
    """Outputs have one row per destination; a source row gets a gradient only where a destination reads it:
    a destination's own row (the root term, R-GAT's destination score) or an edge's source. Rows no edge
    reads get none. SAGE with a root and R-GCN read each of those rows, so all of them get one."""
    graph, x, seeds = _case(graph_name)
    tblock = _padded(full_typed_block(graph, seeds)[0], extra=3)
    relations = list(graph.relations)
    if kind == "rgcn":
        layer, x = RGCNConv(OUT, 5, relations, num_bases=2), _same_width(x, OUT)
    elif kind == "rgat":
        layer = RGATConv(WIDTHS, 6, relations, heads=2)
    else:
        layer = TypedSAGEConv(WIDTHS, 5, relations, root=None if kind == "sage-none" else "relation")
    gen = torch.Generator().manual_seed(2)
    h = {t: torch.randn(n, x[t].shape[1], generator=gen, requires_grad=True) for t, n in tblock.num_src.items()}
    out = layer(tblock, h)
    assert {t: v.shape for t, v in out.items()} == {t: (n, layer.out_dim) for t, n in tblock.num_dst.items()}
    sum(v.sum() for v in out.values()).backward()
    for t, leaf in h.items():
        read = torch.zeros(tblock.num_src[t], dtype=torch.bool)
        if kind != "sage-none":
            read[:tblock.num_dst.get(t, 0)] = True
        for r, block in tblock.blocks.items():
            if r[0] == t:
                read[block.indices.long()] = True
        touched = leaf.grad.abs().sum(1) > 0
        assert not touched[~read].any(), f"{t}: rows no destination reads have a gradient"
        assert not touched[-3:].any()
        if kind in ("sage", "sage-none", "rgcn"):
            assert touched[read].all(), f"{t}: a row a destination reads has no gradient"


def test_a_block_of_a_relation_the_layer_lacks_is_refused_and_a_missing_block_has_no_edges():
    graph, x, seeds = _case("tiny")
    tblock, _ = full_typed_block(graph, seeds)
    h = {t: x[t].float().index_select(0, ids) for t, ids in tblock.src_ids.items()}
    some = [r for r in graph.relations if r[1] != "cites"]
    with pytest.raises(ValueError, match="no weights for"):
        TypedSAGEConv(WIDTHS, 4, some)(tblock, h)
    layer = TypedSAGEConv(WIDTHS, 4, list(graph.relations))
    cites = ("paper", "cites", "paper")
    with torch.no_grad():
        full = layer(tblock, h)
        lacking = layer(TypedBlock(tblock.num_dst, tblock.num_src, {r: b for r, b in tblock.blocks.items()
                                                                    if r != cites}), h)
        empty = Block(tblock.num_dst["paper"], tblock.num_src["paper"],
                      torch.zeros(tblock.num_dst["paper"] + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        emptied = layer(TypedBlock(tblock.num_dst, tblock.num_src, {**tblock.blocks, cites: empty}), h)
    torch.testing.assert_close(lacking["paper"], emptied["paper"])
    assert not torch.allclose(full["paper"], lacking["paper"])
    torch.testing.assert_close(lacking["author"], full["author"])


@pytest.mark.parametrize("kind", ["sage", "rgcn", "rgat"])
def test_the_typed_samplers_full_neighbour_blocks_give_the_same_outputs(kind):
    """The layers read ``TypedNeighborSampler``'s blocks as they are: with fanout -1 (every neighbour) its
    two-layer subgraph gives the seeds the outputs of the full-neighbour blocks checked against PyG above
    (its frontiers list new vertices in order of first appearance, not ascending)."""
    from neutronorch.sampling.neighbor_sampler import batch_key
    from neutronorch.sampling.typed_sampler import TypedNeighborSampler

    graph, x, seeds = _case("synthetic")
    seeds = {"paper": seeds["paper"]}
    if kind == "rgcn":
        x = _same_width(x, OUT + 2)
        layers = _rgcn_layers(graph, 2, 2, torch.float32)
    elif kind == "rgat":
        layers = _rgat_layers(graph, 2, WIDTHS, False, torch.float32)
    else:
        layers = _sage_layers(graph, 2, "relation", torch.float32)
    x = {t: v.float() for t, v in x.items()}
    subgraph = TypedNeighborSampler(graph, [-1, -1]).sample(seeds["paper"], batch_key(seed=0, epoch=0, batch_index=0))
    with torch.no_grad():
        sampled = _run_ours(layers, [(tblock, {}) for tblock in subgraph.blocks], x)
        full = _run_ours(layers, _blocks(graph, seeds, 2), x)
    torch.testing.assert_close(sampled["paper"], full["paper"], **TOL[torch.float32])


def test_summed_root_weights_keep_gradients_of_their_own():
    """A type several relations lead into sums their root weights once; a second backward pass (NeutronOrch
    adds its hot rows' gradient after the batch's) must add to each weight's own gradient, not to a buffer
    the weights share."""
    from neutronorch.nn.relational import TypedSAGEConv
    from neutronorch.sampling.block import Block, TypedBlock

    relations = [("a", "r1", "p"), ("p", "r2", "p")]
    layer = TypedSAGEConv({"a": 3, "p": 3}, 4, relations)
    block = lambda: Block(2, 2, torch.tensor([0, 1, 2]), torch.tensor([0, 1]))  # noqa: E731
    tblock = TypedBlock({"p": 2, "a": 0}, {"p": 2, "a": 2}, {r: block() for r in relations})
    x = {"a": torch.randn(2, 3), "p": torch.randn(2, 3)}
    layer(tblock, x)["p"].sum().backward()
    once = {name: p.grad.clone() for name, p in layer.named_parameters()}
    layer(tblock, x)["p"].sum().backward()
    for name, p in layer.named_parameters():
        torch.testing.assert_close(p.grad, 2 * once[name], msg=name)
