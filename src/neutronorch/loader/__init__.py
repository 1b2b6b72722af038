"""The engine as a library: ``NeighborLoader`` (seed vertices of a homogeneous or a typed graph; also named
``TypedNeighborLoader``) and ``LinkNeighborLoader`` (seed edges and their negatives) hand the training
pipeline's mini-batches to your own loop, as PyG data (``batch.to_pyg()``: a ``Data``, or a ``HeteroData`` for
a typed graph), DGL blocks (``batch.to_dgl_blocks()``) or neutronorch's blocks and rows (``batch.blocks``,
``batch.x``; a typed batch's ``batch.features`` and ``batch.ids``). ``docs/loader.md`` has examples and what
they do not do."""

from neutronorch.loader.batch import LoaderBatch, TypedLoaderBatch
from neutronorch.loader.epochs import EpochIterator
from neutronorch.loader.link_batch import LinkLoaderBatch
from neutronorch.loader.link_loader import LinkNeighborLoader
from neutronorch.loader.neighbor_loader import NeighborLoader, TypedNeighborLoader

__all__ = ["NeighborLoader", "LinkNeighborLoader", "TypedNeighborLoader", "LoaderBatch", "LinkLoaderBatch",
           "TypedLoaderBatch", "EpochIterator"]
