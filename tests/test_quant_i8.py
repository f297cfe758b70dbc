"""Integer dot products on GGUF blocks (csrc/include/triforce/linear_i8.h, triforce/models/quant.py):
x rounded to int8 blocks of 32, Q4_1 / Q8_0 weights, int32 sums.

The packing round-trips; triforce_C::rowwise_linear_i8 is bitwise its PyTorch reference
(rowwise_linear_i8_reference, which spells out the definition) at every row count, with rows bitwise
independent; the reference's error against the exact product stays within the bound the rounding of x
allows; Int8DotLinear computes one arithmetic on every path; gguf_copy(..., activations="int8") keeps
every engine lossless against its own autoregressive output."""
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, TokenTree, gguf_copy
from triforce.models import llama as llama_mod
from triforce.models.llama import _rowwise_available
from triforce.models.quant import (Int8DotLinear, Q4Linear, Q8Linear, pack_i8, quantize_activations_i8,
                                   rowwise_linear_i8_reference, unpack_i8)

from .test_quant import q4_1_gguf, small_llama

needs_kernel = pytest.mark.skipif(not _rowwise_available(), reason="the C++ extension is not built")


def i8(x, codes, scales):
    return torch.ops.triforce_C.rowwise_linear_i8(x, codes, scales)


def random_blocks(fmt, N, K, g):
    """(q, d, m) of random Q4_1 or Q8_0 blocks: every code, float16 scales, some d = 0 and subnormal d."""
    G = K // 32
    d = (torch.rand(N, G, generator=g) * 0.02).half().float()
    d.view(-1)[0] = 0.0
    if d.numel() > 1:
        d.view(-1)[1] = torch.tensor(1e-7).half().float()  # a float16 subnormal
    if fmt == "Q4_1":
        q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.uint8)
        m = (-torch.rand(N, G, generator=g) * 0.2).half().float()
        return q, d, m
    return torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8), d, None


def random_x(M, K, g, special):
    """x with, where ``special``, an all-zero block, a block with a value of exactly half a step (ties),
    blocks of huge and tiny magnitude and blocks of subnormal values."""
    x = torch.randn(M, K, generator=g)
    if special and M >= 1:
        x[0, :32] = 0.0
        if M >= 2:
            x[1, :32] = torch.arange(32) - 15.5  # amax 15.5: steps of 15.5 / 127, several values on ties
        if M >= 3:
            x[2] *= 1e30
        if M >= 4:
            x[3] *= 1e-30
        if M >= 5:  # subnormal inputs: dx subnormal (1 / dx would overflow), or rounded to 0
            x[4, :32] *= 1e-39
            x[4, 32:64] *= 1e-44
    return x


@given(fmt=st.sampled_from(["Q4_1", "Q8_0"]), NG=st.integers(1, 4), G=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_packing_round_trips(fmt, NG, G, seed):
    q, d, m = random_blocks(fmt, 16 * NG, 32 * G, torch.Generator().manual_seed(seed))
    codes, scales = pack_i8(q, d, m)
    assert codes.dtype == torch.uint8 and scales.dtype == torch.float16
    assert codes.shape == (NG, G * (256 if fmt == "Q4_1" else 512))
    got_fmt, q2, d2, m2 = unpack_i8(codes, scales, 32 * G)
    assert got_fmt == fmt and torch.equal(q2, q.long()) and torch.equal(d2, d)
    assert (m2 is None) if m is None else torch.equal(m2, m)


def test_packing_refuses_bad_blocks():
    g = torch.Generator().manual_seed(0)
    q, d, m = random_blocks("Q4_1", 16, 64, g)
    with pytest.raises(ValueError, match="multiple of 16"):
        pack_i8(q[:8], d[:8], m[:8])
    with pytest.raises(ValueError, match="multiple of 32"):
        pack_i8(q[:, :48], d, m)
    with pytest.raises(ValueError, match="0..15"):
        pack_i8(q | 16, d, m)
    with pytest.raises(ValueError, match="float16 values"):
        pack_i8(q, d + 1e-9, m)
    with pytest.raises(ValueError, match="int8"):
        pack_i8(q, d)
    with pytest.raises(ValueError, match="not packed"):
        unpack_i8(*pack_i8(q, d, m), 96)


def test_activation_rounding_follows_the_definition():
    """dx = amax / 127, q = round half to even of x / dx, an all-zero block q = 0 and dx = 0, a block with
    inf or NaN dx = NaN and q = 0, sx the sum of q; subnormal inputs still round to the full range."""
    x = torch.zeros(5, 32)
    x[4] = (torch.arange(32) - 15.5) * 1e-40
    x[1] = torch.arange(32) - 15.5
    x[2, 0], x[3, 5] = float("inf"), float("nan")
    q, dx, sx = quantize_activations_i8(x)
    assert dx[0, 0] == 0 and not q[0].any()
    d = torch.tensor(15.5) / 127
    want = torch.round((torch.arange(32) - 15.5) / d).long()
    assert dx[1, 0] == d and torch.equal(q[1, 0], want) and sx[1, 0] == want.sum()
    assert want.abs().max() == 127
    assert torch.isnan(dx[2:4, 0]).all() and not q[2:4].any()
    assert 0 < dx[4, 0] < torch.finfo(torch.float32).tiny and q[4, 0].abs().max() == 127


@needs_kernel
@given(fmt=st.sampled_from(["Q4_1", "Q8_0"]), M=st.integers(0, 11), G=st.integers(1, 6), NG=st.integers(1, 3),
       seed=st.integers(0, 2**31 - 1), special=st.booleans())
@example(fmt="Q4_1", M=5, G=18, NG=96, seed=0, special=True)  # SmolLM2's gate / up projections, a 5-token pass
@example(fmt="Q8_0", M=3, G=18, NG=4, seed=1, special=True)
def test_kernel_is_the_reference_bitwise(fmt, M, G, NG, seed, special):
    g = torch.Generator().manual_seed(seed)
    K = 32 * G
    codes, scales = pack_i8(*random_blocks(fmt, 16 * NG, K, g))
    x = random_x(M, K, g, special)
    out = i8(x, codes, scales)
    assert out.shape == (M, 16 * NG) and out.dtype == torch.float32
    assert torch.equal(out, rowwise_linear_i8_reference(x, codes, scales))
    for m in range(M):  # bitwise row independence
        assert torch.equal(out[m], i8(x[m: m + 1], codes, scales)[0])


@needs_kernel
def test_a_block_with_inf_or_nan_makes_its_rows_nan():
    g = torch.Generator().manual_seed(0)
    for fmt in ("Q4_1", "Q8_0"):
        q, d, m = random_blocks(fmt, 32, 96, g)
        d.fill_(float(torch.tensor(0.01).half()))
        codes, scales = pack_i8(q, d, m)
        x = torch.randn(4, 96, generator=g)
        x[1, 40], x[2, 3] = float("inf"), float("nan")
        out = i8(x, codes, scales)
        assert torch.isnan(out[1:3]).all() and torch.isfinite(out[[0, 3]]).all()
        torch.testing.assert_close(out, rowwise_linear_i8_reference(x, codes, scales), rtol=0, atol=0, equal_nan=True)


@given(fmt=st.sampled_from(["Q4_1", "Q8_0"]), M=st.integers(1, 6), G=st.integers(1, 8), seed=st.integers(0, 2**31 - 1))
def test_reference_error_is_bounded_by_the_rounding_of_x(fmt, M, G, seed):
    """|y - x W^T| <= sum over blocks of dx / 2 * sum |W| (each x moves by at most half a step), plus the
    float32 rounding of the block sums (a relative 1e-5 of |x| |W|^T)."""
    g = torch.Generator().manual_seed(seed)
    K = 32 * G
    q, d, m = random_blocks(fmt, 16, K, g)
    codes, scales = pack_i8(q, d, m)
    w = unpack_i8(codes, scales, K)
    W = (w[1].double().view(16, G, 32) * w[2].double()[..., None]
         + (0 if m is None else w[3].double()[..., None])).view(16, K)
    x = torch.randn(M, K, generator=g)
    _, dx, _ = quantize_activations_i8(x)
    bound = (dx.double()[:, None, :] / 2 * W.abs().view(16, G, 32).sum(-1)[None]).sum(-1)
    exact = x.double() @ W.T
    slack = 1e-5 * (x.double().abs() @ W.abs().T) + 1e-30
    err = (rowwise_linear_i8_reference(x, codes, scales).double() - exact).abs()
    assert (err <= bound + slack).all(), (err - bound).max()


@needs_kernel
def test_kernel_errors():
    g = torch.Generator().manual_seed(0)
    codes, scales = pack_i8(*random_blocks("Q4_1", 16, 64, g))
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="multiple of the block"):
        i8(torch.randn(2, 48), codes, scales)
    with pytest.raises(RuntimeError, match="Q8_0"):
        i8(x, codes[:, :-1], scales)
    with pytest.raises(RuntimeError, match="float16"):
        i8(x, codes, scales.float())
    with pytest.raises(RuntimeError, match="float32"):
        i8(x.double(), codes, scales)
    with pytest.raises(RuntimeError, match="groups"):
        i8(x, codes, torch.cat([scales, scales]))
    assert i8(torch.randn(0, 64), codes, scales).shape == (0, 16)


@pytest.mark.parametrize("fmt", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("bias", [False, True])
def test_module_is_one_arithmetic_on_every_path(fmt, bias, monkeypatch):
    """The kernel and the reference (no kernel) give the same bits, the bias added after; other float
    inputs are computed in float32; a dtype cast keeps the float16 scales; the weight dequantises as gguf."""
    from triforce.models import quant

    g = torch.Generator().manual_seed(0)
    q, d, m = random_blocks(fmt, 48, 96, g)
    b = torch.randn(48, generator=g) if bias else None
    mod = Int8DotLinear(*pack_i8(q, d, m), 96, b)
    assert mod.out_features == 48 and mod.format == fmt
    W = q.float().view(48, 3, 32) * d[..., None] + (0 if m is None else m[..., None])
    assert torch.equal(mod.weight, W.view(48, 96))
    x = torch.randn(2, 7, 96, generator=g)
    want = rowwise_linear_i8_reference(x.view(-1, 96), mod.codes, mod.scales).view(2, 7, 48)
    if bias:
        want = want + b
    if _rowwise_available():
        assert torch.equal(mod(x), want)
    monkeypatch.setitem(quant._KERNELS, "rowwise_linear_i8", False)
    assert torch.equal(mod(x), want)
    assert mod(x.bfloat16()).dtype == torch.bfloat16
    assert mod.fused_projection(torch.float32) is None  # no kernel: not on the fused layer either
    mod.to(torch.bfloat16)
    assert mod.scales.dtype == torch.float16


@needs_kernel
def test_from_the_float_modules_keeps_the_blocks():
    g = torch.Generator().manual_seed(0)
    q, d, m = random_blocks("Q4_1", 32, 64, g)
    from triforce.models.quant import _q4_1_blocks
    q4 = Q4Linear(_q4_1_blocks(d.half(), m.half(), q.view(32, 2, 32)), 64)
    assert torch.equal(Int8DotLinear.from_q4(q4).weight, q4.weight)
    q8, d8, _ = random_blocks("Q8_0", 32, 64, g)
    lin = Q8Linear(q8, d8)
    assert torch.equal(Int8DotLinear.from_q8(lin).weight, lin.weight)


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_gguf_copy_with_int8_activations(tmp_path, bias):
    """Every projection and the tied head become Int8DotLinear; a pass of T tokens gives the logits of T
    one-token steps bitwise (fused layer or modules alike), and every engine emits the copy's own
    autoregressive tokens."""
    path, model = q4_1_gguf(tmp_path, small_llama(bias=bias))
    fast = gguf_copy(model, path, activations="int8")
    assert isinstance(fast.lm_head, Int8DotLinear) and fast.lm_head.format == "Q8_0"
    assert all(isinstance(m, Int8DotLinear) and m.format == "Q4_1" for n, m in fast.named_modules()
               if n.endswith("_proj"))
    with pytest.raises(ValueError, match="activations"):
        gguf_copy(model, path, activations="int4")
    ids = torch.randint(64, (2, 30))
    with torch.no_grad():
        ref = fast(ids)
        assert (ref - model(ids)).abs().max() < 0.1 * model(ids).abs().max()  # close to the float model
        for fused in (True, False):
            llama_mod._FUSED = fused
            try:
                caches = [FullCache(model.config, 2, 64) for _ in range(2)]
                fast(ids[:, :20], cache=caches[0])
                fast(ids[:, :20], cache=caches[1])
                steps = torch.cat([fast(ids[:, 20 + t: 21 + t], cache=caches[0]) for t in range(5)], 1)
                assert torch.equal(fast(ids[:, 20:25], cache=caches[1]), steps)
                tree = TokenTree(torch.tensor([[-1, 0, 1, 2, 3]] * 2))  # a chain: the causal pass
                caches[1].rollback(caches[1].lengths - 5)
                assert torch.equal(fast(ids[:, 20:25], cache=caches[1], tree_parents=tree), steps)
            finally:
                llama_mod._FUSED = None
    prompts = [torch.randint(64, (n,)) for n in (20, 33)]
    want = triforce.generate(fast, prompts, method="autoregressive", max_new_tokens=10)
    for method, options in (("speculative", {"gamma": 3}), ("tree", {}),
                            ("magicdec", {"gamma": 2, "draft_cache": "retrieval", "budget": 12, "chunk_size": 4})):
        got = triforce.generate(fast, prompts, method=method, max_new_tokens=10, **options)
        assert all(torch.equal(a, b) for a, b in zip(want.tokens, got.tokens)), method
