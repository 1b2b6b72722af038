"""One mini-batch of a ``LinkNeighborLoader``: seed edges, their negatives, and the sampled neighbourhoods
of the vertices that score them. The seeds are the pairs' distinct ends (sorted; ``LinkSeeds``), the first
``batch_size`` vertices of ``n_id``; ``pairs`` names every pair by positions among them, and the other forms
(PyG's ``edge_label_index``, DGL's ``pair_ids``) are views of it (docs/loader.md, "The batch")."""

from __future__ import annotations

import torch

from neutronorch.data.interop import optional
from neutronorch.loader.batch import SampledBatch

__all__ = ["LinkLoaderBatch"]


class LinkLoaderBatch(SampledBatch):
    """``SampledBatch``'s fields (``batch_size`` counts the seeds; ``input_id`` the positives' positions in
    ``loader.edges``) and the pairs'."""

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
        return {"edge_label_index": self.edge_label_index, "edge_label": self.edge_label}

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
