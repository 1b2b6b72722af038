"""One mini-batch of a ``NeighborLoader`` over a typed graph, in the three forms a training loop may take.

- Native (neutronorch's ``TypedGNN``, or any module taking the same): ``batch.blocks`` (``TypedBlock``s,
  bottom layer first), ``batch.features`` (each featured type's input rows), ``batch.ids`` (each type's input
  frontier, global ids within the type): ``model(batch.blocks, batch.features, batch.ids)``.
- PyG: ``batch.to_pyg()``, a ``torch_geometric.data.HeteroData`` as PyG's ``NeighborLoader`` yields one for
  heterogeneous data.
- DGL: ``batch.to_dgl()``, one ``dgl.create_block`` per layer, input layer first.

The blocks are the typed sampler's: every destination of a layer draws its neighbours at that layer (DGL's
blocks). PyG's form keeps, of each relation's block, the rows of the destinations the hop before newly
reached, so that each vertex's neighbours are drawn once, as PyG's sampler draws them
(``sampling.typed_block.typed_pyg_form``).
"""

from __future__ import annotations

import torch

from neutronorch.data.typed import TypedGraph
from neutronorch.loader.batch import optional
from neutronorch.orchestration.batch import TypedBatch, target_labels
from neutronorch.sampling.block import TypedBlock, hop_counts, typed_pyg_form

__all__ = ["TypedLoaderBatch"]


class TypedLoaderBatch:
    """A typed mini-batch: ``epoch``, ``index`` (its number in the epoch), ``blocks`` (bottom first),
    ``features`` (the input rows of every featured type of the bottom frontier, float32), ``ids`` (every
    type's bottom frontier, global ids within the type: what an embedding table of a featureless type is
    looked up by; ``n_id`` is the same), ``seeds`` (the target type's seeds: ``ids[target][:batch_size]``),
    ``y`` (their labels), ``batch_size``, ``input_id`` (the seeds' positions among the loader's seeds),
    ``target``. Its tensors are its own (typed modes reuse no buffer): a batch may be kept."""

    def __init__(self, batch: TypedBatch, input_id: torch.Tensor, graph: TypedGraph):
        self.epoch, self.index = batch.epoch, batch.index
        self.blocks: list[TypedBlock] = batch.blocks
        self.features: dict[str, torch.Tensor] = batch.features
        self.ids: dict[str, torch.Tensor] = batch.ids
        self.y: torch.Tensor = batch.labels
        self.input_id = input_id
        self.target = graph.target
        self._graph = graph  # the loader's, its reverse relations added: every type and relation a form names
        self._pyg = None

    @property
    def batch_size(self) -> int:
        return int(self.blocks[-1].num_dst[self.target])

    @property
    def n_id(self) -> dict[str, torch.Tensor]:
        """Every type's sampled vertices (``ids``), PyG's name: the target's seeds first, then each hop's new
        vertices in the order the hop first reached them."""
        return self.ids

    @property
    def seeds(self) -> torch.Tensor:
        return self.ids[self.target][:self.batch_size]

    @property
    def device(self) -> torch.device:
        return self.y.device

    @property
    def num_sampled_nodes(self) -> dict[str, list[int]]:
        """Per type, its vertices per hop: the seeds (the target's; 0 for the others), then those each hop
        added (PyG's ``num_sampled_nodes_dict``)."""
        return hop_counts(self.blocks, list(self._graph.num_nodes))

    # -- the PyG form ---------------------------------------------------------------------------------
    def to_pyg(self):
        """A ``torch_geometric.data.HeteroData`` with what PyG's ``NeighborLoader`` puts in a heterogeneous
        batch (docs/loader.md has the fields): every type and relation of the graph, reverses included, empty
        where the batch did not reach it; ``e_id`` and ``edge_attr`` where a relation has edge features (the
        edges' positions in its CSC, ``to_pyg_hetero``'s edge order). Built once."""
        if self._pyg is not None:
            return self._pyg
        data = optional("torch_geometric.data", "to_pyg").HeteroData()
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
            if width:
                store.edge_attr = form.edge_features.get(relation, torch.zeros(0, width, device=device))
                store.e_id = form.edge_ids.get(relation, torch.zeros(0, dtype=torch.int64, device=device))
        data.set_value_dict("num_sampled_nodes", form.num_sampled_nodes)
        data.set_value_dict("num_sampled_edges", form.num_sampled_edges)
        self._pyg = data
        return data

    # -- the DGL form ---------------------------------------------------------------------------------
    def to_dgl(self) -> list:
        """One DGL block per layer, input layer first (as ``dgl.dataloading`` yields them for a heterograph),
        over every relation (one the layer did not draw has no edge), the sampler's blocks as they are (CSC):
        ``dgl.NID`` per type, the first block's ``srcdata["feat"]``, the last's ``dstdata["label"]`` on the
        target, ``edata["feat"]`` and ``dgl.EID`` where a relation has edge features."""
        dgl = optional("dgl", "to_dgl")
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
                g.edges[relation].data[dgl.EID] = ids
            out.append(g)
        for node_type, rows in self.features.items():
            out[0].srcnodes[node_type].data["feat"] = rows
        out[-1].dstnodes[self.target].data["label"] = self.y
        return out

    to_dgl_blocks = to_dgl  # a homogeneous batch's name for it

    def _release(self) -> None:
        """Its tensors are its own (typed modes reuse no buffer): nothing to give back as the loader moves on."""

    _keep = _release

    def __repr__(self) -> str:
        inputs = {t: int(ids.shape[0]) for t, ids in self.ids.items()}
        return (f"TypedLoaderBatch(epoch={self.epoch}, index={self.index}, batch_size={self.batch_size}, "
                f"inputs={inputs}, edges={[b.num_edges for b in self.blocks]}, device={self.device})")
