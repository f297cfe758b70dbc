"""Quantised linear layers (triforce/models/quant.py) and their kernels (csrc/include/triforce/linear.h).

Weight-only int8 draft copies and triforce_C::rowwise_linear_q8: quantisation error bound, the kernel
against the float64 product with the dequantised weights (flash-attn's measured-error rule), bitwise row
independence, the module's two paths, int8_copy (target untouched, cached, errors) and lossless
speculative decoding with the copy as draft.

Q4_1 (a model run from its GGUF file's own weights) and triforce_C::rowwise_linear_q4_1: the blocks
dequantise exactly as gguf does, the kernel is bitwise the float32 kernel on the dequantised weight, the
module is bitwise a float32 Linear on every path, and gguf_copy of a model loaded from a GGUF computes
bitwise what the model computes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, Llama, LlamaConfig, TokenTree, gguf_copy
from triforce.models.llama import ROWWISE_MAX_ROWS, Linear, _bulk_linears, _rowwise_available
from triforce.models.quant import (GROUP, Q4_1_BLOCK_BYTES, Q4Linear, Q8Linear, dequantize_q4_1, dequantize_q8,
                                   gguf_q4_1_blocks, int8_copy, quantize_q4_1, quantize_q8)

from .helpers import assert_close_measured
from .test_config import write_gguf

needs_kernel = pytest.mark.skipif(not _rowwise_available(), reason="the C++ extension is not built")


def q8(x, q, s):
    return torch.ops.triforce_C.rowwise_linear_q8(x, q, s)


@given(N=st.integers(1, 20), K=st.integers(1, 100), seed=st.integers(0, 2**31 - 1))
@example(N=3, K=33, seed=0)  # a partial last group
def test_quantize_error_bound(N, K, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g) * torch.rand(N, 1, generator=g)
    w[0, : min(K, GROUP)] = 0  # an all-zero group: scale 1, q 0
    q, s = quantize_q8(w)
    assert q.dtype == torch.int8 and q.shape == (N, K) and s.shape == (N, -(-K // GROUP))
    assert int(q.abs().max()) <= 127
    err = (dequantize_q8(q, s) - w).abs()
    bound = s.repeat_interleave(GROUP, 1)[:, :K] * (0.5 + 1e-5)
    assert bool((err <= bound).all())
    assert s[0, 0].item() == 1.0 and not bool(q[0, : min(K, GROUP)].any())


def test_quantize_rejects_bad_input():
    for bad in (torch.randn(3), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([[1.0, float("nan")]])):
        with pytest.raises(ValueError, match="quantize_q8"):
            quantize_q8(bad)


@needs_kernel
@given(M=st.integers(0, 40), K=st.integers(0, 300), N=st.integers(0, 70), seed=st.integers(0, 2**31 - 1))
@example(M=1, K=576, N=1536, seed=0)  # SmolLM2's MLP
@example(M=5, K=33, N=7, seed=2)      # a masked tail, a partial group and a partial block
def test_kernel_matches_float64(M, K, N, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    q, s = quantize_q8(torch.randn(N, K, generator=g))
    out = q8(x, q, s)
    assert out.shape == (M, N) and out.dtype == torch.float32
    w = dequantize_q8(q, s)
    assert_close_measured(out, F.linear(x.double(), w.double()), F.linear(x, w), factor=2.0, floor=1e-5)


@needs_kernel
@given(M=st.integers(2, 40), K=st.integers(1, 200), N=st.integers(1, 40), seed=st.integers(0, 2**31 - 1))
@example(M=2 * 256 + 5, K=40, N=9, seed=6)  # three chunks of rows (kRowChunk = 256)
def test_kernel_rows_are_bitwise_independent(M, K, N, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    q, s = quantize_q8(torch.randn(N, K, generator=g))
    out = q8(x, q, s)
    for m in range(M):
        assert torch.equal(out[m], q8(x[m: m + 1], q, s)[0])


@needs_kernel
@given(M=st.integers(0, 9), K=st.integers(1, 150), N=st.integers(0, 40), group=st.sampled_from([16, 32]),
       seed=st.integers(0, 2**31 - 1))
@example(M=5, K=17, N=7, group=16, seed=1)  # a group of 16, then a masked step of 1 column in its own group
def test_kernel_is_bitwise_the_float32_kernel_on_the_dequantised_weight(M, K, N, group, seed):
    """Scales per 32 weights or per 16 (NVFP4's groups): every row count's product is bitwise ``rowwise_linear`` on
    the dequantised weight (each weight ``q * s`` exact in float32 here, one rounding in general)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    q = torch.randint(-127, 128, (N, K), generator=g, dtype=torch.int8)
    s = torch.rand(N, -(-K // group), generator=g) + 0.01
    w = q.float() * s.repeat_interleave(group, 1)[:, :K]
    if K > 16:
        assert torch.equal(dequantize_q8(q, s), w) and Q8Linear(q, s).group == group
    assert torch.equal(q8(x, q, s), torch.ops.triforce_C.rowwise_linear(x, w))


@needs_kernel
def test_kernel_errors():
    x, (q, s) = torch.randn(2, 40), quantize_q8(torch.randn(3, 40))
    with pytest.raises(RuntimeError, match="scales must be"):
        q8(x, q, s[:, :1])
    with pytest.raises(RuntimeError, match=r"scales must be \[3, 2\] \(one per 32 weights of a row\) or \[3, 3\]"):
        q8(x, q, torch.ones(3, 4))
    with pytest.raises(ValueError, match="one per 32 weights.* or .*one per 16"):
        Q8Linear(q, torch.ones(3, 4))
    with pytest.raises(RuntimeError, match="int8"):
        q8(x, q.float(), s)
    with pytest.raises(RuntimeError, match="columns"):
        q8(torch.randn(2, 41), q, s)


def test_module_paths_agree():
    torch.manual_seed(0)
    lin = torch.nn.Linear(70, 50, bias=True)
    m = Q8Linear.from_linear(lin)
    w = dequantize_q8(m.qweight, m.scales)
    for rows in (1, 3, ROWWISE_MAX_ROWS, ROWWISE_MAX_ROWS + 5):  # the kernel (F.linear past ROWWISE_MAX_ROWS in a prefill)
        x = torch.randn(rows, 70)
        torch.testing.assert_close(m(x), F.linear(x, w, lin.bias), rtol=1e-5, atol=1e-5)
    assert m(torch.randn(2, 3, 70).bfloat16()).dtype == torch.bfloat16


def tiny(seed=0, vocab=64, layers=2, bias=False):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.3, attention_bias=bias, tie_word_embeddings=not bias)
    return Llama(cfg).eval()


@pytest.mark.parametrize("bias", [False, True])
def test_int8_copy_leaves_the_target_alone(bias):
    model = tiny(bias=bias)
    ids = torch.randint(64, (2, 9))
    before = model(ids)
    copy_ = int8_copy(model)
    assert int8_copy(model) is copy_  # made once per model
    assert all(isinstance(mod, Q8Linear) for name, mod in copy_.named_modules() if name.endswith(("_proj", "lm_head")))
    assert not any(isinstance(mod, Q8Linear) for mod in model.modules())
    torch.testing.assert_close(model(ids), before, rtol=0, atol=0)
    # the copy computes the same function up to its weights' rounding
    assert (copy_(ids) - before).abs().max().item() < 0.1 * before.abs().max().item()


def test_int8_copy_rejects_other_models():
    with pytest.raises(TypeError, match="Llama"):
        int8_copy(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="float32"):
        int8_copy(tiny().to(torch.bfloat16))


@pytest.mark.parametrize("method,options", [("speculative", {"gamma": 3}),
                                            ("triforce", {"gamma1": 2, "gamma2": 5, "budget": 12, "chunk_size": 4,
                                                          "sink": 1, "window": 12})])
def test_int8_draft_is_lossless(method, options):
    model = tiny(seed=3)
    prompts = [torch.randint(64, (n,)) for n in (20, 33)]
    want = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=12)
    got = triforce.generate(model, prompts, method=method, draft=int8_copy(model), max_new_tokens=12, **options)
    assert all(torch.equal(a, b) for a, b in zip(want.tokens, got.tokens))


def test_q8_scales_stay_float32_through_a_dtype_cast():
    m = Q8Linear.from_linear(torch.nn.Linear(64, 8))
    scales = m.scales.clone()
    half = m.to(torch.bfloat16)
    assert half.scales.dtype == torch.float32 and torch.equal(half.scales, scales)
    x = torch.randn(3, 64)
    assert torch.equal(half(x.bfloat16()), m(x.bfloat16().float()).bfloat16())


# ---- Q4_1
def q4(x, blocks):
    return torch.ops.triforce_C.rowwise_linear_q4_1(x, blocks)


def random_q4_1(N, K, g, special=True):
    """Blocks with every code and, where ``special``, blocks of d = 0, subnormal d, m = 0 and positive m."""
    G = K // 32
    d16 = (torch.rand(N, G, generator=g) * 0.02).half()
    m16 = (-torch.rand(N, G, generator=g) * 0.2).half()
    if special and N * G >= 4:
        d16.view(-1)[0], d16.view(-1)[1], m16.view(-1)[2], m16.view(-1)[3] = 0.0, 1e-7, 0.0, 0.5
    q = torch.randint(0, 16, (N, G, 32), generator=g, dtype=torch.uint8)
    from triforce.models.quant import _q4_1_blocks
    return _q4_1_blocks(d16, m16, q)


@given(N=st.integers(1, 20), G=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_q4_1_dequantises_as_gguf(N, G, seed):
    import gguf

    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((N, 32 * G)) * rng.uniform(0.01, 3, (N, 1))).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q4_1)
    want = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).copy())
    blocks = gguf_q4_1_blocks(torch.from_numpy(raw.copy()))
    assert blocks.shape == (N, G * Q4_1_BLOCK_BYTES) and blocks.dtype == torch.uint8
    assert torch.equal(dequantize_q4_1(blocks, 32 * G), want)


@given(N=st.integers(1, 20), G=st.integers(1, 6), seed=st.integers(0, 2**31 - 1))
def test_quantize_q4_1_error_bound(N, G, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, 32 * G, generator=g) * torch.rand(N, 1, generator=g)
    w[0, :32] = 0.25  # a constant block: d = 0
    blocks = quantize_q4_1(w)
    wb = w.view(N, G, 32)
    lo, hi = wb.amin(-1), wb.amax(-1)
    d = blocks.view(N, G, Q4_1_BLOCK_BYTES)[..., :8].contiguous().view(torch.float32)
    # half a step, plus what float16 d and m move the grid by (m rounded, 15 steps of a rounded d)
    bound = d[..., 0] / 2 + (d[..., 1] - lo).abs() + 15 * ((hi - lo) / 15 - d[..., 0]).abs() + 1e-7
    err = (dequantize_q4_1(blocks, 32 * G) - w).view(N, G, 32).abs().amax(-1)
    assert bool((err <= bound).all())
    assert bool((dequantize_q4_1(blocks, 32 * G)[0, :32] == 0.25).all())


def test_quantize_q4_1_rejects_bad_input():
    for bad in (torch.randn(3, 33), torch.randn(64), torch.zeros(2, 32, dtype=torch.int32),
                torch.full((1, 32), float("inf")), torch.tensor([[0.0] * 31 + [1e6]])):
        with pytest.raises(ValueError, match="quantize_q4_1"):
            quantize_q4_1(bad)


@needs_kernel
@given(M=st.integers(0, 40), G=st.integers(1, 10), N=st.integers(0, 70), seed=st.integers(0, 2**31 - 1))
@example(M=1, G=18, N=1536, seed=0)  # SmolLM2's gate / up projections
@example(M=5, G=48, N=7, seed=1)     # down_proj's 1536 inputs, a partial weight block
def test_q4_1_kernel_is_the_float32_kernel_on_the_dequantised_weight(M, G, N, seed):
    g = torch.Generator().manual_seed(seed)
    K = 32 * G
    x = torch.randn(M, K, generator=g)
    blocks = random_q4_1(N, K, g)
    out = q4(x, blocks)
    assert out.shape == (M, N) and out.dtype == torch.float32
    assert torch.equal(out, torch.ops.triforce_C.rowwise_linear(x, dequantize_q4_1(blocks, K)))
    for m in range(M):  # bitwise row independence
        assert torch.equal(out[m], q4(x[m: m + 1], blocks)[0])


@needs_kernel
def test_q4_1_kernel_errors():
    x, blocks = torch.randn(2, 64), random_q4_1(3, 64, torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="multiple of the block"):
        q4(torch.randn(2, 48), blocks[:, :36])
    with pytest.raises(RuntimeError, match="48 bytes a row"):
        q4(x, blocks[:, :40])
    with pytest.raises(RuntimeError, match="uint8"):
        q4(x, blocks.view(torch.int8))
    with pytest.raises(RuntimeError, match="float32"):
        q4(x.double(), blocks)
    assert q4(torch.randn(0, 64), blocks).shape == (0, 3)


@pytest.mark.parametrize("bias", [False, True])
def test_q4_module_is_a_float32_linear_on_every_path(bias):
    g = torch.Generator().manual_seed(0)
    blocks = random_q4_1(50, 96, g)
    b = torch.randn(50, generator=g) if bias else None
    m = Q4Linear(blocks, 96, b)
    lin = Linear(96, 50, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(dequantize_q4_1(blocks, 96))
        if bias:
            lin.bias.copy_(b)
    assert torch.equal(m.weight, lin.weight)
    with torch.no_grad():
        for rows in (1, 3, ROWWISE_MAX_ROWS, ROWWISE_MAX_ROWS + 5):  # the kernel at every row count
            x = torch.randn(rows, 96, generator=g)
            assert torch.equal(m(x), lin(x))
        with _bulk_linears():  # a prefill's chunk: F.linear on both sides
            x = torch.randn(ROWWISE_MAX_ROWS + 5, 96, generator=g)
            assert torch.equal(m(x), lin(x))
    x = torch.randn(2, 96, generator=g, requires_grad=True)  # autograd: F.linear
    torch.testing.assert_close(m(x), lin(x), rtol=0, atol=0)
    assert m(torch.randn(2, 3, 96).bfloat16()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="multiple of 32"):
        Q4Linear(blocks, 95)
    with pytest.raises(ValueError, match="blocks must be uint8"):
        Q4Linear(blocks[:, :-1], 96)
    odd = blocks.clone()
    odd[0, :4] = torch.tensor([0.1], dtype=torch.float32).view(torch.uint8)  # a d that float16 cannot hold
    with pytest.raises(ValueError, match="float16 values"):
        Q4Linear(odd, 96)


def test_a_prefill_dequantises_each_layer_once(monkeypatch):
    """Within a prefill (``_bulk_linears``) a quantised layer's F.linear chunks share one dequantised weight,
    with the same results; outside, and after it, the weight is made per call (nothing is kept)."""
    from triforce.models import llama as llama_mod

    g = torch.Generator().manual_seed(0)
    m = Q4Linear(random_q4_1(40, 64, g), 64)
    made = []
    real = dequantize_q4_1
    monkeypatch.setattr("triforce.models.quant.dequantize_q4_1", lambda *a: made.append(1) or real(*a))
    x = torch.randn(3, ROWWISE_MAX_ROWS + 1, 64, generator=g)
    with torch.no_grad():
        want = [F.linear(x[i], real(m.blocks, 64)) for i in range(3)]
        with _bulk_linears():
            with _bulk_linears():  # nested: the outermost one owns the weights
                got = [m(x[i]) for i in range(3)]
            assert len(made) == 1 and len(llama_mod._BULK.weights) == 1
        assert not llama_mod._BULK.weights and all(torch.equal(a, b) for a, b in zip(got, want))
        with _bulk_linears():
            m(x[0])
        assert len(made) == 2  # a new prefill dequantises again (the blocks may have changed)
        monkeypatch.setattr(llama_mod, "BULK_WEIGHT_BYTES", 40 * 64 * 4 - 1)  # no room: made per call
        with _bulk_linears():
            assert torch.equal(m(x[0]), want[0]) and torch.equal(m(x[1]), want[1])
        assert len(made) == 4


def q4_1_gguf(tmp_path, model, name="m.gguf"):
    """``model`` written to a GGUF with its layers' matrices in Q4_1 and the embedding in Q8_0 (as the
    embedded SmolLM2's file), then loaded back as float32."""
    import gguf

    QT = gguf.GGMLQuantizationType

    def quant(name, t):
        if t.ndim != 2:
            return t, None
        qtype = QT.Q8_0 if name == "token_embd.weight" else QT.Q4_1
        return gguf.quants.quantize(t, qtype), qtype

    path = write_gguf(tmp_path / name, model, quant=quant)
    return path, Llama.from_pretrained(path, cache_dir=False)


def small_llama(seed=0, bias=False):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.3, tie_word_embeddings=True, attention_bias=bias)
    return Llama(cfg).eval()


@needs_kernel
@pytest.mark.parametrize("bias", [False, True])
def test_gguf_copy_computes_bitwise_what_the_model_computes(tmp_path, bias):
    path, model = q4_1_gguf(tmp_path, small_llama(bias=bias))
    assert (model.model.layers[0].self_attn.q_proj.bias is not None) == bias
    packed = gguf_copy(model, path)
    assert isinstance(packed.lm_head, Q8Linear)
    assert all(isinstance(m, Q4Linear) for n, m in packed.named_modules() if n.endswith("_proj"))
    assert not any(isinstance(m, (Q4Linear, Q8Linear)) for m in model.modules())  # the model is left alone
    ids = torch.randint(64, (2, 40))
    with torch.no_grad():
        assert torch.equal(packed(ids), model(ids))
        caches = [FullCache(model.config, 2, 64) for _ in range(2)]
        for T in (20, 1, 1, 5, 3):  # a prefill, one-token steps and verification passes
            step = torch.randint(64, (2, T))
            assert torch.equal(packed(step, cache=caches[0]), model(step, cache=caches[1]))
        tree = TokenTree(torch.tensor([[-1, 0, 0, 1]] * 2))
        step = torch.randint(64, (2, 4))
        assert torch.equal(packed(step, cache=caches[0], tree_parents=tree),
                           model(step, cache=caches[1], tree_parents=tree))
    prompts = [torch.randint(64, (n,)) for n in (20, 33)]
    want = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=10)
    for method, options in (("autoregressive", {}), ("speculative", {"gamma": 3}), ("tree", {})):
        got = triforce.generate(packed, prompts, method=method, max_new_tokens=10, **options)
        assert all(torch.equal(a, b) for a, b in zip(want.tokens, got.tokens)), method


def test_gguf_copy_refuses_a_model_that_is_not_the_files(tmp_path):
    path, model = q4_1_gguf(tmp_path, small_llama())
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[3, 5] += 1e-3
    with pytest.raises(ValueError, match="layers.1.mlp.up_proj"):
        gguf_copy(model, path)
    with pytest.raises(TypeError, match="Llama"):
        gguf_copy(torch.nn.Linear(2, 2), path)
    with pytest.raises(ValueError, match="float32 model on the CPU"):
        gguf_copy(small_llama().to(torch.bfloat16), path)
