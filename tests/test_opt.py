"""OPT (``model_type="opt"``: facebook's opt-125m to opt-66b): GPT-2's learned positions with OPT's offset of 2, ReLU,
one bias switch, its config's and checkpoints' names (facebook's unprefixed ones too); opt-350m's layout (norms after
the residual adds, no final norm, embeddings narrower than the layers projected in and out) and a pre-norm model
without its final norm; against transformers' OPTForCausalLM."""
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
         "gelu-unbiased-untied": {"activation_function": "gelu", "enable_bias": False, "tie_word_embeddings": False},
         # opt-350m's: post-norm layers, no final norm, 32-wide embeddings under 64-wide layers
         "opt-350m": {"do_layer_norm_before": False, "word_embed_proj_dim": 32},
         "opt-350m-untied": {"do_layer_norm_before": False, "word_embed_proj_dim": 48, "tie_word_embeddings": False},
         # without a final norm the head reads the raw stream: at init_std 0.2 its logits reach 38 and transformers'
         # own float32 logits are 1.8e-5 off its float64 ones (past TOL; ours 1.7e-5), at 0.1 1.6e-6 (measured)
         "no-final-norm": {"_remove_final_layer_norm": True, "init_std": 0.1}}


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
    assert (c.norm_after_residual, c.final_norm, c.embed_dim) == (
        not hf.config.do_layer_norm_before, hf.model.decoder.final_layer_norm is not None,
        hf.config.word_embed_proj_dim)
    assert ("project_in" in ours.model._modules) == (hf.model.decoder.project_in is not None)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("hidden_size", "ffn_dim", "num_hidden_layers",
                                                         "num_attention_heads", "max_position_embeddings",
                                                         "activation_function", "enable_bias", "init_std",
                                                         "tie_word_embeddings", "do_layer_norm_before",
                                                         "word_embed_proj_dim", "_remove_final_layer_norm"))
    assert_pass_equals_steps(ours, torch.float32)


@pytest.mark.parametrize("case", ["default", "opt-350m"])
def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16(case):
    _, ours = opt(**CASES[case])
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_opt_350m_names_read_and_are_written(tmp_path):
    """opt-350m's checkpoint names (model.decoder.project_in / project_out, no decoder.final_layer_norm) read and
    written."""
    hf, ours = opt(**CASES["opt-350m"])
    assert_saved_names_are_transformers(tmp_path, hf, ours, [
        "model.decoder.project_in.weight", "model.decoder.project_out.weight",
        "model.decoder.layers.0.self_attn_layer_norm.bias", "model.decoder.layers.2.final_layer_norm.weight"])


def test_the_norms_order_and_the_projections_matter():
    """opt-350m's norms put before the blocks (a pre-norm layer), or its projections left out of the head, move the
    logits past TOL (the tests above can fail)."""
    hf, ours = opt(**CASES["opt-350m"])
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(ids).logits
        assert (ours(ids) - want).abs().max().item() <= TOL * max(1.0, want.abs().max().item())
        for layer in ours.model.layers:
            layer.norm_after = False  # (its attention then reads input_layernorm(h), the norm after the MLP too)
        assert (ours(ids) - want).abs().max().item() > 100 * TOL
        for layer in ours.model.layers:
            layer.norm_after = True
        w = ours.model.project_out.weight.clone()
        ours.model.project_out.weight.mul_(1.5)
        assert (ours(ids) - want).abs().max().item() > 100 * TOL
        ours.model.project_out.weight.copy_(w)


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


@pytest.mark.parametrize("extra,match", [({"do_layer_norm_before": "no"}, "do_layer_norm_before"),
                                         ({"word_embed_proj_dim": 0}, "word_embed_proj_dim"),
                                         ({"word_embed_proj_dim": 32.0}, "word_embed_proj_dim"),
                                         ({"_remove_final_layer_norm": 1}, "_remove_final_layer_norm"),
                                         ({"layer_norm_elementwise_affine": False}, "elementwise_affine"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"attention_bias": False}, "attention_bias"),
                                         ({"rms_norm_eps": 1e-6}, "rms_norm_eps"),
                                         ({"enable_bias": "yes"}, "enable_bias"),
                                         ({"ffn_dim": 96, "intermediate_size": 80}, "ffn_dim"),
                                         ({"activation_function": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    """Values of opt-350m's keys that are not of their type, norms without weights (not implemented), keys OPTConfig
    does not read (RoPE, KV heads, the bias switches, a norm eps), a name given twice apart, another activation:
    each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "opt", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
@pytest.mark.parametrize("case", ["gelu-unbiased-untied", "opt-350m"])
def test_greedy_equals_autoregressive(method, opts, case):
    """The engines over an OPT model give its greedy tokens (a layer-skip draft for the two-model methods: opt-350m's
    shares the projections)."""
    _, ours = opt(**CASES[case])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)


@pytest.mark.parametrize("kind", ["medusa", "hidden_transfer"])
def test_trained_heads_and_a_draft_vocabulary_over_opt_350m(kind):
    """Heads draft for opt-350m through its head (project_out, then the 32-wide tied head), with the whole vocabulary
    and with a draft vocabulary (its rows of that head, after project_out): greedy output autoregressive's."""
    import triforce

    from .test_heads import ranked_heads

    _, ours = opt(**CASES["opt-350m"])
    prompts = [torch.randint(3, 101, (n,), generator=torch.Generator().manual_seed(n)) for n in (30, 41)]
    ref = triforce.generate(ours, prompts, method="autoregressive", max_new_tokens=16)
    h = ranked_heads(ours, kind)
    for extra in ({}, {"draft_vocab": 20}):
        out = triforce.generate(ours, prompts, method="tree", draft=h, tree=(2, 1), max_new_tokens=16, **extra)
        assert all(torch.equal(a, b) for a, b in zip(out.tokens, ref.tokens)), extra
