"""Feature gathering into reused buffers.

Gathering a few hundred thousand random rows into a freshly allocated tensor costs far more than the copy
itself (page faults on every new page), so gathers go into a small pool of buffers that are handed back
when the training step that used them has finished. On a CUDA machine the buffers are pinned, so the
copy to the device can be asynchronous. This module never copies the whole feature matrix.
"""

from __future__ import annotations

import queue

import numpy as np
import torch

from neutronorch.sampling import kernels


class BufferPool:
    """A fixed number of row buffers; ``acquire`` blocks while every buffer is in use."""

    def __init__(self, count: int, width: int, dtype: torch.dtype = torch.float32, pin: bool = False):
        self.width, self.dtype, self.pin = width, dtype, pin
        self._free: queue.Queue = queue.Queue()
        for _ in range(count):
            self._free.put(torch.empty((0, width), dtype=dtype))

    def acquire(self, rows: int) -> torch.Tensor:
        buffer = self._free.get()
        if buffer.shape[0] < rows:
            # Grow with headroom so a slightly larger batch later does not reallocate again.
            capacity = int(rows * 1.25) + 1024
            buffer = torch.empty((capacity, self.width), dtype=self.dtype, pin_memory=self.pin)
        return buffer

    def release(self, buffer: torch.Tensor) -> None:
        self._free.put(buffer)


class FeatureStore:
    """Host-resident features (a numpy array or memory map) gathered by row ids."""

    def __init__(self, features: np.ndarray, labels: np.ndarray):
        self.features = features
        self.labels = torch.from_numpy(np.array(labels, dtype=np.int64))  # small; a writable copy

    @property
    def width(self) -> int:
        return int(self.features.shape[1])

    def gather_into(self, rows: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
        """Copy ``features[rows]`` into the front of ``buffer`` (converted to float32); return that view."""
        out = buffer[:rows.shape[0]]
        if self.features.dtype == np.float16:
            kernels.gather_half_rows(self.features.view(np.uint16), rows.numpy(), kernels.HALF_TO_FLOAT,
                                     out.numpy())
        else:
            kernels.gather_rows(self.features, rows.numpy(), out.numpy())
        return out

    def gather(self, rows: torch.Tensor) -> torch.Tensor:
        """Allocate and fill (for cold paths such as inference)."""
        return self.gather_into(rows, torch.empty((rows.shape[0], self.width), dtype=torch.float32))
