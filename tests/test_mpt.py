"""MPT (``model_type="mpt"``: mosaicml's mpt-7b / 30b and their instruct / chat models): ALiBi instead of RoPE
(``verify_attention``'s ``alibi_slopes``, by ``alibi_bias_max``), torch's LayerNorm without a bias, one ``Wqkv``
([q; k; v]) optionally clamped (``clip_qkv``), its scores by ``softmax_scale``, an ungated MLP of the exact GELU, no
biases, a tied head; its config's names (``d_model``, ``n_heads``, ``n_layers``, ``max_seq_len``, ``attn_config``) and
checkpoints' names (``transformer.wte``, ``blocks``, ``norm_f``); against transformers' MptForCausalLM."""
import math

import numpy as np
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, d_model=64, n_layers=3, n_heads=4, max_seq_len=64, layer_norm_epsilon=1e-3,
            initializer_range=0.1)
CASES = {"four-heads": {},
         "six-heads-clipped-scaled-untied": {"d_model": 48, "n_heads": 6, "tie_word_embeddings": False, "attn_config": {
             "clip_qkv": 0.5, "softmax_scale": 0.2}}}


def mpt(**kw):
    """A tiny random transformers MptForCausalLM and ours."""
    return model_type_and_ours("mpt", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = mpt(**CASES[case])
    c, attn = ours.config, CASES[case].get("attn_config", {})
    assert (c.intermediate_size, c.attention_bias, c.mlp_bias, c.activation, c.gated_mlp, c.rms_norm_eps) == (
        4 * c.hidden_size, False, False, "gelu", False, 1e-3)
    assert (c.clip_qkv, c.attention_scale, c.max_position_embeddings) == (
        attn.get("clip_qkv"), attn.get("softmax_scale", 1 / math.sqrt(c.head_dim)), 64)
    assert c.rope_layers == (False,) * 3 and c.torch_layer_norm == "nobias"
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours, keys=("d_model", "n_layers", "n_heads", "max_seq_len",
                                                                "layer_norm_epsilon", "tie_word_embeddings"))
    for key in ("clip_qkv", "softmax_scale", "alibi_bias_max", "alibi"):  # (its attn_config's)
        assert getattr(back.attn_config, key) == getattr(hf.config.attn_config, key), key


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(mpt(**CASES["six-heads-clipped-scaled-untied"])[1], dtype)


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 48, 56, 64])
def test_the_slopes_are_transformers(heads):
    """Each head's slope, bitwise build_mpt_alibi_tensor's as MptModel calls it (1 / 2 ** (k * 8 / p), the odd k first
    where the head count is no power of 2): its bias at the key one position before the last is minus the slope."""
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    c = LlamaConfig.from_dict({"model_type": "mpt", "d_model": 8 * heads, "n_heads": heads})
    assert torch.equal(torch.tensor(c.alibi_slopes), -build_mpt_alibi_tensor(heads, 2)[:, 0, 0])


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    hf, ours = mpt()
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.wte.weight",
                                                            "transformer.blocks.0.attn.Wqkv.weight",
                                                            "transformer.blocks.2.attn.out_proj.weight",
                                                            "transformer.blocks.1.ffn.up_proj.weight",
                                                            "transformer.blocks.1.norm_2.weight",
                                                            "transformer.norm_f.weight"])


def test_alibi_the_clamp_and_the_scale_matter():
    """Without ALiBi, without the clamp, or at head_dim ** -0.5, the logits move past TOL (the tests above can
    fail)."""
    hf, ours = mpt(**CASES["six-heads-clipped-scaled-untied"])
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        for key, off in (("alibi", None), ("clip", None), ("scale", ours.config.head_dim ** -0.5)):
            for layer in ours.model.layers:
                setattr(layer.self_attn, key, off)
            assert (ours(ids) - ref).abs().max().item() > 100 * TOL, key


def test_defaults():
    """A config without the keys takes MptConfig's (50368 tokens, 24 layers of 2048 with 16 heads, 2048 positions,
    eps 1e-5, alibi_bias_max 8, tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "mpt"}), transformers.AutoConfig.for_model("mpt")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings) == (
        want.vocab_size, want.d_model, want.n_layers, want.n_heads, want.max_seq_len)
    assert (c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings, c.clip_qkv) == (
        4 * want.d_model, want.layer_norm_epsilon, want.tie_word_embeddings, want.attn_config.clip_qkv)
    assert c.alibi_slopes[0] == torch.tensor(2 ** -0.5).item()  # (alibi_bias_max 8 over 16 heads: 2 ** (-8 / 16))
    back = transformers.MptConfig.from_dict(c.to_dict())  # (our config written as MptConfig's names)
    assert (back.d_model, back.n_layers, back.max_seq_len, back.attn_config.alibi_bias_max) == (2048, 24, 2048, 8)
    assert not {"rope_theta", "num_key_value_heads", "hidden_size", "intermediate_size", "hidden_act",
                "clip_qkv", "alibi_bias_max"} & set(c.to_dict())


# mpt-7b's config.json as mosaicml ships it (its own code named in auto_map, its training keys)
MPT_7B = {"architectures": ["MPTForCausalLM"], "attn_config": {
    "alibi": True, "alibi_bias_max": 8, "attn_impl": "torch", "attn_pdrop": 0, "attn_type": "multihead_attention",
    "attn_uses_sequence_id": False, "clip_qkv": None, "prefix_lm": False, "qk_ln": False, "softmax_scale": None},
    "auto_map": {"AutoConfig": "configuration_mpt.MPTConfig", "AutoModelForCausalLM": "modeling_mpt.MPTForCausalLM"},
    "d_model": 4096, "emb_pdrop": 0, "embedding_fraction": 1.0, "expansion_ratio": 4, "init_config": {
        "emb_init_std": None, "emb_init_uniform_lim": None, "fan_mode": "fan_in", "init_div_is_residual": True,
        "init_gain": 0, "init_nonlinearity": "relu", "init_std": 0.02, "name": "kaiming_normal_", "verbose": 0},
    "init_device": "cpu", "learned_pos_emb": True, "logit_scale": None, "max_seq_len": 2048, "model_type": "mpt",
    "n_heads": 32, "n_layers": 32, "no_bias": True, "norm_type": "low_precision_layernorm", "resid_pdrop": 0,
    "tokenizer_name": "EleutherAI/gpt-neox-20b", "torch_dtype": "bfloat16", "transformers_version": "4.28.1",
    "use_cache": False, "verbose": 0, "vocab_size": 50432}


def test_mpt_7b_config_reads_as_transformers_reads_it():
    c = LlamaConfig.from_dict(MPT_7B)
    want = transformers.MptConfig.from_dict({k: v for k, v in MPT_7B.items() if k != "auto_map"})
    assert (c.hidden_size, c.num_attention_heads, c.num_hidden_layers, c.head_dim, c.intermediate_size) == (
        want.d_model, want.n_heads, want.n_layers, want.d_model // want.n_heads, 4 * want.d_model)
    assert (c.vocab_size, c.max_position_embeddings, c.clip_qkv, c.attention_scale) == (
        50432, 2048, None, 1 / math.sqrt(4096 / 32))  # (MptAttention's default scale, as it computes it)
    assert c.to_dict()["attn_config"]["alibi_bias_max"] == 8


@pytest.mark.parametrize("extra,match", [({"attn_config": {"alibi": False}}, "alibi"),
                                         ({"attn_config": {"attn_type": "multiquery_attention"}}, "attn_type"),
                                         ({"attn_config": {"prefix_lm": True}}, "prefix_lm"),
                                         ({"attn_config": {"alibi_bias_max": 6}}, "alibi_bias_max"),
                                         ({"attn_config": {"qk_ln": True}}, "qk_ln"),
                                         ({"attn_config": {"rope": True}}, "rope"),
                                         ({"attn_config": {"clip_qkv": -1}}, "clip_qkv"),
                                         ({"no_bias": False}, "no_bias"),
                                         ({"logit_scale": 2.0}, "logit_scale"),
                                         ({"expansion_ratio": 2}, "expansion_ratio"),
                                         ({"norm_type": "rmsnorm"}, "norm_type"),
                                         ({"clip_qkv": 0.5}, "clip_qkv"),
                                         ({"num_attention_heads": 8}, "n_heads"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"intermediate_size": 80}, "intermediate_size")])
def test_what_transformers_does_not_run_so_raises(extra, match):
    """What transformers' MPT does not run as the checkpoint's own code would (ALiBi off, multi-query, a prefix LM, q /
    k LayerNorms, slopes by another alibi_bias_max, biases, a logit scale, another MLP width or norm), what
    MptAttentionConfig has no key for, a clamp out of range, the model's names for its attn_config's keys or for what it
    has no key for (RoPE, an MLP width), a name given twice apart: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "mpt", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over an MPT model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = mpt(**CASES["six-heads-clipped-scaled-untied"], max_seq_len=512)
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)


def mpt_kv(c) -> dict:
    """The ``mpt.*`` metadata llama.cpp's converter writes for transformers' MptConfig ``c``: its ALiBi bias, its
    clamp where ``attn_config.clip_qkv`` (no head_count_kv: no kv_n_heads)."""
    kv = {"context_length": c.max_seq_len, "embedding_length": c.d_model, "feed_forward_length": 4 * c.d_model,
          "block_count": c.n_layers, "attention.head_count": c.n_heads, "attention.max_alibi_bias": 8.0,
          "attention.layer_norm_epsilon": float(c.layer_norm_epsilon), "vocab_size": c.vocab_size}
    clip = c.attn_config.clip_qkv
    return kv if clip is None else {**kv, "attention.clamp_kqv": float(clip)}


GGUF_CASES = {"four-heads": {}, "eight-heads-clipped-untied": {"n_heads": 8, "tie_word_embeddings": False,
                                                               "attn_config": {"clip_qkv": 0.5}}}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_as_llama_cpp_writes_it(tmp_path, case):
    """An mpt GGUF as llama.cpp's converter writes the checkpoint (Wqkv as it is: every query, then every key, then
    every value; the clamp as attention.clamp_kqv) gives transformers' logits; its blocks compute the loaded model
    bitwise; its metadata read (its slopes MPT's: llama.cpp's at 8 where the head count is a power of 2)."""
    from .test_families import assert_converted_gguf_is_the_checkpoint

    hf, ours = mpt(**GGUF_CASES[case])
    loaded = assert_converted_gguf_is_the_checkpoint(tmp_path, hf, "mpt", mpt_kv(hf.config))
    c = loaded.config
    assert (c.model_type, c.alibi, c.attention_bias, c.mlp_bias, c.torch_layer_norm, c.clip_qkv) == (
        "mpt", "mpt", False, False, "nobias", ours.config.clip_qkv)
    assert c.alibi_slopes == ours.config.alibi_slopes and c.attention_scale == ours.config.attention_scale
    assert c.rms_norm_eps == torch.tensor(1e-3).item() and c.max_position_embeddings == 64  # (a float32 in the file)
    assert c.tie_word_embeddings == hf.config.tie_word_embeddings


@pytest.mark.parametrize("kv,match", [({"attention.head_count": 6}, "no power of 2"),
                                      ({"attention.max_alibi_bias": 6.0}, "max_alibi_bias"),
                                      ({"attn_q_norm": 1}, "q_norm"),
                                      ({"attention.layer_norm_epsilon": None}, "layer_norm_epsilon")])
def test_gguf_what_raises(tmp_path, kv, match):
    """An mpt file with a head count no power of 2 (llama.cpp runs it with BLOOM's slopes, which are not MPT's), another
    ALiBi bias than 8, a tensor the model has not (q / k norms: MPT's qk_ln) or without its eps raises naming it."""
    from triforce.models import Llama

    from .test_families import write_converted_gguf

    hf, _ = mpt(**({"d_model": 48, "n_heads": 6} if kv.get("attention.head_count") == 6 else {}))
    keys = {k: v for k, v in {**mpt_kv(hf.config), **kv}.items() if v is not None and k != "attn_q_norm"}
    norm = {"blk.0.attn_q_norm.weight": np.ones(16, np.float32)} if "attn_q_norm" in kv else {}
    path = write_converted_gguf(tmp_path / "f.gguf", hf, "mpt", keys, tensors=norm)
    with pytest.raises(ValueError, match=match):
        Llama.from_pretrained(path, cache_dir=False)
