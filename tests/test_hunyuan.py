"""Hunyuan (``model_type="hunyuan_v1_dense"``: Hunyuan-0.5B / 1.8B / 4B / 7B, Hunyuan-MT; ``"hunyuan_v1_moe"``:
Hunyuan-A13B): Llama's layer with a per-head q/k RMSNorm *after* RoPE, RoPE of a fixed NTK alpha, and in the mixture a
float32 router, the softmax's top k renormalised and an ungated shared expert. Against transformers'
HunYuanDenseV1ForCausalLM / HunYuanMoEV1ForCausalLM on the same weights, and from GGUF as llama.cpp's converter writes
it. The norms after RoPE are computed in a form RoPE commutes with (keys divided by their RMS before RoPE, the key
norm's weight moved onto the queries): the same scores, and a StreamingLLM cache re-rotates its keys as any family's."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# the checkpoints' RoPE: 'dynamic' with a fixed alpha (transformers' NTK alpha reads alpha alone)
ALPHA = {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
         "mscale_all_dim": 1.0, "rope_theta": 10000.0}
BASE = dict(TINY, num_hidden_layers=3, head_dim=16)
CASES = {
    "dense-alpha": ("HunYuanDenseV1", dict(rope_parameters=ALPHA)),
    "dense-bias-tied": ("HunYuanDenseV1", dict(head_dim=8, attention_bias=True, tie_word_embeddings=True)),
    "moe-alpha": ("HunYuanMoEV1", dict(num_experts=5, moe_topk=2, rope_parameters=ALPHA)),
    "moe-top1-tied": ("HunYuanMoEV1", dict(num_experts=3, moe_topk=1, tie_word_embeddings=True)),
    # 'dynamic' without alpha: transformers' dynamic NTK RoPE, at its starting base within the context
    # (tests/test_internlm3.py: this factor and base move the frequencies' bits)
    "dense-dynamic-ntk": ("HunYuanDenseV1", dict(max_position_embeddings=96, rope_parameters={
        "rope_type": "dynamic", "factor": 1.334, "rope_theta": 10000.0 + 2.0 ** -11})),
}


def pair(case="dense-alpha", **kw):
    """transformers' Hunyuan model of ``case`` and ours on its weights (:func:`hunyuan_pair`)."""
    name, own = CASES[case]
    return hunyuan_pair(name, **{**BASE, **own, **kw})


def hunyuan_pair(name: str, **kw):
    """transformers' ``<name>ForCausalLM`` of config ``kw`` (random weights, norms randomised, decisive routers: std
    0.5) and ours on its weights."""
    from triforce.models.loading import _build

    hf, _ = transformers_and_ours(name, **kw)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("mlp.gate.wg.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers' logits;
    the layers are sparse where transformers' are (every layer of the mixture); the config reads back in transformers
    as the same model (its NTK alpha included)."""
    hf, ours = pair(case)
    c = ours.config
    assert c.qk_norm and c.qk_norm_after_rope and c.rope_type == ("dynamic" if "alpha" in case or "dynamic" in case
                                                                  else "default")
    moe = case.startswith("moe")
    assert all((type(layer.mlp) is SparseMoE) == moe for layer in ours.model.layers)
    assert_every_path_matches(hf, ours)
    back = type(hf.config).from_dict(c.to_dict())
    assert back.rope_parameters.get("alpha") == hf.config.rope_parameters.get("alpha")
    for key in ("head_dim", "num_key_value_heads", "attention_bias", "tie_word_embeddings", "num_experts", "moe_topk"):
        assert getattr(back, key, None) == getattr(hf.config, key, None), key
    want = transformers.HunYuanDenseV1ForCausalLM(back) if not moe else transformers.HunYuanMoEV1ForCausalLM(back)
    assert want.model.rotary_emb.inv_freq.equal(hf.model.rotary_emb.inv_freq)


def test_each_part_matters():
    """The norms' place (before RoPE, Qwen3's, the same weights), the NTK alpha and the float32 router's weight each
    move the logits well past the tests' tolerance; so the comparisons above see them."""
    from triforce.models.loading import _build

    hf, ours = pair("moe-alpha")
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        c = ours.config
        assert (_build(c.replace(rope_scaling=None), hf.state_dict(), None, None)(ids) - ref).abs().max() > 10 * TOL
        for layer in ours.model.layers:
            layer.self_attn.after_rope = False  # (the norms before RoPE: Qwen3's layer)
        assert (ours(ids) - ref).abs().max().item() > 10 * TOL
        _, other = pair("moe-alpha")
        for layer in other.model.layers:
            w = layer.mlp.gate.weight
            w.copy_(w.to(torch.bfloat16).float())
        assert (other(ids) - ref).abs().max().item() > TOL


def test_norms_after_rope_give_transformers_scores_at_any_position():
    """The claim a StreamingLLM cache rests on: with the keys divided by their RMS before RoPE and the key norm's
    weight on the queries, a query at position p and a key rotated to any position s score as transformers' norms
    after RoPE score them (float32), for positions far apart (a re-rotated sink, a re-based window)."""
    from transformers.models.hunyuan_v1_dense import modeling_hunyuan_v1_dense as m

    from triforce.models.rope import rope_cos_sin, rope_inv_freq

    hf, ours = pair("dense-alpha")
    att, theirs = ours.model.layers[1].self_attn, hf.model.layers[1].self_attn
    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 6, 64, generator=g)
    positions = torch.tensor([[0, 1, 37, 500, 4095, 70000]])
    inv_freq = rope_inv_freq(ours.config)
    cos, sin = rope_cos_sin(inv_freq, positions, torch.float32)
    with torch.no_grad():
        q, k, k_raw, _ = att.project(x, cos, sin)
        hcos, hsin = hf.model.rotary_emb(x, positions)
        shape = (1, 6, -1, 16)
        hq = theirs.q_proj(x).view(shape).transpose(1, 2)
        hk = theirs.k_proj(x).view(shape).transpose(1, 2)
        hq, hk = m.apply_rotary_pos_emb(hq, hk, hcos, hsin)
        hq, hk = theirs.query_layernorm(hq), theirs.key_layernorm(hk)
        hk = hk.repeat_interleave(2, dim=1)  # (2 query heads per KV head)
        mine = torch.einsum("bthd,bshd->bhts", q, k.repeat_interleave(2, dim=2))
        want = torch.einsum("bhtd,bhsd->bhts", hq, hk)
        assert (mine - want).abs().max().item() <= 1e-5 * want.abs().max().item()
        # the cached key is the key divided by its RMS (the norm's eps in it), rotated: k_raw re-rotated to another
        # position is the key there
        raw = theirs.k_proj(x).view(1, 6, -1, 16)
        unit = raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + theirs.key_layernorm.variance_epsilon)
        assert (k_raw - unit).abs().max().item() <= 1e-6 * unit.abs().max().item()


def tiny_hunyuan(model_type: str, seed: int) -> Llama:
    extra = {"num_experts": 4, "moe_topk": 2} if model_type == "hunyuan_v1_moe" else {}
    return tiny_family(model_type, seed, rope_scaling={"rope_type": "dynamic", "alpha": 50.0}, extra=extra)


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(model_type, dtype):
    """The norms after RoPE, the float32 router and the experts read each token's own row: a pass gives bitwise the
    logits of one-token steps (so speculative decoding keeps its tokens exactly)."""
    assert_pass_equals_steps(pair("dense-alpha" if model_type == "hunyuan_v1_dense" else "moe-alpha")[1], dtype)


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(model_type, method, opts):
    """Every method (StreamingLLM and retrieval drafts included) emits autoregressive decoding's tokens."""
    assert_greedy_equals_autoregressive(tiny_hunyuan(model_type, 0), tiny_hunyuan(model_type, 1), method, opts)


def test_a_streaming_cache_keeps_each_key_rotated_from_its_unit_copy():
    """After evictions (the sinks re-rotated, the window re-based) every key a StreamingLLM cache holds is its
    unit-RMS un-rotated copy rotated at the token's StreamingLLM position: Hunyuan's keys move as any family's."""
    from triforce.models.rope import apply_rope, rope_cos_sin, rope_inv_freq

    from .test_gemma3 import streaming_after_evictions

    model = tiny_hunyuan("hunyuan_v1_dense", 0)
    cfg = model.config
    cache, n, pos = streaming_after_evictions(model)
    cos, sin = rope_cos_sin(rope_inv_freq(cfg), pos[None], torch.float32)
    for layer in range(cfg.num_hidden_layers):
        raw = cache.k_raw[layer][:, :n]
        assert (raw.pow(2).mean(-1) - 1).abs().max() <= 1e-3  # (divided by their RMS: 1 but for the norm's eps)
        assert (cache.k[layer][:, :n] - apply_rope(raw, cos, sin)).abs().max() <= TOL, layer


def test_bfloat16_keeps_the_router_in_float32_as_transformers(tmp_path):
    """In bfloat16 the router's weight stays float32 (transformers creates it so), ``.to`` included, and its logits
    take the rows in float32; the logits are as near float32's as transformers' bfloat16 model's."""
    hf, ours = pair("moe-alpha")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        hf.save_pretrained(tmp_path)
        theirs = transformers.HunYuanMoEV1ForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
        assert theirs.model.layers[0].mlp.gate.wg.weight.dtype == torch.float32
        err = (theirs(ids).logits.float() - ref).abs().max().item()
        for model in (ours.to(torch.bfloat16), Llama.from_pretrained(tmp_path, dtype=torch.bfloat16)):
            assert model.model.layers[0].mlp.gate.weight.dtype == torch.float32
            assert (model(ids).float() - ref).abs().max().item() <= 2 * err + 1e-3


@pytest.mark.parametrize("case", ["dense-alpha", "moe-alpha"])
def test_checkpoint_directories_both_ways(tmp_path, case):
    """A checkpoint transformers saves (Hunyuan's names: query_layernorm / key_layernorm, mlp.gate.wg, mlp.shared_mlp,
    each expert's projections apart as Hunyuan's checkpoints hold them) loads with its logits; ours saves the same
    names and tensors, which transformers reads back bitwise as the same model."""
    from .test_moe import assert_checkpoint_directories_both_ways

    assert_checkpoint_directories_both_ways(tmp_path, pair(case)[0])


# Hunyuan-7B's config.json as Tencent ships it (a derivative's copy: HunyuanImage-2.1's prompt enhancer)
HUNYUAN_7B = {
    "add_classification_head": False, "architectures": ["HunYuanDenseV1ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.1, "attention_head_dim": 128, "bos_token_id": 1, "cla_share_factor": 2, "class_num": 0,
    "dense_list": [4096, 0], "eos_token_id": 127960, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "im_end_id": 5, "im_newline_id": 11, "im_start_id": 4, "initializer_range": 0.02, "intermediate_size": 14336,
    "mask_init_id": 12, "max_position_embeddings": 32768, "mlp_bias": False, "model_type": "hunyuan_v1_dense",
    "norm_type": "rms", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "org_vocab_size": 128167, "pad_id": 127961, "pad_token_id": 127961, "pool_type": "last", "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {k: v for k, v in ALPHA.items() if k not in ("rope_type", "rope_theta")} | {
        "type": "dynamic"}, "rope_theta": 10000.0, "sep_token_id": 127962, "text_end_id": 7, "text_start_id": 6,
    "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.55.0.dev0", "use_cache": False,
    "use_cla": False, "use_qk_norm": True, "use_rotary_pos_emb": True, "vocab_size": 128167}
# Hunyuan-A13B's mixture keys as its config.json spells them (per layer)
A13B = {**HUNYUAN_7B, "architectures": ["HunYuanMoEV1ForCausalLM"], "model_type": "hunyuan_v1_moe",
        "intermediate_size": 3072, "moe_intermediate_size": [3072] * 32, "moe_topk": [8] * 32, "num_experts": 64,
        "num_shared_expert": [1] * 32, "use_mixed_mlp_moe": True, "moe_drop_tokens": False,
        "moe_random_routing_dropped_token": False, "moe_layer_num_skipped": 0, "norm_topk_prob": True,
        "group_limited_greedy": False, "routed_scaling_factor": 1.0, "use_mla": False, "kv_lora_rank": None,
        "q_lora_rank": None, "n_group": None, "topk_group": None}


def test_the_published_configs_load():
    """Hunyuan-7B's config reads as transformers reads it (the base stretched by alpha 1000, the norms after RoPE, no
    cross-layer attention); A13B's per-layer mixture keys read as one value each (64 experts, 8 a token, one shared of
    intermediate_size); both round-trip."""
    from triforce.models.rope import rope_inv_freq

    c = LlamaConfig.from_dict(HUNYUAN_7B)
    assert (c.head_dim, c.num_key_value_heads, c.rope_type, c.tie_word_embeddings, c.qk_norm_after_rope) == (
        128, 8, "dynamic", True, True)
    base = 10000.0 * 1000.0 ** (128 / 126)
    assert torch.equal(rope_inv_freq(c), 1.0 / (base ** (torch.arange(0, 128, 2).float() / 128)))
    assert LlamaConfig.from_dict(c.to_dict()) == c
    m = LlamaConfig.from_dict(A13B)
    e = m.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.renormalize, e.float32_router) == (
        64, 8, 3072, 3072, True, True)
    assert e.layers == (True,) * 32 and LlamaConfig.from_dict(m.to_dict()) == m


@pytest.mark.parametrize("change,match", [
    ({"use_cla": True}, "'use_cla'"), ({"use_qk_norm": False}, "'use_qk_norm'"),
    ({"rope_scaling": {"type": "dynamic"}}, "dynamic"), ({"norm_type": "layer"}, "'norm_type'"),
    ({"attention_head_dim": 64}, "'attention_head_dim'"), ({"add_classification_head": True}, "'add_classification"),
    ({"mlp_bias": True}, "'mlp_bias'"), ({"num_experts": 2}, "'num_experts'"),
    ({"model_type": "hunyuan_v1_moe", "moe_intermediate_size": 1024}, "'moe_intermediate_size'"),
    ({"model_type": "hunyuan_v1_moe", "num_shared_expert": 2}, "'num_shared_expert'"),
    ({"model_type": "hunyuan_v1_moe", "moe_topk": [8, 4]}, "'moe_topk'"),
    ({"model_type": "hunyuan_v1_moe", "use_mixed_mlp_moe": False}, "'use_mixed_mlp_moe'"),
    ({"model_type": "hunyuan_v1_moe", "moe_drop_tokens": True}, "'moe_drop_tokens'"),
    ({"model_type": "hunyuan_v1_moe", "num_experts": 2, "moe_topk": 4}, "more than"),
    ({"model_type": "llama", "rope_scaling": {"type": "dynamic", "alpha": 1000.0}}, "dynamic"),
])
def test_what_it_does_not_implement_raises(change, match):
    """Cross-layer attention, no q/k norms, a dynamic RoPE with neither alpha nor factor (and Hunyuan's alpha in another
    family), a LayerNorm, a classification head, an MLP bias (transformers' Hunyuan has none), per-layer mixture values
    that differ, other widths or shared-expert counts, token dropping: each raises naming what it is."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({**HUNYUAN_7B, **change})


def hunyuan_kv(c) -> dict:
    """The ``<arch>.*`` metadata llama.cpp's converter writes for transformers' Hunyuan config ``c``: its RoPE base
    stretched by the NTK alpha, no RoPE scaling; the mixture's experts, their width and the shared expert's."""
    from .test_families import converted_kv

    kv = converted_kv(c)
    alpha = c.rope_parameters.get("alpha")
    if alpha is not None:
        kv["rope.freq_base"] = float(c.rope_parameters["rope_theta"] * alpha ** (c.head_dim / (c.head_dim - 2)))
    kv.update({"rope.scaling.type": "none", "rope.scaling.factor": 1.0})
    if hasattr(c, "num_experts"):
        kv.update({"expert_count": c.num_experts, "expert_used_count": c.moe_topk, "expert_shared_count": 1,
                   "expert_feed_forward_length": c.intermediate_size,
                   "expert_shared_feed_forward_length": c.intermediate_size})
    return kv


def write_hunyuan_moe_gguf(path, hf, quant=None, kv=None):
    from .test_families import write_stacked_experts_gguf

    return write_stacked_experts_gguf(path, hf, "hunyuan-moe", kv or hunyuan_kv(hf.config), quant=quant)


@pytest.mark.parametrize("case", ["dense-alpha", "dense-bias-tied"])
def test_gguf_dense_as_llama_cpp_writes_it(tmp_path, case):
    """A hunyuan-dense GGUF as llama.cpp's converter writes it (the base already stretched by alpha, the norms as
    attn_q_norm / attn_k_norm, NEOX RoPE so q / k rows as the checkpoint holds them) gives transformers' logits; its
    blocks compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, _ = pair(case)
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "hunyuan-dense", hunyuan_kv(hf.config))
    assert ours.config.model_type == "hunyuan_v1_dense" and ours.config.rope_scaling is None


@pytest.mark.parametrize("case", ["moe-alpha", "moe-top1-tied"])
def test_gguf_moe_as_llama_cpp_writes_it(tmp_path, case):
    """A hunyuan-moe GGUF (the router as ffn_gate_inp, the experts stacked, the shared expert as ffn_*_shexp) loads as
    the checkpoint's model: transformers' logits, the conversion read back by transformers, Q8_0 / Q5_0 blocks
    computing the loaded model bitwise."""
    from .test_families import assert_mixture_gguf_loads

    hf, ours = pair(case)
    assert_mixture_gguf_loads(tmp_path, hf, ours, write_hunyuan_moe_gguf)


@pytest.mark.parametrize("key,value", [("expert_feed_forward_length", 48), ("expert_shared_feed_forward_length", 48),
                                       ("expert_shared_count", 2)])
def test_gguf_moe_of_other_widths_raises(tmp_path, key, value):
    """A hunyuan-moe file whose experts or shared expert are not of feed_forward_length, or with more than one shared
    expert, is not transformers' Hunyuan MoE: it raises naming the key."""
    hf, _ = pair("moe-alpha")
    path = write_hunyuan_moe_gguf(tmp_path / "m.gguf", hf, kv={**hunyuan_kv(hf.config), key: value})
    with pytest.raises(ValueError, match=key):
        Llama.from_pretrained(path, cache_dir=False)


@given(data=st.data())
def test_drawn_checkpoints_and_their_gguf_files_load_as_transformers_model(data):
    """Property: a drawn tiny Hunyuan checkpoint (dense or a mixture of 1-6 experts, 1-3 of them a token; head_dim 8 /
    16 / 32 over 1, 2 or 4 KV heads; an NTK alpha or none; biases, a tied head) gives transformers' logits on 32 tokens,
    a 6-token pass the bits of its steps, and its GGUF as llama.cpp's converter writes it (float32, or Q8_0 / Q5_0
    blocks) loads with transformers' logits or, in blocks, computes the loaded model bitwise."""
    from .test_families import assert_drawn_checkpoint_loads, write_converted_gguf

    draw = data.draw
    moe = draw(st.booleans())
    head_dim, kv = draw(st.sampled_from([8, 16, 32])), draw(st.sampled_from([1, 2, 4]))
    kw = dict(BASE, num_hidden_layers=2, head_dim=head_dim, num_key_value_heads=kv,
              attention_bias=draw(st.booleans()) and not moe, tie_word_embeddings=draw(st.booleans()))
    alpha = draw(st.sampled_from([None, 1.5, 50.0, 1000.0]))
    if alpha is not None:
        kw["rope_parameters"] = {"rope_type": "dynamic", "alpha": alpha, "factor": 1.0, "rope_theta": 10000.0}
    if moe:
        count = draw(st.integers(1, 6))
        kw.update(num_experts=count, moe_topk=draw(st.integers(1, min(3, count))))
    hf, ours = hunyuan_pair("HunYuanMoEV1" if moe else "HunYuanDenseV1", **kw)

    def write(path, quant):
        if moe:
            return write_hunyuan_moe_gguf(path, hf, quant=quant)
        return write_converted_gguf(path, hf, "hunyuan-dense", hunyuan_kv(hf.config), quant=quant)

    assert_drawn_checkpoint_loads(draw, hf, ours, write)


@pytest.mark.parametrize("model_type", ["hunyuan_v1_dense", "hunyuan_v1_moe"])
def test_int8_drafts_and_trained_heads_see_the_model(model_type):
    """The int8 draft copy (every linear, the float32 router too) drafts losslessly; Hidden Transfer heads' training
    forward runs the upper layers as decoding runs them (the norms after RoPE included)."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_hunyuan(model_type, 0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)
