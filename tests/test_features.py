import threading

import numpy as np
import torch

from neutronorch.features.store import BufferPool, FeatureStore


def test_gather_reads_float32_and_float16_rows():
    rng = np.random.default_rng(0)
    features = rng.standard_normal((50, 7)).astype(np.float32)
    rows = torch.tensor([3, 3, 49, 0])
    for stored in (features, features.astype(np.float16)):
        out = FeatureStore(stored, np.zeros(50, np.int64)).gather(rows)
        assert out.dtype == torch.float32
        np.testing.assert_array_equal(out.numpy(), stored[rows.numpy()].astype(np.float32))


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
