"""VaultGemma (``model_type="vaultgemma"``: vaultgemma-1b, trained with differential privacy): Gemma 2's layer (its
soft-caps, every other layer sliding, the scores scaled by query_pre_attn_scalar, Gemma's 1 + w norms and scaled
embeddings) without the norms after the attention and the MLP: Gemma's two norms before them, the one before the MLP
named ``pre_feedforward_layernorm`` in its checkpoints (renamed on loading, back on saving). Against transformers'
VaultGemmaForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_gemma2 import GEMMA2
from .test_gemma3 import tiny_gemma
from .test_families import assert_saved_reads_back, randomize_
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")


def pair(**kw):
    """transformers' VaultGemmaForCausalLM with Gemma 2's tiny test config (small caps, windows of 6; random weights,
    norms and biases) and ours from its config and weights."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.VaultGemmaConfig(**{**GEMMA2, **kw}, attn_implementation="eager")
    hf = randomize_(transformers.VaultGemmaForCausalLM(config).eval())
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("kw", [{}, {"attention_bias": True, "tie_word_embeddings": False}],
                         ids=["default", "biases-untied"])
def test_every_path_and_our_save_match_transformers(tmp_path, kw):
    hf, ours = pair(**kw)
    c = ours.config
    assert c.model_type == "vaultgemma" and c.layer_windows == (6, 0, 6, 0) and c.attention_scale == 24 ** -0.5
    assert (c.attn_softcap, c.final_softcap, c.sandwich_norms, c.gemma_norm, c.embed_scale) == (2.0, 1.5, False,
                                                                                                True, True)
    assert not any("pre_feedforward" in k for k in ours.state_dict())
    ids, ref = assert_every_path_matches(hf, ours)
    assert ref.abs().max() <= 1.5  # (the logits' cap)
    assert_saved_reads_back(tmp_path, hf, ours)
    assert LlamaConfig.from_dict(c.to_dict()) == c


def test_the_caps_and_the_norms_place_matter():
    """Read as Gemma 2 without its norms after the blocks, or without the caps, the logits move: VaultGemma is Gemma
    2's layer less those norms, not Gemma 1's."""
    from triforce.models.loading import _build, _norm_names

    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    sd = _norm_names(ours.config, hf.state_dict())
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() < 1e-4
        uncapped = ours.config.replace(extra={**ours.config.extra, "attn_logit_softcapping": None,
                                              "final_logit_softcapping": None})
        assert (_build(uncapped, sd, None, None)(ids) - ref).abs().max().item() > 1e-2
        gemma1 = ours.config.replace(model_type="gemma", extra={})
        assert (_build(gemma1, sd, None, None)(ids) - ref).abs().max().item() > 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_defaults():
    """A config without the keys takes VaultGemmaConfig's (Gemma 2's: caps 50 and 30, windows of 4096 on every other
    layer, the first sliding)."""
    c, want = LlamaConfig.from_dict({"model_type": "vaultgemma"}), transformers.VaultGemmaConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    assert (c.attn_softcap, c.final_softcap) == (want.attn_logit_softcapping, want.final_logit_softcapping)
    assert c.layer_windows == tuple(want.sliding_window if t == "sliding_attention" else 0 for t in want.layer_types)
    assert c.attention_scale == want.query_pre_attn_scalar ** -0.5


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    def tiny(seed):
        return tiny_gemma("vaultgemma", seed, extra={"sliding_window": 7, "query_pre_attn_scalar": 12,
                                                     "attn_logit_softcapping": 3.0, "final_logit_softcapping": 5.0})
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
