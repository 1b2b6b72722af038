"""The host feature cache: hottest rows in memory, the rest in a compact file of cold rows."""

import os

import numpy as np
import pytest
import torch

from neutronorch.features import host_cache as host_cache_module
from neutronorch.features.host_cache import HostCache, host_cache_rows
from neutronorch.features.store import FeatureStore


def _mapped(tmp_path, stored):
    bits = stored.dtype.itemsize == 2 and stored.dtype != np.float16  # bfloat16: saved as its bits
    path = tmp_path / f"features-{stored.dtype.kind}{stored.dtype.itemsize}.npy"
    np.save(path, stored.view(np.uint16) if bits else stored)
    mapped = np.load(path, mmap_mode="r")
    return mapped.view(stored.dtype) if bits else mapped


@pytest.mark.parametrize("cached", [0, 1, 700, 2999, 3000])
def test_rows_come_back_unchanged_from_the_cache_and_the_cold_file(tmp_path, cached):
    from neutronorch.data.dtypes import bfloat16

    rng = np.random.default_rng(cached)
    features = rng.standard_normal((3000, 9)).astype(np.float32)
    rows = torch.from_numpy(rng.integers(0, 3000, 5000))
    hot = rng.choice(3000, cached, replace=False)
    for stored in (features, features.astype(np.float16), features.astype(bfloat16())):
        mapped = _mapped(tmp_path, stored)
        for ordered in (False, True):
            for dtype in (torch.float32, torch.bfloat16):
                plain = FeatureStore(mapped, np.zeros(3000, np.int64), dtype, ordered=ordered)
                store = FeatureStore(mapped, np.zeros(3000, np.int64), dtype, ordered=ordered)
                store.rows_per_region = 7  # many small regions
                store.attach_cache(HostCache(mapped, hot, str(tmp_path)))
                assert torch.equal(store.gather(rows), plain.gather(rows))
                hits = int(np.isin(rows.numpy(), hot).sum())
                assert store.take_counts() == (5000, hits)
                assert store.take_counts() == (0, 0)
        cache = store.host_cache
        assert cache.rows == cached and cache.table.shape == (cached, 9)
        assert cache.cold_file == (cached < 3000)
        assert cache.cold.shape[0] == (3000 - cached if cached < 3000 else 3000)
    # The cold file is removed as soon as it is mapped: nothing is left beside the features.
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".neutronorch-cold")]


def test_without_room_for_the_cold_file_misses_are_read_in_place(tmp_path, monkeypatch, caplog):
    features = np.arange(400 * 3, dtype=np.float32).reshape(400, 3)
    mapped = _mapped(tmp_path, features)
    monkeypatch.setattr(host_cache_module.shutil, "disk_usage", lambda path: type("U", (), {"free": 10})())
    with caplog.at_level("WARNING", logger="neutronorch"):
        cache = HostCache(mapped, np.arange(0, 400, 3), str(tmp_path))
    assert not cache.cold_file and cache.cold is mapped
    assert "no room" in caplog.text and "host_cache_dir" in caplog.text
    store = FeatureStore(mapped, np.zeros(400, np.int64), ordered=True)
    store.attach_cache(cache)
    rows = torch.arange(399, -1, -1)
    assert torch.equal(store.gather(rows), torch.from_numpy(features)[rows])


def test_split_order_puts_hits_first_then_misses_region_by_region():
    from neutronorch.sampling.kernels import split_order

    rng = np.random.default_rng(3)
    where = rng.integers(-500, 2000, 6000)
    order, hits = split_order(where, 64, 2000)
    assert sorted(order.tolist()) == list(range(6000))
    assert hits == (where < 0).sum() and (where[order[:hits]] < 0).all()
    assert (np.diff(order[:hits]) > 0).all()  # hits in their own order
    regions = where[order[hits:]] // 64
    assert (regions >= 0).all() and (np.diff(regions) >= 0).all()
    same, _ = split_order(where, 2000, 2000)  # one region: misses in their own order
    assert (np.diff(same[hits:]) > 0).all()


def test_the_cache_size_follows_the_setting_and_the_memory_left(tmp_path):
    mapped = _mapped(tmp_path, np.zeros((1000, 25), np.float32))  # rows of 100 bytes
    GiB = 1 << 30
    assert host_cache_rows("auto", np.asarray(mapped), True, 10**9, 0) == (0, "features in memory")
    assert host_cache_rows(1.0, np.zeros((1000, 25), np.float32), True, 10**9, 0)[0] == 0
    assert host_cache_rows("auto", mapped, False, 10**9, 0) == (0, "memory-mapped features fit in memory")
    assert host_cache_rows("auto", mapped, True, None, 0)[0] == 0
    rows, why = host_cache_rows("auto", mapped, True, 60_000, 10_000)
    assert rows == int(0.6 * 50_000) // 100 and "available" in why
    assert host_cache_rows("auto", mapped, True, 5_000, 10_000)[0] == 0  # working memory takes it all
    assert host_cache_rows("auto", mapped, True, 10 * GiB, 0)[0] == 1000  # never more than every row
    assert host_cache_rows(4000 / GiB, mapped, False, None, 0) == (40, "host_cache_gb")


def test_a_cache_that_cannot_be_built_leaves_no_file(tmp_path, monkeypatch):
    mapped = _mapped(tmp_path, np.ones((300, 4), np.float32))
    monkeypatch.setattr(host_cache_module, "COPY_BYTES", 16 * 50)  # several steps; fail in the second

    real = np.asarray
    calls = []

    def failing(array, *args, **kwargs):
        if isinstance(array, np.memmap):
            calls.append(1)
            if len(calls) == 2:
                raise OSError("read failed")
        return real(array, *args, **kwargs)

    monkeypatch.setattr(host_cache_module.np, "asarray", failing)
    with pytest.raises(OSError):
        HostCache(mapped, np.arange(10), str(tmp_path))
    assert [p.name for p in tmp_path.iterdir()] == ["features-f4.npy"]
    assert not any(name.startswith(".neutronorch-cold") for name in os.listdir(tmp_path))


def test_auto_sizes_the_cache_from_the_presampled_working_memory(tmp_path, monkeypatch):
    # ``auto`` ranks the rows by presampling, estimates the working memory from the frontiers it saw (far
    # below the fanouts' worst case on a small graph), and takes 60% of what the available memory leaves
    # beside it; ranks launched together on a node each take their share.
    from neutronorch.config import TrainConfig
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.data.native import load_native, save_native
    from neutronorch.features.cache import hotness_order
    from neutronorch.features.placement import workspace_bytes
    from neutronorch.orchestration import factory

    graph = load_native(save_native(generate(SyntheticSpec(nodes=3000, degree=8, features=20, classes=4)),
                                    tmp_path / "g"))
    assert isinstance(graph.features, np.memmap)
    config = TrainConfig(fanouts=[5, 5], batch_size=64, hidden=16).validate()
    sampling = config.sampling
    worst = workspace_bytes(3000, 20, 16, 4, [5, 5], 64)
    frontiers: list = []
    order = hotness_order(graph.indptr, graph.indices, graph.train_idx, [5, 5], 64, config.seed, frontiers=frontiers)
    assert len(frontiers) == 3 and frontiers[0] == 64 and frontiers[0] < frontiers[1] < frontiers[2] <= 3000
    measured = workspace_bytes(3000, 20, 16, 4, [5, 5], 64, measured=frontiers)
    assert measured < worst
    monkeypatch.setattr(factory, "available_memory_bytes", lambda: measured + 100_000)
    rows, why, ranked = factory.host_cache_size(config, graph, sampling, file_order=True)
    assert rows == int(0.6 * 100_000) // 80 and "available" in why
    assert np.array_equal(ranked, order)  # the ranking is passed on, not computed twice
    assert factory.host_cache_size(config, graph, sampling, file_order=False)[0] == 0  # fits: none
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(factory, "available_memory_bytes", lambda: 2 * (measured + 100_000))
    rows, why, _ = factory.host_cache_size(config, graph, sampling, file_order=True, distributed=True)
    assert rows == int(0.6 * 100_000) // 80 and "shared by 2 ranks" in why
    # NeutronOrch mode's host producer holds about two mini-batches' input rows more: counted.
    neutronorch = TrainConfig(mode="neutronorch", fanouts=[5, 5], batch_size=64, hidden=16).validate()
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    monkeypatch.setattr(factory, "available_memory_bytes", lambda: measured + 350_000)
    extra = 2 * frontiers[-1] * 20 * 4
    with_host = factory.host_cache_size(neutronorch, graph, sampling, file_order=True)[0]
    alone = factory.host_cache_size(config, graph, sampling, file_order=True)[0]
    assert with_host == int(0.6 * (350_000 - extra)) // 80 < alone == int(0.6 * 350_000) // 80


def test_a_cold_file_that_cannot_be_written_is_given_up(tmp_path, monkeypatch, caplog):
    features = np.arange(500 * 4, dtype=np.float32).reshape(500, 4)
    mapped = _mapped(tmp_path, features)
    monkeypatch.setattr(host_cache_module, "COPY_BYTES", 16 * 100)  # five steps
    real_open = open
    monkeypatch.setattr(host_cache_module, "open", lambda path, mode: _FullDisk(real_open(path, mode)),
                        raising=False)
    with caplog.at_level("WARNING", logger="neutronorch"):
        cache = HostCache(mapped, np.arange(0, 500, 7), str(tmp_path))
    assert not cache.cold_file and cache.cold is mapped and "No space left" in caplog.text
    store = FeatureStore(mapped, np.zeros(500, np.int64), ordered=True)
    store.attach_cache(cache)
    rows = torch.arange(499, -1, -2)
    assert torch.equal(store.gather(rows), torch.from_numpy(features)[rows])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".neutronorch-cold")]


class _FullDisk:
    """A file whose second write fails as on a full disk."""

    def __init__(self, file):
        self.file, self.writes = file, 0

    def write(self, data):
        self.writes += 1
        if self.writes == 2:
            raise OSError(28, "No space left on device")
        return self.file.write(data)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()
        return False
