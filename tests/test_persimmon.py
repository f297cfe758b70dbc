"""Persimmon (``model_type="persimmon"``: Adept's persimmon-8b; Fuyu's language model): LayerNorms with a bias,
GPT-NeoX's per-head query_key_value, Phi's shared q / k LayerNorm, RoPE on half of each head, an ungated ReLU-squared
MLP; against transformers' PersimmonForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours,
                            randomize_)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=512, bos_token_id=1, eos_token_id=2, initializer_range=0.1)
CASES = {"default": {}, "no-qk-norm-quarter-rope-tied": {
    "qk_layernorm": False, "tie_word_embeddings": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 25000.0, "partial_rotary_factor": 0.25}}}


def persimmon(**kw):
    """A tiny random transformers PersimmonForCausalLM and ours."""
    return model_type_and_ours("persimmon", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = persimmon(**CASES[case])
    c = ours.config
    assert (c.qk_norm, c.rotary_dim, c.attention_bias, c.mlp_bias) == (
        hf.config.qk_layernorm, int(16 * hf.config.rope_parameters["partial_rotary_factor"]), True, True)
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("qk_layernorm", "rope_parameters", "layer_norm_eps", "hidden_act"):
        assert getattr(back, key) == getattr(hf.config, key), key
    assert_pass_equals_steps(ours, torch.float32)


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """Its query_key_value, dense, q / k LayerNorms, dense_h_to_4h / dense_4h_to_h and final_layernorm: read and
    written under its names."""
    assert_saved_names_are_transformers(tmp_path, *persimmon(), ["model.layers.0.self_attn.query_key_value.bias",
                                                                "model.layers.0.self_attn.q_layernorm.weight",
                                                                "model.final_layernorm.bias"])


def test_the_qk_norm_and_the_head_layout_matter():
    """Without its q / k LayerNorms, or its query_key_value read as q, k, v blocks (Phi-3's layout) instead of per
    head: the logits move past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    hf, _ = persimmon()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d, sd = hf.config.to_dict(), dict(hf.state_dict())
    blocks = {}
    for k, t in sd.items():  # (each head's [q; k; v] rows regrouped as every q, then every k, then every v)
        if ".query_key_value." in k:
            t = t.reshape(4, 3, 16, *t.shape[1:]).transpose(0, 1).reshape(t.shape)
        blocks[k] = t
    with torch.no_grad():
        ref = hf(ids).logits
        plain = _build(LlamaConfig.from_dict({**d, "qk_layernorm": False}), {
            k: t for k, t in sd.items() if "layernorm" not in k or "self_attn" not in k}, None, None)
        assert (plain(ids) - ref).abs().max().item() > 100 * TOL
        other = _build(LlamaConfig.from_dict(d), blocks, None, None)
        assert (other(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes PersimmonConfig's (persimmon-8b's shape, its q / k norms on, RoPE on half)."""
    c, want = LlamaConfig.from_dict({"model_type": "persimmon"}), transformers.AutoConfig.for_model("persimmon")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert (c.rms_norm_eps, c.qk_norm, c.rope_theta) == (want.layer_norm_eps, True, want.rope_parameters["rope_theta"])
    assert c.rotary_dim == int(c.head_dim * want.rope_parameters["partial_rotary_factor"])


@pytest.mark.parametrize("extra,match", [({"attention_bias": False}, "attention_bias"),
                                         ({"hidden_act": "gelu"}, "hidden_act"),
                                         ({"qk_layernorm": 1}, "qk_layernorm")])
def test_what_would_not_be_read_so_raises(extra, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "persimmon", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Persimmon model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = persimmon()
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)


def test_fuyu_loads_as_its_persimmon_language_model(tmp_path):
    """Fuyu (fuyu-8b) saved by transformers loads as its Persimmon language model (its patch embedding not read), with
    the wrapper's logits on text on every path; our save reads back in transformers as Persimmon."""
    from .test_qwen_vl import assert_loads_as_its_language_model

    torch.manual_seed(0)
    text = {k: v for k, v in BASE.items() if k not in ("bos_token_id", "eos_token_id")}
    config = transformers.FuyuConfig(text_config={**text, "model_type": "persimmon"}, patch_size=4,
                                     image_token_id=100, attn_implementation="eager")
    hf = randomize_(transformers.FuyuForCausalLM(config).eval())
    assert_loads_as_its_language_model(hf, tmp_path, "fuyu", "persimmon")
