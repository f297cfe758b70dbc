"""DeepSeek-V2 / V3 (``model_type="deepseek_v2"``: DeepSeek-V2, V2-Lite, V2.5, Coder-V2; ``"deepseek_v3"``: DeepSeek-V3,
R1, Moonlight): multi-head latent attention, absorbed (triforce.models.llama.LatentAttention: the caches hold one latent
KV head), and their routers (V2's softmax, greedy or within groups; V3's sigmoid with a correction bias within groups),
against transformers' DeepseekV2ForCausalLM / DeepseekV3ForCausalLM on the same weights; GGUF files of these models (and
of GLM-4.5's and dots.llm1's mixtures) as llama.cpp's converter writes them (``write_grouped_gguf``)."""
import functools
import json

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import triforce
from triforce.models import FullCache, Llama, LlamaConfig, StreamingCache
from triforce.models.llama import LatentAttention, SparseMoE
from triforce.models.quant import Q8Linear, int8_copy

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (QT, assert_blocks_compute_the_loaded_model, gguf_tokenizer, quantizer, randomize_,
                            stacked_expert_tensors, write_stacked_experts_gguf)
from .test_model import TOL
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# hidden 64, 4 heads of qk 16 + 8 (RoPE) and v 12 over a latent of 32: a cached key of 32 + 8 = 40; a dense first
# layer, then 2 of 6 experts and a shared one
BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
            n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=40, first_k_dense_replace=1,
            n_shared_experts=1, q_lora_rank=None)
_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
CASES = {
    # V2-Lite's shape: one query projection, greedy
    "v2": ("DeepseekV2", dict(topk_method="greedy")),
    # V2's: low-rank queries, the experts within the 2 best of 3 groups, scaled weights, 2 shared experts
    "v2-groups": ("DeepseekV2", dict(q_lora_rank=24, topk_method="group_limited_greedy", n_group=3, topk_group=2,
                                     routed_scaling_factor=2.0, n_shared_experts=2)),
    # YaRN with mscale / mscale_all_dim (V2's: the scores scaled by mscale_all_dim's factor squared)
    "v2-yarn": ("DeepseekV2", dict(rope_parameters=dict(_YARN), max_position_embeddings=64)),
    # V3's: low-rank queries, sigmoid scores with a correction bias, 2 of 3 groups, renormalised and scaled
    "v3": ("DeepseekV3", dict(q_lora_rank=24, n_group=3, topk_group=2, norm_topk_prob=True,
                              routed_scaling_factor=2.5)),
    # half-split RoPE pairs in the checkpoint, not renormalised, one group of two, two dense layers, YaRN
    "v3-half-split": ("DeepseekV3", dict(rope_interleave=False, n_group=2, topk_group=1, norm_topk_prob=False,
                                         first_k_dense_replace=2, num_hidden_layers=4, max_position_embeddings=64,
                                         rope_parameters={**_YARN, "mscale": 1.0, "mscale_all_dim": 1.0})),
}


def pair(case, **kw):
    """transformers' model of ``case`` with decisive routers (std 0.5; V3's correction biases random too) and ours
    on its weights."""
    name, config = CASES[case]
    return transformers_pair(name, {**BASE, **config, **kw})


def transformers_pair(name: str, kw: dict):
    """transformers' ``<name>ForCausalLM`` of config ``kw`` (random weights, decisive routers: std 0.5; random
    correction biases) and ours on its weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    hf_config = getattr(transformers, f"{name}Config")(**kw, attn_implementation="eager")
    hf = randomize_(getattr(transformers, f"{name}ForCausalLM")(hf_config).eval())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    random_correction_biases_(hf, g)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


def random_correction_biases_(model, g=None, std: float = 0.2):
    """``model``'s routers' correction biases (DeepSeek-V3's, GLM-4.5's) drawn ~ N(0, std), in place."""
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * std)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits; the layers are latent attention and sparse where transformers' are; our config reads back in
    transformers as the same model."""
    hf, ours = pair(case)
    layers = ours.model.layers
    assert all(type(layer.self_attn) is LatentAttention for layer in layers)
    sparse = [type(layer.mlp) is SparseMoE for layer in layers]
    assert sparse == [i >= hf.config.first_k_dense_replace for i in range(len(layers))] and any(sparse)
    assert_every_path_matches(hf, ours)
    back = type(hf.config).from_dict(ours.config.to_dict())
    for key in ("num_key_value_heads", "head_dim", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
                "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok",
                "moe_intermediate_size", "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group",
                "topk_method", "norm_topk_prob", "rope_interleave", "rope_parameters"):
        assert getattr(back, key, None) == getattr(hf.config, key, None), key


def test_the_caches_hold_one_latent_head():
    """Every cache of the model holds one KV head of kv_lora_rank + qk_rope_head_dim per token (40 here), not the
    heads' keys and values (4 * (24 + 12) = 144; DeepSeek-V2's 576 against 128 heads * 320 = 40960), and holds it
    once: the values are the keys (v[layer] is k[layer]), so a cache is half the size of one with both."""
    _, ours = pair("v2")
    c = ours.config
    assert (c.num_key_value_heads, c.head_dim, c.rotary_dim) == (1, 40, 8)
    v2 = LlamaConfig.from_dict({"model_type": "deepseek_v2", "num_experts_per_tok": 6, "num_key_value_heads": 32})
    assert (v2.num_key_value_heads, v2.head_dim, v2.mla.qk_head_dim) == (1, 576, 192)
    caches = {"full": FullCache(c, 2, 64), "chunked": FullCache(c, 2, 64, chunk_size=4),
              "streaming": StreamingCache(c, 2, sink=2, window=20, max_step=4)}
    for name, cache in caches.items():
        assert tuple(cache.k[0].shape[-2:]) == (1, 40)
        assert all(v is k for k, v in zip(cache.k, cache.v)), name
    latent = 3 * 2 * 64 * 40 * 4  # layers x rows x slots x dims x bytes
    assert caches["full"].memory_bytes() == latent + 2 * 4  # (+ the lengths)
    # k and k_raw (not v) of 26 slots, and slot_pos, evicted, frame (int64) and the lengths
    assert caches["streaming"].memory_bytes() == 2 * 3 * 2 * 26 * 40 * 4 + 2 * 26 * 8 + 2 * 8 + 2 * 8 + 2 * 4


@pytest.mark.parametrize("kind", ["full", "streaming"])
def test_rows_leave_a_latent_cache(kind):
    """select_rows (finished rows leaving the batch) keeps v the keys and the kept rows' tokens: the next step of
    the kept rows gives the logits of the same rows in a cache that never held the others."""
    _, ours = pair("v3")
    ids = torch.randint(0, 101, (3, 21), generator=torch.Generator().manual_seed(5))

    def make(B):
        return FullCache(ours.config, B, 32) if kind == "full" else StreamingCache(
            ours.config, B, sink=2, window=8, max_step=4)
    with torch.no_grad():
        cache, alone = make(3), make(2)
        for i in range(20):
            ours(ids[:, i:i + 1], cache=cache)
            ours(ids[[2, 0], i:i + 1], cache=alone)
        cache.select_rows([2, 0])
        assert all(v is k for k, v in zip(cache.k, cache.v))
        assert torch.equal(ours(ids[[2, 0], 20:], cache=cache), ours(ids[[2, 0], 20:], cache=alone))


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved (its experts, shared_experts, V3's correction bias, RoPE rows in adjacent
    pairs) loads with transformers' logits; ours saves the same names, which transformers reads back bitwise as the
    same model."""
    assert_checkpoint_directories_both_ways(tmp_path / "v3", pair("v3")[0])
    assert_checkpoint_directories_both_ways(tmp_path / "v2", pair("v2-groups")[0])


def test_v3s_multi_token_prediction_layers_are_skipped(tmp_path):
    """DeepSeek-V3's checkpoints hold num_nextn_predict_layers layers after the model's (multi-token prediction, not
    in the forward): they load as transformers loads them, skipped; a layer past those raises."""
    from triforce.models.loading import _build

    hf, ours = pair("v3")
    sd = dict(hf.state_dict())
    n = hf.config.num_hidden_layers
    extra = {k.replace(f"layers.{n - 1}.", f"layers.{n}."): t for k, t in sd.items() if f"layers.{n - 1}." in k}
    config = LlamaConfig.from_dict({**hf.config.to_dict(), "num_nextn_predict_layers": 1})
    model = _build(config, {**sd, **extra}, None, None)
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(ids), ours(ids))
    late = {k.replace(f"layers.{n}.", f"layers.{n + 1}."): t for k, t in extra.items()}
    with pytest.raises(ValueError, match="unexpected"):
        _build(config, {**sd, **late}, None, None)


@pytest.mark.parametrize("case", ["v2-groups", "v3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(case, dtype):
    """The latent attention's per-head products, the routers and the experts read each token's own row: a 10-token
    pass gives bitwise the logits of 10 one-token steps."""
    assert_pass_equals_steps(pair(case)[1], dtype)


@pytest.mark.skipif(not hasattr(torch.ops.triforce_C, "mla_qk"), reason="the extension's mla_qk is not built")
@pytest.mark.parametrize("case,kw", [("v2", {}), ("v2-yarn", {}), ("v3", {}), ("v3-half-split", {}),
                                     ("v2", dict(q_lora_rank=24, qk_rope_head_dim=16))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_native_query_and_key_step_is_the_modules(case, kw, dtype, monkeypatch):
    """``triforce_C::mla_qk`` (csrc/cpu/decoder.cpp: the latent attention's norm, gather by slots and RoPE between
    its products, one call where the fused layer's rows are few) gives bitwise the queries, keys and keys before RoPE
    of the modules' ATen ops (DeepSeek-V2's float32 RoPE in bfloat16 included), on ordinary rows and on rows with
    values that overflow, infinities and NaNs."""
    import triforce.models.llama as llama

    _, ours = pair(case, **kw)
    ours = ours.to(dtype)
    att = ours.model.layers[0].self_attn
    calls = []
    real = torch.ops.triforce_C.mla_qk
    monkeypatch.setattr(torch.ops.triforce_C, "mla_qk", lambda *a: calls.append(1) or real(*a), raising=False)
    g = torch.Generator().manual_seed(5)
    for scale in (1.0, 1e30):
        x = (torch.randn(2, 3, 64, generator=g) * scale).to(dtype)
        x[0, 1, 3], x[1, 2, 7] = float("inf"), float("nan")
        pos = torch.arange(3).expand(2, 3) + torch.tensor([[5], [900]])
        cos, sin = ours.rope_tables(pos)[0]
        with torch.no_grad():
            native = att.project(x, cos, sin)
            monkeypatch.setattr(llama, "_fused_path", lambda h: False)
            modules = att.project(x, cos, sin)
            monkeypatch.undo()
            monkeypatch.setattr(torch.ops.triforce_C, "mla_qk", lambda *a: calls.append(1) or real(*a), raising=False)
        for a, b in zip(native, modules):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.isnan(), b.isnan())
            assert torch.equal(a.nan_to_num(0.0, 1.0, -1.0), b.nan_to_num(0.0, 1.0, -1.0))
    assert len(calls) == 2


@pytest.mark.skipif(not hasattr(torch.ops.triforce_C, "mla_qk"), reason="the extension's mla_qk is not built")
@given(data=st.data())
def test_mla_qk_is_its_reference_for_any_layout(data):
    """Property: ``mla_qk`` against its reference written out (RMSNorm's ATen composite of kv's first R dims, the
    gather ``cat([pe, latent])[..., layout]``, apply_rope in the dtype, or in float32 rounded once) for drawn shapes,
    any permutation as the layout (runs of every length, not only DeepSeek's four), float32 / bfloat16 tables and
    values, both RoPE modes: bitwise."""
    from triforce.models.rope import apply_rope

    draw = data.draw
    B, T, H = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    nope, r, R = draw(st.integers(1, 8)), 2 * draw(st.integers(1, 4)), 2 * draw(st.integers(1, 6))
    D, dtype, f32 = R + r, draw(st.sampled_from([torch.float32, torch.bfloat16])), draw(st.booleans())
    perm = draw(st.permutations(list(range(D))))
    layout = torch.tensor(perm if draw(st.booleans()) else sorted(perm))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    rnd = lambda *shape, s=1.0: (torch.randn(*shape, generator=g) * s).to(dtype)  # noqa: E731
    q, q_lat, kv, w = rnd(B, T, H, nope + r), rnd(B, T, H, R), rnd(B, T, D, s=3.0), rnd(R) + 1
    tables = torch.float32 if f32 else dtype
    cos, sin = (torch.rand(B, T, 1, D, generator=g).to(tables) for _ in range(2))
    got = torch.ops.triforce_C.mla_qk(q, q_lat, kv, w, 1e-6, cos, sin, layout, f32)
    c = kv[..., :R].float()
    c = w * (c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype)
    q_asm = torch.cat([q[..., nope:], q_lat], -1)[..., layout]
    k_raw = torch.cat([kv[..., R:], c], -1)[..., layout][:, :, None]
    if f32 and dtype != torch.float32:
        want = [apply_rope(t.float(), cos.float(), sin.float()).to(dtype) for t in (q_asm, k_raw)]
    else:
        want = [apply_rope(t, cos, sin) for t in (q_asm, k_raw)]
    for a, b in zip(got, (*want, k_raw)):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.skipif(not hasattr(torch.ops.triforce_C, "mla_qk"), reason="the extension's mla_qk is not built")
def test_mla_qk_checks_its_arguments():
    """Shapes that disagree, a layout of another length, dtype or out of range, mixed dtypes raise, naming the
    argument (not a crash, not a silent read out of bounds)."""
    op = torch.ops.triforce_C.mla_qk
    B, T, H, nope, r, R = 1, 2, 2, 4, 4, 6

    def call(q=(B, T, H, nope + r), lat=(B, T, H, R), kv=(B, T, R + r), layout=None, dtype=torch.float32):
        t = torch.zeros(B, T, 1, R + r)
        return op(torch.zeros(q), torch.zeros(lat, dtype=dtype), torch.zeros(kv), torch.ones(R), 1e-6, t, t,
                  torch.arange(R + r) if layout is None else layout, False)

    q, k, k_raw = call()
    assert q.shape == (B, T, H, R + r) and k.shape == k_raw.shape == (B, T, 1, R + r)
    for kw, match in ((dict(q=(B, T, H)), "must be \\[B, T, H, \\*\\]"), (dict(lat=(B, T, H + 1, R)), "disagree"),
                      (dict(kv=(B, T, R + 3)), "disagree"), (dict(q=(B, T, H, r)), "disagree"),
                      (dict(lat=(B, T, H, R - 1), kv=(B, T, R - 1 + r)), "disagree"),  # (an odd R)
                      (dict(layout=torch.arange(R + r - 1)), "layout must be int64"),
                      (dict(layout=torch.arange(R + r).int()), "layout must be int64"),
                      (dict(layout=torch.arange(R + r) + 1), "is outside"),
                      (dict(dtype=torch.bfloat16), "one dtype")):
        with pytest.raises(RuntimeError, match=match):
            call(**kw)


def test_each_part_matters():
    """The correction bias, the groups, the renormalisation, the scaling factor, the RoPE rows' order and the
    attention's mscale each move the logits by more than ten times the tolerance: the tests above would see any one
    wrong."""
    ids = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    hf, ours = pair("v3")
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        for change in (lambda m: m.gate.e_score_correction_bias.zero_(), lambda m: setattr(m, "groups", None),
                       lambda m: setattr(m, "renormalize", False), lambda m: setattr(m, "scale", 1.0)):
            _, ours = pair("v3")
            moes = [layer.mlp for layer in ours.model.layers if type(layer.mlp) is SparseMoE]
            for m in moes:
                change(m)
            assert (ours(ids) - ref).abs().max().item() > 10 * TOL
        for case in ("v2", "v2-yarn"):
            hf, ours = pair(case)
            ref = hf(ids).logits
            if case == "v2":  # RoPE's rows not reordered: the checkpoint's adjacent pairs turned as half-split ones
                for layer, theirs in zip(ours.model.layers, hf.model.layers):
                    for name in ("q_proj", "kv_a_proj_with_mqa"):
                        getattr(layer.self_attn, name).weight.copy_(getattr(theirs.self_attn, name).weight)
            else:  # the scores without mscale_all_dim's factor
                for layer in ours.model.layers:
                    layer.self_attn.scale = ours.config.mla.qk_head_dim ** -0.5
            assert (ours(ids) - ref).abs().max().item() > 10 * TOL


def tiny_deepseek(model_type: str, seed: int) -> Llama:
    """A tiny random DeepSeek model (3 layers, the first dense; 4 heads over a latent of 16 + 8) whose routers and
    correction biases are decisive enough to pick varied experts."""
    torch.manual_seed(seed)
    extra = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, n_routed_experts=4,
                 num_experts_per_tok=2, moe_intermediate_size=24, first_k_dense_replace=1, n_shared_experts=1,
                 q_lora_rank=12, n_group=2, topk_group=1)
    if model_type == "deepseek_v2":
        extra["topk_method"] = "group_limited_greedy"
    else:
        extra["norm_topk_prob"] = True
    if model_type in ("deepseek_v32", "glm_moe_dsa"):  # (each query over its 8 best keys: the prompts are longer)
        extra.update(index_topk=8, index_head_dim=12, index_n_heads=8)
    if model_type == "glm_moe_dsa":  # (its last layer attends to the keys the second chose)
        extra.update(indexer_types=["full", "full", "shared"])
    config = LlamaConfig(model_type=model_type, vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=1024,
                         initializer_range=0.3, extra=extra)
    return random_correction_biases_(randomize_(Llama(config), seed).eval(), std=0.3)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(model_type, method, opts):
    """Every method (StreamingLLM and retrieval drafts over the latent cache included) emits autoregressive
    decoding's tokens."""
    assert_greedy_equals_autoregressive(tiny_deepseek(model_type, 0), tiny_deepseek(model_type, 1), method, opts)


def test_a_streaming_cache_rotates_the_latent_keys_rope_dims_only():
    """In a StreamingLLM cache (its window's keys rotated at their positions, its sinks re-rotated from the unrotated
    copies after evictions) only the RoPE'd dims of a cached latent key differ from its unrotated copy; the values
    (the same latent keys) hold the latent unchanged."""
    model = tiny_deepseek("deepseek_v3", 0)
    ids = torch.randint(0, 64, (1, 30), generator=torch.Generator().manual_seed(4))
    cache = StreamingCache(model.config, 1, sink=2, window=10, max_step=4)
    with torch.no_grad():
        for i in range(30):
            model(ids[:, i:i + 1], cache=cache)
    rope, latent = model.config.mla.slots()
    for layer in range(3):
        k, k_raw, v = (t[layer][0, :12, 0] for t in (cache.k, cache.k_raw, cache.v))
        assert torch.equal(k[:, latent], k_raw[:, latent]) and torch.equal(v[:, latent], k_raw[:, latent])
        assert (k[:, rope] != k_raw[:, rope]).any(1).sum() >= 10  # (all but position 0's)


def test_int8_copy_keeps_the_correction_bias_and_drafts_losslessly():
    """The int8 draft copy replaces every linear layer (the routers too) and keeps V3's correction biases on its
    routers; speculative decoding with it emits autoregressive decoding's tokens."""
    model = tiny_deepseek("deepseek_v3", 0)
    draft = int8_copy(model)
    routers = [layer.mlp.gate for layer in draft.model.layers if type(layer.mlp) is SparseMoE]
    assert routers and all(type(r) is Q8Linear for r in routers)
    for r, layer in zip(routers, model.model.layers[1:]):
        assert r.e_score_correction_bias is layer.mlp.gate.e_score_correction_bias
    assert_greedy_equals_autoregressive(model, draft, "speculative", {"gamma": 3})


def test_bad_configs_raise():
    v2 = {**BASE, "model_type": "deepseek_v2"}
    v3 = {**BASE, "model_type": "deepseek_v3", "n_group": 2, "topk_group": 1}
    LlamaConfig.from_dict(v2), LlamaConfig.from_dict(v3)
    for base, bad, match in (
            (v2, {"num_key_value_heads": 2}, "num_key_value_heads = 2"),
            (v2, {"head_dim": 16}, "head_dim = 16"),
            (v2, {"qk_head_dim": 20}, "qk_head_dim = 20"),
            (v2, {"kv_lora_rank": 31}, "must be even"),
            (v2, {"kv_lora_rank": "32"}, "'kv_lora_rank'"),
            (v2, {"norm_topk_prob": True}, "'norm_topk_prob'"),
            (v2, {"topk_method": "noaux_tc"}, "'topk_method'"),
            (v3, {"topk_method": "greedy"}, "'topk_method'"),
            (v2, {"scoring_func": "sigmoid"}, "'scoring_func'"),
            (v2, {"rope_interleave": False}, "'rope_interleave'"),
            (v2, {"moe_layer_freq": 2}, "'moe_layer_freq'"),
            (v2, {"topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 1}, "must divide"),
            (v2, {"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 1, "num_experts_per_tok": 3},
             "cannot be chosen"),
            (v3, {"n_group": 3, "topk_group": 2, "num_experts_per_tok": 5}, "cannot be chosen"),
            (v3, {"n_group": 6, "topk_group": 3}, "best two"),
            (v2, {"num_experts_per_tok": 7}, "more than the 6"),
            (v2, {"num_experts_per_tok": None}, "'num_experts_per_tok'"),
            (v2, {"attention_bias": True}, "'attention_bias'"),
            (v2, {"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}}, "'quantization_config'"),
            (v2, {"num_nextn_predict_layers": 1}, "'num_nextn_predict_layers'"),
            (v2, {"auto_map": {"AutoModel": "modeling_x.XModel"}}, "'auto_map'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})
    with pytest.raises(ValueError, match="latent KV head"):
        LlamaConfig(model_type="deepseek_v2", num_attention_heads=4, hidden_size=64, num_key_value_heads=4,
                    extra={"num_experts_per_tok": 2})
    # DeepSeek's own config.json (its remote code's keys at the values where it and transformers agree) loads
    ok = LlamaConfig.from_dict({**v2, "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                                                   "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
                                "moe_layer_freq": 1, "scoring_func": "softmax", "aux_loss_alpha": 0.001,
                                "seq_aux": True, "ep_size": 1, "norm_topk_prob": False})
    assert ok.experts.scoring == "softmax"


# the keys and values of DeepSeek-V2-Lite's and DeepSeek-V3's published config.json files (V3's FP8
# quantization_config apart: read in test_deepseeks_published_configs_load)
V2_LITE = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV2Config",
                 "AutoModel": "modeling_deepseek.DeepseekV2Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV2ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 100000, "eos_token_id": 100001, "first_k_dense_replace": 1,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2", "moe_intermediate_size": 1408,
    "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2, "norm_topk_prob": False,
    "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 102400}
V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config",
                 "AutoModel": "modeling_deepseek.DeepseekV3Model",
                 "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM"},
    "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
    "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3", "moe_intermediate_size": 2048,
    "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "pretraining_tp": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": True,
    "tie_word_embeddings": False, "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280}


def test_deepseeks_published_configs_load():
    """DeepSeek-V2-Lite's and V3's config.json keys load (V3's with its FP8 quantization_config too) and read as
    transformers reads them: the latent head, the routers, the dense layers, V2-Lite's attention scale with YaRN's mscale_all_dim."""
    import math

    lite = LlamaConfig.from_dict(V2_LITE)
    assert (lite.num_key_value_heads, lite.head_dim, lite.rotary_dim, lite.mla.q_lora_rank) == (1, 576, 64, None)
    e = lite.experts
    assert (e.count, e.top_k, e.shared_intermediate_size, e.groups, e.scoring, e.renormalize) == (
        64, 6, 2816, None, "softmax", False)
    assert e.layers == (False,) + (True,) * 26
    m = 0.1 * 0.707 * math.log(40) + 1
    assert lite.attention_scale == pytest.approx(192 ** -0.5 * m * m, rel=1e-15)
    assert lite.attention_scale == transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2Attention(
        transformers.DeepseekV2Config.from_dict({**V2_LITE, "num_hidden_layers": 1}), 0).scaling
    v3 = LlamaConfig.from_dict(V3)
    e = v3.experts
    assert (e.count, e.top_k, e.groups, e.group_top2, e.scoring, e.correction_bias, e.renormalize, e.scale) == (
        256, 8, (8, 4), True, "sigmoid", True, True, 2.5)
    assert e.layers == (False,) * 3 + (True,) * 58 and v3.mla.rope_interleaved and v3.mla.q_lora_rank == 1536
    back = LlamaConfig.from_dict(v3.to_dict())
    assert back == v3
    # as shipped: FP8 weights in 128 x 128 blocks, dequantised on loading (tests/test_fp8.py); saved float
    fp8 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
    assert LlamaConfig.from_dict({**V3, "quantization_config": fp8}).to_dict() == v3.to_dict()


# the keys and values of Kimi K2 Instruct's config.json (Moonshot: DeepSeek-V3's architecture and code, its own
# model_type; FP8 blocks)
KIMI_K2 = {**{k: v for k, v in V3.items() if k not in ("transformers_version", "num_nextn_predict_layers")},
           "model_type": "kimi_k2", "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1,
           "max_position_embeddings": 131072, "n_group": 1, "n_routed_experts": 384, "num_attention_heads": 64,
           "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "routed_scaling_factor": 2.827,
           "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                            "original_max_position_embeddings": 4096, "type": "yarn"},
           "rope_theta": 50000.0, "topk_group": 1, "vocab_size": 163840,
           "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                   "weight_block_size": [128, 128]}}


def test_kimi_k2_reads_as_deepseek_v3(tmp_path):
    """Kimi K2's config.json (model_type kimi_k2, naming DeepseekV3ForCausalLM and DeepSeek's code) reads as
    DeepSeek-V3 and saves as it (which transformers reads without remote code); a checkpoint directory under that
    name loads with the logits of transformers' DeepseekV3ForCausalLM on its weights; kimi_k2 naming another
    architecture raises."""
    c = LlamaConfig.from_dict(KIMI_K2)
    e = c.experts
    assert c.model_type == "deepseek_v3" and c.to_dict()["model_type"] == "deepseek_v3"
    assert (e.count, e.top_k, e.groups, e.scale, e.layers[:2]) == (384, 8, (1, 1), 2.827, (False, True))
    assert (c.num_attention_heads, c.mla.kv_lora_rank, c.rope_scaling["factor"]) == (64, 512, 32.0)
    hf, ours = pair("v3")
    hf.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, "model_type": "kimi_k2",
                                                      "auto_map": KIMI_K2["auto_map"]}))
    loaded = Llama.from_pretrained(tmp_path)
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    with pytest.raises(ValueError, match="read as DeepSeek-V3"):
        LlamaConfig.from_dict({**KIMI_K2, "architectures": ["KimiK2ForCausalLM"]})


@pytest.mark.parametrize("tie", [False, True, None])
def test_kimi_k25_loads_its_language_model_with_transformers_logits(tmp_path, tie):
    """Kimi K2.5 (transformers' Kimi_K25ForConditionalGeneration: DeepSeek-V3's language model beside a vision tower
    and a projector) saved in Moonshot's layout (language_model.model.* / .lm_head, vision_tower.*, mm_projector.*;
    text_config kimi_k2 with Kimi K2's auto_map): ours loads the language model with the logits of transformers' model
    and of transformers' load of that directory on text tokens, the image side not read. The head: the wrapper's
    tie_word_embeddings where given, else text_config's: the checkpoint's own head (``tie`` None; transformers 5.23
    keeps it too, the tie of Kimi_K25Config's default refused where the two differ). transformers' save_pretrained
    of the model loads as the same model."""
    import safetensors.torch

    torch.manual_seed(0)
    config = transformers.Kimi_K25Config(
        text_config={**BASE, **CASES["v3"][1]}, tie_word_embeddings=bool(tie),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2),
        projection_hidden_size=32)
    hf = randomize_(transformers.Kimi_K25ForConditionalGeneration(config).eval())
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape) * 0.5)
    random_correction_biases_(hf)
    moonshot = {"model.language_model.": "language_model.model.", "lm_head.": "language_model.lm_head.",
                "model.vision_tower.": "vision_tower.", "model.mm_projector.": "mm_projector."}
    sd = {next(new + k[len(old):] for old, new in moonshot.items() if k.startswith(old)): v.clone()
          for k, v in hf.state_dict().items()}
    assert any(k.startswith("vision_tower.") for k in sd) and any(k.startswith("mm_projector.") for k in sd)
    safetensors.torch.save_file(sd, tmp_path / "model.safetensors")
    hf.config.save_pretrained(tmp_path)
    d = json.loads((tmp_path / "config.json").read_text())
    d["text_config"] = {**d["text_config"], "model_type": "kimi_k2", "auto_map": KIMI_K2["auto_map"]}
    if tie is None:
        del d["tie_word_embeddings"]
    (tmp_path / "config.json").write_text(json.dumps(d))
    loaded = Llama.from_pretrained(tmp_path)
    assert loaded.config.model_type == "deepseek_v3" and loaded.config.tie_word_embeddings == bool(tie)
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    back = transformers.Kimi_K25ForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        ours = loaded(ids)
        assert (ours - hf(input_ids=ids).logits).abs().max().item() <= TOL
        assert (ours - back(input_ids=ids).logits).abs().max().item() <= TOL
    if tie is not None:  # transformers' own save (the language model's layers as language_model.model.blocks.*)
        hf.save_pretrained(tmp_path / "saved")
        with torch.no_grad():
            assert torch.equal(Llama.from_pretrained(tmp_path / "saved")(ids), ours)


@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3"])
def test_trained_head_kinds_and_lookup_draft_for_a_deepseek_target(model_type):
    """Every kind of draft head (random weights: any drafts) and prompt lookup drafting trees for a DeepSeek target:
    greedy output equals autoregressive decoding's."""
    from .test_heads import KINDS, random_heads

    m = tiny_deepseek(model_type, 0)
    prompts = [torch.randint(0, 64, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 17, 5)]
    ref = triforce.generate(m, prompts, method="autoregressive", max_new_tokens=16)
    for draft in [random_heads(m, kind) for kind in KINDS] + ["lookup"]:
        out = triforce.generate(m, prompts, method="tree", draft=draft, tree=(2, 1), max_new_tokens=16)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), draft


def _twin(cls):
    """``cls`` holding the values in a buffer of their own (as every other family's cache does), for comparison."""
    class Twin(cls):
        def _allocate(self, shape):
            self.values_are_keys = False
            return super()._allocate(shape)
    return Twin


@given(seed=st.integers(0, 2**31 - 1), kind=st.sampled_from(["full", "streaming"]), sink=st.integers(0, 3),
       window=st.integers(1, 12), max_step=st.integers(1, 5))
@example(seed=7, kind="full", sink=2, window=12, max_step=5)
@example(seed=7, kind="streaming", sink=2, window=12, max_step=5)
@example(seed=3, kind="streaming", sink=0, window=3, max_step=2)
def test_a_latent_cache_gives_the_logits_of_one_holding_the_values_apart(seed, kind, sink, window, max_step):
    """A cache whose values are its keys (one buffer) gives bitwise the logits of a twin holding the values in a buffer
    of their own, over chunked prefills (a StreamingLLM cache's prefill-sized forwards, which run in a temporary
    buffer and evict at their end), passes, trees kept with commit_path, rollbacks and rows leaving, in random order:
    every bookkeeping path moves the one buffer once (the values' RoPE'd dims differ between the two after a
    re-rotation, and drop out of the output)."""
    model = _tiny_v3()
    ids = torch.randint(0, 64, (3, 120), generator=torch.Generator().manual_seed(seed))

    def make(cls):
        return cls(model.config, 3, 128) if kind == "full" else cls(model.config, 3, sink=sink, window=window,
                                                                     max_step=max_step)
    cls = FullCache if kind == "full" else StreamingCache
    ours, twin = make(cls), make(_twin(cls))
    assert ours.v[0] is ours.k[0] and twin.v[0] is not twin.k[0]
    g = torch.Generator().manual_seed(seed)
    step = 128 if kind == "full" else max_step  # (a StreamingLLM cache's passes and trees: at most max_step tokens)
    pos, rows = 0, [0, 1, 2]
    with torch.no_grad():
        for i in range(12):
            action = int(torch.randint(0, 5, (), generator=g))
            if i == 0 or action == 0:  # a chunked prefill (prefill-sized forwards)
                T = 6 + int(torch.randint(0, 8, (), generator=g))
                outs = [model.prefill(ids[rows, pos:pos + T], c, chunk_size=7) for c in (ours, twin)]
            elif action == 1 and step >= 4:  # a tree, its first path kept
                parents = torch.tensor([[-1, 0, 0, 1]] * len(rows))
                outs = [model(ids[rows, pos:pos + 4], cache=c, tree_parents=parents) for c in (ours, twin)]
                path, accepted = torch.tensor([[0, 1, 3]] * len(rows)), torch.full((len(rows),), 2)
                for c in (ours, twin):  # (the 4 nodes follow what the forward's eviction left)
                    c.commit_path(c.lengths - 4, path, accepted)
                T = 3
            else:  # a pass of up to 5 tokens, its last one rolled back half the time
                T = int(torch.randint(1, min(5, step) + 1, (), generator=g))
                outs = [model(ids[rows, pos:pos + T], cache=c) for c in (ours, twin)]
                if action == 2 and T > 1:
                    for c in (ours, twin):
                        c.rollback(c.lengths - 1)
                    T -= 1
            assert torch.equal(*outs), i
            pos += T
            if i == 6:  # a row leaves
                for c in (ours, twin):
                    c.select_rows([2, 0])
                rows = [2, 0]
        assert all(v is k for k, v in zip(ours.k, ours.v))


@functools.lru_cache(maxsize=None)
def _tiny_v3():
    return tiny_deepseek("deepseek_v3", 0)


def test_a_latent_retrieval_cache_gives_the_logits_of_one_holding_the_values_apart():
    """TriForce's retrieval cache over a latent full cache (chunks retrieved by the absorbed queries' scores against
    the latent keys' chunk means, the tail copied by sync) gives bitwise the logits of twins holding the values apart:
    a draft cache's contents are checked here, as a wrong draft would only lower the acceptance, not change the
    output the engines' tests compare."""
    from triforce.models import RetrievalCache

    model = tiny_deepseek("deepseek_v2", 0)
    ids = torch.randint(0, 64, (2, 60), generator=torch.Generator().manual_seed(8))
    caches = []
    with torch.no_grad():
        for full_cls, cls in ((FullCache, RetrievalCache), (_twin(FullCache), _twin(RetrievalCache))):
            full = full_cls(model.config, 2, 80, chunk_size=4)
            model.prefill(ids[:, :40], full)
            caches.append((full, cls(model.config, full, budget=12, chunk_size=4, max_step=4, rebuild_stride=8)))
        (full, ours), (full_twin, twin) = caches
        assert ours.v[0] is ours.k[0] and twin.v[0] is not twin.k[0] and full.v[0] is full.k[0]
        pos = 40
        for _ in range(6):
            drafts = [model(ids[:, pos:pos + 3], cache=c) for c in (ours, twin)]  # the draft level's pass
            assert torch.equal(*drafts)
            verified = [model(ids[:, pos:pos + 3], cache=c) for c in (full, full_twin)]  # the full level's
            assert torch.equal(*verified)
            for c in (ours, twin):
                c.sync()  # (rebuilds every 8 tokens: retrieval again from the grown full cache)
            pos += 3
        assert ours.num_rebuilds == twin.num_rebuilds >= 2


# ---- GGUF files (llama.cpp's deepseek2: DeepSeek-V2 / V2.5 / V3 / R1, Kimi K2)

def write_deepseek2_gguf(path, hf, layout: str = "mla", **kw):
    """:func:`write_grouped_gguf` of a DeepseekV2 / V3 model as a deepseek2 file."""
    return write_grouped_gguf(path, hf, "deepseek2", layout, **kw)


def write_grouped_gguf(path, hf, arch: str, layout: str = "mla", quant=None, meta=None, drop=(), omit=(),
                       mtp: bool = False, tokenizer=None):
    """A GGUF of transformers' model ``hf`` with DeepSeek's mixture as llama.cpp's converter writes the checkpoint:
    ``arch`` deepseek2 (DeepseekV2Model: DeepseekV2 / V3), deepseek32 (DeepseekV32Model) or glm-dsa (GlmMoeDsaModel:
    deepseek2's with the indexer's tensors and attention.indexer.* keys), glm4moe (Glm4MoeModel) or dots1
    (Dots1Model). No permutation (llama.cpp runs deepseek2's RoPE on adjacent pairs, glm4moe's and dots1's on
    half-split ones, as the checkpoints hold them), the experts stacked as ffn_{gate,up,down}_exps, the correction bias
    as exp_probs_b.bias, the router's kind as expert_gating_func (1 softmax, 2 sigmoid), expert_weights_norm (deepseek2:
    only where true), glm4moe's rope.dimension_count the rotated half. deepseek2: YaRN's mscale_all_dim as 0.1 x
    rope.scaling.yarn_log_multiplier; ``layout`` "mla" (the converter since 2025): one KV head, key_length /
    value_length the latent head's, the per-head dims as key_length_mla / value_length_mla, kv_b_proj split per head
    into attn_k_b (transposed) and attn_v_b; "kv_b" (files before): key_length / value_length the per-head dims,
    kv_b_proj whole as attn_kv_b, head_count_kv the checkpoint's. ``quant(name, array)``: as
    test_families.write_converted_gguf's (2-D tensors; the experts' stacks are Q8_0 where their rows allow); ``meta``
    / ``drop``: keys added / left out; ``omit``: tensors whose names end so left out; ``mtp``: a multi-token
    prediction layer after the model's, as GLM's converters append it (the last layer's tensors again, its nextn.*
    ones, block_count one more, nextn_predict_layers 1); ``tokenizer``: tokenizer.ggml.* keys."""
    c = hf.config
    rp, deepseek = c.rope_parameters, arch in ("deepseek2", "deepseek32", "glm-dsa")
    v3 = c.model_type != "deepseek_v2"  # (V3's router: V3, GLM-4.7-Flash, GLM-4.5, dots.llm1)
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
          "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps), "rope.freq_base": float(rp["rope_theta"]),
          "vocab_size": c.vocab_size, "leading_dense_block_count": _leading_dense(c),
          "expert_feed_forward_length": c.moe_intermediate_size, "expert_count": c.n_routed_experts,
          "expert_used_count": c.num_experts_per_tok, "expert_shared_count": c.n_shared_experts or 0,
          "expert_weights_scale": float(c.routed_scaling_factor), "expert_gating_func": 2 if v3 else 1}
    if deepseek:
        R, r, H, nope, v = c.kv_lora_rank, c.qk_rope_head_dim, c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim
        kv.update({"attention.kv_lora_rank": R, "rope.dimension_count": r,
                   **({"attention.head_count_kv": 1, "attention.key_length": R + r, "attention.value_length": R,
                       "attention.key_length_mla": nope + r, "attention.value_length_mla": v} if layout == "mla" else
                      {"attention.key_length": nope + r, "attention.value_length": v})})
        if c.q_lora_rank is not None:
            kv["attention.q_lora_rank"] = c.q_lora_rank
        if arch != "deepseek2":  # DeepSeek-V3.2's / GLM-5's indexer (GLM-5's converter: its layers' kinds)
            kv.update({"attention.indexer.head_count": c.index_n_heads, "attention.indexer.key_length":
                       c.index_head_dim, "attention.indexer.top_k": c.index_topk})
            if arch == "glm-dsa":
                kv["attention.indexer.types"] = [t == "full" for t in c.indexer_types]
        if rp["rope_type"] == "yarn":
            kv.update({"rope.scaling.type": "yarn", "rope.scaling.factor": float(rp["factor"]),
                       "rope.scaling.original_context_length": rp["original_max_position_embeddings"],
                       "rope.scaling.yarn_log_multiplier": 0.1 * rp["mscale_all_dim"]})
    else:
        kv.update({"attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
                   "rope.dimension_count": int(c.head_dim * rp.get("partial_rotary_factor", 1.0))})
    if v3 and (c.norm_topk_prob or not deepseek):
        kv["expert_weights_norm"] = bool(c.norm_topk_prob)
    if c.n_group is not None:  # (the converter writes any checkpoint's groups: V2's group_limited_greedy too)
        kv.update({"expert_group_count": c.n_group, "expert_group_used_count": c.topk_group})
    kv = {k: val for k, val in {**kv, **(meta or {})}.items() if k not in drop}
    def latent_halves(name, t, i):  # (the current layout: kv_b_proj per head as attn_k_b (transposed), attn_v_b)
        if not (name.endswith("kv_b_proj.weight") and layout == "mla"):
            return None
        k_b, v_b = t.view(H, nope + v, R).split([nope, v], dim=1)
        return {f"blk.{i}.attn_k_b.weight": k_b.transpose(1, 2), f"blk.{i}.attn_v_b.weight": v_b}

    tensors = stacked_expert_tensors(hf, arch, latent_halves)
    if mtp:
        n = c.num_hidden_layers
        tensors.update({name.replace(f"blk.{n - 1}.", f"blk.{n}."): t.clone() for name, t in list(tensors.items())
                        if name.startswith(f"blk.{n - 1}.")})
        g = torch.Generator().manual_seed(9)
        tensors.update({f"blk.{n}.nextn.eh_proj.weight": torch.randn(c.hidden_size, 2 * c.hidden_size, generator=g),
                        **{f"blk.{n}.nextn.{k}.weight": torch.rand(c.hidden_size, generator=g) + 0.5
                           for k in ("enorm", "hnorm", "shared_head_norm")}})
        kv.update({"block_count": n + 1, "nextn_predict_layers": 1})
    return write_stacked_experts_gguf(path, hf, arch, kv, quant, omit, tensors, tokenizer)


def _leading_dense(c) -> int:
    """The converter's leading_dense_block_count: config.json's first_k_dense_replace (GLM-4.7-Flash's carries it
    beside the mlp_layer_types transformers reads: its leading dense layers)."""
    if getattr(c, "first_k_dense_replace", None) is not None:
        return c.first_k_dense_replace
    types = list(c.mlp_layer_types)
    return types.index("sparse") if "sparse" in types else len(types)


# MLP widths of whole Q8_0 / Q5_0 blocks (32), so the quantised files hold blocks of every projection but o_proj
_GGUF_WIDTHS = dict(moe_intermediate_size=64, intermediate_size=96)


@pytest.mark.parametrize("case,layout,q_rank,layers", [
    ("v2", "kv_b", None, 3), ("v2", "mla", 24, 3), ("v2-yarn", "mla", 24, 3), ("v2-yarn", "kv_b", None, 3),
    ("v2", "mla", None, 27), ("v2-groups", "mla", 24, 3), ("v2-groups", "kv_b", None, 3), ("v3", "mla", 24, 3),
    ("v3", "kv_b", 24, 3)])
def test_gguf_deepseek2_as_llama_cpp_writes_it(tmp_path, case, layout, q_rank, layers):
    """A deepseek2 GGUF (llama.cpp's converter, its current layout and the one before: kv_b_proj split per head or
    whole) loads as its checkpoint's model (:func:`assert_grouped_gguf_loads`; the joined kv_b_proj, 3-D in the file,
    stays float32 on the blocks' paths); V2's groups (DeepSeek-V2's 236B shape) and V3's; YaRN's mscale from the
    file's log multiplier. (llama.cpp's oracle takes a
    file without attention.q_lora_rank only at V2-Lite's 27 layers, which one case has.)"""
    hf, ours = pair(case, q_lora_rank=q_rank, num_hidden_layers=layers, **_GGUF_WIDTHS)
    loaded = assert_grouped_gguf_loads(tmp_path, hf, ours, "deepseek2", layout=layout)
    if case == "v2-yarn":  # (mscale_all_dim through the file's float32 log multiplier: 0.707 to float32 rounding)
        got, rs = loaded.config.rope_scaling, ours.config.rope_scaling
        assert {k: got[k] for k in ("rope_type", "factor", "original_max_position_embeddings")} == {
            k: rs[k] for k in ("rope_type", "factor", "original_max_position_embeddings")}
        assert got["mscale"] == got["mscale_all_dim"] == pytest.approx(rs["mscale_all_dim"], rel=1e-6)


def assert_grouped_gguf_loads(tmp_path, hf, ours, arch: str, model_type=None, **kw) -> Llama:
    """``hf`` written as llama.cpp's converter writes it (:func:`write_grouped_gguf`, ``arch``, ``kw``) loads as its
    checkpoint's model: ``ours``' config (family, or ``model_type`` where the file names another; latent attention,
    mixture, KV heads), transformers' logits, the conversion cache read back by transformers as the same model; in
    Q8_0 / Q5_0 blocks (the experts in Q8_0) ``gguf_copy`` and ``load_gguf_int8`` compute the loaded model bitwise.
    -> ours from the float32 file."""
    import dataclasses

    loaded = Llama.from_pretrained(write_grouped_gguf(tmp_path / "f32.gguf", hf, arch, **kw),
                                   cache_dir=tmp_path / "cache")
    c, want = loaded.config, ours.config
    f32 = lambda e: dataclasses.replace(e, scale=float(np.float32(e.scale)))  # noqa: E731  (the file's float32)
    assert (c.model_type, c.mla, f32(c.experts), c.num_key_value_heads, c.head_dim, c.rotary_dim) == (
        model_type or want.model_type, want.mla, f32(want.experts), want.num_key_value_heads, want.head_dim,
        want.rotary_dim)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (loaded(ids) - ref).abs().max().item() <= TOL
        entry = next((tmp_path / "cache").glob("gguf-*"))
        back = transformers.AutoModelForCausalLM.from_pretrained(entry, attn_implementation="eager").eval()
        assert (back(ids).logits - loaded(ids)).abs().max().item() <= TOL
    q = write_grouped_gguf(tmp_path / "q.gguf", hf, arch, quant=quantizer(np.random.default_rng(0),
                                                                         types=(QT.Q8_0, QT.Q5_0)), **kw)
    assert (assert_blocks_compute_the_loaded_model(q, ids) - ref).abs().max().item() > TOL
    return loaded


def test_gguf_deepseek2_generates_from_the_command_line(tmp_path, capsys):
    """``triforce generate`` on a deepseek2 file with its tokenizer (deepseek-v3's pre-tokenizer), on its Q8_0 blocks
    with integer dot products: TriForce and a token tree print autoregressive's text."""
    from triforce import cli

    hf, _ = pair("v3", vocab_size=300, **_GGUF_WIDTHS)
    path = write_grouped_gguf(tmp_path / "m.gguf", hf, "deepseek2", tokenizer=gguf_tokenizer("deepseek-v3", 300),
                              quant=quantizer(np.random.default_rng(0), types=(QT.Q8_0,)))
    texts = {}
    for method in ("autoregressive", "triforce", "tree"):
        assert cli.main(["generate", "--model", str(path), "--dtype", "gguf-int8", "--method", method,
                         "--prompt", "Hello world, the tokens 12345", "--max-new-tokens", "10"]) == 0
        texts[method] = capsys.readouterr().out
    assert texts["autoregressive"].strip() and len(set(texts.values())) == 1, texts


def test_gguf_deepseek2_multi_token_prediction_layers_are_skipped(tmp_path):
    """GLM-4.7-Flash's converter appends its multi-token prediction layer (nextn_predict_layers: a whole layer and its
    nextn.* tensors, block_count counting it): the model is the layers before, as llama.cpp's forward runs it; the
    file's blocks skip it too."""
    hf, ours = pair("v3", **_GGUF_WIDTHS)
    loaded = Llama.from_pretrained(write_deepseek2_gguf(tmp_path / "m.gguf", hf, mtp=True), cache_dir=False)
    assert loaded.config.num_hidden_layers == hf.config.num_hidden_layers
    ids = torch.randint(0, 101, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
    q = write_deepseek2_gguf(tmp_path / "q.gguf", hf, mtp=True, quant=quantizer(np.random.default_rng(0),
                                                                                  types=(QT.Q8_0,)))
    assert_blocks_compute_the_loaded_model(q, ids)


def test_gguf_deepseek2_v2s_groups_are_ranked_by_their_best_expert(tmp_path):
    """DeepSeek-V2's ``group_limited_greedy`` in a deepseek2 file (the converter writes any checkpoint's n_group /
    topk_group as expert_group_count / expert_group_used_count): the loaded model ranks the groups by their best
    expert, as the checkpoint's code does (transformers' logits); ranked by their best two summed (llama.cpp's rule for
    every grouped router, the oracle's view of such a file), or greedy (the file read without its groups), its logits
    on these ids are others."""
    from .llama_cpp_oracle import groups_ranked_by_best_two

    # (the best of 3 groups of 2: with 2 of 3, the best expert's group and the second's are both kept, greedy's)
    hf, _ = pair("v2-groups", topk_group=1, **_GGUF_WIDTHS)
    loaded = Llama.from_pretrained(write_deepseek2_gguf(tmp_path / "m.gguf", hf), cache_dir=False)
    ids = torch.randint(0, 101, (1, 24), generator=torch.Generator().manual_seed(1))
    moes = [m for m in loaded.modules() if isinstance(m, SparseMoE)]
    assert [m.groups for m in moes] == [(3, 1)] * 2
    with torch.no_grad():
        ref = hf(ids).logits
        assert (loaded(ids) - ref).abs().max().item() <= TOL
        with groups_ranked_by_best_two(loaded) as changed:
            assert changed == 2 and (loaded(ids) - ref).abs().max().item() > 1e-2
        assert (loaded(ids) - ref).abs().max().item() <= TOL  # (restored)
        for m in moes:
            m.groups = None
        assert (loaded(ids) - ref).abs().max().item() > 1e-2


def test_gguf_deepseek2_a_sigmoid_router_without_its_bias_takes_zeros(tmp_path):
    """llama.cpp's exp_probs_b is optional: a sigmoid router without it chooses by the scores alone, the model of
    zero correction biases."""
    from .test_families import assert_missing_router_biases_are_zeros

    assert_missing_router_biases_are_zeros(tmp_path, pair("v3")[0], write_deepseek2_gguf)


@pytest.mark.parametrize("case,meta,drop,match", [
    ("v2", {"expert_weights_norm": True}, (), "softmax router"),
    ("v2-groups", {}, ("expert_group_used_count",), "topk_group = None"),
    ("v3", {"expert_gating_func": 3}, (), "expert_gating_func = 3"),
    ("v3", {}, ("attention.kv_lora_rank",), "lacks metadata deepseek2.attention.kv_lora_rank"),
    ("v3", {}, ("expert_count",), "expert_count >= 1"),
    ("v3", {"attention.key_length": 24}, (), "latent head's"),  # (the per-head dims: the older files' meaning)
    ("v2-yarn", {}, ("rope.scaling.yarn_log_multiplier",), "yarn_log_multiplier > 0"),
    ("v3", {"rope.scaling.yarn_log_multiplier": 0.1}, (), "without yarn"),
    ("v3", {"attention.key_length_mla": 8, "attention.value_length_mla": 12}, (), "more than its 8 RoPE"),
])
def test_gguf_deepseek2_what_is_not_supported_raises(tmp_path, case, meta, drop, match):
    """Metadata llama.cpp would run otherwise than the model computes, or that is missing or contradicts itself,
    raises, naming the key."""
    hf, _ = pair(case)
    with pytest.raises(ValueError, match=match):
        Llama.from_pretrained(write_deepseek2_gguf(tmp_path / "m.gguf", hf, meta=meta, drop=drop), cache_dir=False)


def test_gguf_deepseek2_latent_halves_must_agree(tmp_path):
    """A layer with attn_k_b but no attn_v_b, or both and attn_kv_b, raises naming the layer."""
    hf, _ = pair("v2")
    with pytest.raises(ValueError, match="layer 0 needs attn_k_b"):
        Llama.from_pretrained(write_deepseek2_gguf(tmp_path / "a.gguf", hf, omit=("0.attn_v_b.weight",)),
                              cache_dir=False)


# glm4_moe's and dots1's tiny shape (their test modules' BASE: grouped K/V heads of 16)
_GGUF_OTHER_BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, n_routed_experts=6, num_experts_per_tok=2,
                        moe_intermediate_size=40)


@given(data=st.data())
def test_gguf_files_of_drawn_configs_load_as_their_checkpoints(data):
    """Property: a deepseek2 / glm4moe / dots1 GGUF of a drawn tiny checkpoint (V2's router greedy or within groups,
    V3's, queries low-rank or not, either kv_b layout, YaRN, one or two shared experts, a dense first layer or none,
    groups, renormalisation, scaling, q/k norms and biases, a prediction layer appended, Q8_0 blocks) loads with
    transformers' logits, and its blocks compute the loaded model bitwise."""
    draw = data.draw
    family = draw(st.sampled_from(["deepseek_v2", "deepseek_v3", "glm4_moe", "dots1"]))
    kw = {**_GGUF_WIDTHS, "first_k_dense_replace": draw(st.integers(0, 1)),
          "n_shared_experts": draw(st.sampled_from([1, 2]))}
    arch = "deepseek2" if family.startswith("deepseek") else family.replace("_", "")
    layout, mtp = "mla", False
    if family != "deepseek_v2":  # V3's router
        groups = draw(st.sampled_from([1, 2, 3]))
        kw.update(n_group=groups, topk_group=draw(st.integers(1, groups)), norm_topk_prob=draw(st.booleans()),
                  routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])))
    elif draw(st.booleans()):  # V2's group_limited_greedy (else greedy, V2-Lite's n_group 1 or none)
        groups = draw(st.sampled_from([2, 3]))
        kw.update(topk_method="group_limited_greedy", n_group=groups, topk_group=draw(st.integers(1, groups)),
                  routed_scaling_factor=draw(st.sampled_from([1.0, 2.0])))
    else:
        kw.update(topk_method="greedy", **draw(st.sampled_from([{}, {"n_group": 1, "topk_group": 1}])))
    if family.startswith("deepseek"):
        layout = draw(st.sampled_from(["mla", "kv_b"]))
        kw.update(q_lora_rank=draw(st.sampled_from([None, 24])))
        if draw(st.booleans()):
            m = draw(st.sampled_from([0.707, 1.0]))
            kw.update(max_position_embeddings=64, rope_parameters={**_YARN, "mscale": m, "mscale_all_dim": m})
    if family in ("deepseek_v3", "glm4_moe"):
        mtp = draw(st.booleans())
    if family == "glm4_moe":
        kw.update(use_qk_norm=draw(st.booleans()), attention_bias=draw(st.booleans()))
    if family == "dots1":
        kw.update(attention_bias=draw(st.booleans()), num_key_value_heads=draw(st.sampled_from([2, 4])))
    base = BASE if family.startswith("deepseek") else _GGUF_OTHER_BASE
    hf, _ = transformers_pair({"deepseek_v2": "DeepseekV2", "deepseek_v3": "DeepseekV3", "glm4_moe": "Glm4Moe",
                               "dots1": "Dots1"}[family], {**base, **kw})
    quant = quantizer(np.random.default_rng(0), types=(QT.Q8_0,)) if draw(st.booleans()) else None
    assert_drawn_gguf_loads(hf, arch, 12, quant, layout=layout, mtp=mtp)


def assert_drawn_gguf_loads(hf, arch: str, length: int, quant, **kw) -> None:
    """``hf`` written as :func:`write_grouped_gguf` writes it (``arch``, ``quant``, ``kw``) into a temporary file: in
    float32 it loads with transformers' logits on ``length`` tokens, in blocks the blocks compute the loaded model
    bitwise."""
    import tempfile
    from pathlib import Path

    ids = torch.randint(0, 101, (1, length), generator=torch.Generator().manual_seed(4))
    with tempfile.TemporaryDirectory() as d:
        path = write_grouped_gguf(Path(d) / "m.gguf", hf, arch, quant=quant, **kw)
        with torch.no_grad():
            if quant is None:
                loaded = Llama.from_pretrained(path, cache_dir=False)
                assert (loaded(ids) - hf(ids).logits).abs().max().item() <= TOL
            else:
                assert_blocks_compute_the_loaded_model(path, ids)
