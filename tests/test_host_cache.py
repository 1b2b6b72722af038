"""The host feature cache: hottest rows in memory, the rest in a compact file of cold rows."""

import os

import numpy as np
import pytest
import torch

from neutronorch.features import host_cache as host_cache_module
from neutronorch.features import memory as memory_module
from neutronorch.features.host_cache import HostCache
from neutronorch.features.memory import AutoSize, measured_rows, rows_to_free
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
                store.host_cache = HostCache(mapped, hot, str(tmp_path))
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
    store.host_cache = cache
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


def test_the_cache_size_follows_the_setting_and_the_memory_measured(tmp_path):
    mapped = _mapped(tmp_path, np.zeros((1000, 25), np.float32))  # rows of 100 bytes
    GiB, MiB = 1 << 30, 1 << 20
    from neutronorch.features.reading import host_cache_size
    ranked = lambda: np.arange(1000)  # noqa: E731
    assert host_cache_size("auto", np.asarray(mapped), True, ranked) == (0, "features in memory", None)
    assert host_cache_size(1.0, np.zeros((1000, 25), np.float32), True, ranked)[0] == 0
    assert host_cache_size("auto", mapped, False, ranked) == (0, "memory-mapped features fit in memory", None)
    assert host_cache_size("auto", mapped, True, ranked)[0] == 0  # sized later, by measurement
    assert host_cache_size(4000 / GiB, mapped, False, ranked) == (40, "host_cache_gb", None)
    # Measured: what the available memory leaves beside the working memory's way back up to its peak, a
    # margin for it to grow (5% of the peak, at least 128 MiB) and the page cache kept for mapped files.
    rows, growth = measured_rows(MiB, 10**6, available=3 * GiB, anon_now=2 * GiB, anon_peak=2 * GiB + 200 * MiB,
                                 keep=500 * MiB)
    assert growth == 128 * MiB and rows == 3 * 1024 - 200 - 128 - 500
    rows, growth = measured_rows(MiB, 10**6, 6 * GiB, 4 * GiB, 4 * GiB, 0)
    assert growth == int(0.05 * 4 * GiB) and rows == (6 * GiB - growth) // MiB
    assert measured_rows(MiB, 10**6, 3 * GiB, 2 * GiB, 2 * GiB, 500 * MiB, ranks=2)[0] == (3 * 1024 - 128 - 500) // 2
    assert measured_rows(MiB, 10**6, 500 * MiB, 2 * GiB, 2 * GiB, 500 * MiB)[0] == 0  # no room: none
    assert measured_rows(MiB, 100, 30 * GiB, 0, 0, 0)[0] == 100  # never more than the candidates
    # A smaller memory cgroup limit (less available beside the same working memory) gives a smaller cache.
    sizes = [measured_rows(MiB, 10**6, int(avail * GiB), 2 * GiB, 2 * GiB, 300 * MiB)[0] for avail in (4, 3, 2, 0.4)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[1] > sizes[2] > 0 == sizes[3]
    # Shrinking: nothing while the page cache has what it needs; else enough to restore it and the margin.
    assert rows_to_free(MiB, 500, available=600 * MiB, keep=500 * MiB, growth=128 * MiB) == 0
    assert rows_to_free(MiB, 500, 400 * MiB, 500 * MiB, 128 * MiB) == 228
    assert rows_to_free(MiB, 500, 490 * MiB, 500 * MiB, 0) == 64  # at least SHRINK_MIN
    assert rows_to_free(MiB, 100, 0, 500 * MiB, 128 * MiB) == 100  # at most every row
    assert rows_to_free(MiB, 0, 0, 500 * MiB, 128 * MiB) == 0


class _Memory:
    """Memory readers for ``host_cache``, set by a test: a simulated cgroup's room and the process's memory."""

    def __init__(self, monkeypatch, available, anon, files=0):
        self.available, self.anon, self.files = available, anon, files
        monkeypatch.setattr(host_cache_module, "available_memory_bytes", lambda: self.available)
        monkeypatch.setattr(host_cache_module, "process_anonymous_bytes", lambda: self.anon)
        monkeypatch.setattr(host_cache_module, "mapped_file_bytes", lambda exclude=(): self.files)


def _auto_cache(tmp_path, monkeypatch, features, available, anon, warmup=3):
    """A cache sized by measurement over ``features`` (memory-mapped), its watcher stopped so that the test
    drives it (``_tick``); the page cache kept: 1,000 bytes of topology and STREAM_BYTES of 10,000 bytes."""
    monkeypatch.setattr(memory_module, "STREAM_BYTES", 10_000)
    monkeypatch.setattr(memory_module, "GROWTH_MIN", 2_000)
    monkeypatch.setattr(memory_module, "SHRINK_MIN", 100)
    memory = _Memory(monkeypatch, available, anon)
    mapped = _mapped(tmp_path, features)
    hottest = np.random.default_rng(0).permutation(features.shape[0])
    cache = HostCache(mapped, hottest, str(tmp_path), AutoSize(files=1_000, warmup=warmup))
    cache.close()
    return cache, mapped, hottest, memory


def test_auto_sizes_the_cache_after_the_first_gathers_from_the_memory_they_used(tmp_path, monkeypatch):
    features = np.random.default_rng(1).standard_normal((2000, 10)).astype(np.float32)  # rows of 40 bytes
    cache, mapped, hottest, memory = _auto_cache(tmp_path, monkeypatch, features, available=60_000, anon=50_000)
    plain = FeatureStore(mapped, np.zeros(2000, np.int64), ordered=True)
    store = FeatureStore(mapped, np.zeros(2000, np.int64), ordered=True)
    store.host_cache = cache
    rows = torch.from_numpy(np.random.default_rng(2).integers(0, 2000, 3000))
    # Until it is sized: empty, rows read from the features in place, the working memory sampled.
    for anon in (50_000, 58_000, 52_000):
        memory.anon = anon
        assert cache._tick() == host_cache_module.POLL_WARMUP_S and cache.sizing is None
        assert torch.equal(store.gather(rows), plain.gather(rows))
    assert cache.rows == 0 and cache.cold is mapped and cache.gathers == 3
    memory.anon = 52_000
    cache._tick()  # sized: the peak (58,000) is 6,000 above now; margin 2,900 (5%); kept 1,000 + 10,000
    expected = (60_000 - 6_000 - 2_900 - 11_000) // 40
    assert cache.rows == expected and cache.cold_file and cache.cold.shape[0] == 2000 - expected
    assert set(cache.where[hottest[:expected]] < 0) == {True}  # the hottest candidates, hottest first
    assert np.array_equal(-1 - cache.where[hottest[:expected]], np.arange(expected))
    assert cache.sizing["working_gib"] == round(58_000 / 2**30, 3) and cache.sizing["shrinks"] == 0
    assert torch.equal(store.gather(rows), plain.gather(rows))
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".neutronorch-cold")]
    # The memory is squeezed (the cgroup's anonymous memory grew): the coldest cached rows go to the cold
    # file, enough to give the page cache back what it needs and the margin; rows come back unchanged.
    memory.available = 11_000 - 4_000
    cache._tick()
    freed = -(-(11_000 + 2_900 - 7_000) // 40)
    assert cache.rows == expected - freed and cache.cold.shape[0] == 2000 - expected + freed
    assert np.array_equal(-1 - cache.where[hottest[:expected - freed]], np.arange(expected - freed))
    assert (cache.where[hottest[expected - freed:]] >= 0).all()
    assert cache.sizing["shrinks"] == 1
    assert torch.equal(store.gather(rows), plain.gather(rows))
    memory.available = 11_000
    cache._tick()  # enough again: no change
    assert cache.rows == expected - freed
    memory.available = 0
    for _ in range(3):
        cache._tick()
    assert cache.rows == 0 and cache.cold.shape[0] == 2000  # every row in the (longer) cold file
    assert torch.equal(store.gather(rows), plain.gather(rows))
    gathered, hits = store.take_counts()
    assert gathered == 6 * 3000 and 0 < hits < 2 * 3000  # hits only while it held rows


def test_auto_takes_less_under_a_smaller_memory_limit_and_none_without_room(tmp_path, monkeypatch):
    features = np.ones((1000, 10), np.float32)
    sizes = []
    for available in (60_000, 40_000, 20_000, 10_000):
        (tmp_path / str(available)).mkdir()
        cache, *_ = _auto_cache(tmp_path / str(available), monkeypatch, features, available, 30_000, warmup=0)
        cache._tick()
        sizes.append(cache.rows)
    assert sizes[0] > sizes[1] > sizes[2] > 0 == sizes[3]


def test_auto_without_a_cold_file_shrinks_into_the_features_in_place(tmp_path, monkeypatch):
    features = np.arange(600 * 4, dtype=np.float32).reshape(600, 4)
    monkeypatch.setattr(host_cache_module.shutil, "disk_usage", lambda path: type("U", (), {"free": 10})())
    cache, mapped, hottest, memory = _auto_cache(tmp_path, monkeypatch, features, 17_800, 0, warmup=0)
    cache._tick()
    assert cache.rows == 300 and not cache.cold_file and cache.cold is mapped
    memory.available = 0
    cache._tick()
    assert cache.rows < 600 and (cache.where[hottest[cache.rows:]] == hottest[cache.rows:]).all()
    store = FeatureStore(mapped, np.zeros(600, np.int64), ordered=True)
    store.host_cache = cache
    rows = torch.arange(599, -1, -1)
    assert torch.equal(store.gather(rows), torch.from_numpy(features)[rows])


def test_the_watcher_sizes_the_cache_by_itself(tmp_path, monkeypatch):
    import time

    monkeypatch.setattr(memory_module, "STREAM_BYTES", 1_000)
    monkeypatch.setattr(memory_module, "GROWTH_MIN", 1_000)
    _Memory(monkeypatch, 50_000, 10_000)
    mapped = _mapped(tmp_path, np.ones((500, 10), np.float32))
    cache = HostCache(mapped, np.arange(500), str(tmp_path), AutoSize(warmup=2))
    store = FeatureStore(mapped, np.zeros(500, np.int64), ordered=True)
    store.host_cache = cache
    for _ in range(2):
        store.gather(torch.arange(500))
    deadline = time.monotonic() + 10
    while cache.sizing is None and time.monotonic() < deadline:
        time.sleep(0.01)
    cache.close()
    assert cache.rows > 0 and cache.summary(1000, 0)["sizing"]["gathers"] == 2


def test_auto_sizes_the_cache_from_the_presampled_working_memory(tmp_path, monkeypatch):
    # ``auto`` ranks the rows by presampling, builds no rows itself and hands the ranking on: the cache
    # then sizes itself from the memory the first mini-batches use; ranks launched together on a node each
    # take their share.
    from neutronorch.config import TrainConfig
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.data.native import load_native, save_native
    from neutronorch.features.cache import hotness_order
    from neutronorch.features.reading import auto_size, host_cache_size
    from neutronorch.orchestration import factory

    graph = load_native(save_native(generate(SyntheticSpec(nodes=3000, degree=8, features=20, classes=4)),
                                    tmp_path / "g"))
    assert isinstance(graph.features, np.memmap)
    config = TrainConfig(fanouts=[5, 5], batch_size=64, hidden=16).validate()
    sampling = config.sampling
    order = hotness_order(graph, [5, 5], 64, config.seed)
    rank = lambda: hotness_order(graph, sampling.fanouts, sampling.batch_size, sampling.seed)  # noqa: E731
    rows, why, ranked = host_cache_size(config.host_cache_gb, graph.features, True, rank)
    assert rows == 0 and "first mini-batches" in why
    assert np.array_equal(ranked, order)  # the ranking is passed on, not computed twice
    assert host_cache_size(config.host_cache_gb, graph.features, False, rank) == (
        0, "memory-mapped features fit in memory", None)  # fits: none
    topology = [graph.indptr, graph.indices]
    sized = auto_size([graph.features], topology)
    assert sized.files == graph.indptr.nbytes + graph.indices.nbytes and sized.ranks == 1
    assert str(graph.features.filename) in sized.exclude
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert auto_size([graph.features], topology, distributed=True).ranks == 2
    assert auto_size([graph.features], topology, distributed=True, caches=3).ranks == 6  # a typed run's types
    # Built for a run: the store reads through a cache sized by measurement, empty until then.
    monkeypatch.setattr(factory, "read_orders", lambda *args: (True, True))
    mode = factory.build_mode(config, graph, torch.device("cpu"))
    cache = mode.store.host_cache
    assert cache is not None and cache.auto is not None and cache.rows == 0
    cache.close()


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
    store.host_cache = cache
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


@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_a_cache_sized_by_measurement_changes_no_loss_as_it_grows_and_shrinks(tmp_path, monkeypatch, mode):
    # Memory-mapped features read in file order, ``--host-cache-gb auto``: the cache starts empty, is sized
    # after two gathers from a simulated cgroup's room, then shrinks as the room falls; the losses are those
    # of a run without a cache, and no file is left behind.
    import json

    from neutronorch.cli import main
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.data.native import save_native

    directory = save_native(generate(SyntheticSpec(nodes=2000, degree=8, features=12, classes=4)), tmp_path / "g")
    before = sorted(p.name for p in directory.iterdir())
    monkeypatch.setattr(host_cache_module, "WARMUP_GATHERS", 2)
    monkeypatch.setattr(host_cache_module, "POLL_S", 0.001)
    for name, value in (("STREAM_BYTES", 1_000), ("GROWTH_MIN", 1_000), ("SHRINK_MIN", 48 * 50)):
        monkeypatch.setattr(memory_module, name, value)
    calls = []

    caches = []
    make = host_cache_module.HostCache.__init__

    def recorded(self, *args, **kwargs):
        make(self, *args, **kwargs)
        caches.append(self)

    monkeypatch.setattr(host_cache_module.HostCache, "__init__", recorded)

    def room():  # 60,000 bytes when sized (about 1,100 rows of 48 bytes), then less and less, to a floor; as
        calls.append(1)  # in a real process the rows a shrink gives up come back as room, so shrinking settles
        if len(calls) == 1:  # however often a loaded machine polls
            return 60_000 + 50_000
        sizing = caches[-1].sizing if caches else None
        freed = 48 * (sizing["sized_rows"] - caches[-1].rows) if sizing else 0
        return 60_000 + 50_000 - 4_000 * min(len(calls) - 1, 12) + freed

    monkeypatch.setattr(host_cache_module, "available_memory_bytes", room)
    monkeypatch.setattr(host_cache_module, "process_anonymous_bytes", lambda: 50_000)
    monkeypatch.setattr(host_cache_module, "mapped_file_bytes", lambda exclude=(): 0)
    runs = {}
    for size in ("0", "auto"):
        calls.clear()
        out = tmp_path / f"{size}.json"
        assert main(["train", "--dataset", str(directory), "--mode", mode, "--fanouts", "5,5", "--hidden", "16",
                     "--epochs", "3", "--batch-size", "32", "--seed", "5", "--device", "cpu", "--read-order", "file",
                     "--host-cache-gb", size, "--summary-json", str(out), "--no-progress"]) == 0
        runs[size] = json.loads(out.read_text())
    off, on = runs.values()
    assert [e["train_loss"] for e in on["epochs"]] == [e["train_loss"] for e in off["epochs"]]
    sizing = on["host_cache"]["sizing"]
    assert sizing["gathers"] >= 2 and 500 < sizing["sized_rows"] < 2000 and sizing["shrinks"] >= 1
    assert on["host_cache"]["rows"] < sizing["sized_rows"] and on["host_cache"]["hit_rate"] > 0
    assert sorted(p.name for p in directory.iterdir()) == before


def test_auto_holding_every_row_still_shrinks_into_a_file_of_its_own(tmp_path, monkeypatch):
    # Room for every row: the cold file is empty but made all the same, so that rows given up later go to
    # it rather than being read from the whole features file in place.
    features = np.random.default_rng(4).standard_normal((700, 6)).astype(np.float32)  # rows of 24 bytes
    cache, mapped, hottest, memory = _auto_cache(tmp_path, monkeypatch, features, 10**6, 0, warmup=0)
    cache._tick()
    assert cache.rows == 700 and cache.cold_file and cache.cold.shape[0] == 0
    store = FeatureStore(mapped, np.zeros(700, np.int64), ordered=True)
    store.host_cache = cache
    rows = torch.from_numpy(np.random.default_rng(5).integers(0, 700, 2000))
    assert torch.equal(store.gather(rows), torch.from_numpy(features)[rows])
    memory.available = 11_000 - 2_400  # short by 2,400 bytes: 100 rows, + the 2,000-byte margin
    cache._tick()
    assert cache.rows == 700 - 184 and cache.cold_file and cache.cold.shape[0] == 184
    assert sorted(cache.where[hottest[-184:]].tolist()) == list(range(184))
    assert torch.equal(store.gather(rows), torch.from_numpy(features)[rows])
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".neutronorch-cold")]



def _typed_folder(tmp_path):
    from neutronorch.data.synthetic_typed import synthetic_typed
    from neutronorch.data.native import read_typed, write_typed

    folder = tmp_path / "typed"
    if not folder.exists():
        write_typed(synthetic_typed(nodes=1200, features=8, field_features=4), folder)
    graph = read_typed(folder)
    assert all(isinstance(rows, np.memmap) for rows in graph.features.values())
    return folder, graph


def test_a_typed_types_hot_rows_are_those_its_training_batches_read_most(tmp_path):
    # Per featured type: out-degree summed over the relations out of the type, plus (presample) the rows'
    # appearances in the input frontiers of presampled training batches, as hotness_order ranks them.
    from neutronorch.features.cache import hotness_order, out_degrees
    from neutronorch.sampling.neighbor_sampler import batch_key
    from neutronorch.sampling.typed_sampler import TypedNeighborSampler

    _, graph = _typed_folder(tmp_path)
    graph = graph.with_reverse()
    sampler = TypedNeighborSampler(graph, [4, 4])
    by_degree = hotness_order(graph, sampler.fanouts, 32, 0, policy="degree")
    ranked = hotness_order(graph, sampler.fanouts, 32, 0)
    assert set(ranked) == set(by_degree) == set(graph.features)
    for t, order in ranked.items():
        degree = sum(out_degrees(r.indices, graph.num_nodes[t]) for (s, _, _), r in graph.relations.items() if s == t)
        assert np.array_equal(by_degree[t], np.argsort(-degree, kind="stable"))
        assert np.array_equal(np.sort(order), np.arange(graph.num_nodes[t]))
    # The hottest tenth of the papers serves more of the training batches' paper rows than a tenth does.
    counts = np.zeros(graph.num_nodes["paper"])
    for epoch in range(3):
        order = np.random.default_rng(epoch + 5).permutation(np.asarray(graph.train_idx))
        for b, seeds in enumerate(np.array_split(order, 8)):
            counts[sampler.sample(seeds, batch_key(1, epoch, b)).input_nodes["paper"].numpy()] += 1
    tenth = graph.num_nodes["paper"] // 10
    served = counts[ranked["paper"][:tenth]].sum()
    assert served > 1.3 * tenth / graph.num_nodes["paper"] * counts.sum()
    assert served >= counts[by_degree["paper"][:tenth]].sum()  # the presample sees where the seeds are


def test_a_typed_run_trains_the_same_losses_in_file_order_and_through_host_caches(tmp_path):
    # Memory-mapped featured types read in file order, through host caches of a fixed size (shared by the
    # types in proportion to their bytes) or sized by measurement: the same rows, so the same losses to the
    # bit, and the summary reports the caches as a homogeneous run's does.
    from neutronorch.config import TrainConfig
    from neutronorch.features.cache import hotness_order
    from neutronorch.features.reading import typed_stores
    from neutronorch.sampling.typed_sampler import TypedNeighborSampler
    from neutronorch import train

    folder, graph = _typed_folder(tmp_path)
    paper, field = graph.features["paper"], graph.features["field"]
    gib = 300 * paper.strides[0] * (paper.nbytes + field.nbytes) / paper.nbytes / 2**30  # 300 papers' rows

    def run(**settings):
        config = TrainConfig(dataset=str(folder), model="rgcn", fanouts=[4, 4], hidden=16, batch_size=32, epochs=2,
                             eval_every=0, seed=1, threads=1, sampler_threads=1, host_cache_dir=str(tmp_path),
                             **settings)
        return config, train(config, graph)

    _, plain = run(read_order="batch", host_cache_gb=0)
    losses = [e["train_loss"] for e in plain["epochs"]]
    assert plain["host_cache"] is None and plain["read_order"] == {"features": "batch", "topology": "batch"}
    _, ordered = run(read_order="file", host_cache_gb=0)
    assert [e["train_loss"] for e in ordered["epochs"]] == losses and ordered["read_order"]["features"] == "file"
    # NeutronOrch mode's host thread reads its hot rows through the same stores.
    hot = dict(mode="neutronorch", hot_ratio=0.3, super_batch=4)
    _, reused = run(read_order="batch", host_cache_gb=0, **hot)
    _, reused_cached = run(read_order="file", host_cache_gb=gib, **hot)
    assert [e["train_loss"] for e in reused_cached["epochs"]] == [e["train_loss"] for e in reused["epochs"]]
    assert reused_cached["host_cache"]["hit_rate"] > 0
    config, cached = run(read_order="batch", host_cache_gb=gib)
    assert [e["train_loss"] for e in cached["epochs"]] == losses
    summary = cached["host_cache"]
    assert summary["types"]["paper"]["rows"] == 300 and summary["rows"] == 300 + summary["types"]["field"]["rows"]
    assert set(summary) >= {"rows", "gib", "cold_file", "build_seconds", "hit_rate"} and 0 < summary["hit_rate"] < 1
    _, measured = run(read_order="file", host_cache_gb="auto")
    assert [e["train_loss"] for e in measured["epochs"]] == losses
    assert measured["host_cache"]["types"]["paper"]["sizing"] is None  # too few gathers to size it
    # The papers cached are the hottest ones.
    two_way = graph.with_reverse()
    sampler = TypedNeighborSampler(two_way, [4, 4])
    cache = typed_stores(config, two_way, sampler.fanouts)["paper"].host_cache
    hottest = hotness_order(two_way, sampler.fanouts, 32, 1)["paper"]
    assert cache.rows == 300 and (cache.where[hottest[:300]] < 0).all() and (cache.where[hottest[300:]] >= 0).all()
