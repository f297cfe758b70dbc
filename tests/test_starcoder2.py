"""StarCoder 2 (``model_type="starcoder2"``: starcoder2-3b / 7b / 15b): torch's LayerNorm with a bias, biases on every
projection by its one ``use_bias`` key, an ungated MLP (``c_fc``, GELU's tanh form, ``c_proj``), a sliding window on
every layer where its config sets one. Against transformers' Starcoder2ForCausalLM, and from GGUF as llama.cpp's
converter writes it."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import BiasLayerNorm, FeedForward

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(TINY, num_hidden_layers=3, bos_token_id=0, eos_token_id=0)
CASES = {"biases-tied": {}, "window-no-bias": dict(sliding_window=7, use_bias=False),
         "untied-heads-8": dict(head_dim=8, tie_word_embeddings=False)}


def pair(case="biases-tied", **kw):
    """transformers' Starcoder2ForCausalLM of ``case`` (random weights, biases and norms randomised) and ours."""
    return transformers_and_ours("Starcoder2", **{**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers' logits
    (the LayerNorms with their biases, the ungated MLP, the window); the checkpoint we save (c_fc / c_proj, use_bias,
    norm_epsilon) reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = ours.config
    layer = ours.model.layers[0]
    assert type(layer.mlp) is FeedForward and type(layer.input_layernorm) is BiasLayerNorm
    assert c.attention_bias == c.mlp_bias == hf.config.use_bias and c.rms_norm_eps == hf.config.norm_epsilon
    assert c.layer_windows == (hf.config.sliding_window or 0,) * 3
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    """The LayerNorm, the GELU (the native kernel's, each row alone) and the biases: a pass gives bitwise the logits of
    one-token steps."""
    assert_pass_equals_steps(pair("window-no-bias")[1], dtype)
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes Starcoder2Config's (biases, a tied head, 2 KV heads, eps 1e-5, no window); its
    shipped dropouts (training only) load; its bias key is use_bias alone; other keys it does not read raise."""
    c = LlamaConfig.from_dict({**TINY, "model_type": "starcoder2", "attention_dropout": 0.1, "residual_dropout": 0.1,
                               "embedding_dropout": 0.1, "norm_epsilon": 1e-6})
    assert c.attention_bias and c.mlp_bias and c.tie_word_embeddings and c.rms_norm_eps == 1e-6
    d = LlamaConfig.from_dict({"model_type": "starcoder2"})
    assert (d.num_key_value_heads, d.vocab_size, d.layer_windows) == (2, 49152, (0,) * 30)
    assert LlamaConfig.from_dict(c.to_dict()).to_dict() == c.to_dict() and c.to_dict()["norm_epsilon"] == 1e-6
    for bad, match in (({"attention_bias": False}, "'attention_bias'"), ({"hidden_act": "gelu"}, "'hidden_act'"),
                       ({"embedding_dropout": 1.5}, "'embedding_dropout'"),
                       ({"model_type": "llama", "embedding_dropout": 0.1}, "'embedding_dropout'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**TINY, "model_type": "starcoder2", **bad})


def tiny_starcoder2(seed):
    return tiny_family("starcoder2", seed, attention_bias=True, mlp_bias=True)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_starcoder2(0), tiny_starcoder2(1), method, opts)


@pytest.mark.parametrize("case", ["biases-tied", "untied-heads-8"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """A starcoder2 GGUF as llama.cpp's converter writes a Starcoder2ForCausalLM checkpoint (the gguf package's names:
    c_fc as ffn_up, c_proj as ffn_down, the norms' biases beside their weights, output_norm.bias; the LayerNorms' eps
    as attention.layer_norm_epsilon; NEOX RoPE, so q / k rows as the checkpoint holds them) gives transformers'
    logits; its blocks (gguf_copy, load_gguf_int8) compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, _ = pair(case)
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "starcoder2", starcoder2_kv(hf.config))
    assert ours.config.model_type == "starcoder2" and ours.config.mlp_bias and not any(ours.config.layer_windows)


def test_int8_drafts_and_trained_heads_see_the_model():
    """The int8 draft copy (the ungated MLP's projections too) drafts losslessly; Hidden Transfer heads' training
    forward runs the upper layers (LayerNorms, ungated MLP) as decoding runs them."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_starcoder2(0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)


def starcoder2_kv(c) -> dict:
    """The ``starcoder2.*`` metadata llama.cpp's converter writes for transformers' Starcoder2Config ``c`` (the
    LayerNorms' eps as attention.layer_norm_epsilon; no window)."""
    from .test_families import converted_kv

    kv = converted_kv(c)
    kv["attention.layer_norm_epsilon"] = float(kv.pop("attention.layer_norm_rms_epsilon"))
    return kv
