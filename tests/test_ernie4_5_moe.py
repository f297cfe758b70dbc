"""ERNIE 4.5's mixtures (``model_type="ernie4_5_moe"``: ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): ERNIE 4.5's layer
(biases on every projection by ``use_bias``, the head's too; RoPE on adjacent pairs in float32) with sparse layers by
``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval``, a float32 router whose softmax plus a
correction bias chooses the experts, weighted by the renormalised probabilities, and shared experts; against
transformers' Ernie4_5_MoeForCausalLM on the same weights."""
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

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, moe_num_experts=6, moe_k=2, moe_intermediate_size=40,
            moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_interval=1)
CASES = {
    # ERNIE-4.5-21B-A3B's shape: the first layer dense, then every one sparse, a shared expert, tied, no biases
    "a3b": {},
    # every projection biased (the head too), untied, 2 shared experts
    "biases-untied": dict(use_bias=True, tie_word_embeddings=False, moe_num_shared_experts=2),
    # every other layer sparse from the first, up to layer 2; no shared expert; 3 of 6 experts
    "interval": dict(moe_layer_start_index=0, moe_layer_end_index=2, moe_layer_interval=2, moe_num_shared_experts=0,
                     moe_k=3),
}


def transformers_model(kw: dict):
    """transformers' Ernie4_5_MoeForCausalLM of config ``kw`` (random weights; decisive routers: std 0.5; random
    correction biases: its moe_statics parameters)."""
    torch.manual_seed(0)
    hf = randomize_(transformers.Ernie4_5_MoeForCausalLM(
        transformers.Ernie4_5_MoeConfig(**kw, attn_implementation="eager")).eval())
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if n.endswith("mlp.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif n.endswith("e_score_correction_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return hf


def pair(case, **kw):
    from triforce.models.loading import _build

    hf = transformers_model({**BASE, **CASES[case], **kw})
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """Every path gives transformers' logits (the layers' kinds by the start / end / interval keys); the config reads
    back in transformers as the same model."""
    hf, ours = pair(case)
    c, e = ours.config, ours.config.experts
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        type(layer.mlp).__name__ == "Ernie4_5_MoeSparseMoeBlock" for layer in hf.model.layers]
    assert (e.correction_bias, e.renormalize, e.float32_weights, e.float32_router, c.head_bias) == (
        True, True, False, True, case == "biases-untied")
    assert_every_path_matches(hf, ours)
    back = transformers.Ernie4_5_MoeConfig.from_dict(c.to_dict())
    for key in ("moe_num_experts", "moe_k", "moe_intermediate_size", "moe_num_shared_experts",
                "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval", "use_bias",
                "tie_word_embeddings", "head_dim", "rope_parameters"):
        assert getattr(back, key) == getattr(hf.config, key), key


@pytest.mark.parametrize("case", ["a3b", "biases-untied"])
def test_checkpoint_directories_both_ways(tmp_path, case):
    """A checkpoint transformers saved loads with its logits (the experts one by one, the correction biases as its
    moe_statics ``[1, experts]``, the shared experts under its names); ours saves the same names, read back
    bitwise."""
    assert_checkpoint_directories_both_ways(tmp_path, pair(case)[0])


def test_bfloat16_keeps_the_router_in_float32_as_transformers():
    """In bfloat16 the router's weight and correction bias stay float32 (transformers'
    ``_keep_in_fp32_modules_strict``), ``.to`` included; the logits are as near float32's as transformers' bfloat16
    model's (loaded with ``dtype=bfloat16``, which keeps them so too)."""
    import tempfile

    hf, ours = pair("biases-untied")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), tempfile.TemporaryDirectory() as d:
        ref = hf(ids).logits
        hf.save_pretrained(d)
        theirs = transformers.Ernie4_5_MoeForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
        assert theirs.model.layers[1].mlp.gate.weight.dtype == torch.float32
        for model in (ours.to(torch.bfloat16), Llama.from_pretrained(d, dtype=torch.bfloat16)):
            gate = model.model.layers[1].mlp.gate
            assert gate.weight.dtype == gate.e_score_correction_bias.dtype == torch.float32
            mine = (model(ids).float() - ref).abs().max().item()
            assert mine <= 2 * (theirs(ids).logits.float() - ref).abs().max().item() + 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("biases-untied")[1], dtype)


def test_each_part_matters():
    """The correction bias, the renormalisation and the head's bias each move the logits well past the tests'
    tolerance (a test of the loaded model would notice one dropped)."""
    hf, ours = pair("biases-untied")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for change in (lambda m: m.gate.e_score_correction_bias.zero_(), lambda m: setattr(m, "renormalize", False)):
            _, other = pair("biases-untied")
            for layer in other.model.layers:
                if isinstance(layer.mlp, SparseMoE):
                    change(layer.mlp)
            assert (other(ids) - ref).abs().max().item() > 10 * TOL
        _, other = pair("biases-untied")
        other.lm_head.bias.zero_()
        assert (other(ids) - ref).abs().max().item() > 10 * TOL


def tiny_ernie_moe(seed: int) -> Llama:
    torch.manual_seed(seed)
    config = LlamaConfig(model_type="ernie4_5_moe", vocab_size=64, hidden_size=32, intermediate_size=48, head_dim=8,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, initializer_range=0.3, attention_bias=True, mlp_bias=True,
                         extra=dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=24, moe_num_shared_experts=1))
    model = randomize_(Llama(config), seed).eval()
    from .test_deepseek import random_correction_biases_
    return random_correction_biases_(model, std=0.3)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_ernie_moe(0), tiny_ernie_moe(1), method, opts)


# the keys and values of ERNIE-4.5-21B-A3B-PT's config.json as Baidu ships it
ERNIE_21B_A3B = {
    "architectures": ["Ernie4_5_MoeForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 2560, "intermediate_size": 12288, "max_position_embeddings": 131072, "model_type": "ernie4_5_moe",
    "num_attention_heads": 20, "num_key_value_heads": 4, "num_hidden_layers": 28, "pad_token_id": 0,
    "rms_norm_eps": 1e-05, "use_cache": False, "vocab_size": 103424, "rope_theta": 500000, "use_bias": False,
    "tie_word_embeddings": True, "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1,
    "moe_intermediate_size": 1536, "moe_capacity": [64, 64, 64], "moe_k": 6, "moe_layer_interval": 1,
    "moe_use_aux_free": True, "num_nextn_predict_layers": 1, "multi_token_pred_lambda": 0.3, "moe_gate_act": "softmax",
    "torch_dtype": "bfloat16"}


def test_the_published_config_loads_and_its_prediction_weights_are_skipped(tmp_path):
    """ERNIE-4.5-21B-A3B-PT's config reads as transformers reads it (64 experts, 6 a token, 2 shared, layers 1-27
    sparse); a checkpoint holding its multi-token prediction weights (``model.mtp_*``, not part of the forward)
    loads without them, as transformers drops them."""
    import safetensors.torch

    c = LlamaConfig.from_dict(ERNIE_21B_A3B)
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, c.head_dim, c.rope_theta) == (
        64, 6, 1536, 3072, 128, 500000.0)
    assert e.layers == (False,) + (True,) * 27 and LlamaConfig.from_dict(c.to_dict()) == c
    hf, _ = pair("a3b")
    hf.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    sd = safetensors.torch.load_file(path)
    g = torch.Generator().manual_seed(0)
    mtp = {"model.mtp_block.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g),
           "model.mtp_linear_proj.0.weight": torch.randn(64, 128, generator=g),
           "model.mtp_hidden_norm.0.weight": torch.ones(64), "model.mtp_emb_norm.0.weight": torch.ones(64)}
    safetensors.torch.save_file({**sd, **mtp}, path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    ids = torch.randint(0, 101, (1, 16), generator=g)
    with torch.no_grad():
        assert (Llama.from_pretrained(tmp_path)(ids) - hf(ids).logits).abs().max().item() <= TOL


def test_bad_configs_raise():
    base = {**BASE, "model_type": "ernie4_5_moe"}
    assert LlamaConfig.from_dict({**base, "num_experts": 6, "num_experts_per_tok": 2}).experts.top_k == 2
    for bad, match in (({"moe_k": 7}, "more than the 6 experts"), ({"moe_gate_act": "sigmoid"}, "'moe_gate_act'"),
                       ({"moe_norm_min": 0.5}, "'moe_norm_min'"), ({"moe_use_aux_free": False}, "'moe_use_aux_free'"),
                       ({"moe_num_experts": [6, 6]}, "'moe_num_experts'"), ({"attention_bias": True}, "use_bias"),
                       ({"num_experts_per_tok": 3}, "disagree"), ({"n_routed_experts": 6}, "'n_routed_experts'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, **bad})


# ---- GGUF files (llama.cpp's ernie4_5-moe)

def write_ernie_moe_gguf(path, hf, quant=None, omit=()):
    """A GGUF of transformers' model ``hf`` as llama.cpp's converter (Ernie4_5MoeModel) writes the checkpoint
    (test_families.write_stacked_experts_gguf: q / k rows as the checkpoint holds them, llama.cpp's normal RoPE;
    the correction bias as its ``[1, experts]``): expert_count / expert_used_count / interleave_moe_layer_step /
    leading_dense_block_count / expert_feed_forward_length / expert_shared_count, and expert_shared_feed_forward_length
    as the converter computes it (intermediate_size // num_key_value_heads)."""
    from .test_families import converted_kv, write_stacked_experts_gguf

    c = hf.config
    kv = {**converted_kv(c), "expert_count": c.moe_num_experts, "expert_used_count": c.moe_k,
          "interleave_moe_layer_step": c.moe_layer_interval, "leading_dense_block_count": c.moe_layer_start_index,
          "expert_feed_forward_length": c.moe_intermediate_size, "expert_shared_count": c.moe_num_shared_experts,
          "expert_shared_feed_forward_length": c.intermediate_size // c.num_key_value_heads}
    return write_stacked_experts_gguf(path, hf, "ernie4_5-moe", kv, quant, omit)


# MLP widths of whole Q8_0 blocks (32), so the quantised files hold blocks of the experts too; the dense MLP's width
# over the KV heads the shared expert's, as the converter's expert_shared_feed_forward_length has it (llama.cpp
# checks the shared expert's tensors against it)
_GGUF_WIDTHS = dict(moe_intermediate_size=64, intermediate_size=128)


@pytest.mark.parametrize("case", ["a3b", "interval"])
def test_gguf_ernie4_5_moe_as_llama_cpp_writes_it(tmp_path, case):
    """An ernie4_5-moe GGUF (ERNIE-4.5-21B-A3B's shape; every other layer sparse from the first) loads as its
    checkpoint's model: transformers' logits, the conversion cache read back by transformers as the same model; in
    Q8_0 / Q5_0 blocks (the experts in Q8_0) ``gguf_copy`` and ``load_gguf_int8`` compute the loaded model bitwise.
    (The file has no end index: llama.cpp's sparse layers run to the last, as the checkpoints' do. llama.cpp refuses
    the "interval" file: its loader wants experts in every layer from leading_dense_block_count on, whatever
    interleave_moe_layer_step, which its forward reads; ERNIE 4.5's published mixtures have an interval of 1.)"""
    from .test_families import assert_mixture_gguf_loads

    hf, ours = pair(case, moe_layer_end_index=-1, **_GGUF_WIDTHS)
    assert_mixture_gguf_loads(tmp_path, hf, ours, write_ernie_moe_gguf)


def test_gguf_ernie4_5_moe_without_router_biases_takes_zeros(tmp_path):
    from .test_families import assert_missing_router_biases_are_zeros

    assert_missing_router_biases_are_zeros(tmp_path, pair("a3b", **_GGUF_WIDTHS)[0], write_ernie_moe_gguf)
