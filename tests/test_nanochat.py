"""NanoChat (``model_type="nanochat"``: Karpathy's nanochat as transformers converts it): RMSNorms without weights
before the attention and the MLP, at the end and on the embeddings before the first layer; Qwen3's attention with its
per-head q / k norms after RoPE, and RoPE by -angle (its rotate_half's signs flipped: read as RoPE on each head's
halves swapped); an ungated ReLU-squared MLP (``fc1``, ``fc2``); the logits soft-capped. Against transformers'
NanoChatForCausalLM."""
import dataclasses

import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

CASES = {"default": {}, "biases-gqa-cap": dict(attention_bias=True, num_key_value_heads=2, final_logit_softcapping=2.0,
                                                tie_word_embeddings=True)}


def pair(case="default"):
    """transformers' NanoChatForCausalLM of ``case`` (random weights and biases; its norms have none) and ours."""
    return transformers_and_ours("NanoChat", **{**TINY, "num_hidden_layers": 3, "eos_token_id": 1, **CASES[case]})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert (c.activation, c.gated_mlp, c.qk_norm_after_rope, c.embed_norm) == ("relu2", False, True, True)
    assert c.final_softcap == hf.config.final_logit_softcapping and c.attn_softcap is None
    assert not any("norm" in k for k in hf.state_dict())  # (weightless: ours are ones)
    assert all(bool((t == 1).all()) for k, t in ours.state_dict().items() if "norm" in k)
    ids, ref = assert_every_path_matches(hf, ours)
    if c.final_softcap < 10:
        assert ref.abs().max() <= c.final_softcap
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_difference_matters(monkeypatch):
    """RoPE read the usual way round, the embeddings not normed, or the logits not capped: the logits move."""
    from triforce.models import config as config_module
    from triforce.models.loading import _build

    hf, ours = pair("biases-gqa-cap")
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        for field in ("rope_reversed", "embed_norm"):
            with monkeypatch.context() as m:
                m.setitem(config_module.FAMILIES, "nanochat",
                          dataclasses.replace(config_module.FAMILIES["nanochat"], **{field: False}))
                assert (_build(ours.config, hf.state_dict(), None, None)(ids) - ref).abs().max().item() > 1e-3, field
        uncapped = ours.config.replace(extra={**ours.config.extra, "final_logit_softcapping": None})
        assert (_build(uncapped, hf.state_dict(), None, None)(ids) - ref).abs().max().item() > 1e-2


def test_weightless_norms_both_ways(tmp_path):
    """A checkpoint holding a norm weight raises (NanoChat's have none); a model whose norm weight is not all ones
    cannot be saved in that layout."""
    from triforce.models.loading import _build

    hf, ours = pair()
    sd = {**hf.state_dict(), "model.norm.weight": torch.ones(TINY["hidden_size"])}
    with pytest.raises(ValueError, match="model.norm.weight"):
        _build(ours.config, sd, None, None)
    with torch.no_grad():
        ours.model.layers[1].self_attn.k_norm.weight[3] = 2.0
    with pytest.raises(ValueError, match="layers.1.self_attn.k_norm.weight"):
        ours.save_pretrained(tmp_path)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("biases-gqa-cap")[1], dtype)


def test_defaults():
    """A config without the keys takes NanoChatConfig's (d20's shape: 12 layers of 768, MHA, ReLU squared, cap 15)."""
    c, want = LlamaConfig.from_dict({"model_type": "nanochat"}), transformers.NanoChatConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.head_dim == want.hidden_size // want.num_attention_heads
    assert (c.final_softcap, c.rope_theta) == (want.final_logit_softcapping, want.rope_parameters["rope_theta"])


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """(StreamingLLM's re-rotated keys among them: the swapped halves turn as any family's.)"""
    def tiny(seed):
        return tiny_family("nanochat", seed, head_dim=8, extra={"final_logit_softcapping": 4.0})
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
