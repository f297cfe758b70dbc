"""dots.llm1 (``model_type="dots1"``): Qwen3's attention (a per-head q/k RMSNorm, Qwen's sliding windows from
``max_window_layers`` on) with DeepSeek-V3's mixture (sigmoid router with a correction bias, groups, renormalisation,
scaling, shared experts) from ``first_k_dense_replace`` on, against transformers' Dots1ForCausalLM on the same
weights."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import SparseMoE

from .test_deepseek import V2_LITE, V3, transformers_pair
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_glm4_moe import tiny_v3_mixture
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, n_routed_experts=6, num_experts_per_tok=2, moe_intermediate_size=40,
            first_k_dense_replace=1, n_shared_experts=2, norm_topk_prob=True, routed_scaling_factor=2.5)
CASES = {
    # dots.llm1's: a dense first layer, two shared experts, renormalised and scaled, 2 groups (the best one)
    "dots1": dict(n_group=2, topk_group=1),
    # Qwen's sliding windows (6) from max_window_layers (1) on, q/k/v/o biases, one shared expert, one group, not
    # renormalised, no dense layer
    "dots1-window": dict(sliding_window=6, max_window_layers=1, max_position_embeddings=64, attention_bias=True,
                         n_shared_experts=1, norm_topk_prob=False, first_k_dense_replace=0),
}


def pair(case, **kw):
    """transformers' model of ``case`` with decisive routers and random correction biases, and ours on its
    weights."""
    return transformers_pair("Dots1", {**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """Every path gives transformers' logits (the per-head q/k norms, the windows of Qwen's layers, V3's router); the
    config reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = ours.config
    assert (c.qk_norm, c.qkv_bias, c.out_bias, c.mla) == (True, c.attention_bias, c.attention_bias, None)
    assert c.layer_windows == ((0, 6, 6) if "window" in case else (0, 0, 0))
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [i >= hf.config.first_k_dense_replace
                                                                           for i in range(3)]
    assert_every_path_matches(hf, ours)
    back = transformers.Dots1Config.from_dict(c.to_dict())
    for key in ("head_dim", "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
                "first_k_dense_replace", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                "attention_bias", "sliding_window", "layer_types", "rope_parameters"):
        assert getattr(back, key, None) == getattr(hf.config, key, None), key


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved loads with its logits (the shared experts and correction biases under its
    names); ours saves the same names, read back bitwise."""
    assert_checkpoint_directories_both_ways(tmp_path, pair("dots1")[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("dots1-window")[1], dtype)


def tiny_dots1(seed: int) -> Llama:
    return tiny_v3_mixture("dots1", seed, n_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_dots1(0), tiny_dots1(1), method, opts)


def test_null_groups_are_one_group():
    """n_group / topk_group null (as dots.llm1's config.json has them; transformers' router fails on them): every
    expert in one group, the logits of n_group = topk_group = 1 bitwise; DeepSeek-V3's router the same. V2's
    grouped method needs both and raises naming them."""
    hf, one = pair("dots1", n_group=1, topk_group=1)
    null = Llama(LlamaConfig.from_dict({**one.config.to_dict(), "n_group": None, "topk_group": None}))
    null.load_state_dict(one.state_dict())
    assert null.config.experts.groups is None and one.config.experts.groups == (1, 1)
    ids = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(null.eval()(ids), one(ids))
    assert LlamaConfig.from_dict({**V3, "n_group": None, "topk_group": None}).experts.groups is None
    with pytest.raises(ValueError, match="needs both as ints >= 1"):
        LlamaConfig.from_dict({**V2_LITE, "topk_method": "group_limited_greedy", "n_group": None, "topk_group": None})


def test_bad_configs_raise():
    base = {**BASE, "model_type": "dots1"}
    LlamaConfig.from_dict(base)
    for bad, match in (({"n_group": 4, "topk_group": 1}, "must divide"),
                       ({"n_group": 3, "topk_group": 1, "num_experts_per_tok": 3}, "cannot be chosen"),
                       ({"num_experts_per_tok": 7}, "more than the 6"),
                       ({"q_lora_rank": 8}, "'q_lora_rank'"), ({"topk_method": "greedy"}, "'topk_method'"),
                       ({"scoring_func": "softmax"}, "'scoring_func'"), ({"use_qk_norm": True}, "'use_qk_norm'"),
                       ({"partial_rotary_factor": 0.5}, "'partial_rotary_factor'"),
                       ({"sliding_window": None, "layer_types": ["full_attention", "sliding_attention"] * 1
                         + ["full_attention"]}, "'sliding_window'"),
                       ({"layer_types": ["full_attention"] * 2}, "'layer_types'"),
                       ({"max_window_layers": "all"}, "'max_window_layers'"),
                       ({"num_nextn_predict_layers": 1}, "'num_nextn_predict_layers'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})


# the keys and values of dots.llm1.inst's config.json that a public converted copy of it lists (MLX's quantization
# key left out)
DOTS_LLM1 = {
    "model_type": "dots1", "hidden_size": 4096, "num_hidden_layers": 62, "intermediate_size": 10944,
    "num_attention_heads": 32, "num_key_value_heads": 32, "rms_norm_eps": 1e-05, "vocab_size": 152064,
    "first_k_dense_replace": 1, "moe_intermediate_size": 1408, "n_routed_experts": 128, "n_shared_experts": 2,
    "num_experts_per_tok": 6, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "max_position_embeddings": 32768,
    "rope_theta": 10000000, "scoring_func": "sigmoid", "attention_bias": False, "tie_word_embeddings": False,
    "eos_token_id": 151649, "n_group": None, "topk_group": None}


def test_dots_llm1s_published_config_loads():
    c = LlamaConfig.from_dict(DOTS_LLM1)
    e = c.experts
    assert (c.head_dim, c.num_key_value_heads, c.qk_norm, c.qkv_bias, c.rope_theta) == (128, 32, True, False, 1e7)
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.groups, e.renormalize, e.scale,
            e.scoring, e.correction_bias) == (128, 6, 1408, 2816, None, True, 2.5, "sigmoid", True)
    assert e.layers == (False,) + (True,) * 61 and c.layer_windows == (0,) * 62
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict()  # (its to_dict adds the family's defaults)


@pytest.mark.parametrize("case", ["dots1"])
def test_gguf_dots1_as_llama_cpp_writes_it(tmp_path, case):
    """A dots1 GGUF (dots.llm1's, as llama.cpp's converter writes the checkpoint) loads as its checkpoint's model
    (the per-head q/k norms, no window: llama.cpp's dots1 slides none):
    transformers' logits, the conversion cache read back, the blocks bitwise."""
    from .test_deepseek import _GGUF_WIDTHS, assert_grouped_gguf_loads

    # (dots.llm1's heads: as many KV heads as query heads, the shape llama.cpp's dots1 builds; its oracle refuses others)
    hf, ours = pair(case, num_key_value_heads=4, **_GGUF_WIDTHS)
    assert_grouped_gguf_loads(tmp_path, hf, ours, "dots1")
