"""Helium (``model_type="helium"``: Kyutai's Helium-1 2B): Llama's layer with RoPE on adjacent pairs of dims (the
checkpoint's q / k dims reordered on loading, back on saving), its RMSNorm's weight applied in float32, biases on q, k
and v only by attention_bias. Against transformers' HeliumForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, tiny_family, transformers_and_ours
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

HELIUM = dict(TINY, head_dim=16, pad_token_id=0)


@pytest.mark.parametrize("kw", [{}, {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}],
                         ids=["default", "biases-tied"])
def test_every_path_and_our_save_match_transformers(tmp_path, kw):
    hf, ours = transformers_and_ours("Helium", **{**HELIUM, **kw})
    c = ours.config
    assert c.model_type == "helium" and c.rope_interleaved and c.float32_norm and not c.out_bias
    assert c.qkv_bias == kw.get("attention_bias", False)
    assert_every_path_matches(hf, ours)
    ours.save_pretrained(tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert type(back).__name__ == "HeliumForCausalLM"
    assert all(torch.equal(t, hf.state_dict()[k]) for k, t in back.state_dict().items())
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(Llama.from_pretrained(tmp_path)(ids), ours(ids))


def test_the_pairs_and_the_float32_norm_matter(monkeypatch):
    """Each of Helium's two differences from Llama moves the logits when dropped: its q / k dims read as half-split
    pairs (float32), its norm's weight applied in the model's dtype (bfloat16)."""
    import dataclasses

    from triforce.models import config as config_module
    from triforce.models.loading import _build

    hf, ours = transformers_and_ours("Helium", **HELIUM)
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        as_llama = _build(ours.config.replace(model_type="llama"), hf.state_dict(), None, None)
        assert (as_llama(ids) - ref).abs().max().item() > 1e-3
        want = _build(ours.config, hf.state_dict(), None, torch.bfloat16)(ids)
        monkeypatch.setitem(config_module.FAMILIES, "helium",
                            dataclasses.replace(config_module.FAMILIES["helium"], float32_norm=False))
        assert not torch.equal(_build(ours.config, hf.state_dict(), None, torch.bfloat16)(ids), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(transformers_and_ours("Helium", **HELIUM)[1], dtype)


def test_defaults():
    """A config without the keys takes HeliumConfig's (Helium-1 2B's shape, its eps 1e-8 and RoPE base 1e5)."""
    c, want = LlamaConfig.from_dict({"model_type": "helium"}), transformers.HeliumConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"] == 1e5


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_family("helium", 0, head_dim=16), tiny_family("helium", 1, head_dim=16),
                                        method, opts)
