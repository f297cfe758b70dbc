"""GPT-1 (``model_type="openai-gpt"``: openai-community/openai-gpt): GPT-2's learned positions, Conv1D weights and
``c_attn``, with its norms after each block's residual add and no final norm, its config's names (``afn``: "gelu" is
GELU's tanh form) and checkpoints' names (``tokens_embed``, ``positions_embed``, unprefixed ones too); against
transformers' OpenAIGPTLMHeadModel."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_edited_save_reads_the_same, assert_our_save_reads_back,
                            assert_saved_names_are_transformers, model_type_and_ours, old_attention_buffers)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, n_embd=64, n_layer=3, n_head=4, n_positions=512, initializer_range=0.2)
CASES = {"default": {}, "relu-untied": {"afn": "relu", "tie_word_embeddings": False}}


def gpt1(**kw):
    """A tiny random transformers OpenAIGPTLMHeadModel and ours."""
    return model_type_and_ours("openai-gpt", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = gpt1(**CASES[case])
    c = ours.config
    assert (c.position_offset, c.intermediate_size, c.attention_bias, c.mlp_bias, c.norm_after_residual,
            c.final_norm, c.activation) == (0, 256, True, True, True, False,
                                            "relu" if hf.config.afn == "relu" else "gelu_tanh")
    assert type(ours.model.norm) is torch.nn.Identity
    assert_every_path_matches(hf, ours)
    assert_our_save_reads_back(tmp_path, hf, ours, keys=("n_embd", "n_layer", "n_head", "n_positions", "afn",
                                                         "layer_norm_epsilon", "tie_word_embeddings"))
    assert_pass_equals_steps(ours, torch.float32)


def test_a_pass_gives_the_bits_of_one_token_steps_in_bfloat16():
    _, ours = gpt1()
    assert_pass_equals_steps(ours, torch.bfloat16)


def test_its_checkpoint_names_read_and_are_written_unprefixed_ones_read_and_old_buffers_dropped(tmp_path):
    """Its checkpoints' names (transformer.tokens_embed, positions_embed, h.*.attn.c_attn, ln_1, ln_2; Conv1D weights,
    [in, out]; no final norm) read and written; OpenAIGPTModel's unprefixed names read the same; an old checkpoint's
    attention mask buffer (attn.bias) dropped."""
    hf, ours = gpt1()
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.tokens_embed.weight",
                                                            "transformer.positions_embed.weight",
                                                            "transformer.h.0.attn.c_attn.weight",
                                                            "transformer.h.2.mlp.c_proj.bias",
                                                            "transformer.h.1.ln_2.weight"])

    def unprefixed(sd):
        sd = {k.removeprefix("transformer."): t for k, t in sd.items()}
        assert "positions_embed.weight" in sd and "h.2.attn.c_proj.weight" in sd
        return {**sd, **old_attention_buffers("h.0.attn.")}

    assert_edited_save_reads_the_same(tmp_path, ours, unprefixed)


def test_the_norms_order_and_the_positions_matter():
    """Its norms put before the blocks (GPT-2's order), or its learned positions zeroed, move the logits past TOL (the
    tests above can fail)."""
    hf, ours = gpt1()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        for layer in ours.model.layers:
            layer.norm_after = False
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL
        for layer in ours.model.layers:
            layer.norm_after = True
        ours.model.embed_positions.weight.zero_()
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes OpenAIGPTConfig's (openai-gpt's shape: 40478 tokens, 512 positions, 12 x 768;
    GELU's tanh form; tied)."""
    c, want = LlamaConfig.from_dict({"model_type": "openai-gpt"}), transformers.AutoConfig.for_model("openai-gpt")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings) == (
        want.vocab_size, want.n_embd, want.n_layer, want.n_head, want.n_positions)
    assert (c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings, c.activation) == (
        4 * want.n_embd, want.layer_norm_epsilon, want.tie_word_embeddings, "gelu_tanh")
    back = transformers.OpenAIGPTConfig.from_dict(c.to_dict())  # (our config written as OpenAIGPTConfig's names)
    assert (back.n_embd, back.n_positions, back.afn, back.n_layer) == (768, 512, "gelu", 12)
    assert not {"rope_theta", "num_key_value_heads", "attention_bias", "hidden_size", "intermediate_size",
                "hidden_act"} & set(c.to_dict())


def test_the_hubs_config_reads():
    """openai-community/openai-gpt's config.json as published (its n_ctx, n_special, predict_special_tokens and
    summary keys, unread by transformers' model) reads as OpenAIGPTConfig does, and writes back."""
    hub = {"afn": "gelu", "architectures": ["OpenAIGPTLMHeadModel"], "attn_pdrop": 0.1, "embd_pdrop": 0.1,
           "initializer_range": 0.02, "layer_norm_epsilon": 1e-05, "model_type": "openai-gpt", "n_ctx": 512,
           "n_embd": 768, "n_head": 12, "n_layer": 12, "n_positions": 512, "n_special": 0,
           "predict_special_tokens": True, "resid_pdrop": 0.1, "summary_activation": None,
           "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
           "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
           "vocab_size": 40478}
    c = LlamaConfig.from_dict(hub)
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.max_position_embeddings, c.activation) == (
        40478, 768, 3072, 512, "gelu_tanh")
    assert {k: v for k, v in c.to_dict().items() if k in hub} == hub
    with pytest.raises(ValueError, match="n_special"):
        LlamaConfig.from_dict({**hub, "n_special": 2})


@pytest.mark.parametrize("extra,match", [({"afn": "silu"}, "hidden_act"),
                                         ({"intermediate_size": 80}, "intermediate_size"),
                                         ({"rope_theta": 5e5}, "rope_theta"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"mlp_bias": True}, "mlp_bias"),
                                         ({"n_embd": 64, "hidden_size": 32}, "n_embd"),
                                         ({"attn_pdrop": 2}, "attn_pdrop")])
def test_what_would_not_be_read_so_raises(extra, match):
    """SiLU (transformers' silu / swish: not implemented), keys OpenAIGPTConfig does not read (an MLP width, RoPE, KV
    heads, the bias switches), a name given twice apart, a dropout out of range: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "openai-gpt", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a GPT-1 model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = gpt1(**CASES["relu-untied"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
