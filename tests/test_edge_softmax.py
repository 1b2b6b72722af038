"""Attention's numba kernels (nn/edge_softmax.py: the per-edge softmax and the per-vertex scores) against the
torch ops they replace on CPU (still what other devices run): forward and every gradient within float32
rounding, for float32 and bfloat16, with empty destinations, and the same bits whatever numba's thread count;
then GAT and R-GAT layers with the kernels against the same layers with the torch ops."""

import numba
import pytest
import torch

from neutronorch.nn import edge_softmax as es
from neutronorch.nn.layers import GATConv
from neutronorch.nn.relational import RGATConv
from neutronorch.sampling.block import Block, TypedBlock

pytestmark = pytest.mark.usefixtures("one_thread")


def random_block(gen: torch.Generator, num_dst: int = 60, num_src: int = 150, max_degree: int = 30,
                 dst_offset: int = 0, empty_every: int = 5) -> Block:
    """Random in-degrees, every ``empty_every``-th destination without edges."""
    degree = torch.randint(0, max_degree, (num_dst,), generator=gen)
    degree[::empty_every] = 0
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), degree.cumsum(0)])
    indices = torch.randint(0, num_src, (int(degree.sum()),), generator=gen)
    return Block(num_dst, num_src, indptr, indices, dst_offset)


def leaves(gen: torch.Generator, *shapes, scale: float = 1.0) -> list[torch.Tensor]:
    return [(torch.randn(*shape, generator=gen) * scale).requires_grad_() for shape in shapes]


def softmax_and_grads(block, score_src, score_dst, edge_logits, self_loops, grad, kernels, monkeypatch):
    monkeypatch.setattr(es, "kernels", kernels)
    alpha = es.edge_softmax(block, score_src, score_dst, edge_logits, 0.2, self_loops)
    inputs = [t for t in (score_src, score_dst, edge_logits) if t is not None]
    return [alpha] + list(torch.autograd.grad((alpha * grad).sum(), inputs))


def assert_rounding(new: list[torch.Tensor], old: list[torch.Tensor], grad_scale: float) -> None:
    """The coefficients within 1e-6 relative; gradients within 1e-6 of the incoming gradient's largest value
    (a destination score's gradient sums terms that cancel to about 0: no elementwise relative bound)."""
    torch.testing.assert_close(new[0], old[0], rtol=1e-6, atol=1e-9)
    for a, b in zip(new[1:], old[1:]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * grad_scale)


@pytest.mark.parametrize("dst_offset", [0, 9])
@pytest.mark.parametrize("heads", [1, 4])
@pytest.mark.parametrize("with_edges", [False, True], ids=["scores", "edge-logits"])
@pytest.mark.parametrize("self_loops", [False, True], ids=["no-loops", "self-loops"])
def test_edge_softmax_equals_the_torch_ops(self_loops, with_edges, heads, dst_offset, monkeypatch):
    for seed in range(6):
        gen = torch.Generator().manual_seed(seed)
        block = random_block(gen, dst_offset=dst_offset)
        scale = (1.0, 5.0, 20.0)[seed % 3]  # 20: most destinations' softmax dominated by one edge
        score_src, score_dst, edge_logits = leaves(gen, (block.num_src, heads), (block.num_dst, heads),
                                                   (block.num_edges, heads), scale=scale)
        edge_logits = edge_logits if with_edges else None
        grad = torch.randn(block.num_edges + block.num_dst, heads, generator=gen)
        args = (block, score_src, score_dst, edge_logits, self_loops, grad)
        new = softmax_and_grads(*args, True, monkeypatch)
        old = softmax_and_grads(*args, False, monkeypatch)
        assert type(new[0].grad_fn).__name__ == "_EdgeSoftmaxBackward"  # the kernels, against the torch ops
        assert new[0].dtype == torch.float32 and new[0].shape == (block.num_edges + block.num_dst, heads)
        assert_rounding(new, old, float(grad.abs().max()))


def test_empty_destinations_and_blocks(monkeypatch):
    gen = torch.Generator().manual_seed(3)
    block = random_block(gen, num_dst=40, empty_every=3)
    empty = (block.in_degrees() == 0).nonzero().flatten()
    score_src, score_dst = leaves(gen, (block.num_src, 2), (block.num_dst, 2))
    grad = torch.randn(block.num_edges + block.num_dst, 2, generator=gen)
    for self_loops in (False, True):
        alpha, g_src, g_dst = softmax_and_grads(block, score_src, score_dst, None, self_loops, grad, True,
                                                monkeypatch)
        loops = alpha[block.num_edges:]
        assert torch.equal(loops[empty], torch.full((len(empty), 2), 1.0 if self_loops else 0.0))
        sums = torch.zeros(block.num_dst, 2).index_add(0, torch.repeat_interleave(
            torch.arange(block.num_dst), block.in_degrees()), alpha[:block.num_edges]) + loops
        has_inputs = (block.in_degrees() > 0) | self_loops
        torch.testing.assert_close(sums[has_inputs], torch.ones(int(has_inputs.sum()), 2))
        assert torch.equal(g_dst[empty], torch.zeros(len(empty), 2))  # a lone coefficient is always 1
    # No edges at all; no destinations at all.
    for num_dst, num_src in ((5, 7), (0, 7)):
        bare = Block(num_dst, num_src, torch.zeros(num_dst + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
        score_src, score_dst = leaves(gen, (num_src, 3), (num_dst, 3))
        for self_loops in (False, True):
            out = softmax_and_grads(bare, score_src, score_dst, None, self_loops, torch.ones(num_dst, 3), True,
                                    monkeypatch)
            assert torch.equal(out[0], torch.full((num_dst, 3), float(self_loops)))
            assert not out[1].any() and not out[2].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_scores_are_widened_to_float32(dtype, monkeypatch):
    """As under bfloat16 autocast: the softmax runs in float32 on the widened scores, its gradients come back
    in the scores' dtype."""
    gen = torch.Generator().manual_seed(5)
    block = random_block(gen)
    low = [t.detach().to(dtype).requires_grad_() for t in leaves(gen, (block.num_src, 4), (block.num_dst, 4),
                                                                   (block.num_edges, 4))]
    wide = [t.detach().float().requires_grad_() for t in low]
    grad = torch.randn(block.num_edges + block.num_dst, 4, generator=gen)
    new = softmax_and_grads(block, *low, True, grad, True, monkeypatch)
    old = softmax_and_grads(block, *wide, True, grad, False, monkeypatch)
    assert new[0].dtype == torch.float32 and all(g.dtype == dtype for g in new[1:])
    torch.testing.assert_close(new[0], old[0], rtol=1e-6, atol=1e-9)
    unit = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11  # half a unit in the last place
    for a, b in zip(new[1:], old[1:]):
        torch.testing.assert_close(a.float(), b, rtol=unit, atol=1e-6 * float(grad.abs().max()))


@pytest.mark.parametrize("with_dst", [False, True])
@pytest.mark.parametrize("att_shape", ["heads-width", "pyg"])
def test_head_scores_equal_the_torch_ops(att_shape, with_dst, monkeypatch):
    gen = torch.Generator().manual_seed(11)
    rows, heads, width, offset, num_dst = 300, 4, 16, 20, 90
    shape = (heads, width) if att_shape == "heads-width" else (1, heads, width)
    z, att_src, att_dst = leaves(gen, (rows, heads, width), shape, shape)
    grads = torch.randn(rows, heads, generator=gen), torch.randn(num_dst, heads, generator=gen)
    results = []
    for kernels in (True, False):
        monkeypatch.setattr(es, "kernels", kernels)
        score_src, score_dst = es.head_scores(z * 1.0, att_src, att_dst if with_dst else None, offset, num_dst)
        loss = (score_src * grads[0]).sum() + ((score_dst * grads[1]).sum() if with_dst else 0)
        inputs = [z, att_src] + ([att_dst] if with_dst else [])
        results.append([score_src] + ([score_dst] if with_dst else []) + list(torch.autograd.grad(loss, inputs)))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.detach().abs().max()))
    with pytest.raises(ValueError, match="beyond"):
        es.head_scores(z, att_src, att_dst, rows - 5, 10)


def test_same_bits_whatever_the_threads(monkeypatch):
    """Every value of either kernel, forward and backward, is the same with 1 thread and with all of numba's:
    each destination's, source's and chunk's sums run in one fixed order."""
    gen = torch.Generator().manual_seed(2)
    block = random_block(gen, num_dst=3000, num_src=5000, max_degree=25)  # many chunks of 64 destinations
    score_src, score_dst, edge_logits = leaves(gen, (block.num_src, 4), (block.num_dst, 4), (block.num_edges, 4))
    z, att_src, att_dst = leaves(gen, (block.num_src, 4, 8), (4, 8), (4, 8))
    grad = torch.randn(block.num_edges + block.num_dst, 4, generator=gen)
    monkeypatch.setattr(es, "kernels", True)

    def run():
        alpha = es.edge_softmax(block, score_src, score_dst, edge_logits, 0.2, self_loops=True)
        out = [alpha] + list(torch.autograd.grad((alpha * grad).sum(), [score_src, score_dst, edge_logits]))
        s_src, s_dst = es.head_scores(z, att_src, att_dst, 0, block.num_dst)
        loss = (s_src * grad[:block.num_src]).sum() + (s_dst * grad[:block.num_dst]).sum()
        return out + [s_src, s_dst] + list(torch.autograd.grad(loss, [z, att_src, att_dst]))

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run()
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = run()
    finally:
        numba.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one, many))


def layer_run(layer, call, inputs, kernels, monkeypatch, seed=0, autocast=False):
    """Output and every gradient (parameters, then inputs) of ``call(layer, inputs)``."""
    monkeypatch.setattr(es, "kernels", kernels)
    layer.zero_grad(set_to_none=True)
    for x in inputs:
        x.grad = None
    torch.manual_seed(seed)  # the same dropout masks for both paths
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = call(layer, inputs)
    out = torch.cat([o.float().flatten() for o in out.values()]) if isinstance(out, dict) else out.float()
    (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
    grads = [p.grad for p in layer.parameters() if p.grad is not None] + [x.grad for x in inputs]
    return [out.detach()] + grads


def assert_layers_agree(new, old, tolerance):
    assert len(new) == len(old)
    for a, b in zip(new, old):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance * float(b.abs().max()))


@pytest.mark.parametrize("training", [False, True], ids=["eval", "train-dropout"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_gat_layer_with_the_kernels_equals_the_torch_ops(autocast, training, monkeypatch):
    gen = torch.Generator().manual_seed(4)
    block = random_block(gen, num_dst=70, num_src=200, max_degree=12)
    block.src_ids = torch.randperm(10_000, generator=gen)[:block.num_src]  # keys the dropout masks
    torch.manual_seed(0)
    layer = GATConv(12, 16, heads=4, attention_dropout=0.4).train(training)
    (x,) = leaves(gen, (block.num_src, 12))
    new, old = (layer_run(layer, lambda m, i: m(block, i[0]), [x], k, monkeypatch, autocast=autocast)
                for k in (True, False))
    # bfloat16 products: the scores come from bfloat16 z in both paths; sums differ in float32 rounding only.
    assert_layers_agree(new, old, 1e-5)


@pytest.mark.parametrize("widths", [{"a": 6, "b": 6}, {"a": 5, "b": 7}], ids=["equal", "per-type"])
def test_rgat_layer_with_the_kernels_equals_the_torch_ops(widths, monkeypatch):
    """Relations between two types and within one (whose destinations' scores come from z's leading rows),
    edge features on one, a source frontier smaller than the destinations on another, empty destinations."""
    gen = torch.Generator().manual_seed(8)
    num_dst, num_src = {"a": 15, "b": 40}, {"a": 20, "b": 100}  # writes: 20 source rows, 40 destinations
    relations = [("a", "writes", "b"), ("b", "cites", "b"), ("b", "rev_writes", "a")]
    blocks = {r: random_block(gen, num_dst[r[2]], num_src[r[0]], 9) for r in relations}
    tblock = TypedBlock(num_dst, num_src, blocks)
    cites = relations[1]
    torch.manual_seed(0)
    layer = RGATConv(widths, 8, relations, heads=2, edge_dims={cites: 3}).train()
    x = dict(zip(widths, leaves(gen, *[(num_src[t], w) for t, w in widths.items()])))
    (attr,) = leaves(gen, (blocks[cites].num_edges, 3))
    call = lambda m, i: m(tblock, {"a": i[0], "b": i[1]}, {cites: i[2]})  # noqa: E731
    new, old = (layer_run(layer, call, [x["a"], x["b"], attr], k, monkeypatch) for k in (True, False))
    assert_layers_agree(new, old, 1e-5)
