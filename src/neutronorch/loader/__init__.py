"""The engine as a library: ``NeighborLoader`` (seed vertices of a homogeneous or a typed graph) and
``LinkNeighborLoader`` (seed edges and their negatives) hand the training pipeline's mini-batches to your own
loop, as PyG data, DGL blocks or neutronorch's blocks and rows (docs/loader.md)."""

from neutronorch.loader.batch import LoaderBatch, TypedLoaderBatch
from neutronorch.loader.epochs import EpochIterator
from neutronorch.loader.link_batch import LinkLoaderBatch
from neutronorch.loader.link_loader import LinkNeighborLoader
from neutronorch.loader.neighbor_loader import NeighborLoader, TypedNeighborLoader

__all__ = ["NeighborLoader", "LinkNeighborLoader", "TypedNeighborLoader", "LoaderBatch", "LinkLoaderBatch",
           "TypedLoaderBatch", "EpochIterator"]
