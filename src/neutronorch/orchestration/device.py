"""Mode ``device``, for both kinds of graph: sample and gather on the training device, like DGL-UVA and GNNLab.

A background thread samples with the device sampler over topology on the device (or read through UVA) and
gathers through a device feature cache (``device_reader.py``), on its own CUDA stream, so only seed ids and
cache misses cross the host-device boundary while training. With ``--device cpu`` the same code runs on host
tensors. Each batch depends only on its key ``batch_key(seed, epoch, index)``, so a run resumes at any step.
"""

from __future__ import annotations

import torch

from neutronorch.config import SamplingConfig
from neutronorch.observe import Spans, StageTable
from neutronorch.orchestration.device_reader import DeviceReader
from neutronorch.orchestration.link_seeds import LinkSeeds
from neutronorch.orchestration.mode import LoadingMode
from neutronorch.orchestration.seeds import NodeSeeds

class DeviceMode(LoadingMode):
    name = "device"
    stages = StageTable({"sample": "sampler", "gather": "sampler"})
    threads: dict[str, int] = {}  # its sampler runs torch ops on the training threads

    def __init__(self, seeds: NodeSeeds | LinkSeeds, reader: DeviceReader, sampling: SamplingConfig, spans: Spans):
        super().__init__(seeds, reader, sampling, spans)
        self.device = self.sample_device = reader.device
        self.new_sampler = reader.new_sampler
        self.sample_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def start(self, model: torch.nn.Module) -> None:
        """Place what the reader places once ``model`` is known (a typed graph's)."""
        self.loader.start(model)
        if self.sample_stream is not None:
            self.sample_stream.wait_stream(torch.cuda.current_stream(self.device))  # the copies, made on that stream

    def describe(self) -> str:
        return "sampling and gathering on the training device"
