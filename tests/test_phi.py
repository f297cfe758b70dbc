"""Phi-2 (``model_type="phi"``: phi-1, phi-1.5, phi-2): one LayerNorm (with a bias) before the attention and the MLP,
which run in parallel on it; biases on every projection and on the LM head; RoPE on the first
``partial_rotary_factor`` of each head; an ungated MLP of GELU's tanh form (``fc1``, ``fc2``); with ``qk_layernorm`` a
LayerNorm (with a bias) over each query and key head, shared by the heads. Against transformers' PhiForCausalLM, and
from GGUF as llama.cpp's converter writes it (``phi2``)."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import BiasLayerNorm, FeedForward

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k != "rms_norm_eps"} | {"num_hidden_layers": 3}
CASES = {"phi-2-rope": dict(partial_rotary_factor=0.4, num_key_value_heads=4), "gqa-half-rope": {},
         "tied-dropouts": dict(tie_word_embeddings=True, resid_pdrop=0.1, embd_pdrop=0.1),
         "qk-layernorm": dict(qk_layernorm=True, partial_rotary_factor=0.4)}


def pair(case="phi-2-rope", **kw):
    """transformers' PhiForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("Phi", **{**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the parallel block on one LayerNorm, partial RoPE, the ungated MLP, the
    head's bias); the checkpoint we save (dense, fc1 / fc2, final_layernorm) reads back in transformers as the same
    model."""
    hf, ours = pair(case)
    layer = ours.model.layers[0]
    assert type(layer.mlp) is FeedForward and type(layer.input_layernorm) is BiasLayerNorm
    assert "post_attention_layernorm" not in layer._modules and ours.lm_head.bias is not None
    assert ours.config.rotary_dim == int(16 * hf.config.rope_parameters["partial_rotary_factor"]) // 2 * 2
    q_norm = layer.self_attn.q_norm  # (the checkpoint's q_layernorm: its weight and bias reordered with RoPE's dims)
    assert (q_norm is None) == (not hf.config.qk_layernorm) and (q_norm is None or type(q_norm) is BiasLayerNorm)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes PhiConfig's (half of each head RoPE'd, biases everywhere, eps 1e-5 by
    layer_norm_eps, no q / k LayerNorm); bias keys (not PhiConfig's) raise."""
    c = LlamaConfig.from_dict({**BASE, "model_type": "phi", "layer_norm_eps": 1e-6, "resid_pdrop": 0.1})
    assert (c.rotary_dim, c.rms_norm_eps, c.qkv_bias, c.out_bias, c.mlp_bias, c.head_bias) == (8, 1e-6, True, True,
                                                                                                True, True)
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict() and "attention_bias" not in c.to_dict()
    assert not c.qk_norm and LlamaConfig.from_dict({**BASE, "model_type": "phi", "qk_layernorm": True}).qk_norm
    for bad, match in (({"attention_bias": True}, "'attention_bias'"), ({"qk_layernorm": "yes"}, "'qk_layernorm'"),
                       ({"hidden_act": "gelu"}, "'hidden_act'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**BASE, "model_type": "phi", **bad})


def tiny_phi(seed):
    return tiny_family("phi", seed, attention_bias=True, mlp_bias=True)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_phi(0), tiny_phi(1), method, opts)


def test_int8_drafts_and_trained_heads_see_the_model():
    """The int8 draft copy (the head's bias kept) drafts losslessly; Hidden Transfer heads' training forward runs the
    upper layers (the parallel block, partial RoPE) as decoding runs them."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_phi(0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)


@pytest.mark.parametrize("case", ["phi-2-rope", "tied-dropouts"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A phi2 GGUF as llama.cpp's converter writes a PhiForCausalLM checkpoint (the gguf package's names: dense as
    attn_output, fc1 / fc2 as ffn_up / ffn_down, final_layernorm as output_norm, the head's bias as output.bias;
    rope.dimension_count the RoPE'd dims, NEOX RoPE) gives transformers' logits; its blocks compute the loaded model
    bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, ours = pair(case)
    kv = converted_kv(hf.config, rotated=ours.config.rotary_dim, eps_key="attention.layer_norm_epsilon")
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "phi2", kv)
    assert loaded.config.model_type == "phi" and loaded.config.rotary_dim == ours.config.rotary_dim
