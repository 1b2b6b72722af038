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
