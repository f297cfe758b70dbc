"""XGLM (``model_type="xglm"``: facebook's xglm-564M to 7.5B): BioGPT's layer with fixed sinusoidal positions at
offset 2 (computed: in no checkpoint), the embeddings times sqrt(d_model) (``scale_embedding``), its config's names;
against transformers' XGLMForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, d_model=64, ffn_dim=96, num_layers=3, attention_heads=4, max_position_embeddings=512,
            bos_token_id=0, eos_token_id=2, pad_token_id=1, init_std=0.2)
CASES = {"default": {}, "unscaled-relu-untied": {"scale_embedding": False, "activation_function": "relu",
                                                 "tie_word_embeddings": False}}


def xglm(**kw):
    """A tiny random transformers XGLMForCausalLM and ours."""
    return model_type_and_ours("xglm", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = xglm(**CASES[case])
    c = ours.config
    assert (c.position_offset, c.sinusoidal_positions, c.rms_norm_eps, c.attention_bias) == (2, True, 1e-5, True)
    assert torch.equal(ours.model.embed_positions.weight, hf.model.embed_positions.weights)  # (the same table)
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("d_model", "num_layers", "attention_heads", "ffn_dim",
                                                         "activation_function", "scale_embedding",
                                                         "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = xglm()
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_its_checkpoint_names_read_and_are_written_without_the_positions(tmp_path):
    """Its checkpoints' names (model.layer_norm, self_attn_layer_norm, final_layer_norm, fc1, fc2, out_proj) read and
    written; the positions in neither (computed on loading, as transformers computes them); a model drawn at random
    holds the table too."""
    hf, ours = xglm(**CASES["unscaled-relu-untied"])
    assert_saved_names_are_transformers(tmp_path, hf, ours, [
        "model.layer_norm.weight", "model.layers.0.self_attn_layer_norm.bias", "model.layers.1.final_layer_norm.bias",
        "model.layers.2.fc1.weight", "model.layers.0.self_attn.out_proj.bias", "lm_head.weight"])
    drawn = Llama(ours.config)
    assert torch.equal(drawn.model.embed_positions.weight, hf.model.embed_positions.weights)


def test_the_positions_matter():
    """The sinusoid zeroed, or read at offset 0, moves the logits past TOL (the tests above can fail)."""
    hf, ours = xglm()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        table = ours.model.embed_positions.weight
        saved = table.clone()
        table[2:] = saved[:-2].clone()  # (position p at row p: no offset)
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL
        table.zero_()
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes XGLMConfig's (xglm-564M's shape; the exact GELU; scaled embeddings; tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "xglm"}), transformers.AutoConfig.for_model("xglm")
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.max_position_embeddings) == (want.vocab_size, want.d_model, want.ffn_dim, want.num_layers,
                                           want.attention_heads, want.max_position_embeddings)
    assert (c.activation, c.rounded_embed_factor, c.tie_word_embeddings, c.pad_token_id) == (
        want.activation_function, want.d_model ** 0.5, want.tie_word_embeddings, want.pad_token_id)
    back = transformers.XGLMConfig.from_dict(c.to_dict())
    assert (back.d_model, back.ffn_dim, back.num_layers) == (1024, 4096, 24)


@pytest.mark.parametrize("extra,match", [({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"d_model": 64, "hidden_size": 32}, "d_model"),
                                         ({"scale_embedding": 2}, "scale_embedding"),
                                         ({"activation_function": "silu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "xglm", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over an XGLM model give its greedy tokens (a layer-skip draft, its table shared)."""
    _, ours = xglm()
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
