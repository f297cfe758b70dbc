"""MiniMax-M2 (``model_type="minimax_m2"``: MiniMax-M2, M2.1, M2.5): Llama's attention with an RMSNorm over each
token's whole query and key projections (heads x head_dim wide) and RoPE on the first ``rotary_dim`` of each head;
every layer a mixture whose sigmoid router (logits in the model's dtype) plus a correction bias chooses the experts,
weighted by the renormalised sigmoids; against transformers' MiniMaxM2ForCausalLM on the same weights."""
import json

import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import randomize_
from .test_model import TOL
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# 4 query heads of 32 over 2 KV heads (the norms 128 and 64 wide, past hidden 64), RoPE on 16 of each head's 32
BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, head_dim=32, num_local_experts=6, num_experts_per_tok=2, rotary_dim=16,
            max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
CASES = {"m2": {}, "whole-head": dict(rotary_dim=16, num_experts_per_tok=3, head_dim=16)}


def pair(case, **kw):
    """transformers' model of ``case`` (random weights, decisive routers: std 0.5; random correction biases) and
    ours on its weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    hf = randomize_(transformers.MiniMaxM2ForCausalLM(
        transformers.MiniMaxM2Config(**{**BASE, **CASES[case], **kw}, attn_implementation="eager")).eval())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        for n, b in hf.named_buffers():
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """Every path gives transformers' logits (the whole-projection q/k norms, partial RoPE's dims reordered, their
    norms' weights with them); the config reads back in transformers as the same model."""
    hf, ours = pair(case)
    c, e = ours.config, ours.config.experts
    assert c.qk_norm_full and c.rotary_dim == hf.config.rotary_dim and all(
        type(layer.mlp) is SparseMoE for layer in ours.model.layers)
    assert (e.scoring, e.correction_bias, e.renormalize, e.float32_weights, e.logits_in_dtype, e.groups) == (
        "sigmoid", True, True, True, True, None)
    assert_every_path_matches(hf, ours)
    back = transformers.MiniMaxM2Config.from_dict(c.to_dict())
    for key in ("num_local_experts", "num_experts_per_tok", "head_dim", "intermediate_size", "rope_parameters"):
        assert getattr(back, key) == getattr(hf.config, key), key


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved loads with its logits (Mixtral's names: block_sparse_moe, w1 / w3 / w2, the
    correction bias beside the router); ours saves the same names, read back bitwise."""
    assert_checkpoint_directories_both_ways(tmp_path, pair("m2")[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("m2")[1], dtype)


def test_each_part_matters():
    """The correction bias, the renormalisation and partial RoPE each move the logits well past the tests'
    tolerance."""
    hf, _ = pair("m2")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for change in (lambda m: m.gate.e_score_correction_bias.zero_(), lambda m: setattr(m, "renormalize", False)):
            _, other = pair("m2")
            for layer in other.model.layers:
                change(layer.mlp)
            assert (other(ids) - ref).abs().max().item() > 10 * TOL
        whole = pair("m2", rotary_dim=32)[1]  # (the same weights, RoPE on the whole head)
        assert (whole(ids) - ref).abs().max().item() > 10 * TOL


def tiny_minimax(seed: int) -> Llama:
    from .test_deepseek import random_correction_biases_

    torch.manual_seed(seed)
    config = LlamaConfig.from_dict({**BASE, "model_type": "minimax_m2", "vocab_size": 64, "hidden_size": 32,
                                    "head_dim": 16, "rotary_dim": 8, "num_local_experts": 4,
                                    "max_position_embeddings": 1024, "initializer_range": 0.3})
    return random_correction_biases_(randomize_(Llama(config), seed).eval(), std=0.3)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_minimax(0), tiny_minimax(1), method, opts)


# the keys and values of MiniMax-M2's published config.json (its FP8 weights' quantization_config)
MINIMAX_M2 = {
    "architectures": ["MiniMaxM2ForCausalLM"], "attn_type_list": [1] * 62,
    "auto_map": {"AutoConfig": "configuration_minimax_m2.MiniMaxM2Config",
                 "AutoModelForCausalLM": "modeling_minimax_m2.MiniMaxM2ForCausalLM"},
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 3072, "intermediate_size": 1536,
    "max_position_embeddings": 196608, "model_type": "minimax_m2", "mtp_transformer_layers": 1,
    "num_attention_heads": 48, "num_experts_per_tok": 8, "num_hidden_layers": 62, "num_key_value_heads": 8,
    "num_local_experts": 256, "num_mtp_modules": 3, "qk_norm_type": "per_layer", "rms_norm_eps": 1e-06,
    "rope_theta": 5000000, "rotary_dim": 64, "scoring_func": "sigmoid", "shared_intermediate_size": 0,
    "tie_word_embeddings": False, "transformers_version": "4.46.1", "use_cache": True, "use_mtp": True,
    "use_qk_norm": True, "use_routing_bias": True, "vocab_size": 200064, "torch_dtype": "bfloat16",
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "float8_e4m3fn", "quant_method": "fp8",
                            "weight_block_size": [128, 128],
                            "modules_to_not_convert": ["gate", "e_score_correction_bias", "lm_head"]}}


def test_the_published_config_loads():
    """MiniMax-M2's config reads as transformers reads it (RoPE on 64 of 128 dims, 8 of 256 experts, its FP8
    weights' config read); the config we write (the dequantised model's) reads back the same."""
    c = LlamaConfig.from_dict(MINIMAX_M2)
    e = c.experts
    assert (c.rotary_dim, c.head_dim, c.rope_theta, e.count, e.top_k, e.intermediate_size) == (
        64, 128, 5000000.0, 256, 8, 1536)
    assert LlamaConfig.from_dict(c.to_dict()) == LlamaConfig.from_dict(
        {k: v for k, v in MINIMAX_M2.items() if k != "quantization_config"})


def test_bad_configs_raise():
    base = {**BASE, "model_type": "minimax_m2"}
    for bad, match in (({"attn_type_list": [1, 0, 1]}, "'attn_type_list'"),
                       ({"use_qk_norm": False}, "'use_qk_norm'"), ({"qk_norm_type": "per_head"}, "'qk_norm_type'"),
                       ({"scoring_func": "softmax"}, "'scoring_func'"),
                       ({"shared_intermediate_size": 64}, "'shared_intermediate_size'"),
                       ({"use_routing_bias": False}, "'use_routing_bias'"), ({"rotary_dim": 40}, "rotary_dim"),
                       ({"num_experts_per_tok": 7}, "more than the 6 experts")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})
    assert json.dumps(LlamaConfig.from_dict(base).to_dict())


# ---- GGUF files (llama.cpp's minimax-m2)

def write_minimax_m2_gguf(path, hf, quant=None, omit=()):
    """A GGUF of transformers' model ``hf`` as llama.cpp's converter (MiniMaxM2Model) writes the checkpoint
    (test_families.write_stacked_experts_gguf: q / k rows as the checkpoint holds them, llama.cpp's NEOX RoPE on the
    first rope.dimension_count dims, its rotary_dim): expert_feed_forward_length the model's intermediate_size,
    expert_gating_func 2 (its scoring_func sigmoid)."""
    from .test_families import converted_kv, write_stacked_experts_gguf

    c = hf.config
    kv = {**converted_kv(c, rotated=int(c.head_dim * c.rope_parameters.get("partial_rotary_factor", 1.0))),
          "expert_count": c.num_local_experts, "expert_used_count": c.num_experts_per_tok,
          "expert_feed_forward_length": c.intermediate_size, "expert_gating_func": 2}
    return write_stacked_experts_gguf(path, hf, "minimax-m2", kv, quant, omit)


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_minimax_m2_as_llama_cpp_writes_it(tmp_path, case):
    """A minimax-m2 GGUF loads as its checkpoint's model (RoPE on rope.dimension_count of each head, the whole
    projections' q / k norms, the router's correction bias): transformers' logits, the conversion cache read back by
    transformers as the same model; in Q8_0 / Q5_0 blocks (the experts in Q8_0) ``gguf_copy`` and
    ``load_gguf_int8`` compute the loaded model bitwise."""
    from .test_families import assert_mixture_gguf_loads

    assert_mixture_gguf_loads(tmp_path, *pair(case, intermediate_size=64), write_minimax_m2_gguf)


def test_gguf_minimax_m2_other_gating_raises(tmp_path):
    from .test_families import write_gguf_file

    hf, _ = pair("m2")
    path = write_minimax_m2_gguf(tmp_path / "m.gguf", hf)
    import gguf
    reader = gguf.GGUFReader(str(path))
    kv = {k[len("minimax-m2."):]: f.contents() for k, f in reader.fields.items() if k.startswith("minimax-m2.")}
    arrays = {t.name: t.data.reshape([int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    write_gguf_file(tmp_path / "s.gguf", "minimax-m2", {**kv, "expert_gating_func": 1}, arrays, hf.config)
    with pytest.raises(ValueError, match="expert_gating_func = 1"):
        Llama.from_pretrained(tmp_path / "s.gguf", cache_dir=False)
