"""Weight-only int8 draft copies (triforce/models/quant.py) and their kernel triforce_C::rowwise_linear_q8
(csrc/include/triforce/linear.h): quantisation error bound, the kernel against the float64 product with
the dequantised weights (flash-attn's measured-error rule), bitwise row independence, the module's two
paths, int8_copy (target untouched, cached, errors) and lossless speculative decoding with the copy as
draft."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import Llama, LlamaConfig
from triforce.models.llama import ROWWISE_MAX_ROWS, _rowwise_available
from triforce.models.quant import GROUP, Q8Linear, dequantize_q8, int8_copy, quantize_q8

from .helpers import assert_close_measured

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
def test_kernel_errors():
    x, (q, s) = torch.randn(2, 40), quantize_q8(torch.randn(3, 40))
    with pytest.raises(RuntimeError, match="scales must be"):
        q8(x, q, s[:, :1])
    with pytest.raises(RuntimeError, match="int8"):
        q8(x, q.float(), s)
    with pytest.raises(RuntimeError, match="columns"):
        q8(torch.randn(2, 41), q, s)


def test_module_paths_agree():
    torch.manual_seed(0)
    lin = torch.nn.Linear(70, 50, bias=True)
    m = Q8Linear.from_linear(lin)
    w = dequantize_q8(m.qweight, m.scales)
    for rows in (1, 3, ROWWISE_MAX_ROWS, ROWWISE_MAX_ROWS + 5):  # kernel up to ROWWISE_MAX_ROWS rows, F.linear beyond
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
