"""GPT-J (``model_type="gptj"``: gpt-j-6b and its fine-tunes): Phi-2's parallel block without attention biases, RoPE at
base 10000 on the first ``rotary_dim`` dims on adjacent pairs, a biased head, its config's and checkpoints' names;
against transformers' GPTJForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (assert_edited_save_reads_the_same, assert_our_save_reads_back,
                            assert_saved_names_are_transformers, model_type_and_ours, old_attention_buffers)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, n_embd=64, n_layer=3, n_head=4, n_positions=512, rotary_dim=8, bos_token_id=1,
            eos_token_id=2, initializer_range=0.2)  # (weights wide enough for the attention to see positions)
CASES = {"default": {}, "rotary-16-inner-tied": {"rotary_dim": 16, "n_inner": 80, "tie_word_embeddings": True}}


def gptj(**kw):
    """A tiny random transformers GPTJForCausalLM and ours."""
    return model_type_and_ours("gptj", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = gptj(**CASES[case])
    c = ours.config
    assert (c.rotary_dim, c.intermediate_size, c.head_bias, c.attention_bias, c.mlp_bias) == (
        hf.config.rotary_dim, hf.config.n_inner or 4 * hf.config.n_embd, True, False, True)
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("n_embd", "n_layer", "n_head", "n_positions", "n_inner", "rotary_dim", "layer_norm_epsilon",
                "activation_function", "tie_word_embeddings"):
        assert getattr(back, key) == getattr(hf.config, key), key
    assert_pass_equals_steps(ours, torch.float32)


def test_its_checkpoint_names_read_and_are_written_and_old_buffers_dropped(tmp_path):
    """Its checkpoints' names (transformer.h.*.attn.*, mlp.fc_in / fc_out, ln_1, ln_f) read and written; an old
    checkpoint's attention buffers (attn.bias, attn.masked_bias: a causal mask and its fill) dropped, as transformers
    ignores them."""
    hf, ours = gptj()
    assert_saved_names_are_transformers(tmp_path, hf, ours, ["transformer.h.0.attn.out_proj.weight",
                                                            "transformer.h.0.mlp.fc_in.bias", "lm_head.bias"])
    assert_edited_save_reads_the_same(tmp_path, ours,
                                      lambda sd: {**sd, **old_attention_buffers("transformer.h.0.attn.")})


def test_the_rotary_dims_and_their_pairs_matter(monkeypatch):
    """Another rotary_dim, or RoPE's pairs taken as halves (i, i + r/2) instead of GPT-J's adjacent dims, moves the
    logits past TOL (the tests above can fail)."""
    import dataclasses

    from triforce.models import config as configs
    from triforce.models.loading import _build

    hf, _ = gptj()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d = hf.config.to_dict()
    with torch.no_grad():
        ref = hf(ids).logits
        other = _build(LlamaConfig.from_dict({**d, "rotary_dim": 16}), hf.state_dict(), None, None)
        assert (other(ids) - ref).abs().max().item() > 100 * TOL
        monkeypatch.setitem(configs.FAMILIES, "gptj", dataclasses.replace(configs.FAMILIES["gptj"],
                                                                         rope_interleaved=False))
        halves = _build(LlamaConfig.from_dict(d), hf.state_dict(), None, None)
        assert (halves(ids) - ref).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes GPTJConfig's (gpt-j-6b's shape; rotary_dim 64; n_inner 4 * n_embd)."""
    c, want = LlamaConfig.from_dict({"model_type": "gptj"}), transformers.AutoConfig.for_model("gptj")
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.max_position_embeddings) == (
        want.vocab_size, want.n_embd, want.n_layer, want.n_head, want.n_positions)
    assert (c.rotary_dim, c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings) == (
        want.rotary_dim, 4 * want.n_embd, want.layer_norm_epsilon, want.tie_word_embeddings)
    assert (c.bos_token_id, c.eos_token_id, c.rope_theta) == (want.bos_token_id, want.eos_token_id, 10000.0)
    back = transformers.GPTJConfig.from_dict(c.to_dict())  # (our config written as GPTJConfig's names)
    assert (back.n_embd, back.n_inner, back.rotary_dim, back.activation_function) == (4096, None, 64, "gelu_new")


@pytest.mark.parametrize("extra,match", [({"rope_theta": 5e5}, "rope_theta"), ({"rotary_dim": None}, "rotary_dim"),
                                         ({"rotary_dim": 7}, "rotary_dim"), ({"rotary_dim": 32}, "rotary_dim"),
                                         ({"num_key_value_heads": 2}, "num_key_value_heads"),
                                         ({"attention_bias": True}, "attention_bias"),
                                         ({"n_embd": 64, "hidden_size": 32}, "n_embd"),
                                         ({"activation_function": "relu"}, "hidden_act")])
def test_what_would_not_be_read_so_raises(extra, match):
    """Keys GPTJConfig does not read (a RoPE base, KV heads, attention biases), a rotary_dim it refuses or the head
    cannot hold, a name given twice apart, another activation: each raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "gptj", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a GPT-J model give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = gptj(**CASES["rotary-16-inner-tied"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(2), method, opts)
