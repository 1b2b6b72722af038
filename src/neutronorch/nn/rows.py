"""Rows of a tensor picked by an index, with a gradient that is the same on every run.

``x[index]`` differentiates into ``index_put_(accumulate=True)``, which sums the gradients of a row picked
more than once. On the CPU, with more than one torch thread and at least 32,768 elements, torch sums them
with atomic additions from every thread (``torch.use_deterministic_algorithms`` lists it as
non-deterministic): the order of the sums, hence their last bits, follows the threads' timing, and a run
stops repeating itself from its first step on (a link task's loss picks each batch's seeds' embeddings
many times over, GAT's attention picks each vertex's score once per edge). ``index_select``'s backward
(``index_add_``) adds in the index's order on the CPU, whatever the threads. On CUDA it is the other way
round: ``index_add_`` adds atomically, and indexing's backward sorts the indices first; so each device
gets the one that repeats.
"""

from __future__ import annotations

import torch

__all__ = ["take_rows"]


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for an integer ``index`` of any shape (the result's shape is ``index.shape +
    x.shape[1:]``), whose backward sums repeated rows in a fixed order on the CPU and on CUDA."""
    if x.device.type == "cpu":
        return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])
    return x[index]
