"""OPT (``model_type="opt"``: facebook's opt-125m to opt-66b but opt-350m): GPT-2's learned positions with OPT's offset
of 2, ReLU, one bias switch, its config's and checkpoints' names (facebook's unprefixed ones too); against
transformers' OPTForCausalLM."""
import dataclasses

import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_edited_save_reads_the_same, assert_our_save_reads_back,
                            assert_saved_names_are_transformers, model_type_and_ours)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, ffn_dim=96, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0, init_std=0.2)
CASES = {"default": {},
         "gelu-unbiased-untied": {"activation_function": "gelu", "enable_bias": False, "tie_word_embeddings": False}}


def opt(**kw):
    """A tiny random transformers OPTForCausalLM and ours."""
    return model_type_and_ours("opt", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = opt(**CASES[case])
    c = ours.config
    assert (c.position_offset, c.rope_layers, c.intermediate_size, c.attention_bias, c.mlp_bias, c.rms_norm_eps) == (
        2, (False,) * 3, 96, hf.config.enable_bias, hf.config.enable_bias, 1e-5)
    assert ours.model.embed_positions.weight.shape == (514, 64)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("hidden_size", "ffn_dim", "num_hidden_layers",
                                                         "num_attention_heads", "max_position_embeddings",
                                                         "activation_function", "enable_bias", "init_std",
                                                         "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = opt()
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_its_checkpoint_names_read_and_are_written_and_unprefixed_ones_read(tmp_path):
    """Its checkpoints' names (model.decoder.*: embed_positions, self_attn_layer_norm, the layers' final_layer_norm
    and the decoder's, fc1, fc2, out_proj) read and written; facebook's own checkpoints' unprefixed names (OPTModel's:
    decoder.*) read the same."""
    hf, ours = opt()
    assert_saved_names_are_transformers(tmp_path, hf, ours, [
        "model.decoder.embed_positions.weight", "model.decoder.layers.0.self_attn_layer_norm.bias",
        "model.decoder.layers.0.final_layer_norm.weight", "model.decoder.final_layer_norm.bias",
        "model.decoder.layers.2.fc1.weight", "model.decoder.layers.1.self_attn.out_proj.bias"])

    def unprefixed(sd):  # (facebook's own checkpoint: OPTModel's names)
        sd = {k.removeprefix("model."): t for k, t in sd.items()}
        assert "decoder.embed_tokens.weight" in sd
        return sd

    assert_edited_save_reads_the_same(tmp_path, ours, unprefixed)


def test_the_position_offset_matters(monkeypatch):
    """Position p read at row p (no offset) instead of p + 2 moves the logits past TOL (the tests above can fail)."""
    from triforce.models import config as configs
    from triforce.models.loading import _build

    hf, _ = opt()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    sd = dict(hf.state_dict())
    sd["model.decoder.embed_positions.weight"] = sd["model.decoder.embed_positions.weight"][:-2]  # (rows 0 .. 511)
    monkeypatch.setitem(configs.FAMILIES, "opt", dataclasses.replace(configs.FAMILIES["opt"], position_offset=0))
    with torch.no_grad():
        other = _build(LlamaConfig.from_dict(hf.config.to_dict()), sd, None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes OPTConfig's (opt-125m's shape; ReLU; biases; tied; eps 1e-5)."""
    c, want = LlamaConfig.from_dict({"model_type": "opt"}), transformers.AutoConfig.for_model("opt")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.max_position_embeddings) == (want.vocab_size, want.hidden_size, want.ffn_dim, want.num_hidden_layers,
                                           want.num_attention_heads, want.max_position_embeddings)
    assert (c.activation, c.attention_bias, c.mlp_bias, c.tie_word_embeddings, c.rms_norm_eps) == (
        want.activation_function, want.enable_bias, want.enable_bias, want.tie_word_embeddings, 1e-5)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (want.bos_token_id, want.eos_token_id,
                                                                want.pad_token_id)
    back = transformers.OPTConfig.from_dict(c.to_dict())  # (our config written as OPTConfig's names)
    assert (back.ffn_dim, back.activation_function, back.enable_bias) == (3072, "relu", True)
    assert not {"rope_theta", "num_key_value_heads", "attention_bias", "rms_norm_eps"} & set(c.to_dict())


@pytest.mark.parametrize("extra,match", [({"do_layer_norm_before": False}, "do_layer_norm_before"),
                                         ({"word_embed_proj_dim": 32}, "word_embed_proj_dim"),
                                         ({"_remove_final_layer_norm": True}, "_remove_final_layer_norm"),
                                         ({"layer_norm_elementwise_affine": False}, "elementwise_affine"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"attention_bias": False}, "attention_bias"),
                                         ({"rms_norm_eps": 1e-6}, "rms_norm_eps"),
                                         ({"enable_bias": "yes"}, "enable_bias"),
                                         ({"ffn_dim": 96, "intermediate_size": 80}, "ffn_dim"),
                                         ({"activation_function": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    """opt-350m's layouts (post-norm layers, projected embeddings), a model without its final norm or its norms'
    weights (not implemented), keys OPTConfig does not read (RoPE, KV heads, the bias switches, a norm eps), a name
    given twice apart, another activation: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "opt", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over an OPT model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = opt(**CASES["gelu-unbiased-untied"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
