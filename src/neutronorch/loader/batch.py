"""One mini-batch of a loader (``LoaderBatch``, ``TypedLoaderBatch``, a ``LinkNeighborLoader``'s
``LinkLoaderBatch``) in three forms: plain (``blocks``, ``x``, ``y``), PyG's (``to_pyg()``) and DGL's
(``to_dgl_blocks()``); their fields: docs/loader.md, "The batch forms" and "Typed graphs" (a link batch's:
"The batch")."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from neutronorch.data.interop import optional
from neutronorch.data.typed import TypedGraph
from neutronorch.orchestration.batch import MiniBatch, target_labels
from neutronorch.orchestration.mode import StepInputs
from neutronorch.sampling.block import Block, hop_counts, pyg_edge_ids, pyg_form, typed_pyg_form


class SampledBatch:
    """What every loader's batch holds (a typed one's per type): ``epoch``, ``index`` (its number in the
    epoch), ``batch_size``, ``seeds``, ``input_id`` (the positions of its items among the loader's seeds or
    edges), ``n_id`` (every sampled vertex, seeds first), ``blocks``, ``x``.

    ``x`` may be a view of a reused gather buffer: valid until the iteration is asked for the next batch,
    after which reading it raises (``reuse_buffers=False``: a copy of its own). The last batch an iteration
    handed out keeps its rows when the iteration closes."""

    def __init__(self, minibatch: MiniBatch, inputs: StepInputs, input_id: torch.Tensor, reused: bool = True):
        self.minibatch = minibatch
        self._reused = reused  # x may be the pool's buffer, refilled after the next batch is asked for
        self.epoch, self.index = minibatch.epoch, minibatch.index
        self.blocks: list[Block] = inputs.blocks  # the sampler's own tensors, never reused
        self._x = inputs.features
        if not reused:  # a copy of its own, the buffer back in the pool at once (a typed batch's rows are its own)
            if isinstance(self._x, torch.Tensor) and self._x.device.type == "cpu":
                self._x = self._x.clone()
            minibatch.release()
        self.input_id = input_id
        self._pyg = None
        self._released = False

    @property
    def x(self) -> torch.Tensor:
        self._check()
        return self._x

    @property
    def device(self) -> torch.device:
        return self._x.device

    @property
    def seeds(self) -> torch.Tensor:
        """The seeds' global ids (on the batch's device)."""
        return self.n_id[:self.batch_size]

    @property
    def batch_size(self) -> int:
        return int(self.blocks[-1].num_dst)

    @property
    def n_id(self) -> torch.Tensor:
        """Global ids of the bottom block's sources: every vertex sampled, seeds first, then each hop's new
        vertices in the order they were first reached."""
        ids = self.blocks[0].src_ids
        return ids if ids is not None else self.minibatch.subgraph.input_nodes.to(self.device)

    @property
    def num_sampled_nodes(self) -> list[int]:
        """Vertices per hop: the seeds, then those each hop added (PyG's ``num_sampled_nodes``)."""
        sizes = [self.blocks[-1].num_dst] + [b.num_src for b in reversed(self.blocks)]
        return [sizes[0]] + [b - a for a, b in zip(sizes, sizes[1:])]

    def to_pyg(self):
        """A ``torch_geometric.data.Data`` with what PyG's loaders put in one, and the task's own fields
        (docs/loader.md). Built once per batch."""
        self._check()
        if self._pyg is None:
            pyg = optional("torch_geometric.data", "batch.to_pyg()", ImportError)
            edge_index, nodes, edges = pyg_form(self.blocks)
            n_id = self.n_id
            self._pyg = pyg.Data(x=self._x, edge_index=edge_index, n_id=n_id, input_id=self.input_id,
                                 num_sampled_nodes=nodes, num_sampled_edges=edges, **self._pyg_fields(n_id))
        return self._pyg

    def _pyg_fields(self, n_id: torch.Tensor) -> dict:
        """The task's fields of the PyG form."""
        return {}

    _times, _by_vertices = None, False  # sampled by time: the graph's times sampled by (``LoaderBatch``)

    @property
    def seed_time(self) -> torch.Tensor | None:
        """Sampled by time: the time of each entry of ``n_id`` (its seed's; a vertex may be two entries)."""
        return self.blocks[0].src_time

    def _time_fields(self, n_id: torch.Tensor) -> dict:
        """Sampled by time, the PyG form's ``seed_time``, and by edge times ``e_id`` and ``edge_time`` of
        ``edge_index``'s edges, by vertex times ``time``, each vertex's own (PyG copies the attribute it
        sampled by); nothing otherwise."""
        if self._times is None:
            return {}
        if self._by_vertices:
            return {"seed_time": self.seed_time,
                    "time": torch.from_numpy(np.asarray(self._times)[n_id.cpu().numpy()]).to(n_id.device)}
        e_id = pyg_edge_ids(self.blocks)
        return {"seed_time": self.seed_time, "e_id": e_id,
                "edge_time": torch.from_numpy(np.asarray(self._times)[e_id.cpu().numpy()]).to(e_id.device)}

    def to_dgl_blocks(self) -> list:
        """One DGL block per layer, input layer first (as ``dgl.dataloading`` yields them), the sampler's blocks
        in CSC as they are, ``dgl.NID`` on both ends, the first's ``srcdata["feat"]`` ``x``."""
        self._check()
        dgl = optional("dgl", "batch.to_dgl_blocks()", ImportError)
        out = []
        for block in self.blocks:
            # CSC, as the sampler made it and DGL's message passing reads it (empty edge ids: CSC order).
            no_ids = torch.empty(0, dtype=torch.int64, device=block.indices.device)
            g = dgl.create_block(("csc", (block.indptr.long(), block.indices.long(), no_ids)),
                                 num_src_nodes=block.num_src, num_dst_nodes=block.num_dst,
                                 device=block.indices.device)
            g.srcdata[dgl.NID] = block.src_ids
            g.dstdata[dgl.NID] = block.dst_ids
            if block.src_time is not None:  # sampled by time: each entry's, and the edges' (docs/temporal.md)
                g.srcdata["seed_time"], g.dstdata["seed_time"] = block.src_time, block.src_time[:block.num_dst]
                if not self._by_vertices:
                    g.edata[dgl.EID] = block.edge_ids
                    g.edata["timestamp"] = torch.from_numpy(np.asarray(self._times)[block.edge_ids.cpu().numpy()]
                                                            ).to(block.edge_ids.device)
            out.append(g)
        out[0].srcdata["feat"] = self._x
        self._dgl_fields(out)
        return out

    def _dgl_fields(self, blocks: list) -> None:
        """The task's data on the DGL blocks."""

    def _check(self) -> None:
        if self._released:
            raise RuntimeError(f"batch {self.index} of epoch {self.epoch}: its input rows were in a reused buffer "
                               f"that the loader has since refilled (it moved on to the next batch). Copy what "
                               f"you keep (x.clone()) before asking for the next batch, or build the loader with "
                               f"reuse_buffers=False.")

    def _keep(self) -> None:
        """The iteration ended with this batch in hand: it keeps its rows (a copy) and the gather buffer goes
        back to the pool, so ``next(iter(loader))`` gives a batch that stays valid."""
        if self._reused and not self._released:
            if self._x.device.type == "cpu":
                self._x = self._x.clone()
                if self._pyg is not None:
                    self._pyg.x = self._x
            self.minibatch.release()
            self._reused = False

    def _release(self) -> None:
        """The loader moved on: the gather buffer goes back to the pipeline's pool."""
        if self._reused:
            self.minibatch.release()
            self._released = True
            self._pyg = None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(epoch={self.epoch}, index={self.index}, batch_size={self.batch_size}, "
                f"nodes={self.num_sampled_nodes}, edges={[b.num_edges for b in self.blocks]}, device={self.device})")


class LoaderBatch(SampledBatch):
    """A mini-batch handed out by ``NeighborLoader``: ``SampledBatch``'s fields and ``y``, the seeds'
    labels (one per seed, or one row of tasks); sampled by time, ``seed_time`` and ``input_time`` too
    (docs/temporal.md, "The loader"). ``times``: the graph's times sampled by (its edge times, or with
    ``by_vertices`` its vertex times), None when not sampled by time."""

    def __init__(self, minibatch: MiniBatch, inputs: StepInputs, input_id: torch.Tensor,
                 labels: Callable[[torch.Tensor], torch.Tensor], reused: bool = True, times=None,
                 by_vertices: bool = False):
        super().__init__(minibatch, inputs, input_id, reused)
        self.y = minibatch.labels
        self._labels = labels  # global ids -> labels, on the batch's device
        self._times, self._by_vertices = times, by_vertices

    @property
    def input_time(self) -> torch.Tensor | None:
        """Sampled by time: the seeds' times (PyG's ``input_time`` of the batch)."""
        times = self.blocks[-1].src_time
        return None if times is None else times[:self.batch_size]

    def _pyg_fields(self, n_id: torch.Tensor) -> dict:
        """As PyG's ``NeighborLoader``: ``y``, a label per vertex of ``n_id``, and ``batch_size``; sampled by
        time, ``seed_time`` and ``input_time``, and by edge times ``e_id`` and ``edge_time`` of ``edge_index``'s
        edges, by vertex times ``time``, each vertex's own (PyG copies the attribute it sampled by)."""
        fields = {"y": self._labels(n_id), "batch_size": self.batch_size, **self._time_fields(n_id)}
        return fields if self._times is None else {**fields, "input_time": self.input_time}

    def _dgl_fields(self, blocks: list) -> None:
        blocks[-1].dstdata["label"] = self.y


class LinkLoaderBatch(SampledBatch):
    """``SampledBatch``'s fields (``batch_size`` counts the seeds; ``input_id`` the positives' positions in
    ``loader.edges``) and the pairs'; sampled by time (``times``: the graph's edge times), ``seed_time`` and
    ``edge_label_time`` too."""

    def __init__(self, minibatch: MiniBatch, inputs: StepInputs, input_id: torch.Tensor, reused: bool = True,
                 times=None):
        super().__init__(minibatch, inputs, input_id, reused)
        self._times = times

    @property
    def edge_label_time(self) -> torch.Tensor | None:
        """Sampled by time: each pair's time (``edge_label_index``'s order: the positives, then the negatives,
        each at its positive's time)."""
        if self._times is None:
            return None
        src = self.pair_ids()[0]  # a pair's source entry carries its time
        return torch.cat([self.seed_time[src], self.seed_time[src.repeat_interleave(self.negatives)]])

    @property
    def pairs(self) -> torch.Tensor:
        """(P, 2 + K) int64: positions among the seeds of each positive's source, destination and negative
        destinations (what ``train()``'s link loss reads)."""
        return self.minibatch.labels

    @property
    def num_pairs(self) -> int:
        """P, the positive (seed) edges of the batch."""
        return int(self.pairs.shape[0])

    @property
    def negatives(self) -> int:
        """K, the negative destinations per positive."""
        return int(self.pairs.shape[1]) - 2

    def pair_ids(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pos_src, pos_dst, neg_src, neg_dst): positions among the seeds (the top block's destinations,
        ``n_id[:batch_size]``) of the P positive pairs and of the P*K negative pairs, each positive's K
        negatives together and in order, each paired with its positive's source."""
        pairs = self.pairs
        return (pairs[:, 0], pairs[:, 1], pairs[:, 0].repeat_interleave(self.negatives),
                pairs[:, 2:].reshape(-1))

    @property
    def edge_label_index(self) -> torch.Tensor:
        """(2, P + P*K) positions in ``n_id``: the positives, then the negatives (``pair_ids`` order)."""
        pos_src, pos_dst, neg_src, neg_dst = self.pair_ids()
        return torch.stack([torch.cat([pos_src, neg_src]), torch.cat([pos_dst, neg_dst])])

    @property
    def edge_label(self) -> torch.Tensor:
        """(P + P*K,) float: 1 for each positive, then 0 for each negative."""
        count = self.num_pairs
        label = torch.zeros(count * (1 + self.negatives), device=self.pairs.device)
        label[:count] = 1.0
        return label

    def _pyg_fields(self, n_id: torch.Tensor) -> dict:
        """As PyG's ``LinkNeighborLoader`` with binary negative sampling. No ``y``: a link batch's labels
        are ``edge_label``; no ``batch_size``, as in PyG's link batches."""
        fields = {"edge_label_index": self.edge_label_index, "edge_label": self.edge_label, **self._time_fields(n_id)}
        return fields if self._times is None else {**fields, "edge_label_time": self.edge_label_time}

    def to_dgl_pair_graphs(self) -> tuple:
        """(pos_graph, neg_graph): the positive and the negative pairs as DGL graphs over the seeds (their
        ``ndata[dgl.NID]`` the global ids), as DGL's ``as_edge_prediction_sampler`` yields them beside the
        blocks: score ``h = model(blocks, x)`` on ``pos_graph.edges()`` and ``neg_graph.edges()``."""
        self._check()
        dgl = optional("dgl", "batch.to_dgl_pair_graphs()", ImportError)
        pos_src, pos_dst, neg_src, neg_dst = self.pair_ids()
        graphs = []
        for src, dst in ((pos_src, pos_dst), (neg_src, neg_dst)):
            graph = dgl.graph((src, dst), num_nodes=self.batch_size, device=self.pairs.device)
            graph.ndata[dgl.NID] = self.seeds
            graphs.append(graph)
        return tuple(graphs)


class TypedLoaderBatch(SampledBatch):
    """A typed mini-batch: ``SampledBatch``'s fields per type (``x``, also ``features``: each featured type's
    input rows), ``ids`` (also ``n_id``: every type's bottom frontier), ``y`` (the target seeds' labels),
    ``target``. Its tensors are its own (typed modes reuse no buffer): a batch may be kept."""

    def __init__(self, batch: MiniBatch, inputs: StepInputs, input_id: torch.Tensor, graph: TypedGraph,
                 edge_order: dict | None = None):
        super().__init__(batch, inputs, input_id, reused=False)
        self.ids: dict[str, torch.Tensor] = batch.ids
        self.y: torch.Tensor = batch.labels
        self.target = graph.target
        self._graph = graph  # the loader's, its reverse relations added: every type and relation a form names
        self._edge_order = edge_order or {}  # by vertex times: each re-sorted relation's old edge positions

    def _edge_ids(self, relation, positions: torch.Tensor) -> torch.Tensor:
        """Edge positions in the loader's graph as positions in the relation as given (re-sorted by vertex
        times: through its order)."""
        order = self._edge_order.get(relation)
        if order is None:
            return positions
        return torch.from_numpy(order[positions.cpu().numpy()]).to(positions.device)

    features = SampledBatch.x

    @property
    def batch_size(self) -> int:
        return int(self.blocks[-1].num_dst[self.target])

    @property
    def n_id(self) -> dict[str, torch.Tensor]:
        """``ids``, PyG's name for them."""
        return self.ids

    @property
    def seeds(self) -> torch.Tensor:
        return self.ids[self.target][:self.batch_size]

    @property
    def device(self) -> torch.device:
        return self.y.device

    @property
    def seed_time(self) -> dict[str, torch.Tensor]:
        """Sampled by time: per type, the time of each entry of ``ids`` (its seed's); else empty."""
        return self.blocks[0].src_time

    @property
    def num_sampled_nodes(self) -> dict[str, list[int]]:
        """``hop_counts`` of the blocks (PyG's ``num_sampled_nodes_dict``)."""
        return hop_counts(self.blocks, list(self._graph.num_nodes))

    def to_pyg(self):
        """A ``torch_geometric.data.HeteroData`` with what PyG's ``NeighborLoader`` puts in a heterogeneous
        batch (docs/loader.md): every type and relation of the graph, reverses included. Built once."""
        if self._pyg is not None:
            return self._pyg
        data = optional("torch_geometric.data", "batch.to_pyg()", ImportError).HeteroData()
        graph, device = self._graph, self.device
        form = typed_pyg_form(self.blocks, list(graph.num_nodes), list(graph.relations))
        for node_type in graph.num_nodes:
            width = graph.feature_dim(node_type)
            ids = self.ids.get(node_type, torch.zeros(0, dtype=torch.int64, device=device))
            store = data[node_type]
            store.n_id, store.num_nodes = ids, int(ids.shape[0])
            if width:
                store.x = self.features.get(node_type, torch.zeros(0, width, device=device))
        target = data[self.target]
        target.y = target_labels(graph, target.n_id.cpu().numpy()).to(device)
        target.batch_size, target.input_id = self.batch_size, self.input_id
        for relation, rel in graph.relations.items():
            store, width = data[relation], rel.edge_feature_dim
            store.edge_index = form.edge_index[relation]
            positions = form.edge_ids.get(relation, torch.zeros(0, dtype=torch.int64, device=device))
            if width:
                store.edge_attr = form.edge_features.get(relation, torch.zeros(0, width, device=device))
                store.e_id = self._edge_ids(relation, positions)
            if rel.edge_time is not None and relation in form.edge_ids:  # sampled by time
                store.e_id = self._edge_ids(relation, positions)
                store.edge_time = torch.from_numpy(np.asarray(rel.edge_time)[positions.cpu().numpy()]).to(device)
        for node_type, times in self.seed_time.items():
            data[node_type].seed_time = times
        if self._edge_order:  # by vertex times: each vertex's own, as PyG copies the attribute it sampled by
            for node_type, times in graph.node_time.items():
                data[node_type].time = torch.from_numpy(np.asarray(times)[data[node_type].n_id.cpu().numpy()]
                                                        ).to(device)
        data.set_value_dict("num_sampled_nodes", form.num_sampled_nodes)
        data.set_value_dict("num_sampled_edges", form.num_sampled_edges)
        self._pyg = data
        return data

    def to_dgl(self) -> list:
        """``to_dgl_blocks``' blocks for a heterograph, over every relation (one the layer did not draw has no
        edge), ``edata["feat"]`` and ``dgl.EID`` where a relation has edge features (docs/loader.md)."""
        dgl = optional("dgl", "batch.to_dgl()", ImportError)
        graph, out = self._graph, []
        for tblock in self.blocks:
            counts_src = {t: int(tblock.num_src.get(t, 0)) for t in graph.num_nodes}
            counts_dst = {t: int(tblock.num_dst.get(t, 0)) for t in graph.num_nodes}
            data = {}
            for relation in graph.relations:
                block = tblock.blocks.get(relation)
                if block is None:
                    indptr = torch.zeros(counts_dst[relation[2]] + 1, dtype=torch.int64, device=self.device)
                    indices = torch.zeros(0, dtype=torch.int64, device=self.device)
                else:
                    indptr, indices = block.indptr.long(), block.indices.long()
                data[relation] = ("csc", (indptr, indices, torch.zeros(0, dtype=torch.int64, device=self.device)))
            g = dgl.create_block(data, num_src_nodes=counts_src, num_dst_nodes=counts_dst, device=self.device)
            for node_type, ids in tblock.src_ids.items():
                if node_type in counts_src:
                    g.srcnodes[node_type].data[dgl.NID] = ids
                    g.dstnodes[node_type].data[dgl.NID] = ids[:counts_dst[node_type]]
            for relation, rows in tblock.edge_features.items():
                g.edges[relation].data["feat"] = rows
            for relation, ids in tblock.edge_ids.items():
                g.edges[relation].data[dgl.EID] = self._edge_ids(relation, ids)
            out.append(g)
        for node_type, rows in self.features.items():
            out[0].srcnodes[node_type].data["feat"] = rows
        out[-1].dstnodes[self.target].data["label"] = self.y
        return out

    to_dgl_blocks = to_dgl  # a homogeneous batch's name for it
