"""The seed order of an epoch, and its mini-batches' keys: a pure function of (seed, epoch)."""

from __future__ import annotations

import numpy as np
import torch

from neutronorch.data.graph import Graph
from neutronorch.sampling.neighbor_sampler import mix_key


def training_seeds(graph: Graph) -> torch.Tensor:
    """The training vertices as an int64 tensor (a small, writable copy of a possibly read-only map)."""
    return torch.from_numpy(np.array(graph.train_idx, dtype=np.int64))


def batches_per_epoch(graph: Graph, batch_size: int) -> int:
    """Mini-batches of an epoch: the training seeds in batches of ``batch_size``, the last one partial."""
    return -(-len(graph.train_idx) // batch_size)


def epoch_order(train_idx: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """The seed order of one epoch: a permutation derived from (seed, epoch) alone."""
    generator = torch.Generator()
    generator.manual_seed(mix_key(seed, epoch) & 0x7FFF_FFFF_FFFF_FFFF)
    return train_idx[torch.randperm(train_idx.shape[0], generator=generator)]
