"""Kolibri-1 (``model_type="kolibri1"``: Aleph Alpha's Kolibri-1): EXAONE 4's attention (q/k norms per head; RoPE and
a window on the sliding layers only) in GLM-4's four-norm layer, every MLP a mixture whose router chooses by the
logits plus a correction bias and weighs by their sigmoid, with an ungated shared expert; against transformers'
Kolibri1ForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (TINY, assert_our_save_reads_back, assert_saved_names_are_transformers,
                            model_type_and_ours, tiny_family)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")

MOE = {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 8, "num_experts_per_tok": 3}
CASES = {"default": {}, "renormalised-types-tied": {
    "norm_topk_prob": True, "tie_word_embeddings": True,
    "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]}}


def kolibri(**kw):
    """A tiny random transformers Kolibri1ForCausalLM (its correction biases drawn from N(0, 1)) and ours."""
    return model_type_and_ours("kolibri1", ("e_score_correction_bias",), **{
        **{k: v for k, v in TINY.items() if k != "intermediate_size"}, "head_dim": 16, "num_hidden_layers": 5,
        "sliding_window": 6, **MOE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = kolibri(**CASES[case])
    c = ours.config
    sliding = tuple(t == "sliding_attention" for t in hf.config.layer_types)
    assert c.layer_windows == tuple(6 if s else 0 for s in sliding) and c.rope_layers == sliding
    assert c.experts.bias_on_logits and c.experts.renormalize == hf.config.norm_topk_prob
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    assert back.layer_types == hf.config.layer_types


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """transformers saves Kolibri-1 under its checkpoints' names (post_attn_norm, post_ffn_norm, moe.router.expert_bias,
    the experts one by one): read from such a file, and ours written with the same names."""
    assert_saved_names_are_transformers(tmp_path, *kolibri(), ["model.layers.0.moe.router.expert_bias",
                                                              "model.layers.0.post_attn_norm.weight",
                                                              "model.layers.0.post_ffn_norm.weight"])


def test_the_router_the_window_and_the_rope_layers_matter():
    """The correction bias added to the scores (DeepSeek-V3's choice) instead of the logits, no window, or RoPE on
    every layer: the logits move past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    hf, ours = kolibri()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        for m in ours.modules():
            if getattr(m, "bias_on_logits", False):
                m.bias_on_logits = False
        assert (ours(ids) - ref).abs().max().item() > 100 * TOL
        for change in ({"layer_types": ["full_attention"] * 5}, {"sliding_window": 10 ** 6}):
            other = _build(LlamaConfig.from_dict({**hf.config.to_dict(), **change}), hf.state_dict(), None, None)
            assert (other(ids) - ref).abs().max().item() > 100 * TOL, change


def test_defaults():
    """A config without the keys takes Kolibri1Config's: its shape, a window of 513 on four layers of every five (RoPE
    there only), 384 experts of 512, six chosen, not renormalised, a shared expert of 512."""
    c, want = LlamaConfig.from_dict({"model_type": "kolibri1"}), transformers.AutoConfig.for_model("kolibri1")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                 "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
                 "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.rope_scaling is None
    sliding = tuple(t == "sliding_attention" for t in want.layer_types)
    assert c.layer_windows == tuple(513 if s else 0 for s in sliding) and c.rope_layers == sliding
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize, e.shared_intermediate_size) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size, want.norm_topk_prob,
        want.shared_expert_intermediate_size)


@pytest.mark.parametrize("extra,match", [({"sliding_window": None}, "sliding_window"),
                                         ({"layer_types": ["full_attention"]}, "layer_types"),
                                         ({"num_experts_per_tok": 0}, "num_experts_per_tok"),
                                         ({"norm_topk_prob": 1}, "norm_topk_prob"),
                                         ({"sliding_window": None, "layer_types": ["full_attention"] * 5},
                                          "sliding_window")])
def test_what_would_not_be_read_so_raises(extra, match):
    """A sliding layer without a window (Kolibri1Config refuses it; without any sliding layer transformers' model fails
    on it), layer_types of the wrong length, no expert chosen and a switch that is not a bool raise naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "kolibri1", "num_hidden_layers": 5, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Kolibri-1 model (a window of 6 the prompts and drafts cross) give its greedy tokens."""
    def tiny(seed):
        model = tiny_family("kolibri1", seed, layers=5, extra={"sliding_window": 6, **MOE, "norm_topk_prob": True})
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    b.normal_(0, 1)
        return model
    target = tiny(0)
    assert target.config.layer_windows == (6, 6, 6, 6, 0)
    assert_greedy_equals_autoregressive(target, tiny(1), method, opts)
