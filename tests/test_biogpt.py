"""BioGPT (``model_type="biogpt"``: microsoft's biogpt, BioGPT-Large): OPT's layer and learned positions at offset 2
with the exact GELU and the embeddings times sqrt(hidden_size) (``scale_embedding``), its LayerNorms' eps fixed at
1e-5 whatever its ``layer_norm_eps`` says, its checkpoints' ``biogpt.*`` names; against transformers'
BioGptForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=512, bos_token_id=0, eos_token_id=2, pad_token_id=1, initializer_range=0.2)
CASES = {"default": {}, "unscaled-relu-untied": {"scale_embedding": False, "hidden_act": "relu",
                                                 "tie_word_embeddings": False}}


def biogpt(**kw):
    """A tiny random transformers BioGptForCausalLM and ours."""
    return model_type_and_ours("biogpt", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = biogpt(**CASES[case])
    c = ours.config
    assert (c.position_offset, c.rms_norm_eps, c.attention_bias, c.mlp_bias) == (2, 1e-5, True, True)
    assert c.rounded_embed_factor == (8.0 if hf.config.scale_embedding else None)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("hidden_size", "intermediate_size", "num_hidden_layers",
                                                         "scale_embedding", "hidden_act", "layer_norm_eps",
                                                         "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = biogpt()
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    hf, ours = biogpt(**CASES["unscaled-relu-untied"])
    assert_saved_names_are_transformers(tmp_path, hf, ours, [
        "biogpt.embed_positions.weight", "biogpt.layer_norm.bias", "biogpt.layers.0.self_attn_layer_norm.weight",
        "biogpt.layers.1.final_layer_norm.bias", "biogpt.layers.2.fc2.weight", "output_projection.weight"])


def test_the_scale_and_the_order_of_the_sum_matter():
    """The embeddings unscaled, or scaled after the positions are added (their sum times sqrt(hidden)), move the
    logits past TOL; the unread layer_norm_eps changes nothing (the tests above can fail)."""
    from triforce.models.loading import _build

    hf, ours = biogpt()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d = hf.config.to_dict()
    with torch.no_grad():
        ref = hf(ids).logits
        unscaled = _build(LlamaConfig.from_dict({**d, "scale_embedding": False}), hf.state_dict(), None, None)
        assert (unscaled(ids) - ref).abs().max().item() > 100 * TOL
        pos = ours.model.embed_positions
        ours.model.embed_positions.weight.div_(8.0)  # (positions / 8, then the sum times 8: positions added after)
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL
        pos.weight.mul_(8.0)
        other_eps = _build(LlamaConfig.from_dict({**d, "layer_norm_eps": 0.5}), hf.state_dict(), None, None)
        assert torch.equal(other_eps(ids), ours(ids))


def test_defaults():
    """A config without the keys takes BioGptConfig's (biogpt's shape; the exact GELU; scaled embeddings; tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "biogpt"}), transformers.AutoConfig.for_model("biogpt")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.max_position_embeddings) == (want.vocab_size, want.hidden_size, want.intermediate_size,
                                           want.num_hidden_layers, want.num_attention_heads,
                                           want.max_position_embeddings)
    assert (c.activation, c.rounded_embed_factor, c.tie_word_embeddings, c.rms_norm_eps) == (
        want.hidden_act, want.hidden_size ** 0.5, want.tie_word_embeddings, 1e-5)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (want.bos_token_id, want.eos_token_id,
                                                                want.pad_token_id)
    assert not {"rope_theta", "num_key_value_heads", "attention_bias", "rms_norm_eps"} & set(c.to_dict())


@pytest.mark.parametrize("extra,match", [({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"attention_bias": True}, "attention_bias"),
                                         ({"rms_norm_eps": 1e-6}, "rms_norm_eps"),
                                         ({"scale_embedding": 2}, "scale_embedding"),
                                         ({"layer_norm_eps": 0}, "layer_norm_eps"),
                                         ({"hidden_act": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "biogpt", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a BioGPT model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = biogpt()
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
