"""Laguna (``model_type="laguna"``): AFMoE's attention with a query head count per layer and a softplus output gate (per
head or per dim), a RoPE per layer type (partial on the full layers, the whole head on the sliding ones), a mixture with
a soft-capped sigmoid router, a routed scale and an ungated shared expert; against transformers' LagunaForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=6, moe_intermediate_size=32,
            shared_expert_intermediate_size=24, num_experts=8, num_experts_per_tok=3, initializer_range=0.05)
TYPES = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
CASES = {"default": {}, "heads-per-layer-dims-gate-capped": {
    "layer_types": TYPES, "num_attention_heads_per_layer": [4, 2, 6, 4], "gating": "per-element",
    "moe_router_logit_softcapping": 2.0, "moe_routed_scaling_factor": 1.5,
    "mlp_layer_types": ["dense", "sparse", "dense", "sparse"], "tie_word_embeddings": True}}


def laguna(**kw):
    """A tiny random transformers LagunaForCausalLM (its correction biases drawn from N(0, 1)) and ours."""
    return model_type_and_ours("laguna", ("e_score_correction_bias",), **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = laguna(**CASES[case])
    c, h = ours.config, hf.config
    sliding = tuple(t == "sliding_attention" for t in h.layer_types)
    assert c.layer_windows == tuple(6 if s else 0 for s in sliding) and c.rope_layers == tuple(not s for s in sliding)
    assert [layer.self_attn.n_heads for layer in ours.model.layers] == h.num_attention_heads_per_layer
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [t == "sparse" for t in h.mlp_layer_types]
    assert c.rotary_dim == 8 and c.local_rope_theta == h.rope_parameters["sliding_attention"]["rope_theta"]
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("layer_types", "mlp_layer_types", "num_attention_heads_per_layer", "gating", "rope_parameters",
                "moe_router_logit_softcapping", "moe_routed_scaling_factor"):
        assert getattr(back, key) == getattr(h, key), key
    assert_pass_equals_steps(ours, torch.float32)


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """transformers saves Laguna under its checkpoints' names (mlp.experts.e_score_correction_bias, mlp.shared_expert,
    the experts one by one, self_attn.g_proj): read and written so."""
    assert_saved_names_are_transformers(tmp_path, *laguna(), ["model.layers.1.mlp.experts.e_score_correction_bias",
                                                             "model.layers.1.mlp.shared_expert.up_proj.weight",
                                                             "model.layers.0.self_attn.g_proj.weight"])


@pytest.mark.parametrize("change", [
    {"moe_router_logit_softcapping": 0.0}, {"moe_routed_scaling_factor": 1.0}, {"gating": True},
    {"layer_types": ["full_attention"] * 4},
    {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 1.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}],
    ids=["no-cap", "no-scale", "gate-per-head", "no-window", "full-rope"])
def test_each_switch_matters(change):
    """Without the router's cap or the routed scale, the gate per head instead of per dim, no window, or RoPE on the
    full layers' whole head: the logits move past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    case = CASES["heads-per-layer-dims-gate-capped"]
    hf, _ = laguna(**case)
    d, sd = hf.config.to_dict(), dict(hf.state_dict())
    if "gating" in change:  # (a gate per head: its projection's rows, one per head, from the first of each head's dims)
        sd = {k: t.view(-1, 16, t.shape[-1])[:, 0] if k.endswith("g_proj.weight") else t for k, t in sd.items()}
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        other = _build(LlamaConfig.from_dict({**d, **change}), sd, None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 100 * TOL


def test_defaults():
    """A config without the keys takes LagunaConfig's: its shape, every layer full (RoPE on half of each head at 5e5;
    1e4 on the whole head of a sliding one), the first layer dense, 256 experts of 512, eight chosen, a gate per
    head."""
    c, want = LlamaConfig.from_dict({"model_type": "laguna"}), transformers.AutoConfig.for_model("laguna")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    full, local = want.rope_parameters["full_attention"], want.rope_parameters["sliding_attention"]
    assert (c.rope_theta, c.rotary_dim, c.local_rope_theta) == (
        full["rope_theta"], int(c.head_dim * full["partial_rotary_factor"]), local["rope_theta"])
    assert c.softplus_gate == "head" and not any(c.layer_windows)
    assert [c.layer_heads(i) for i in range(c.num_hidden_layers)] == want.num_attention_heads_per_layer
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.scale, e.logit_softcap) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size, want.shared_expert_intermediate_size,
        want.moe_routed_scaling_factor, want.moe_router_logit_softcapping)
    assert e.layers == tuple(t == "sparse" for t in want.mlp_layer_types)


@pytest.mark.parametrize("extra,match", [
    ({"moe_apply_router_weight_on_input": True}, "moe_apply_router_weight_on_input"),
    ({"num_attention_heads_per_layer": [4, 3, 4, 4]}, "num_attention_heads_per_layer"),
    ({"num_attention_heads_per_layer": [4]}, "num_attention_heads_per_layer"), ({"gating": "x"}, "gating"),
    ({"sliding_window": None, "layer_types": TYPES}, "sliding_window"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.5}}}, "sliding_attention")])
def test_what_would_not_be_read_so_raises(extra, match):
    """Router weights on the input (transformers refuses them), a head count not a multiple of the KV heads or a list
    of the wrong length, another gate, a sliding layer without a window, partial RoPE on the sliding layers: each
    raises naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "laguna", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Laguna model (head counts per layer, a window of 6 the prompts and drafts cross, two RoPEs)
    give its greedy tokens (a layer-skip draft for the two-model methods: TriForce's retrieval cache keeps each layer's
    queries at its own head count)."""
    _, ours = laguna(**CASES["heads-per-layer-dims-gate-capped"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(3), method, opts)
