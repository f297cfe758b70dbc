"""OLMo 1 (``model_type="olmo"``: OLMo-1B-hf, OLMo-7B-hf, OLMo-7B-0424-hf, OLMo-1.7-7B-hf): Llama's layer with a
LayerNorm of no weight and no bias (float32, eps 1e-5) before the attention, the MLP and the head, and with
``clip_qkv`` the queries, keys and values clamped. Against transformers' OlmoForCausalLM, and from GGUF as llama.cpp's
converter writes it (``olmo``: llama's permuted q / k rows, no norm tensors, ``attention.clamp_kqv``)."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import BareLayerNorm

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = {k: v for k, v in TINY.items() if k != "rms_norm_eps"} | {"num_hidden_layers": 3}
CASES = {"olmo-1b": {}, "clip-bias-tied-gqa": dict(clip_qkv=0.4, attention_bias=True, tie_word_embeddings=True)}


def pair(case="olmo-1b", **kw):
    """transformers' OlmoForCausalLM of ``case`` (random weights, biases randomised) and ours."""
    return transformers_and_ours("Olmo", **{**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path gives transformers' logits (the weightless LayerNorms, the clamp, the biases); the model holds no norm
    parameter, and the checkpoint we save reads back in transformers as the same model."""
    hf, ours = pair(case)
    layer = ours.model.layers[0]
    assert all(type(n) is BareLayerNorm for n in (layer.input_layernorm, layer.post_attention_layernorm,
                                                  ours.model.norm))
    assert not [k for k in ours.state_dict() if "norm" in k]
    assert ours.config.clip_qkv == hf.config.clip_qkv
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_the_clamp_matters():
    """A clamp well inside the projections' values moves the logits (so the test above checks it is applied)."""
    hf, ours = pair("clip-bias-tied-gqa")
    _, unclamped = pair("clip-bias-tied-gqa", clip_qkv=None)
    ids = torch.randint(0, 101, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (ours(ids) - unclamped(ids)).abs().max().item() > 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("clip-bias-tied-gqa")[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes OlmoConfig's (no clamp, no biases, untied, eps 1e-5 fixed: an rms_norm_eps key,
    which OlmoConfig does not read, is dropped and not written back); a clamp of 0 raises; a GGUF file of another eps
    (llama.cpp would run it) raises."""
    c = LlamaConfig.from_dict({**BASE, "model_type": "olmo", "rms_norm_eps": 1e-6})
    assert (c.clip_qkv, c.attention_bias, c.tie_word_embeddings, c.rms_norm_eps, c.torch_layer_norm) == (
        None, False, False, 1e-5, "bare")
    d = c.to_dict()
    assert "rms_norm_eps" not in d and LlamaConfig.from_dict(d).to_dict() == d
    with pytest.raises(ValueError, match="'clip_qkv'"):
        LlamaConfig.from_dict({**BASE, "model_type": "olmo", "clip_qkv": 0})
    assert LlamaConfig(model_type="olmo", rms_norm_eps=1e-6).rms_norm_eps == 1e-5


def test_gguf_of_another_eps_raises(tmp_path):
    from .test_families import write_converted_gguf

    hf, _ = pair()
    kv, convert = converted(hf)
    path = write_converted_gguf(tmp_path / "m.gguf", hf, "olmo", {**kv, "attention.layer_norm_epsilon": 1e-6},
                                convert=convert)
    with pytest.raises(ValueError, match="layer_norm_epsilon"):
        Llama.from_pretrained(path, cache_dir=False)


def tiny_olmo(seed):
    return tiny_family("olmo", seed, attention_bias=seed == 0, extra={"clip_qkv": 0.8} if seed == 0 else {})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_olmo(0), tiny_olmo(1), method, opts)


def test_int8_drafts_and_trained_heads_see_the_model():
    """The int8 draft copy drafts losslessly; trained heads start from a weightless final norm (factor 1) and their
    training forward runs the upper layers as decoding runs them."""
    from triforce.models.quant import int8_copy

    from .test_heads import assert_perturbed_heads_train_as_they_decode

    model = tiny_olmo(0)
    assert_greedy_equals_autoregressive(model, int8_copy(model), "speculative", {"gamma": 3})
    assert_perturbed_heads_train_as_they_decode(model)


def converted(hf):
    """``(kv, convert)`` of llama.cpp's converter for OLMo ``hf``: its metadata (eps 1e-5, clamp_kqv where set) and
    its permutation of q / k rows (llama's: interleaved RoPE pairs)."""
    c = hf.config
    head_dim = c.hidden_size // c.num_attention_heads
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
          "rope.dimension_count": head_dim, "rope.freq_base": float(c.rope_parameters["rope_theta"]),
          "attention.layer_norm_epsilon": 1e-5, "vocab_size": c.vocab_size}
    if c.clip_qkv is not None:
        kv["attention.clamp_kqv"] = float(c.clip_qkv)

    def permute(t, heads):  # (llama.cpp's: each head's rows in interleaved RoPE pairs)
        return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    def convert(name, t):
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            return permute(t, c.num_attention_heads)
        if name.endswith(("k_proj.weight", "k_proj.bias")):
            return permute(t, c.num_key_value_heads)
        return t
    return kv, convert


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """An olmo GGUF as llama.cpp's converter writes it (permuted q / k rows, no norm tensors, its clamp as
    attention.clamp_kqv) gives transformers' logits; its blocks compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = pair(case)
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "olmo", *converted(hf))
    c = loaded.config
    assert (c.model_type, c.attention_bias, c.tie_word_embeddings) == (
        "olmo", ours.config.attention_bias, ours.config.tie_word_embeddings)
    assert c.clip_qkv == (None if ours.config.clip_qkv is None else pytest.approx(ours.config.clip_qkv, rel=1e-7))


@given(data=st.data())
def test_drawn_checkpoints_and_their_gguf_files_load_as_transformers_model(data):
    """Property: a drawn tiny OLMo checkpoint (head_dim 8 / 16 / 32 over 1, 2 or 4 KV heads; a clamp or none; attention
    biases or none; tied or not) gives transformers' logits on 32 tokens, a 6-token pass the bits of its steps, and its
    GGUF (float32: transformers' logits; Q8_0 / Q5_0 blocks: the loaded model bitwise)."""
    from .test_families import assert_drawn_checkpoint_loads, write_converted_gguf

    draw = data.draw
    heads = 64 // draw(st.sampled_from([8, 16, 32]))
    kw = dict(BASE, num_attention_heads=heads, num_key_value_heads=min(heads, draw(st.sampled_from([1, 2, 4]))),
              clip_qkv=draw(st.sampled_from([None, 0.3, 2.0])), attention_bias=draw(st.booleans()),
              tie_word_embeddings=draw(st.booleans()), num_hidden_layers=2)
    hf, ours = transformers_and_ours("Olmo", **kw)
    kv, convert = converted(hf)
    assert_drawn_checkpoint_loads(draw, hf, ours, lambda path, quant: write_converted_gguf(
        path, hf, "olmo", kv, quant=quant, convert=convert))
