import threading

import numpy as np
import torch

from neutronorch.features.store import BufferPool, FeatureStore


def test_gather_reads_float32_float16_and_bfloat16_rows():
    from neutronorch.data.dtypes import bfloat16

    rng = np.random.default_rng(0)
    features = rng.standard_normal((50, 7)).astype(np.float32)
    rows = torch.tensor([3, 3, 49, 0])
    for stored in (features, features.astype(np.float16), features.astype(bfloat16())):
        expected = torch.from_numpy(stored[rows.numpy()].astype(np.float32))
        for dtype in (torch.float32, torch.bfloat16):
            out = FeatureStore(stored, np.zeros(50, np.int64), dtype).gather(rows)
            assert out.dtype == dtype
            torch.testing.assert_close(out, expected.to(dtype), rtol=0, atol=0)


def test_gathers_in_file_order_give_the_same_rows(tmp_path):
    # A memory map gathered region by region of the file (what a graph larger than memory needs) gives
    # exactly the rows of the gather in position order, for every storage type.
    from neutronorch.data.dtypes import bfloat16
    from neutronorch.features import store as store_module

    rng = np.random.default_rng(1)
    features = rng.standard_normal((3000, 9)).astype(np.float32)
    rows = torch.from_numpy(rng.choice(3000, 1700, replace=False))
    for stored in (features, features.astype(np.float16), features.astype(bfloat16())):
        path = tmp_path / f"f{stored.dtype.itemsize}-{stored.dtype.kind}.npy"
        bits = stored.dtype.itemsize == 2 and stored.dtype != np.float16  # bfloat16: stored as its bits
        np.save(path, stored.view(np.uint16) if bits else stored)
        mapped = np.load(path, mmap_mode="r")
        mapped = mapped.view(stored.dtype) if bits else mapped
        assert isinstance(mapped, np.memmap)
        for dtype in (torch.float32, torch.bfloat16):
            direct = FeatureStore(mapped, np.zeros(3000, np.int64), dtype, ordered=False)
            ordered = FeatureStore(mapped, np.zeros(3000, np.int64), dtype, ordered=True)
            ordered.rows_per_region = 7  # many small regions
            assert torch.equal(ordered.gather(rows), direct.gather(rows))
    assert store_module.beyond_memory([mapped], available=2 * mapped.nbytes - 2)
    assert not store_module.beyond_memory([mapped], available=2 * mapped.nbytes + 2)
    assert store_module.beyond_memory([mapped, mapped], available=4 * mapped.nbytes - 2)  # together
    assert not store_module.beyond_memory([mapped], available=3 * mapped.nbytes, reserve=mapped.nbytes)
    assert store_module.beyond_memory([mapped], available=3 * mapped.nbytes, reserve=mapped.nbytes + 4)
    assert not store_module.beyond_memory([np.asarray(mapped)], available=1)  # in memory: never


def test_region_order_visits_regions_front_to_back():
    from neutronorch.sampling.kernels import region_order

    rng = np.random.default_rng(2)
    rows = rng.choice(10_000, 4000, replace=False)
    order = region_order(rows, 64, 10_000)
    assert sorted(order.tolist()) == list(range(4000))
    regions = rows[order] // 64
    assert (np.diff(regions) >= 0).all()
    for r in np.unique(regions)[:20]:  # within a region, positions keep their own order
        assert (np.diff(order[regions == r]) > 0).all()


def test_available_memory_counts_the_memory_cgroup(tmp_path):
    from neutronorch.features.memory import _cgroup_room

    v1 = tmp_path / "memory" / "jobs" / "a"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("1000000\n")
    (v1 / "memory.stat").write_text("cache 5\nrss 7\ntotal_rss 300000\n")
    (tmp_path / "self-v1").write_text("4:cpu:/\n9:memory:/jobs/a\n")
    assert _cgroup_room(tmp_path, str(tmp_path / "self-v1")) == 700000
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # no limit
    assert _cgroup_room(tmp_path, str(tmp_path / "self-v1")) is None
    v2 = tmp_path / "user.slice"
    v2.mkdir()
    (v2 / "memory.max").write_text("2000000\n")
    (v2 / "memory.stat").write_text("anon 500000\nfile 9\n")
    (tmp_path / "self-v2").write_text("0::/user.slice\n")
    assert _cgroup_room(tmp_path, str(tmp_path / "self-v2")) == 1500000
    (v2 / "memory.max").write_text("max\n")
    assert _cgroup_room(tmp_path, str(tmp_path / "self-v2")) is None


def test_buffer_pool_reuses_buffers_and_blocks_when_all_are_in_use():
    pool = BufferPool(2, 4)
    a = pool.acquire(10)
    b = pool.acquire(10)
    assert a.shape[0] >= 10 and a.data_ptr() != b.data_ptr()
    got = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(5)))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive(), "acquire must wait while every buffer is in use"
    pool.release(a)
    waiter.join(2)
    assert got and got[0].data_ptr() == a.data_ptr(), "a released buffer is reused, not reallocated"


def test_the_read_order_setting_decides_both_orders():
    from neutronorch.data import SyntheticSpec, generate
    from neutronorch.features.reading import read_orders

    graph = generate(SyntheticSpec(nodes=300, degree=4, features=8, classes=3))
    arrays = [graph.features], [graph.indices, graph.indptr]
    assert read_orders("file", *arrays, 0) == (True, True) and read_orders("batch", *arrays, 0) == (False, False)
    assert read_orders("auto", *arrays, 1 << 50) == (False, False)  # in memory, not memory maps: never


def test_typed_inputs_read_each_featured_type_as_stored_for_every_dtype(tmp_path):
    # A typed run's rows (one FeatureStore per featured type) are the stored rows as float32: float16 and
    # bfloat16 decoded exactly, other dtypes converted as numpy converts them, in memory or memory-mapped,
    # contiguous or not; edge features through the same gather.
    import dataclasses

    from neutronorch.data.dtypes import bfloat16
    from neutronorch.data.synthetic_typed import synthetic_typed
    from neutronorch.data.native import read_typed, write_typed
    from neutronorch.features.store import TypedInputs

    rng = np.random.default_rng(2)
    values = rng.standard_normal((120, 10)) * 3
    ids = torch.from_numpy(rng.integers(0, 120, 300))
    for stored in (values.astype(np.float32), values.astype(np.float16), values.astype(bfloat16()), values,
                   values.astype(np.float32)[:, ::2], (values * 10).astype(np.int32)):
        graph = dataclasses.replace(synthetic_typed(nodes=400, features=4), features={"paper": stored})
        features, got_ids = TypedInputs(graph)({"paper": ids, "author": ids[:5]}, torch.device("cpu"))
        assert set(features) == {"paper"} and torch.equal(got_ids["author"], ids[:5])
        assert features["paper"].dtype == torch.float32
        assert np.array_equal(features["paper"].numpy(), np.asarray(stored[ids.numpy()], dtype=np.float32))
    graph = synthetic_typed(nodes=400, features=6, field_features=3)
    for dtype in ("float16", "bfloat16"):
        narrow = dataclasses.replace(graph, features={t: rows.astype(bfloat16() if dtype == "bfloat16" else dtype)
                                                      for t, rows in graph.features.items()})
        mapped = read_typed(write_typed(narrow, tmp_path / dtype))
        assert all(isinstance(rows, np.memmap) for rows in mapped.features.values())
        frontier = {t: torch.from_numpy(rng.integers(0, mapped.num_nodes[t], 50)) for t in mapped.features}
        features, _ = TypedInputs(mapped)(frontier, torch.device("cpu"))
        for t, rows in features.items():
            assert np.array_equal(rows.numpy(), np.asarray(mapped.features[t][frontier[t].numpy()], np.float32))
