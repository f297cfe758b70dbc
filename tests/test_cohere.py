"""Cohere (``model_type="cohere"``: Command R, Command R 08-2024, Aya 23, Aya Expanse): Cohere 2's layer (one LayerNorm,
the attention and the MLP in parallel, the logit scale, RoPE on adjacent pairs in float32) with RoPE on every layer
and no window. Against transformers' CohereForCausalLM, and from GGUF (``command-r``) as llama.cpp's converter writes
it."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

COHERE = dict({k: v for k, v in TINY.items() if k != "rms_norm_eps"}, num_hidden_layers=3, pad_token_id=None,
              bos_token_id=1, eos_token_id=2, layer_norm_eps=1e-4, logit_scale=0.25)


def pair(**kw):
    return transformers_and_ours("Cohere", **{**COHERE, **kw})


@pytest.mark.parametrize("kw", [{}, {"attention_bias": True, "tie_word_embeddings": False, "logit_scale": -2.0},
                                {"use_qk_norm": True}], ids=["tied", "bias-untied", "qk-norm"])
def test_logits_and_every_path_match_transformers(tmp_path, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers'
    logits; the checkpoint we save reads back in transformers as the same model, bit for bit."""
    hf, ours = pair(**kw)
    c = ours.config
    assert c.layer_norm and c.parallel_block and c.rope_interleaved and c.rope_float32 == "math"
    assert c.logit_scale == kw.get("logit_scale", 0.25) and c.rope_layers == (True,) * 3 and c.rms_norm_eps == 1e-4
    assert c.qk_norm == kw.get("use_qk_norm", False)
    if c.qk_norm:  # (its own weights per head)
        assert ours.model.layers[0].self_attn.q_norm.weight.shape == (4, 16)
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "CohereForCausalLM" and back.config.layer_norm_eps == 1e-4
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes CohereConfig's (logit scale 1/16, eps 1e-5, tied, no window); a window raises."""
    base = {k: v for k, v in TINY.items() if k != "rms_norm_eps"}
    c = LlamaConfig.from_dict({**base, "model_type": "cohere", "use_qk_norm": False})
    assert (c.logit_scale, c.rms_norm_eps, c.tie_word_embeddings, c.layer_windows) == (0.0625, 1e-5, True, (0, 0))
    for bad, match in (({"use_qk_norm": 1}, "'use_qk_norm'"), ({"sliding_window": 8}, "'sliding_window'"),
                       ({"logit_scale": None}, "'logit_scale'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**base, "model_type": "cohere", **bad})


def tiny_cohere(seed):
    return tiny_family("cohere", seed, tie_word_embeddings=True, extra={"logit_scale": 0.5})


@pytest.mark.parametrize("method,opts", TINY_CASES[::2], ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES[::2])])
def test_greedy_equals_autoregressive(method, opts):
    """(Every other of the tiny cases: Cohere 2's tests run them all on the same layer.)"""
    assert_greedy_equals_autoregressive(tiny_cohere(0), tiny_cohere(1), method, opts)


@pytest.mark.parametrize("kw", [{}, {"use_qk_norm": True}], ids=["plain", "qk-norm"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, kw):
    """A command-r GGUF as llama.cpp's converter writes a CohereForCausalLM checkpoint (one attn_norm, q / k rows as the
    checkpoint holds them, Command R+'s per-head q / k norm weights, logit_scale, attention.layer_norm_epsilon) gives
    transformers' logits; its blocks compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, _ = pair(**kw)
    kv = {**converted_kv(hf.config, eps_key="attention.layer_norm_epsilon"), "logit_scale": 0.25}
    c = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "command-r", kv).config
    assert c.model_type == "cohere" and c.logit_scale == 0.25 and c.rms_norm_eps == pytest.approx(1e-4)
