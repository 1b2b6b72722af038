"""The engine as a library: ``NeighborLoader`` hands the training pipeline's mini-batches to your own loop,
as PyG ``Data`` (``batch.to_pyg()``), DGL blocks (``batch.to_dgl_blocks()``) or neutronorch's blocks and rows
(``batch.blocks``, ``batch.x``). ``docs/loader.md`` has examples and what it does not do."""

from neutronorch.loader.batch import LoaderBatch
from neutronorch.loader.neighbor_loader import EpochIterator, NeighborLoader

__all__ = ["NeighborLoader", "LoaderBatch", "EpochIterator"]
