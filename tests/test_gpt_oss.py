"""GPT-OSS (``model_type="gpt_oss"``: gpt-oss-20b, gpt-oss-120b): attention sinks (a learned logit per query head in
each softmax), q/k/v/o biases, every other layer sliding, YaRN RoPE, RMSNorm's weight in float32, and every layer a
mixture whose router and experts have biases and whose experts run a clamped SwiGLU; against transformers'
GptOssForCausalLM on the same weights, and its MXFP4 checkpoints dequantised as transformers dequantises them."""
import json

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, Llama, LlamaConfig
from triforce.models.loading import _FP4_VALUES, _build, dequantize_mxfp4

from triforce.models.llama import SparseMoE, _bulk_linears, _clamped_swiglu, _clamped_swiglu_ops

from .llama_cpp_oracle import rewrite_gguf
from .test_decoder import ulps_apart
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_
from .test_model import TOL
from .test_moe import assert_checkpoint_directories_both_ways, module_by_module, needs_op
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# 2 of 4 experts 40 wide, head_dim 16 (not hidden / heads), a window of 7 on layers 0 and 2 (GptOssConfig's pattern)
GPT_OSS = dict(TINY, num_local_experts=4, num_experts_per_tok=2, intermediate_size=40, head_dim=16,
               num_hidden_layers=3, sliding_window=7)
CASES = {
    "default": GPT_OSS,
    # a limit that clamps most gates and ups, another alpha, no attention biases, the windows where layer_types say
    "clamped": dict(GPT_OSS, swiglu_limit=0.3, swiglu_alpha=2.5, attention_bias=False,
                    layer_types=["full_attention", "sliding_attention", "sliding_attention"]),
}


def pair(case="default", **kw):
    """transformers' GptOssForCausalLM of ``case`` (eager attention; biases and norms random, sinks ~ N(0, 1.5):
    they matter; decisive routers: a rounding difference cannot swap a token's experts) and ours on its weights."""
    torch.manual_seed(0)
    config = transformers.GptOssConfig(**{**CASES[case], **kw}, attn_implementation="eager")
    hf = randomize_(transformers.GptOssForCausalLM(config).eval())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("sinks"):
                p.copy_(torch.randn(p.shape, generator=g) * 1.5)
            elif n.endswith("mlp.router.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif n.endswith(("experts.gate_up_proj", "experts.down_proj")):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree (windows of 7 over 40 tokens) give
    transformers' logits; the windows and the mixture are where transformers has them."""
    hf, ours = pair(case)
    c = ours.config
    assert c.layer_windows == ((7, 0, 7) if case == "default" else (0, 7, 7))
    assert c.experts.biases and c.experts.softmax_of_top_k and c.swiglu_clamp == (hf.config.swiglu_alpha,
                                                                                 hf.config.swiglu_limit)
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "truncate": False, "original_max_position_embeddings": 4096}
    assert_every_path_matches(hf, ours)


def test_the_sinks_the_clamp_and_the_float32_norms_matter():
    """Each of GPT-OSS's own steps moves the logits by more than ten times the tolerance, so the tests above would
    see it missing (the clamp: most gates and ups past its limit); its RMSNorm gives transformers' bits in
    bfloat16, which Llama's (the weight applied after rounding) does not."""
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(2))
    hf, ours = pair("clamped")
    experts = [e for layer in ours.model.layers for e in layer.mlp.experts]
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        seen = []
        hooks = [e.gate_up_proj.register_forward_hook(lambda m, a, out: seen.append(out.flatten())) for e in experts]
        ours(ids)
        for h in hooks:
            h.remove()
        assert (torch.cat(seen).abs() > 0.3).float().mean().item() > 0.5
        for e in experts:
            e.swiglu_clamp = (e.swiglu_clamp[0], 1e9)
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL
        hf, ours = pair()
        ref = hf(ids).logits
        for layer in ours.model.layers:
            layer.self_attn.sinks = None
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL
        x = torch.randn(64, 64, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
        theirs, mine = hf.model.layers[0].input_layernorm, ours.model.layers[0].input_layernorm
        theirs, mine = theirs.to(torch.bfloat16), mine.to(torch.bfloat16)
        assert type(mine) is triforce.models.llama.Float32RMSNorm and torch.equal(mine(x), theirs(x))
        assert not torch.equal(triforce.models.llama.RMSNorm.forward(mine, x), theirs(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    """On the CPU a 10-token verify pass gives bitwise the logits of ten one-token steps (the sink factors, the
    clamped SwiGLU's sigmoid, the router with its bias: each row's bits its own)."""
    for case in CASES:
        assert_pass_equals_steps(pair(case)[1], dtype)


def test_a_row_that_sees_nothing_stays_zero_and_the_sinks_scale_the_rest():
    """The cache's sink factor: each query's output times sigmoid(lse - sink); a row that sees no key (its lse
    -inf) stays 0, not NaN."""
    from triforce.models.cache import Step, attention

    g = torch.Generator().manual_seed(0)
    B, T, N, H, D = 2, 3, 8, 4, 16
    q, k, v = (torch.randn(B, n, H, D, generator=g) for n in (T, N, N))
    seqlens = torch.tensor([5, 3], dtype=torch.int32)
    mask = torch.ones(B, T, T, dtype=torch.bool)
    mask[1] = False  # row 1's new tokens see no new token: its queries see its 0 prefix keys, nothing
    step = Step(T, None, None, None, seqlens, None, mask, None, None)
    sinks = torch.randn(H, generator=g)
    out = attention(q, k, v, step, 0, D ** -0.5, 0.0, sinks)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    from triforce_kernels.verify_attention import verify_attention_trusted
    plain, lse = verify_attention_trusted(q, k, v, seqlens, mask, scale=D ** -0.5, return_lse=True)
    want = plain * torch.sigmoid(lse - sinks[:, None]).transpose(1, 2)[..., None]
    assert torch.allclose(out[0], want[0], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_row_sigmoid_gives_each_value_its_own_bits(dtype):
    """``_row_sigmoid`` (the sink factors, the clamped SwiGLU's sigmoid, Qwen2-MoE's gate): every value the bits it
    has alone, in tensors of any shape, also past one slice (16384 values) and past ATen's parallel grain, where
    ``torch.sigmoid`` gives some values other bits."""
    from triforce.models.llama import _row_sigmoid

    z = (torch.randn(40000, generator=torch.Generator().manual_seed(8)) * 6).to(dtype)
    alone = torch.cat([_row_sigmoid(z[i:i + 1]) for i in range(0, 40000, 97)])
    for shape in ((40000,), (400, 100), (8, 5000), (2, 4, 5000), (40000, 1)):
        got = _row_sigmoid(z.view(shape)).reshape(-1)
        assert got.dtype == dtype and torch.equal(got[::97], alone)
    for n in (1, 31, 33, 65, 16385, 33000):
        assert torch.equal(_row_sigmoid(z[:n]), _row_sigmoid(z)[:n])
    if dtype == torch.float32:  # (what it guards against)
        assert not torch.equal(torch.sigmoid(z[:600]), torch.cat([torch.sigmoid(z[i:i + 1]) for i in range(600)]))


# ---- the experts' clamped SwiGLU on the CPU: triforce_C::swiglu_clamped_mul (csrc/include/triforce/glu.h)

needs_swiglu = pytest.mark.skipif(not hasattr(torch.ops.triforce_C, "swiglu_clamped_mul"),
                                  reason="the C++ extension is not built")


@needs_swiglu
@given(rows=st.integers(1, 40), width=st.sampled_from([1, 15, 33, 81, 2880]), threads=st.sampled_from([1, 3]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), alpha=st.sampled_from([1.702, 0.5, 4.0]),
       limit=st.sampled_from([7.0, 0.3, 1.0]), seed=st.integers(0, 2**16))
def test_clamped_swiglu_rows_are_independent(rows, width, threads, dtype, alpha, limit, seed):
    """Each row of the clamped SwiGLU has the bits it has alone, whatever the width and the threads (PyTorch's
    sigmoid does not promise that); every value within a few ulp of PyTorch's ops' (the sigmoid's e^t is not
    Sleef's: float32 2 ulp from the exact value, so 16-bit outputs at most one rounding apart per step), and the
    model's activation is the op on the CPU."""
    g = torch.Generator().manual_seed(seed)
    gate = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    up = (torch.randn(rows, width, generator=g) * 3).to(dtype)
    op, saved = torch.ops.triforce_C.swiglu_clamped_mul, torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        out = op(gate, up, alpha, limit)
        alone = [op(gate[r:r + 1], up[r:r + 1], alpha, limit) for r in range(rows)]
    finally:
        torch.set_num_threads(saved)
    assert out.dtype == dtype and out.shape == gate.shape
    assert torch.equal(out, torch.cat(alone))
    assert torch.equal(_clamped_swiglu(gate, up, alpha, limit), out)
    ref = _clamped_swiglu_ops(gate, up, alpha, limit)
    assert (ulps_apart(out, ref, dtype) <= (8 if dtype == torch.float32 else 3)).all()


@needs_swiglu
def test_clamped_swiglu_special_values_gradients_and_checks():
    """NaN, infinities, values at and past the limit as PyTorch's ops give them (NaN where they give NaN, zeros of
    their sign); under autograd the op's forward bits and the gradients of PyTorch's ops; bad arguments raise."""
    op = torch.ops.triforce_C.swiglu_clamped_mul
    specials = [0.0, -0.0, 1.0, -1.0, 7.0, 7.5, -7.5, 100.0, -100.0, 1e30, -1e30, float("inf"), float("-inf"),
                float("nan")]
    gate, up = torch.tensor(specials).repeat_interleave(14), torch.tensor(specials).repeat(14)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for alpha, limit in ((1.702, 7.0), (0.5, 0.3)):
            got = op(gate.to(dtype), up.to(dtype), alpha, limit)
            want = _clamped_swiglu_ops(gate.to(dtype), up.to(dtype), alpha, limit)
            assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
            finite = want.isfinite()
            assert torch.allclose(got[finite].float(), want[finite].float(), rtol=1e-2, atol=0)
            assert torch.equal(got[want == 0].signbit(), want[want == 0].signbit())
    gen = torch.Generator().manual_seed(0)
    gate = (torch.randn(5, 33, generator=gen) * 4).requires_grad_()
    up = (torch.randn(5, 33, generator=gen) * 4).requires_grad_()
    out = op(gate, up, 1.702, 2.0)
    with torch.no_grad():
        assert torch.equal(out, op(gate, up, 1.702, 2.0))
    weights = torch.randn(5, 33, generator=gen)
    (out * weights).sum().backward()
    mine = gate.grad.clone(), up.grad.clone()
    gate.grad = up.grad = None
    (_clamped_swiglu_ops(gate, up, 1.702, 2.0) * weights).sum().backward()
    assert torch.allclose(mine[0], gate.grad, rtol=1e-5, atol=1e-6) and torch.allclose(mine[1], up.grad, rtol=1e-5,
                                                                                       atol=1e-6)
    assert (up.grad == 0).any() and (gate.grad == 0).any()  # (the clamps cut some gradients)
    x = torch.randn(3, 5, 7).transpose(0, 2)
    assert torch.equal(op(x, x, 1.0, 1.0), op(x.contiguous(), x.contiguous(), 1.0, 1.0))
    assert op(torch.empty(0, 16), torch.empty(0, 16), 1.0, 1.0).shape == (0, 16)
    torch.library.opcheck(op, (torch.randn(4, 33), torch.randn(4, 33), 1.702, 7.0))
    for args, message in (((torch.zeros(2, 8), torch.zeros(2, 9), 1.0, 1.0), "one shape"),
                          ((torch.zeros(2, 8), torch.zeros(2, 8).half(), 1.0, 1.0), "one dtype"),
                          ((torch.zeros(2, 8), torch.zeros(2, 8), 1.0, 0.0), "limit finite and > 0"),
                          ((torch.zeros(2, 8), torch.zeros(2, 8), float("inf"), 1.0), "alpha must be finite"),
                          ((torch.zeros(2, 8), torch.zeros(2, 8), 1.0, float("nan")), "limit finite")):
        with pytest.raises(RuntimeError, match=message):
            op(*args)


@needs_op
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_sparse_layer_takes_moe_experts_with_the_bits_of_its_modules(dtype, monkeypatch):
    """GPT-OSS's sparse MLP (router and expert biases, the clamped SwiGLU) runs its experts in one moe_experts call
    for a step, a pass and 200 rows outside a prefill, in a prefill while no expert has more than 128 rows, with
    the bits of its experts run module by module; experts whose clamps differ run module by module."""
    model = pair("clamped")[1].to(dtype)
    moe = model.model.layers[0].mlp
    assert type(moe) is SparseMoE
    calls = []
    real = torch.ops.triforce_C.moe_experts
    monkeypatch.setattr(torch.ops.triforce_C, "moe_experts",
                        lambda *a, **kw: calls.append((a[0].shape[0], kw)) or real(*a, **kw), raising=False)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for n in (1, 5, 200):
            rows = torch.randn(n, model.config.hidden_size, generator=g).to(dtype)
            assert torch.equal(moe(rows[None])[0], module_by_module(moe, rows))
            assert calls[-1] == (n, {"swiglu_alpha": 2.5, "swiglu_limit": 0.3})
        with _bulk_linears():
            rows = torch.randn(100, model.config.hidden_size, generator=g).to(dtype)
            assert torch.equal(moe(rows[None])[0], module_by_module(moe, rows))
            assert calls[-1][0] == 100
        calls.clear()
        moe.experts[1].swiglu_clamp = (2.5, 0.4)
        rows = torch.randn(50, model.config.hidden_size, generator=g).to(dtype)
        assert torch.equal(moe(rows[None])[0], module_by_module(moe, rows)) and calls == []


def tiny_gpt_oss(seed):
    torch.manual_seed(seed)
    config = LlamaConfig(model_type="gpt_oss", vocab_size=64, hidden_size=32, intermediate_size=24,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=1024, initializer_range=0.3, attention_bias=True,
                         extra=dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=9, swiglu_limit=1.0))
    model = randomize_(Llama(config), seed).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(0, 1.5)
    return model


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_gpt_oss(0), tiny_gpt_oss(1), method, opts)


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved (the experts stacked, transposed, gate and up interleaved; the router with
    its bias; the sinks) loads with transformers' logits; ours saves the same names and tensors, which
    transformers reads back as the same model."""
    assert_checkpoint_directories_both_ways(tmp_path, pair()[0])


def test_mxfp4_dequantises_as_transformers():
    """Every code under every scale (0: subnormals; 255: past float32's range but for codes +-0.5), in bfloat16,
    bitwise transformers' float32 dequantisation."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    # [1 expert, 256 rows, 16 groups, 16 bytes]: row r holds every byte value, each group under scale r
    blocks = torch.arange(256, dtype=torch.uint8).repeat(256).view(1, 256, 16, 16)
    scales = torch.arange(256, dtype=torch.uint8)[None, :, None].expand(1, 256, 16).contiguous()
    ours = dequantize_mxfp4(blocks, scales)  # [1, rows, K], bfloat16: every value exact
    assert ours.dtype == torch.bfloat16
    ours = ours.float()
    ref = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2)
    assert ours.shape == ref.shape == (1, 256, 512)
    assert torch.equal(ours.isinf(), ref.isinf()) and torch.equal(ours[~ours.isinf()], ref[~ref.isinf()])
    assert torch.equal(torch.signbit(ours), torch.signbit(ref))
    # byte 0x2B of row 127 (scale 1): weights 11 (its low nibble) and 2 (its high one)
    assert ours[0, 127, 0x2B * 2].item() == _FP4_VALUES[0xB] and ours[0, 127, 0x2B * 2 + 1].item() == _FP4_VALUES[2]
    with pytest.raises(ValueError, match="MXFP4 blocks"):
        dequantize_mxfp4(blocks.int(), scales)


def assert_experts_on_their_mxfp4_blocks(model, plain):
    """Every expert projection of ``model`` an Int8DotLinear of the MXFP4 form (17 bytes per 32 weights, as the file
    holds them) with the weight of ``plain`` (the float model) bitwise, and its bias."""
    from triforce.models.quant import Int8DotLinear

    for layer, float_layer in zip(model.model.layers, plain.model.layers):
        for expert, float_expert in zip(layer.mlp.experts, float_layer.mlp.experts):
            for name in ("gate_up_proj", "down_proj"):
                lin, ref = getattr(expert, name), getattr(float_expert, name)
                assert type(lin) is Int8DotLinear and lin.format == "MXFP4"
                assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
                assert lin.codes.nbytes + lin.scales.nbytes == ref.weight.numel() * 17 // 32


def assert_one_moe_experts_call(moe, monkeypatch) -> dict:
    """``moe`` (a sparse layer) on 6 random rows runs its experts in one ``moe_experts`` call with the bits of its
    modules; -> that call's keywords."""
    rows, calls = torch.randn(6, moe.gate.in_features), []
    real = torch.ops.triforce_C.moe_experts
    monkeypatch.setattr(torch.ops.triforce_C, "moe_experts",
                        lambda *a, **kw: calls.append(kw) or real(*a, **kw), raising=False)
    with torch.no_grad():
        assert torch.equal(moe(rows[None])[0], module_by_module(moe, rows))
    assert len(calls) == 1
    return calls[0]


def mxfp4_checkpoint(directory):
    """(transformers' model, the directory): a checkpoint as OpenAI ships gpt-oss (quantization_config mxfp4; the
    experts' weights as random *_blocks and *_scales) written to ``directory``, transformers' model holding its
    dequantised weights; and the checkpoint's state dict."""
    from safetensors.torch import save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf, _ = pair(intermediate_size=64)  # (MXFP4 blocks: 32 inputs each)
    g = torch.Generator().manual_seed(7)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    c = hf.config
    with torch.no_grad():
        for i in range(c.num_hidden_layers):
            stem = f"model.layers.{i}.mlp.experts"
            for name, rows, K in (("gate_up_proj", 2 * c.intermediate_size, c.hidden_size),
                                  ("down_proj", c.hidden_size, c.intermediate_size)):
                blocks = torch.randint(0, 256, (c.num_local_experts, rows, K // 32, 16), generator=g,
                                       dtype=torch.uint8)
                scales = torch.randint(122, 128, (c.num_local_experts, rows, K // 32), generator=g,
                                       dtype=torch.uint8)
                del sd[f"{stem}.{name}"]
                sd[f"{stem}.{name}_blocks"], sd[f"{stem}.{name}_scales"] = blocks, scales
                getattr(hf.model.layers[i].mlp.experts, name).copy_(
                    convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
    directory.mkdir()
    save_file(sd, directory / "model.safetensors")
    cfg = {**c.to_dict(), "quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}}
    (directory / "config.json").write_text(json.dumps(cfg))
    return hf, sd


def test_an_mxfp4_checkpoint_loads_dequantised(tmp_path):
    """A checkpoint as OpenAI ships gpt-oss (quantization_config mxfp4; the experts' weights as *_blocks and
    *_scales) loads with the logits of transformers' model holding the dequantised weights."""
    from safetensors.torch import save_file

    hf, sd = mxfp4_checkpoint(tmp_path / "ckpt")
    ours = Llama.from_pretrained(tmp_path / "ckpt")
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= TOL
    assert "quantization_config" not in ours.config.to_dict()  # what it saves is float
    del sd["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(sd, tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(ValueError, match="down_proj_scales"):
        Llama.from_pretrained(tmp_path / "ckpt")


@needs_op
def test_an_mxfp4_checkpoint_runs_on_its_blocks(tmp_path, monkeypatch):
    """``load_mxfp4_int8`` (``load_model(directory, "gguf-int8")``) runs an MXFP4 checkpoint's experts on their
    blocks: each an Int8DotLinear of the MXFP4 form (17 bytes per 32 weights) with its bias, its weight the
    dequantised checkpoint's bitwise, gate and up rows de-interleaved; a sparse layer runs them in one
    ``moe_experts`` call with the bits of its modules; the logits within int8 rounding of the float model's;
    speculative decoding keeps autoregressive decoding's tokens; a checkpoint without MXFP4 or a missing scale
    raises."""
    from safetensors.torch import save_file

    from triforce.models import hub
    from triforce.models.quant import load_mxfp4_int8

    _, sd = mxfp4_checkpoint(tmp_path / "ckpt")
    model, _ = hub.load_model(str(tmp_path / "ckpt"), "gguf-int8")
    plain = Llama.from_pretrained(tmp_path / "ckpt")
    assert_experts_on_their_mxfp4_blocks(model, plain)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = plain(ids)
        err = (model(ids) - want).abs().max().item()
        assert 0 < err < 0.1 * want.abs().max().item()  # (the rows are rounded to int8 blocks)
        assert_one_moe_experts_call(model.model.layers[2].mlp, monkeypatch)
    prompts = [ids[0, :9], ids[1, :17]]
    ref = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=12)
    out = triforce.generate(model, prompts, method="speculative", gamma=3, draft_layers=1, max_new_tokens=12)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))
    plain.save_pretrained(tmp_path / "float")  # (no quantization_config)
    for directory in (tmp_path / "float", tmp_path / "missing"):
        with pytest.raises(ValueError, match="not a GGUF file"):
            hub.load_model(str(directory), "gguf-int8")
        with pytest.raises(ValueError, match="quantization_config mxfp4"):
            load_mxfp4_int8(directory)
    del sd["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(sd, tmp_path / "ckpt" / "model.safetensors")
    with pytest.raises(ValueError, match="down_proj_blocks and _scales"):
        load_mxfp4_int8(tmp_path / "ckpt")


_GGUF_YARN = {"rope.scaling.type": "yarn", "rope.scaling.factor": 32.0, "rope.scaling.original_context_length": 4096}


@pytest.mark.parametrize("experts", ["F32", "MXFP4"])
def test_gguf_file_as_llama_cpp_writes_and_runs_it(tmp_path, experts):
    """A gpt-oss GGUF file as llama.cpp's converter writes it (the sinks as attn_sinks, the norm before the MLP as
    post_attention_norm, the router's and the experts' biases, the experts stacked: float32, or MXFP4 blocks as
    OpenAI's checkpoints hold them) loads as llama.cpp runs it: the window on every other layer from the first,
    the clamped SwiGLU's defaults, YaRN with its ramp ends rounded outwards (``truncate``); with float32 experts the
    logits of our model on the same weights, bitwise; with MXFP4 ones those of our model on the blocks'
    dequantised weights; speculative decoding on it keeps autoregressive decoding's tokens."""
    import gguf

    from .test_config import write_gguf

    _, ours = pair(intermediate_size=64)  # (MXFP4: blocks of 32 inputs)
    mxfp4 = {}

    def quant(name, a):
        if experts == "MXFP4" and name.endswith("_exps.weight"):
            mxfp4[name] = gguf.quants.quantize(a, gguf.GGMLQuantizationType.MXFP4)
            return mxfp4[name], gguf.GGMLQuantizationType.MXFP4
        return a, None

    path = write_gguf(tmp_path / "g.gguf", ours, _GGUF_YARN, quant=quant)
    loaded = Llama.from_pretrained(path, cache_dir=tmp_path / "cache")
    c = loaded.config
    assert c.model_type == "gpt_oss" and c.layer_windows == (7, 0, 7) and c.swiglu_clamp == (1.702, 7.0)
    assert c.experts.count == 4 and c.experts.top_k == 2 and c.experts.biases and c.intermediate_size == 64
    assert c.rope_scaling == {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}
    want = Llama(c).eval()  # ours as llama.cpp runs it: its RoPE's truncate (the file has no such key)
    state = ours.state_dict()
    with torch.no_grad():
        for i, layer in enumerate(want.model.layers):
            for e, expert in enumerate(layer.mlp.experts):
                for name, gguf_name in (("gate_up_proj", None), ("down_proj", "down")):
                    key = f"model.layers.{i}.mlp.experts.{e}.{name}.weight"
                    if experts == "MXFP4":
                        parts = [gguf.quants.dequantize(mxfp4[f"blk.{i}.ffn_{k}_exps.weight"],
                                                        gguf.GGMLQuantizationType.MXFP4)[e]
                                 for k in (("gate", "up") if gguf_name is None else ("down",))]
                        state[key] = torch.from_numpy(np.concatenate(parts)).float()
    want.load_state_dict(state)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids), want(ids))
        assert not torch.equal(loaded.inv_freq, ours.inv_freq)  # (transformers' truncate false: another RoPE)
    for t in loaded.state_dict().values():
        assert torch.isfinite(t).all()
    # the conversion cache is transformers' layout: transformers reads it as the same model
    back = transformers.GptOssForCausalLM.from_pretrained(next((tmp_path / "cache").rglob("config.json")).parent,
                                                          attn_implementation="eager").eval()
    assert back.config.rope_parameters.get("truncate", True) is True
    with torch.no_grad():
        assert (back(ids).logits - loaded(ids)).abs().max().item() <= TOL
    prompts = [ids[0, :9], ids[1, :17]]
    ref = triforce.generate(loaded, prompts, method="autoregressive", max_new_tokens=12)
    out = triforce.generate(loaded, prompts, method="speculative", gamma=3, max_new_tokens=12)
    assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens))


def _fuse_gate_up(src, dst):
    """A copy of the GGUF file ``src`` whose ffn_gate_exps and ffn_up_exps (weights in any type, biases) are one
    ffn_gate_up_exps, gate first, as newer converters write them."""
    import gguf

    kinds = {t.name: t.tensor_type for t in gguf.GGUFReader(str(src)).tensors}

    def fuse(tensors):
        out = {}
        for name, a in tensors.items():
            if ".ffn_up_exps." in name:
                continue
            if ".ffn_gate_exps." in name:
                up = tensors[name.replace("ffn_gate_exps", "ffn_up_exps")]
                name, a = name.replace("ffn_gate_exps", "ffn_gate_up_exps"), (np.concatenate([a, up], 1), kinds[name])
            out[name] = a
        return out
    return rewrite_gguf(src, dst, fuse)


@needs_op
@pytest.mark.parametrize("fused", [False, True])
def test_gguf_mxfp4_experts_run_on_their_blocks(tmp_path, monkeypatch, fused):
    """``load_gguf_int8`` runs a gpt-oss file's MXFP4 experts on their own blocks (17 bytes per 32 weights, as the
    file holds them, against 128 in float32): each an Int8DotLinear of the MXFP4 form with its bias, its weight
    gguf's dequantised one bitwise; gate and up apart or fused in the file, the same model, bitwise
    ``gguf_copy(..., activations="int8")`` of the float model; a sparse layer runs its experts in one
    ``moe_experts`` call with the bits of its modules; speculative decoding keeps autoregressive decoding's tokens."""
    import gguf

    from triforce.models.quant import gguf_copy, load_gguf_int8

    from .test_config import write_gguf

    _, ours = pair(intermediate_size=64)

    def quant(name, a):
        if name.endswith("_exps.weight"):
            return gguf.quants.quantize(a, gguf.GGMLQuantizationType.MXFP4), gguf.GGMLQuantizationType.MXFP4
        return a, None

    path = write_gguf(tmp_path / "g.gguf", ours, _GGUF_YARN, quant=quant)
    if fused:
        path = _fuse_gate_up(path, tmp_path / "fused.gguf")
    model = load_gguf_int8(path)
    plain = Llama.from_pretrained(path)
    assert_experts_on_their_mxfp4_blocks(model, plain)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits = model(ids)
        assert torch.equal(logits, gguf_copy(plain, path, activations="int8")(ids))
        assert (logits - plain(ids)).abs().max().item() > 0  # (the rows are rounded to int8 blocks)
        assert assert_one_moe_experts_call(model.model.layers[1].mlp, monkeypatch) == \
            {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}
    prompts = [ids[0, :9], ids[1, :17]]
    ref = triforce.generate(model, prompts, method="autoregressive", max_new_tokens=12)
    for method, opts in (("speculative", {"gamma": 3, "draft_layers": 1}), ("magicdec", {"gamma": 2})):
        out = triforce.generate(model, prompts, method=method, max_new_tokens=12, **opts)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), method


def test_gguf_gate_up_fused_or_missing(tmp_path):
    """Newer converters write gate and up as one ffn_gate_up_exps (weights and biases, gate first): the same model;
    a file without an expert tensor raises naming it."""
    from .test_config import write_gguf

    _, ours = pair()
    path = write_gguf(tmp_path / "a.gguf", ours, _GGUF_YARN)
    plain = Llama.from_pretrained(path, cache_dir=False)

    def fuse(t):
        out = {n: a for n, a in t.items() if "ffn_gate_exps" not in n and "ffn_up_exps" not in n}
        for i in range(ours.config.num_hidden_layers):
            for what in ("weight", "bias"):
                out[f"blk.{i}.ffn_gate_up_exps.{what}"] = np.concatenate(
                    [t[f"blk.{i}.ffn_gate_exps.{what}"], t[f"blk.{i}.ffn_up_exps.{what}"]], axis=1)
        return out

    fused = Llama.from_pretrained(rewrite_gguf(path, tmp_path / "b.gguf", fuse), cache_dir=False)
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(fused(ids), plain(ids))
    for name, what in (("blk.1.ffn_down_exps.bias", "down_proj bias"), ("blk.0.ffn_up_exps.weight",
                                                                        "gate_up_proj weight")):
        broken = rewrite_gguf(path, tmp_path / "c.gguf", lambda t: {n: a for n, a in t.items() if n != name})
        with pytest.raises(ValueError, match=what):
            Llama.from_pretrained(broken, cache_dir=False)


# gpt-oss-20b's config.json as OpenAI published it
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "eos_token_id": 200002,
    "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "initial_context_length": 4096,
    "initializer_range": 0.02, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "output_router_logits": False, "pad_token_id": 199999,
    "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                       "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
    "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                            "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                            "truncate": False},
    "rope_theta": 150000, "router_aux_loss_coef": 0.9, "sliding_window": 128, "swiglu_limit": 7.0,
    "tie_word_embeddings": False, "transformers_version": "4.55.0.dev0", "use_cache": True, "vocab_size": 201088}


def test_gpt_oss_20b_config_reads_as_transformers_reads_it():
    c = LlamaConfig.from_dict(GPT_OSS_20B)
    hf = transformers.GptOssConfig(**{k: v for k, v in GPT_OSS_20B.items() if k != "quantization_config"})
    assert c.layer_windows == tuple(128 if t == "sliding_attention" else 0 for t in hf.layer_types)
    assert (c.experts.count, c.experts.top_k, c.experts.intermediate_size) == (32, 4, 2880)
    assert c.swiglu_clamp == (hf.swiglu_alpha, hf.swiglu_limit) == (1.702, 7.0)
    assert (c.head_dim, c.num_key_value_heads, c.rope_theta, c.qkv_bias, c.attention_bias) == (64, 8, 150000, True,
                                                                                               True)
    assert {k: v for k, v in c.rope_scaling.items() if k != "rope_type"} == {
        k: v for k, v in hf.rope_parameters.items() if k not in ("rope_type", "rope_theta")}
    # GptOssConfig's defaults where a config leaves keys out
    d = LlamaConfig.from_dict({"model_type": "gpt_oss", "num_hidden_layers": 4})
    assert d.layer_windows == (128, 0, 128, 0) and d.experts.count == 128 and d.rope_type == "yarn"


@pytest.mark.parametrize("key,value", [("swiglu_limit", 0), ("swiglu_alpha", float("inf")), ("experts_per_token", 3),
                                       ("quantization_config", {"quant_method": "bitsandbytes"}),
                                       ("quantization_config", {"quant_method": "mxfp4", "group_size": 64}),
                                       ("sliding_window", 0), ("layer_types", ["full_attention"] * 3)])
def test_bad_gpt_oss_configs_raise(key, value):
    with pytest.raises(ValueError, match=key):
        LlamaConfig.from_dict({**GPT_OSS_20B, key: value})


def test_other_families_refuse_gpt_oss_keys():
    for key, value in (("swiglu_limit", 7.0), ("initial_context_length", 4096),
                       ("quantization_config", {"quant_method": "mxfp4"})):
        with pytest.raises(ValueError, match=key):
            LlamaConfig.from_dict({"model_type": "mixtral", key: value})


def test_bulk_prefill_matches_the_cached_steps_closely():
    """A prefill of more rows than the row-wise kernels take per expert (torch's GEMM there) still gives
    transformers' logits (a sanity check of the bulk products with biases)."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 150), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(ids).logits
        cache = FullCache(ours.config, 2, 160)
        assert (ours.prefill(ids, cache, chunk_size=150) - ref[:, -1]).abs().max().item() <= TOL
