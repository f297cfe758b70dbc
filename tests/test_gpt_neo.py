"""GPT-Neo (``model_type="gpt_neo"``: gpt-neo-125m / 1.3B / 2.7B, the TinyStories models): GPT-2's learned positions
and layer with unbiased q / k / v, unscaled scores, a window on the ``attention_types``' local layers, its config's and
checkpoints' names; against transformers' GPTNeoForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_edited_save_reads_the_same, assert_our_save_reads_back,
                            assert_saved_names_are_transformers, model_type_and_ours, old_attention_buffers)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# (initializer_range 0.1: with unscaled scores at 0.2 this tiny model's softmax is so peaked that transformers' own
# float32 logits are ~1.3e-5 off its float64 ones, past TOL; at 0.1 they are ~1.3e-6 off, ours ~8e-7)
BASE = dict(vocab_size=101, hidden_size=64, num_layers=3, num_heads=4, max_position_embeddings=512, bos_token_id=1,
            eos_token_id=2, initializer_range=0.1)
CASES = {"global-local-local": {"attention_types": [[["global", "local"], 1], [["local"], 1]], "window_size": 7},
         "relu-inner-untied": {"attention_types": [[["local", "global", "local"], 1]], "window_size": 5,
                               "activation_function": "relu", "intermediate_size": 80, "tie_word_embeddings": False}}


def gpt_neo(**kw):
    """A tiny random transformers GPTNeoForCausalLM and ours."""
    return model_type_and_ours("gpt_neo", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = gpt_neo(**CASES[case])
    c = ours.config
    w = hf.config.window_size
    assert c.layer_windows == tuple(w if kind == "local" else 0 for kind in hf.config.attention_layers)
    assert (c.position_offset, c.attention_scale, c.qkv_bias, c.out_bias, c.mlp_bias) == (0, 1.0, False, True, True)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("num_layers", "num_heads", "window_size", "attention_types",
                                                         "attention_layers", "intermediate_size",
                                                         "activation_function", "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = gpt_neo(**CASES["global-local-local"])
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_its_checkpoint_names_read_and_are_written_and_old_buffers_dropped(tmp_path):
    """Its checkpoints' names (transformer.h.*.attn.attention.{q,k,v,out}_proj, mlp.c_fc, ln_1, ln_2, wpe) read and
    written; an old checkpoint's attention buffers (attn.attention.bias, masked_bias) dropped."""
    hf, ours = gpt_neo(**CASES["global-local-local"])
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.wpe.weight",
                                                            "transformer.h.0.attn.attention.q_proj.weight",
                                                            "transformer.h.1.attn.attention.out_proj.bias",
                                                            "transformer.h.2.mlp.c_fc.bias"])
    assert_edited_save_reads_the_same(
        tmp_path, ours, lambda sd: {**sd, **old_attention_buffers("transformer.h.1.attn.attention.")})


def test_the_windows_and_the_unscaled_scores_matter(monkeypatch):
    """The local layers without their window, or the scores scaled by head_dim ** -0.5 as most families', move the
    logits past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    hf, _ = gpt_neo(**CASES["global-local-local"])
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d = hf.config.to_dict()
    with torch.no_grad():
        ref = hf(ids).logits
        wide = _build(LlamaConfig.from_dict({**d, "window_size": 100}), hf.state_dict(), None, None)
        assert (wide(ids) - ref).abs().max().item() > 100 * TOL
        monkeypatch.setattr(LlamaConfig, "attention_scale", property(lambda c: c.head_dim ** -0.5))
        scaled = _build(LlamaConfig.from_dict(d), hf.state_dict(), None, None)
        assert (scaled(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes GPTNeoConfig's (gpt-neo-1.3B's shape: 24 layers, global and local in turn,
    window 256; intermediate 4 * hidden; tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "gpt_neo"}), transformers.AutoConfig.for_model("gpt_neo")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings) == (
        want.vocab_size, want.hidden_size, want.num_layers, want.num_heads, want.max_position_embeddings)
    assert c.layer_windows == (0, 256) * 12 and want.attention_layers == ["global", "local"] * 12
    assert (c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings, c.activation) == (
        4 * want.hidden_size, want.layer_norm_epsilon, want.tie_word_embeddings, "gelu_tanh")
    back = transformers.GPTNeoConfig.from_dict(c.to_dict())
    assert (back.num_layers, back.intermediate_size, back.activation_function) == (24, None, "gelu_new")


@pytest.mark.parametrize("extra,match", [({"attention_types": [[["global", "local"], 12]]}, "attention_types"),
                                         ({"attention_types": [[["global", "sparse", "local"], 1]]}, "attention_types"),
                                         ({"attention_types": [[["global", "local", "local"], 1]],
                                           "attention_layers": ["global"] * 3}, "attention_layers"),
                                         ({"attention_types": [[["local"], 3]], "window_size": 0}, "window_size"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"attention_bias": True}, "attention_bias"),
                                         ({"num_layers": 3, "num_hidden_layers": 4}, "num_layers"),
                                         ({"activation_function": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    """Attention kinds that are not one per layer or not GPT-Neo's, an attention_layers other than their expansion,
    a window under 1, keys GPTNeoConfig does not read (RoPE's, KV heads, the bias switches), a name given twice apart,
    another activation: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "gpt_neo", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a GPT-Neo model with local layers give its greedy tokens (a layer-skip draft for the
    two-model methods)."""
    _, ours = gpt_neo(**CASES["relu-inner-untied"])
    draft = ours.layer_skip(2)
    assert draft.config.layer_windows == ours.config.layer_windows[:2] == (5, 0)
    assert_greedy_equals_autoregressive(ours, draft, method, opts)
