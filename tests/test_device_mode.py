"""Mode ``device``: sampling and gathering on the training device (here: the CPU)."""

import numpy as np
import pytest
import torch

from neutronorch import TrainConfig, train
from neutronorch.cli import main
from neutronorch.data import SyntheticSpec, generate
from neutronorch.orchestration.factory import build_mode

SMALL = "synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6"


def small_config(**overrides):
    values = dict(dataset=SMALL, fanouts=[5, 5], hidden=32, batch_size=128, epochs=3, lr=0.01, dropout=0.5,
                  weight_decay=0.0, progress=False, mode="device")
    values.update(overrides)
    return TrainConfig(**values)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["sage", "gcn"])
def test_device_mode_learns_as_well_as_exact_mode(model):
    # Six epochs: both are past the steep part of the curve, where a step's difference would count.
    device = train(small_config(model=model, epochs=6))
    exact = train(small_config(model=model, mode="exact", epochs=6))
    assert device["test_acc"] > 0.8
    assert abs(device["test_acc"] - exact["test_acc"]) < 0.05
    # Rounded to 0.1 ms: a small graph's gathers can round to 0, so the stage's presence is what is checked
    # (feature_rows below shows it ran).
    stages = device["epochs"][-1]["stage_seconds"]
    assert stages["sample"] > 0 and "gather" in stages
    assert device["moved"]["feature_rows"] > 0


@pytest.mark.parametrize("storage, cache_gb", [("float16", "auto"), ("bfloat16", "auto"), ("bfloat16", 1e-5)])
def test_device_mode_batches_hold_the_right_rows_and_labels(storage, cache_gb):
    from neutronorch.data.dtypes import bfloat16

    graph = generate(SyntheticSpec.parse(SMALL))
    # Stored at half precision, read as float32; a small cache leaves rows to read from host memory.
    graph.features = graph.features.astype(np.float16 if storage == "float16" else bfloat16())
    cfg = small_config(gpu_cache_gb=cache_gb).validate()
    mode = build_mode(cfg, graph, torch.device("cpu"))
    with mode.batches(0) as batches:
        seen = []
        for batch in batches:
            nodes = batch.subgraph.input_nodes
            assert batch.features.dtype == torch.float32
            expected = torch.from_numpy(np.asarray(graph.features[nodes.numpy()], dtype=np.float32))
            torch.testing.assert_close(batch.features, expected, rtol=0, atol=0)
            assert torch.equal(batch.labels, torch.from_numpy(graph.labels[batch.subgraph.seeds.numpy()]).long())
            assert torch.equal(nodes[:batch.blocks[0].num_dst], batch.subgraph.frontiers[1])
            seen.append(batch.subgraph.seeds)
    seeds = torch.cat(seen)
    assert sorted(seeds.tolist()) == sorted(np.asarray(graph.train_idx).tolist())


@pytest.mark.slow
def test_device_mode_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["train", "--dataset", SMALL, "--mode", "device", "--fanouts", "4,4", "--epochs", "1",
                 "--hidden", "16", "--no-progress", "--summary-json", str(out)]) == 0
    assert '"mode": "device"' in out.read_text()


def test_memory_mapped_data_that_does_not_fit_in_memory(tmp_path, monkeypatch, capsys):
    # Device mode samples on the device: topology that cannot be copied into memory is refused with the
    # modes that can read it from the file; features that cannot are read through the host store, row by
    # row, never copied whole. A memory map reaches a GPU a slice at a time (checked here on the CPU).
    from neutronorch.data.native import load_native, save_native
    from neutronorch.features import memory, placement

    directory = save_native(generate(SyntheticSpec(nodes=2000, degree=8, features=12, classes=4)), tmp_path / "g")
    graph = load_native(directory)
    topology = graph.indices.nbytes
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: topology - 1)
    assert main(["train", "--dataset", str(directory), "--mode", "device", "--device", "cpu", "--epochs", "1",
                 "--fanouts", "5,5", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "the topology" in err and "memory-mapped" in err and "--mode exact" in err

    monkeypatch.setattr(memory, "available_memory_bytes", lambda: graph.features.nbytes - 1)
    out = tmp_path / "s.json"
    assert main(["train", "--dataset", str(directory), "--mode", "device", "--device", "cpu", "--epochs", "1",
                 "--fanouts", "5,5", "--host-cache-gb", "0", "--no-progress", "--summary-json", str(out)]) == 0
    import json

    summary = json.loads(out.read_text())
    moved = summary["moved"]
    assert moved["host_rows"] == moved["feature_rows"] > 0  # every row through the host store
    assert summary["placement"]["features"] == "host"

    monkeypatch.setattr(placement, "SLICE_BYTES", 4 * 1000)
    copied = placement.to_device_in_slices(graph.indices, torch.device("cpu"))
    assert torch.equal(copied, torch.from_numpy(np.array(graph.indices)))
    from neutronorch.features.cache import _rows_as  # a whole memory map as the device cache's table

    table = _rows_as(graph.features, torch.float32, torch.device("cpu"))
    assert isinstance(graph.features, np.memmap) and torch.equal(table, torch.from_numpy(np.array(graph.features)))
