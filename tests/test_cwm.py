"""CWM (``model_type="cwm"``: Meta's Code World Model): Llama's layer with Llama 3.1's RoPE (CwmConfig's when the
config has none) and a sliding window on the ``layer_types``' sliding layers (by default all but every fourth from
layer 0), against transformers' CwmForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.config import _CWM_ROPE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import LLAMA3, TINY, assert_our_save_reads_back, model_type_and_ours, tiny_family
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")


def cwm(**kw):
    """A tiny random transformers CwmForCausalLM and ours."""
    return model_type_and_ours("cwm", **{**TINY, "head_dim": 16, "num_hidden_layers": 5, "sliding_window": 6, **kw})


@pytest.mark.parametrize("kw", [{}, {"mlp_bias": True, "tie_word_embeddings": True, "rope_parameters": LLAMA3,
                                     "layer_types": ["sliding_attention", "full_attention", "sliding_attention",
                                                     "sliding_attention", "full_attention"]}],
                         ids=["default", "llama3-bias-tied-types"])
def test_every_path_and_our_save_match_transformers(tmp_path, kw):
    hf, ours = cwm(**kw)
    assert type(hf).__name__ == "CwmForCausalLM" and ours.config.model_type == "cwm"
    assert ours.config.layer_windows == tuple(6 if t == "sliding_attention" else 0 for t in hf.config.layer_types)
    assert sum(w > 0 for w in ours.config.layer_windows) == 3
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    assert back.layer_types == hf.config.layer_types and back.rope_parameters == hf.config.rope_parameters


def test_the_window_and_the_rope_matter():
    """Without its window, or on another RoPE base, the logits move past TOL: the test above can fail."""
    from triforce.models.loading import _build

    hf, ours = cwm()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d = hf.config.to_dict()
    with torch.no_grad():
        ref = hf(ids).logits
        for change in ({"layer_types": ["full_attention"] * 5}, {"rope_parameters": {**_CWM_ROPE, "rope_theta": 1e4}}):
            other = _build(LlamaConfig.from_dict({**d, **change}), hf.state_dict(), None, None)
            assert (other(ids) - ref).abs().max().item() > 100 * TOL, change


def test_defaults():
    """A config without the keys takes CwmConfig's: the 32B shape, its Llama 3.1 RoPE, the window on three layers of
    every four, its three end-of-sequence ids."""
    c, want = LlamaConfig.from_dict({"model_type": "cwm"}), transformers.AutoConfig.for_model("cwm")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "mlp_bias", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    rope = want.rope_parameters
    assert c.rope_theta == rope["rope_theta"] == 1e6
    assert c.rope_scaling == {k: v for k, v in rope.items() if k != "rope_theta"}
    assert c.layer_windows == tuple(8192 if t == "sliding_attention" else 0 for t in want.layer_types)
    assert c.layer_windows[:5] == (0, 8192, 8192, 8192, 0)


def test_cwm_config_json():
    """facebook/cwm's config.json as transformers writes it (its keys; RoPE in rope_parameters): read whole."""
    d = transformers.AutoConfig.for_model("cwm").to_dict()
    c = LlamaConfig.from_dict(d)
    assert c.layer_windows.count(0) == 16 and c.num_hidden_layers == 64


@pytest.mark.parametrize("extra,match", [
    ({"sliding_window": None}, "sliding_window"), ({"sliding_window": 0}, "sliding_window"),
    ({"rope_theta": 5e5}, "rope_theta = 500000.0 without a RoPE dict: CwmConfig"),
    ({"attention_bias": True}, "attention_bias"), ({"use_sliding_window": True}, "use_sliding_window"),
    ({"max_window_layers": 3}, "max_window_layers"), ({"layer_types": ["full_attention"]}, "layer_types")])
def test_what_transformers_would_not_read_so_raises(extra, match):
    """A null or zero window fails CwmConfig; a top-level base without a RoPE dict, an attention bias and Qwen's
    window keys it keeps unread; layer_types of the wrong length fail its validation: each raises here."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "cwm", **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a CWM model (a window of 6: the prompts and the drafts cross it) give its greedy tokens."""
    def tiny(seed):
        return tiny_family("cwm", seed, layers=5, extra={"sliding_window": 6}, rope_theta=1e6,
                           rope_scaling={k: v for k, v in _CWM_ROPE.items() if k != "rope_theta"})
    target = tiny(0)
    assert target.config.layer_windows == (0, 6, 6, 6, 0)
    assert_greedy_equals_autoregressive(target, tiny(1), method, opts)
