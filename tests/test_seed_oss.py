"""Seed-OSS (``model_type="seed_oss"``: Seed-OSS-36B, 512K context): Llama's layer with biases on q, k and v
(``attention_bias``, default true) and on o by its own ``attention_out_bias``. Against transformers'
SeedOssForCausalLM, and from GGUF as llama.cpp's converter writes it."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

SEED = dict(TINY, num_hidden_layers=3, pad_token_id=None, head_dim=16)


def pair(**kw):
    return transformers_and_ours("SeedOss", **{**SEED, **kw})


@pytest.mark.parametrize("kw", [{}, {"attention_out_bias": True, "mlp_bias": True, "head_dim": 8},
                                {"attention_bias": False, "tie_word_embeddings": True}],
                         ids=["qkv-bias", "every-bias", "no-bias-tied"])
def test_logits_and_every_path_match_transformers(tmp_path, kw):
    """The plain forward, a chunked prefill, a verify pass, steps and a tree over the cache give transformers' logits
    (the CPU's fused layer with the biases); the checkpoint we save reads back in transformers as the same model."""
    hf, ours = pair(**kw)
    c = ours.config
    assert c.qkv_bias == kw.get("attention_bias", True) and c.out_bias == kw.get("attention_out_bias", False)
    assert (ours.model.layers[0].self_attn.o_proj.bias is None) != c.out_bias
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair(attention_out_bias=True)[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes SeedOssConfig's (q/k/v biases, none on o, head_dim 128, 8 KV heads); its
    shipped dropouts (0.1, training only) load; keys it does not read raise."""
    c = LlamaConfig.from_dict({**TINY, "model_type": "seed_oss", "head_dim": 16, "attention_dropout": 0.1,
                               "residual_dropout": 0.1})
    assert c.qkv_bias and not c.out_bias
    d = LlamaConfig.from_dict({"model_type": "seed_oss"})
    assert (d.head_dim, d.num_key_value_heads, d.max_position_embeddings) == (128, 8, 524288)
    for bad, match in (({"attention_out_bias": 1}, "'attention_out_bias'"), ({"sliding_window": 8}, "'sliding_window'"),
                       ({"residual_dropout": 1.5}, "'residual_dropout'"),
                       ({"model_type": "llama", "attention_out_bias": True}, "'attention_out_bias'")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({**TINY, "model_type": "seed_oss", "head_dim": 16, **bad})


def tiny_seed_oss(seed):
    return tiny_family("seed_oss", seed, attention_bias=True, extra={"attention_out_bias": True})


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_seed_oss(0), tiny_seed_oss(1), method, opts)


@pytest.mark.parametrize("kw", [{}, {"attention_out_bias": True}], ids=["qkv-bias", "o-bias"])
def test_gguf_as_llama_cpp_writes_it(tmp_path, kw):
    """A seed_oss GGUF as llama.cpp's converter writes a SeedOssForCausalLM checkpoint (the gguf package's names: the
    norm before the MLP as post_attention_norm; q / k rows as the checkpoint holds them, NEOX RoPE) gives
    transformers' logits; its blocks (gguf_copy, load_gguf_int8) compute the loaded model bitwise."""
    from .test_families import assert_converted_gguf_is_the_checkpoint, converted_kv

    hf, _ = pair(**kw)
    ours = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "seed_oss", converted_kv(hf.config))
    assert ours.config.model_type == "seed_oss" and ours.config.out_bias == kw.get("attention_out_bias", False)
