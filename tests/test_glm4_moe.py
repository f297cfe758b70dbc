"""GLM-4.5 / 4.6 / 4.7 (``model_type="glm4_moe"``): Llama's attention with q/k/v biases, RoPE on half of each head
(half-split pairs), an optional per-head q/k RMSNorm, and DeepSeek-V3's mixture (sigmoid router with a correction
bias, groups, renormalisation, scaling, shared experts), against transformers' Glm4MoeForCausalLM on the same
weights."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import Attention, SparseMoE

from .test_deepseek import random_correction_biases_, transformers_pair
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import randomize_
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=40,
            first_k_dense_replace=1, n_shared_experts=1, attention_bias=True)
CASES = {
    # GLM-4.5's: q/k/v biases, RoPE on half of each head, one group, renormalised
    "glm4_moe": {},
    # q/k norms, no biases, 2 groups (the best one), not renormalised, scaled, 2 shared experts
    "glm4_moe-qk-norm": dict(use_qk_norm=True, attention_bias=False, n_group=2, topk_group=1, norm_topk_prob=False,
                             routed_scaling_factor=2.5, n_shared_experts=2),
}


def pair(case, **kw):
    """transformers' model of ``case`` with decisive routers and random correction biases, and ours on its
    weights."""
    return transformers_pair("Glm4Moe", {**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """Every path gives transformers' logits (RoPE on the first half of each head's dims, q/k/v biases, no o bias);
    the config reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = ours.config
    assert (c.rotary_dim, c.qkv_bias, c.out_bias, c.qk_norm) == (8, c.attention_bias, False, "qk-norm" in case)
    assert all(type(layer.self_attn) is Attention for layer in ours.model.layers)
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [False, True, True]
    assert_every_path_matches(hf, ours)
    back = transformers.Glm4MoeConfig.from_dict(c.to_dict())
    for key in ("head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                "use_qk_norm", "attention_bias", "rope_parameters"):
        assert getattr(back, key, None) == getattr(hf.config, key, None), key


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved loads with its logits (the q/k rows reordered for partial RoPE, the shared
    experts and correction biases under its names); ours saves the same names, read back bitwise."""
    assert_checkpoint_directories_both_ways(tmp_path, pair("glm4_moe-qk-norm")[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("glm4_moe")[1], dtype)


def tiny_v3_mixture(model_type: str, seed: int, attention_bias: bool = False, **extra) -> Llama:
    """A tiny random model of a family with DeepSeek-V3's mixture (GLM-4.5's, dots.llm1's): 3 layers, 2 of 4 experts
    within the best of 2 groups, ``extra`` config keys, correction biases ~ N(0, 0.3)."""
    torch.manual_seed(seed)
    config = LlamaConfig(model_type=model_type, vocab_size=64, hidden_size=32, intermediate_size=48, head_dim=8,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, initializer_range=0.3, attention_bias=attention_bias,
                         extra=dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, n_group=2,
                                    topk_group=1, **extra))
    return random_correction_biases_(randomize_(Llama(config), seed).eval(), std=0.3)


def tiny_glm4_moe(seed: int) -> Llama:
    return tiny_v3_mixture("glm4_moe", seed, attention_bias=True, use_qk_norm=True)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_glm4_moe(0), tiny_glm4_moe(1), method, opts)


def test_bad_configs_raise():
    base = {**BASE, "model_type": "glm4_moe"}
    LlamaConfig.from_dict(base)
    for bad, match in (({"use_qk_norm": 1}, "'use_qk_norm'"), ({"mlp_bias": True}, "'mlp_bias'"),
                       ({"partial_rotary_factor": 0.1}, "'partial_rotary_factor'"),  # (1 rotated dim: odd)
                       ({"n_group": 4, "topk_group": 1}, "must divide"),
                       ({"n_group": 3, "topk_group": 1, "num_experts_per_tok": 3}, "cannot be chosen"),
                       ({"q_lora_rank": 8}, "'q_lora_rank'"), ({"topk_method": "noaux_tc"}, "'topk_method'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})
    c = LlamaConfig.from_dict({**base, "num_nextn_predict_layers": 1})
    assert c.experts.correction_bias and c.experts.group_top2 and c.mla is None


# the keys and values of GLM-4.5-Air's published config.json
GLM45_AIR = {
    "architectures": ["Glm4MoeForCausalLM"], "attention_bias": True, "attention_dropout": 0.0, "pad_token_id": 151329,
    "eos_token_id": [151329, 151336, 151338], "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "partial_rotary_factor": 0.5, "initializer_range": 0.02, "intermediate_size": 10944,
    "max_position_embeddings": 131072, "model_type": "glm4_moe", "moe_intermediate_size": 1408,
    "norm_topk_prob": True, "num_attention_heads": 96, "n_group": 1, "topk_group": 1, "n_routed_experts": 128,
    "n_shared_experts": 1, "routed_scaling_factor": 1.0, "num_experts_per_tok": 8, "first_k_dense_replace": 1,
    "num_hidden_layers": 46, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "rope_theta": 1000000, "num_nextn_predict_layers": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.54.0", "use_cache": True, "use_qk_norm": False, "vocab_size": 151552}


def test_glm45_airs_published_config_loads():
    c = LlamaConfig.from_dict(GLM45_AIR)
    e = c.experts
    assert (c.head_dim, c.rotary_dim, c.num_key_value_heads, c.qkv_bias, c.out_bias, c.qk_norm) == (
        128, 64, 8, True, False, False)
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.groups, e.renormalize, e.scale) == (
        128, 8, 1408, 1408, (1, 1), True, 1.0)
    assert e.layers == (False,) + (True,) * 45 and LlamaConfig.from_dict(c.to_dict()) == c


# GLM-4.7-Flash (glm4_moe_lite): DeepSeek-V3's layer (latent attention, its router) under GLM's name, its MLPs' kinds
# listed by mlp_layer_types
LITE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
            n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=40, n_shared_experts=1, q_lora_rank=24)
LITE_CASES = {"lite": {}, "lite-listed": dict(q_lora_rank=None, rope_interleave=False, n_group=2, topk_group=1,
                                              mlp_layer_types=["sparse", "dense", "sparse"])}


@pytest.mark.parametrize("case", list(LITE_CASES))
def test_glm47_flash_matches_transformers(case, tmp_path):
    """Every path gives transformers' Glm4MoeLiteForCausalLM's logits (latent attention, the layers' kinds as listed);
    the config reads back the same; a checkpoint goes both ways; a pass gives the bits of its steps."""
    from triforce.models.llama import LatentAttention

    hf, ours = transformers_pair("Glm4MoeLite", {**LITE, **LITE_CASES[case]})
    assert all(type(layer.self_attn) is LatentAttention for layer in ours.model.layers)
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        t == "sparse" for t in hf.config.mlp_layer_types]
    assert_every_path_matches(hf, ours)
    back = transformers.Glm4MoeLiteConfig.from_dict(ours.config.to_dict())
    for key in ("mlp_layer_types", "kv_lora_rank", "q_lora_rank", "rope_interleave", "n_group", "topk_group"):
        assert getattr(back, key) == getattr(hf.config, key), key
    assert_checkpoint_directories_both_ways(tmp_path, hf)
    assert_pass_equals_steps(ours, torch.float32)


def test_glm47_flash_drafts_losslessly_and_its_layer_skip_cuts_the_list():
    hf, ours = transformers_pair("Glm4MoeLite", {**LITE, **LITE_CASES["lite-listed"]})
    draft = ours.layer_skip(2)
    assert draft.config.extra["mlp_layer_types"] == ["sparse", "dense"]
    for method, opts in (TINY_CASES[2], TINY_CASES[4]):  # a StreamingLLM draft; TriForce's retrieval level
        assert_greedy_equals_autoregressive(ours, draft, method, opts)


def test_glm47_flash_bad_configs_raise():
    base = {**LITE, "model_type": "glm4_moe_lite"}
    assert LlamaConfig.from_dict(base).experts.layers == (False, True, True)
    for bad, match in (({"first_k_dense_replace": 1}, "'first_k_dense_replace'"),
                       ({"mlp_layer_types": ["dense", "sparse"]}, "'mlp_layer_types'"),
                       ({"mlp_layer_types": ["dense", "moe", "sparse"]}, "'mlp_layer_types'"),
                       ({"num_key_value_heads": 2}, "num_key_value_heads = 2"),
                       ({"topk_method": "greedy"}, "'topk_method'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})


@pytest.mark.parametrize("case", ["glm4_moe", "glm4_moe-qk-norm"])
def test_gguf_glm4moe_as_llama_cpp_writes_it(tmp_path, case):
    """A glm4moe GGUF (GLM-4.5's, as llama.cpp's converter writes the checkpoint) loads as its checkpoint's model
    (the multi-token prediction layer its converter appends skipped; RoPE on the first half of each head, the q/k
    norms where the file has them):
    transformers' logits, the conversion cache read back, the blocks bitwise."""
    from .test_deepseek import _GGUF_WIDTHS, assert_grouped_gguf_loads

    hf, ours = pair(case, **_GGUF_WIDTHS)
    assert_grouped_gguf_loads(tmp_path, hf, ours, "glm4moe", mtp=True)


@pytest.mark.parametrize("case", list(LITE_CASES))
def test_gguf_glm47_flash_as_llama_cpp_writes_it(tmp_path, case):
    """GLM-4.7-Flash's GGUF (llama.cpp's converter writes it as deepseek2, its prediction layer appended) loads as
    DeepSeek-V3's layer, the same model: transformers' Glm4MoeLiteForCausalLM's logits, the blocks bitwise (the
    dense layers before leading_dense_block_count: its list's first one). "lite-listed" puts a dense layer after a
    sparse one, which the file cannot say: it raises naming the layer (llama.cpp cannot load it either)."""
    from .test_deepseek import _GGUF_WIDTHS, assert_grouped_gguf_loads, write_grouped_gguf

    # (rms_norm_eps 1e-6: llama.cpp's deepseek2 takes the file's eps for the latent norms too, where the checkpoint's
    # model (transformers', ours) keeps DeepSeek's 1e-6; at GLM-4.7-Flash's 1e-5 its logits differ by ~1e-4 there)
    hf, ours = transformers_pair("Glm4MoeLite", {**LITE, **LITE_CASES[case], **_GGUF_WIDTHS, "rms_norm_eps": 1e-6})
    if case == "lite":
        assert_grouped_gguf_loads(tmp_path, hf, ours, "deepseek2", model_type="deepseek_v3", mtp=True)
        return
    with pytest.raises(ValueError, match="layer 1 lacks ffn_gate_exps"):
        Llama.from_pretrained(write_grouped_gguf(tmp_path / "m.gguf", hf, "deepseek2"), cache_dir=False)


# ---- Solar Open (model_type "solar_open"): GLM-4.5's mixture on every layer under Llama's attention
SOLAR = dict(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=40, n_shared_experts=1,
             attention_bias=True)


def test_solar_open_reads_as_glm45_with_every_layer_sparse_and_whole_head_rope(tmp_path):
    """SolarOpenForCausalLM: every path gives its logits (RoPE on the whole head, every layer sparse, q/k/v biases);
    its checkpoint loads with them; our save (a glm4_moe config over the same names) is read back by transformers'
    Glm4MoeForCausalLM with the same logits. Keys its config does not have, at another value, raise."""
    from .test_model import TOL

    hf, ours = transformers_pair("SolarOpen", SOLAR)
    c = ours.config
    assert (c.model_type, c.rotary_dim, c.qkv_bias, c.out_bias, c.qk_norm) == ("glm4_moe", 16, True, False, False)
    assert all(type(layer.mlp) is SparseMoE for layer in ours.model.layers)
    ids, ref = assert_every_path_matches(hf, ours)
    hf.save_pretrained(tmp_path / "hf")
    loaded = Llama.from_pretrained(tmp_path / "hf")
    loaded.save_pretrained(tmp_path / "ours")
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert type(back).__name__ == "Glm4MoeForCausalLM"
    with torch.no_grad():
        assert (loaded(ids) - ref).abs().max().item() <= TOL
        assert (back(ids).logits - ref).abs().max().item() <= TOL
    for key, value in (("first_k_dense_replace", 1), ("use_qk_norm", True), ("partial_rotary_factor", 0.5)):
        with pytest.raises(ValueError, match=f"'{key}'"):
            LlamaConfig.from_dict({"model_type": "solar_open", **SOLAR, key: value})
    assert_pass_equals_steps(ours, torch.float32)
