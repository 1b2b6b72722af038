"""Rows of a tensor picked by an index, with a gradient that is the same on every run.

``x[index]``'s backward (``index_put_(accumulate=True)``) sums a row picked more than once with atomic
additions from every thread on the CPU (from 32,768 elements on), so its last bits follow the threads'
timing; ``index_select``'s (``index_add_``) adds in the index's order there. On CUDA it is the other way
round, so each device gets the one that repeats.
"""

from __future__ import annotations

import torch


def take_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[index]`` for an integer ``index`` of any shape (the result's shape is ``index.shape +
    x.shape[1:]``), whose backward sums repeated rows in a fixed order on the CPU and on CUDA."""
    if x.device.type == "cpu":
        return x.index_select(0, index.reshape(-1)).view(*index.shape, *x.shape[1:])
    return x[index]
