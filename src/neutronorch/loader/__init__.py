"""The engine as a library: ``NeighborLoader`` (seed vertices) and ``LinkNeighborLoader`` (seed edges and
their negatives) hand the training pipeline's mini-batches to your own loop, as PyG ``Data``
(``batch.to_pyg()``), DGL blocks (``batch.to_dgl_blocks()``) or neutronorch's blocks and rows
(``batch.blocks``, ``batch.x``). ``docs/loader.md`` has examples and what they do not do."""

from neutronorch.loader.base import EpochIterator
from neutronorch.loader.batch import LoaderBatch
from neutronorch.loader.link_batch import LinkLoaderBatch
from neutronorch.loader.link_loader import LinkNeighborLoader
from neutronorch.loader.neighbor_loader import NeighborLoader

__all__ = ["NeighborLoader", "LinkNeighborLoader", "LoaderBatch", "LinkLoaderBatch", "EpochIterator"]
