"""The engine as a library: ``NeighborLoader`` (seed vertices of a homogeneous or a typed graph) and
``LinkNeighborLoader`` (seed edges and their negatives) hand the training pipeline's mini-batches to your own
loop, as PyG data, DGL blocks or neutronorch's blocks and rows (docs/loader.md)."""

from neutronorch.loader.base import EpochIterator
from neutronorch.loader.batch import LinkLoaderBatch, LoaderBatch, TypedLoaderBatch
from neutronorch.loader.loaders import LinkNeighborLoader, NeighborLoader, TypedNeighborLoader

__all__ = ["NeighborLoader", "LinkNeighborLoader", "TypedNeighborLoader", "LoaderBatch", "LinkLoaderBatch",
           "TypedLoaderBatch", "EpochIterator"]
