"""bfloat16: the kernels' bfloat16 rows against float32 references, autocast training, the precision setting."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from numba import njit

from neutronorch import TrainConfig, train
from neutronorch.bfloat16 import load, numpy_view, store
from neutronorch.errors import ConfigError
from neutronorch.features.store import FeatureStore
from neutronorch.nn import precision as precision_module
from neutronorch.nn.activation import relu_dropout
from neutronorch.nn.aggregation import mean_aggregate, mean_aggregate_torch, symmetric_aggregate
from neutronorch.nn.layers import GATConv, GCNConv, SAGEConv
from neutronorch.nn.precision import Precision, resolve_precision
from neutronorch.nn.splice import SpliceIndex, splice, splice_relu_dropout
from neutronorch.sampling.neighbor_sampler import NeighborSampler

BF16 = torch.bfloat16


@pytest.fixture
def subgraph(small_csc):
    indptr, indices = small_csc
    return NeighborSampler(indptr, indices, [6, 4], degrees=True).sample(np.arange(0, 300, 5), 11)


@njit
def _encode_all(x, out):
    for i in range(x.shape[0]):
        store(out, i, x[i])


@njit
def _decode_all(bits, out):
    for i in range(bits.shape[0]):
        out[i] = load(bits[i])


def test_bfloat16_codec_rounds_as_torch_does():
    torch.manual_seed(0)
    x = torch.randn(200_000) * torch.logspace(-40, 38, 200_000)
    x[:6] = torch.tensor([float("inf"), -float("inf"), 0.0, -0.0, 1.00390625, 1.01171875])  # two exact ties
    bits = np.empty(x.shape[0], np.uint16)
    _encode_all(x.numpy(), bits)
    np.testing.assert_array_equal(bits, numpy_view(x.to(BF16)))
    back = np.empty(x.shape[0], np.float32)
    _decode_all(bits, back)
    np.testing.assert_array_equal(back, x.to(BF16).float().numpy())
    nan = np.empty(1, np.uint16)
    _encode_all(np.array([np.nan], np.float32), nan)
    assert torch.isnan(torch.from_numpy(nan).view(BF16).float()).all()


def _rounded(x):
    return x.to(BF16).float()


@pytest.mark.parametrize("include_self", [False, True])
def test_bfloat16_mean_aggregation_is_the_float32_one_rounded(subgraph, include_self):
    block = subgraph.blocks[0]
    x = _rounded(torch.randn(block.num_src, 24))
    grad = _rounded(torch.randn(block.num_dst, 24))
    a = x.to(BF16).requires_grad_()
    b = x.double().requires_grad_()
    out_a = mean_aggregate(block, a, include_self)  # numba, bfloat16 rows
    out_b = mean_aggregate_torch(block, b, include_self)
    assert out_a.dtype == BF16
    # float32 sums of exact inputs, one rounding at the end: within half a bfloat16 ulp of the exact mean.
    torch.testing.assert_close(out_a.double(), out_b, rtol=2 ** -8, atol=1e-6)
    out_a.backward(grad.to(BF16))
    out_b.backward(grad.double())
    assert a.grad.dtype == BF16
    torch.testing.assert_close(a.grad.double(), b.grad, rtol=2 ** -8, atol=1e-6)


def test_bfloat16_symmetric_aggregation_is_the_float32_one_rounded(subgraph):
    first = subgraph.blocks[0]
    block = replace(first, src_degree=torch.randint(0, 40, (first.num_src,)).float())
    x = _rounded(torch.randn(block.num_src, 16))
    a = x.to(BF16).requires_grad_()
    b = x.double().requires_grad_()
    out_a, out_b = symmetric_aggregate(block, a), symmetric_aggregate(block, b)
    torch.testing.assert_close(out_a.double(), out_b, rtol=2 ** -7, atol=1e-5)
    grad = _rounded(torch.randn(block.num_dst, 16))
    out_a.backward(grad.to(BF16))
    out_b.backward(grad.double())
    torch.testing.assert_close(a.grad.double(), b.grad, rtol=2 ** -7, atol=1e-5)


def test_torch_aggregation_of_bfloat16_rows_sums_in_float32(subgraph):
    # The CUDA path: many equal small rows would lose everything past 8 bits if summed in bfloat16.
    block = subgraph.blocks[0]
    x = torch.full((block.num_src, 4), 1 + 2 ** -7).to(BF16)
    out = mean_aggregate_torch(block, x)
    has = block.in_degrees() > 0
    torch.testing.assert_close(out[has].float(), torch.full_like(out[has].float(), 1 + 2 ** -7))


@pytest.mark.parametrize("layer_cls", [SAGEConv, GCNConv, GATConv])
def test_layers_under_bfloat16_autocast_keep_float32_weights_and_track_float32(subgraph, layer_cls):
    torch.manual_seed(1)
    block = subgraph.blocks[1]
    layer = layer_cls(12, 40)
    x = torch.randn(block.num_src, 12)
    reference = layer(block, x)
    with torch.autocast("cpu", dtype=BF16):
        y = layer(block, x.to(BF16))
    assert y.dtype == BF16
    scale = reference.detach().abs().max()
    assert float((y.detach().float() - reference.detach()).abs().max()) < 0.03 * float(scale)
    y.float().sum().backward()
    for p in layer.parameters():
        assert p.dtype == torch.float32 and p.grad is not None and p.grad.dtype == torch.float32


def test_bfloat16_relu_dropout_draws_the_float32_masks():
    y = _rounded(torch.randn(300, 40))
    torch.manual_seed(3)
    a = relu_dropout(y.clone(), 0.5, training=True)
    torch.manual_seed(3)
    b = relu_dropout(y.to(BF16), 0.5, training=True)
    assert b.dtype == BF16
    torch.testing.assert_close(b.float(), _rounded(a), rtol=0, atol=0)


@pytest.mark.parametrize("p", [0.0, 0.5])
def test_bfloat16_splice_equals_the_float32_one(p):
    rng = np.random.default_rng(0)
    n, width, table_rows = 50, 12, 30
    perm = rng.permutation(n)
    hot_pos, cold_pos = np.sort(perm[:20]), np.sort(perm[20:])
    index = SpliceIndex.build(n, cold_pos, hot_pos, rng.choice(table_rows, 20, replace=False))
    y = _rounded(torch.randn(len(cold_pos), width))
    table = _rounded(torch.randn(table_rows, width))
    grad = _rounded(torch.randn(n, width))
    results = []
    for dtype in (torch.float32, BF16):
        leaf = y.to(dtype, copy=True).requires_grad_()
        acc = torch.zeros(table_rows, width)
        torch.manual_seed(5)
        out = splice_relu_dropout(leaf * 1, table.to(dtype), index, p, training=True, grad_acc=acc)
        out.backward(grad.to(dtype))
        assert out.dtype == dtype and leaf.grad.dtype == dtype and acc.dtype == torch.float32
        results.append((out.detach().float(), leaf.grad.float(), acc))
    # Inputs exact in bfloat16 and a scale of 2: every output, gradient and float32 sum is exact in both.
    for a, b in zip(*results):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
    # A float32 table is cast to the rows' dtype.
    assert splice(y.to(BF16), table, index).dtype == BF16


@pytest.mark.parametrize("storage", [np.float32, np.float16])
def test_feature_rows_are_gathered_as_bfloat16(storage):
    features = np.random.default_rng(2).standard_normal((100, 7)).astype(storage)
    rows = torch.tensor([5, 0, 99, 5])
    got = FeatureStore(features, np.zeros(100), BF16).gather(rows)
    assert got.dtype == BF16
    expected = torch.from_numpy(features[rows.numpy()].astype(np.float32)).to(BF16)
    assert torch.equal(got, expected)


def test_precision_setting_resolves_by_the_hardware(monkeypatch):
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu).name == "fp32"
    monkeypatch.setattr(precision_module, "cpu_bf16_units", lambda: [])
    auto = resolve_precision("auto", cpu)
    assert auto.name == "fp32" and "neither" in auto.reason
    forced = resolve_precision("bf16", cpu)
    assert forced.name == "bf16" and "emulated" in forced.reason and "auto or fp32" in forced.reason
    monkeypatch.setattr(precision_module, "cpu_bf16_units", lambda: ["amx_bf16"])
    assert resolve_precision("auto", cpu) == Precision("bf16", "auto: this CPU has AMX-BF16")
    with pytest.raises(ConfigError, match="precision"):
        TrainConfig(precision="fp16").validate()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["exact", "neutronorch"])
def test_bfloat16_training_matches_float32(mode):
    base = dict(dataset="synthetic:nodes=4000,degree=10,features=32,classes=4", fanouts=[6, 4], hidden=64,
                epochs=3, mode=mode, threads=1, sampler_threads=1, progress=False,
                **({"host_threads": 1} if mode == "neutronorch" else {}))
    fp32 = train(TrainConfig(**base))
    bf16 = train(TrainConfig(**base, precision="bf16"))
    assert bf16["precision"]["name"] == "bf16" and fp32["precision"]["name"] == "fp32"
    for summary, itemsize in ((fp32, 4), (bf16, 2)):  # rows gathered as 4 and 2 bytes a value
        moved = summary["epochs"][0]["moved"]
        assert moved["feature_bytes"] > 0 and moved["feature_bytes"] % (32 * itemsize) == 0
        if mode == "exact":
            assert moved["feature_bytes"] == moved["feature_rows"] * 32 * itemsize
    losses32 = [e["train_loss"] for e in fp32["epochs"]]
    losses16 = [e["train_loss"] for e in bf16["epochs"]]
    assert losses16[-1] < losses16[0]
    np.testing.assert_allclose(losses16, losses32, rtol=0.05)
    assert abs(bf16["test_acc"] - fp32["test_acc"]) <= 0.01


@pytest.mark.slow
def test_neutronorch_host_without_native_bfloat16_computes_float32_and_ships_bfloat16(monkeypatch):
    from neutronorch.orchestration.neutronorch import hot_rows

    monkeypatch.setattr(hot_rows, "cpu_bf16_units", lambda: [])
    tables = []
    finish = hot_rows.HotRowComputer._finish_hot

    def spy(self, plan, block, x, *rest):
        tables.append((x.dtype, self.host_bf16))
        return finish(self, plan, block, x, *rest)

    monkeypatch.setattr(hot_rows.HotRowComputer, "_finish_hot", spy)
    summary = train(TrainConfig(dataset="synthetic:nodes=3000,degree=10,features=16,classes=4,noise=0.6",
                                fanouts=[5, 5], hidden=32, batch_size=64, epochs=3, lr=0.01, super_batch=4,
                                mode="neutronorch", precision="bf16",
                                hot_ratio=0.3, hot_grad="cpu", threads=1, sampler_threads=1, host_threads=1,
                                progress=False))
    assert tables and all(dtype == torch.float32 and not native for dtype, native in tables)
    assert summary["hot"]["reuse_rate"] > 0 and summary["test_acc"] > 0.7


def test_bucketed_rows_bound_the_padding_and_the_shapes():
    from neutronorch.nn.bucket import padded_rows

    sizes = [padded_rows(rows) for rows in range(1, 200_000)]
    assert all(rows <= size <= max(rows + 63, rows * (1 + 1 / 32)) for rows, size in zip(range(1, 200_000), sizes))
    assert len(set(sizes)) < 400  # oneDNN builds a kernel per shape: a few hundred at most, not one per batch


def test_bucket_heads_are_buckets_and_leave_a_few_remainder_sizes():
    from neutronorch.nn.bucket import head_rows, padded_rows

    heads = {rows: head_rows(rows) for rows in range(1, 200_000)}
    assert all(head <= rows and (head == 0 or padded_rows(head) == head) for rows, head in heads.items())
    assert len({padded_rows(rows) - head for rows, head in heads.items()}) < 20


@pytest.mark.parametrize("rows", [3000, 2048, 50])  # a head and a padded remainder; a bucket; a remainder only
def test_bucketed_fused_sage_layer_equals_the_unbucketed_one(rows, monkeypatch):
    from neutronorch.nn import aggregation
    from neutronorch.sampling.block import Block

    rng = np.random.default_rng(0)
    indptr = torch.from_numpy(np.arange(rows + 1, dtype=np.int64) * 3)
    block = Block(rows, 2 * rows, indptr, torch.from_numpy(rng.integers(0, 2 * rows, 3 * rows)))
    torch.manual_seed(0)
    layer = SAGEConv(24, 16)
    x = torch.randn(2 * rows, 24).to(BF16).requires_grad_()

    def run():
        layer.zero_grad()
        x.grad = None
        with torch.autocast("cpu", dtype=BF16):
            y = layer(block, x)
        (y.float() * torch.linspace(-1, 1, 16)).sum().backward()
        return y.detach().float(), x.grad.float(), [p.grad.clone() for p in layer.parameters()]

    bucketed = run()
    monkeypatch.setattr(aggregation, "needs_buckets", lambda *args: False)
    plain = run()
    torch.testing.assert_close(bucketed[0], plain[0], rtol=0, atol=0)
    torch.testing.assert_close(bucketed[1], plain[1], rtol=2 ** -7, atol=1e-2)
    for a, b in zip(bucketed[2], plain[2]):
        torch.testing.assert_close(a, b, rtol=2 ** -7, atol=1e-2)


def test_bucketed_bfloat16_products_equal_the_unpadded_ones():
    from neutronorch.nn.bucket import project

    torch.manual_seed(0)
    x = torch.randn(1000, 24, requires_grad=True)
    w = torch.randn(16, 24, requires_grad=True)
    b = torch.randn(16, requires_grad=True)
    with torch.autocast("cpu", dtype=BF16):
        y = project(x, w, b)
        ref = torch.nn.functional.linear(x, w, b)
    assert y.shape == (1000, 16) and y.dtype == BF16
    torch.testing.assert_close(y, ref, rtol=0, atol=0)
    grads = torch.autograd.grad(y.float().sum(), (x, w, b))
    refs = torch.autograd.grad(ref.float().sum(), (x, w, b))
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g, r, rtol=2 ** -7, atol=1e-3)


@pytest.mark.slow
def test_a_checkpoint_from_before_the_setting_resumes_in_either_precision(tmp_path):
    base = dict(dataset="synthetic:nodes=2000,degree=8,features=16,classes=4", fanouts=[4, 4], hidden=16,
                batch_size=128, threads=1, sampler_threads=1, progress=False, checkpoint_dir=str(tmp_path))
    train(TrainConfig(**base, epochs=1))
    last = tmp_path / "last.pt"
    state = torch.load(last, weights_only=False)
    del state["config"]["precision"]  # as written before `precision` existed
    torch.save(state, last)
    resumed = train(TrainConfig(**base, epochs=2, resume=True, precision="bf16"))
    assert resumed["precision"]["name"] == "bf16" and [e["epoch"] for e in resumed["epochs"]] == [0, 1]
