"""Link splits from and to PyTorch Geometric: ``from_pyg_link`` reads the three ``Data`` objects that
``torch_geometric.transforms.RandomLinkSplit`` returns, ``to_pyg_link`` writes a link graph in that layout
(docs/datasets.md, "PyG link splits", says what is read, checked and drawn)."""

from __future__ import annotations

import numpy as np

from neutronorch.data.arrays import _array, feature_rows
from neutronorch.data.csc import edges_to_csc
from neutronorch.data.graph import Graph
from neutronorch.data.interop import _edges, _pairs, optional
from neutronorch.data.link_checks import check_stored_links, link_graph
from neutronorch.data.edge_split import _KEY_LIMIT, UNDIRECTED_SHARE, _link_keys, reciprocity
from neutronorch.data.links import PER_SOURCE, SHARED, LinkSplit, check_link_split, member_mask
from neutronorch.errors import DataError

STAGES = ("train", "val", "test")
# Rounds of redrawing the negatives that hit an edge; each round keeps every draw that missed, so only a
# graph with nearly every pair an edge runs out of them.
_DRAW_ROUNDS = 64


def from_pyg_link(train_data, val_data, test_data, name: str = "pyg") -> Graph:
    """The validated link graph (no node task) of the three ``Data`` objects of ``RandomLinkSplit``, either
    label layout, its split checked against ``train_data.edge_index`` (``check_stored_links``: leaks refused).
    """
    stages = dict(zip(STAGES, (train_data, val_data, test_data)))
    num_nodes = _num_nodes(stages, name)
    positives, negatives = {}, {}
    for stage, data in stages.items():
        positives[stage], negatives[stage] = _labelled_pairs(data, stage, name)
    held_out = [stage for stage in ("val", "test") if negatives[stage].shape[1]]
    if len(held_out) == 1:
        missing = "test" if held_out == ["val"] else "val"
        raise DataError(f"{name}: {held_out[0]}_data holds negatives but {missing}_data none; give both sets "
                        f"their negatives (as RandomLinkSplit does), or neither to have them drawn.")
    shared = bool(held_out)
    split = LinkSplit(train=positives["train"], val=positives["val"], test=positives["test"],
                      val_neg=negatives["val"] if shared else None, test_neg=negatives["test"] if shared else None,
                      negatives=SHARED if shared else None)
    if num_nodes > _KEY_LIMIT:  # held-out edges are looked up as int64 keys dst * num_nodes + src
        raise DataError(f"{name}: {num_nodes:,} vertices are more than a link split handles ({_KEY_LIMIT:,}).")
    check_link_split(split, num_nodes, name)
    edge_index = _pairs(train_data.edge_index, f"{name}: train_data.edge_index")
    # Built directed, then read: symmetric already means undirected, and nothing is added either way.
    indptr, indices = edges_to_csc(edge_index[0], edge_index[1], num_nodes, symmetric=False,
                                   source=f"{name}: train_data.edge_index")
    del edge_index
    split.undirected, split.direction = _direction(split, indptr, indices)
    checked = check_stored_links(split, indptr, indices, name, "train_data.edge_index")
    notes = [f"PyG link split: {'/'.join(f'{getattr(split, s).shape[1]:,}' for s in STAGES)} links, "
             f"{split.direction}"
             + (f"; {negatives['train'].shape[1]:,} training negatives dropped (drawn per batch instead)"
                if negatives["train"].shape[1] else "")] + checked
    return link_graph(name, indptr, indices, feature_rows(train_data.x, f"{name}: train_data.x"), split, notes,
                      "", name)


def to_pyg_link(graph: Graph, seed: int = 0):
    """``(train_data, val_data, test_data)`` as ``RandomLinkSplit`` lays them out, a stage's negatives the
    stored ones, else drawn from ``seed``. Node labels are not carried."""
    data = optional("torch_geometric.data", "to_pyg_link")
    import torch  # noqa: PLC0415 - torch is there when PyG is

    links = graph.links
    if links is None:
        raise DataError(f"{graph.name}: carries no link split; give a link graph (split_edges, an OGB link "
                        f"dataset or from_pyg_link), or use to_pyg for a node task.")
    check_link_split(links, graph.num_nodes, graph.name)
    src, dst = _edges(graph)
    train_graph = np.stack([src, dst])
    del src, dst
    val_edges = np.concatenate([links.val, links.val[::-1]], axis=1) if links.undirected else links.val
    stored = {"val": _stored_negatives(links, "val"), "test": _stored_negatives(links, "test")}
    wanted = [stage for stage in STAGES if stored.get(stage) is None]
    drawn = dict(zip(wanted, _draw_negatives(graph, train_graph, [getattr(links, s).shape[1] for s in wanted], seed)))
    x = torch.from_numpy(np.asarray(graph.features, dtype=np.float32))
    out = []
    for stage, edge_index in zip(STAGES, (train_graph, train_graph, np.concatenate([train_graph, val_edges], 1))):
        positives, negatives = getattr(links, stage), stored.get(stage)
        negatives = drawn[stage] if negatives is None else negatives
        label = np.concatenate([np.ones(positives.shape[1], np.float32), np.zeros(negatives.shape[1], np.float32)])
        out.append(data.Data(x=x, edge_index=torch.from_numpy(np.ascontiguousarray(edge_index)),
                             edge_label_index=torch.from_numpy(np.concatenate([positives, negatives], axis=1)),
                             edge_label=torch.from_numpy(label), num_nodes=graph.num_nodes))
    return tuple(out)


def _num_nodes(stages: dict, name: str) -> int:
    """The vertex count of train_data's features; a stage that is no Data, or whose x has another count, is an
    error."""
    for stage, data in stages.items():
        if data is None or not hasattr(data, "num_nodes"):
            raise DataError(f"{name}: {stage}_data is {type(data).__name__}, not a PyG Data; give the three "
                            f"Data objects RandomLinkSplit returns (train_data, val_data, test_data).")
    if getattr(stages["train"], "x", None) is None:
        raise DataError(f"{name}: train_data has no `x`; neutronorch trains on node features. Give the Data "
                        f"objects RandomLinkSplit made from data with x.")
    rows = {stage: int(data.x.shape[0]) for stage, data in stages.items() if getattr(data, "x", None) is not None}
    if len(set(rows.values())) != 1:
        raise DataError(f"{name}: the stages' x have {rows:,} rows; train_data, val_data and test_data must be the "
                        f"split of one graph.")
    return int(stages["train"].num_nodes)


def _labelled_pairs(data, stage: str, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A stage's positive and negative pairs, each (2, E) int64, from either RandomLinkSplit layout."""
    where = f"{name}: {stage}_data"
    index = getattr(data, "edge_label_index", None)
    if index is None:
        positives = getattr(data, "pos_edge_label_index", None)
        if positives is None:
            raise DataError(f"{where} has no edge_label_index (nor pos_edge_label_index): it names no pairs "
                            f"to learn or score. Give the Data objects RandomLinkSplit returns.")
        negatives = getattr(data, "neg_edge_label_index", None)
        return (_pairs(positives, f"{where}.pos_edge_label_index"),
                np.empty((2, 0), np.int64) if negatives is None else _pairs(negatives, f"{where}.neg_edge_label_index"))
    pairs = _pairs(index, f"{where}.edge_label_index")
    label = getattr(data, "edge_label", None)
    if label is None:
        raise DataError(f"{where} has edge_label_index but no edge_label; give 1 for each edge and 0 for each "
                        f"negative, as RandomLinkSplit does.")
    label = _array(label, f"{where}.edge_label")
    if label.shape != (pairs.shape[1],):
        raise DataError(f"{where}.edge_label has shape {tuple(label.shape)}, expected ({pairs.shape[1]},): one "
                        f"label per pair of edge_label_index.")
    if label.dtype.kind not in "biuf" or not np.isin(label, (0, 1)).all():
        found = np.unique(label)[:5].tolist() if label.dtype.kind in "biuf" else label.dtype
        raise DataError(f"{where}.edge_label holds {found}, where a link split has 1 (an edge) and 0 (a "
                        f"negative). RandomLinkSplit of data with an edge_label of its own writes its classes "
                        f"(shifted by 1): split data without edge_label, or give the labels as 0/1.")
    positive = label == 1
    return np.ascontiguousarray(pairs[:, positive]), np.ascontiguousarray(pairs[:, ~positive])


def _direction(split: LinkSplit, indptr: np.ndarray, indices: np.ndarray) -> tuple[bool, str]:
    """Whether a PyG split is undirected, and why: its training graph has most edges' reverse
    (``UNDIRECTED_SHARE``) and its held-out positives mostly have not (a directed split keeps them)."""
    num_nodes = indptr.shape[0] - 1
    keys = _link_keys(indptr, indices, False)
    share = reciprocity(indptr, indices)
    held_out = np.concatenate([split.val, split.test], axis=1)
    kept = float(member_mask(held_out[0] * num_nodes + held_out[1], keys).mean())
    undirected = share >= UNDIRECTED_SHARE and kept < UNDIRECTED_SHARE
    why = (f"{share:.1%} of train_data.edge_index's edges have their reverse, {kept:.1%} of the validation and test "
           f"positives' reverses are in it")
    return undirected, f"{'undirected' if undirected else 'directed'}: {why}"


def _stored_negatives(links: LinkSplit, part: str) -> np.ndarray | None:
    negatives = getattr(links, f"{part}_neg")
    if negatives is None or links.negative_kind == SHARED:
        return negatives
    assert links.negative_kind == PER_SOURCE
    sources = getattr(links, part)[0]  # each positive's source, once per negative target of its row
    return np.stack([np.repeat(sources, negatives.shape[1]), np.asarray(negatives, np.int64).ravel()])


def _draw_negatives(graph: Graph, train_graph: np.ndarray, counts: list[int], seed: int) -> list[np.ndarray]:
    """(2, count) pairs for each of ``counts``, drawn from ``seed``: no self loop, no edge of the
    message-passing graph, no positive of any set (either direction when the split is undirected)."""
    num_nodes, links = graph.num_nodes, graph.links
    total = sum(counts)
    if total == 0:
        return [np.empty((2, 0), np.int64) for _ in counts]
    if num_nodes > _KEY_LIMIT:
        raise DataError(f"{graph.name}: {num_nodes:,} vertices are more than drawing negatives handles "
                        f"({_KEY_LIMIT:,}).")
    edges = np.concatenate([train_graph, links.train, links.val, links.test], axis=1)
    if links.undirected:
        edges = np.concatenate([edges, edges[::-1]], axis=1)
    known = np.unique(edges[1] * num_nodes + edges[0])
    del edges
    rng = np.random.default_rng(seed)
    pairs = np.empty((2, total), np.int64)
    todo = np.arange(total)
    for _ in range(_DRAW_ROUNDS):
        pairs[:, todo] = rng.integers(0, num_nodes, size=(2, todo.size))
        drawn = pairs[:, todo]
        todo = todo[(drawn[0] == drawn[1]) | member_mask(drawn[1] * num_nodes + drawn[0], known)]
        if todo.size == 0:
            return np.split(pairs, np.cumsum(counts)[:-1], axis=1)
    raise DataError(f"{graph.name}: nearly every pair of vertices is an edge, so {todo.size:,} of {total:,} "
                    f"negatives found no free pair in {_DRAW_ROUNDS} draws; store negatives in the split "
                    f"(val_neg, test_neg) instead.")
