"""Granite SWA (``model_type="granite_swa"``: granite-swash-2b; ``"granitemoe_swa"``: granite-swash-3b-a600m): Granite's
layer and multipliers (GraniteMoeShared's mixture) with GPT-OSS's attention sinks, a sliding window on the
``layer_types``' sliding layers and a RoPE base per layer (``layer_rope_theta``, 0: NoPE), against transformers'
GraniteSWAForCausalLM and GraniteMoeSWAForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_our_save_reads_back, model_type_and_ours, tiny_family
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")

MOE = {"num_local_experts": 4, "num_experts_per_tok": 2}
SCALES = {"embedding_multiplier": 2.0, "attention_multiplier": 0.3, "residual_multiplier": 0.5, "logits_scaling": 3.0}
CASES = {
    "dense": ("granite_swa", {}),
    "nope-full-scales": ("granite_swa", {"layer_rope_theta": [0, 1e4, 1e4, 1e4, 0], **SCALES}),
    "two-bases-untied-biases": ("granite_swa", {"layer_rope_theta": [1e6, 1e4, 1e4, 1e4, 1e6], "attention_bias": True,
                                              "mlp_bias": True, "tie_word_embeddings": False}),
    "llama3-nope-types": ("granite_swa", {
        "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        "layer_rope_theta": [5e5, 5e5, 0, 5e5, 0],
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention",
                        "sliding_attention"]}),
    "moe": ("granitemoe_swa", {**MOE, **SCALES}),
    "moe-shared-nope": ("granitemoe_swa", {**MOE, "shared_intermediate_size": 32,
                                           "layer_rope_theta": [0, 1e4, 1e4, 1e4, 0]}),
}


def granite_swa(model_type, **kw):
    """A tiny random transformers model of ``model_type`` (its sinks drawn from N(0, 1)) and ours."""
    return model_type_and_ours(model_type, ("sinks",), **{
        **TINY, "head_dim": 16, "num_hidden_layers": 5, "sliding_window": 6, "bos_token_id": 1, "eos_token_id": 2,
        **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    model_type, kw = CASES[case]
    hf, ours = granite_swa(model_type, **kw)
    c = ours.config
    assert c.attention_sinks and c.layer_windows == tuple(6 if t == "sliding_attention" else 0
                                                          for t in hf.config.layer_types)
    assert c.rope_layers == tuple(t == c.rope_theta for t in hf.config.layer_rope_theta)
    assert (c.experts is not None) == (model_type == "granitemoe_swa")
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("layer_types", "layer_rope_theta", "sliding_window", "rope_parameters"):
        assert getattr(back, key) == getattr(hf.config, key), key


@pytest.mark.parametrize("change", [{"layer_types": ["full_attention"] * 5}, {"layer_rope_theta": [1e4] * 5},
                                    {"layer_rope_theta": [2e4, 1e4, 1e4, 1e4, 2e4]}],
                         ids=["no-window", "no-nope", "another-base"])
def test_the_window_the_bases_and_the_sinks_matter(change):
    """Without its window, its NoPE layers or its base, or with its sinks at -inf (none), the logits move past TOL:
    the test above can fail."""
    from triforce.models.loading import _build

    hf, ours = granite_swa("granite_swa", **CASES["nope-full-scales"][1])
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        other = _build(LlamaConfig.from_dict({**hf.config.to_dict(), **change}), hf.state_dict(), None, None)
        assert (other(ids) - ref).abs().max().item() > 100 * TOL
        sd = {k: torch.full_like(t, -1e4) if k.endswith("sinks") else t for k, t in hf.state_dict().items()}
        sinkless = _build(LlamaConfig.from_dict(hf.config.to_dict()), sd, None, None)
        assert (sinkless(ids) - ref).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("model_type", ["granite_swa", "granitemoe_swa"])
def test_defaults(model_type):
    """A config without the keys takes its transformers config's defaults (granite-swash-2b's shape for the dense one,
    GraniteMoeShared's for the mixture; a window of 128 on three layers of every four; rope_theta on every layer)."""
    c, want = LlamaConfig.from_dict({"model_type": model_type}), transformers.AutoConfig.for_model(model_type)
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.head_dim == want.hidden_size // want.num_attention_heads  # (Granite's configs have no head_dim)
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.rope_scaling is None
    assert c.layer_windows == tuple(128 if t == "sliding_attention" else 0 for t in want.layer_types)
    assert c.rope_layers == (True,) * c.num_hidden_layers and c.attention_sinks
    if model_type == "granitemoe_swa":
        e = c.experts
        assert (e.count, e.top_k, e.shared_intermediate_size) == (want.num_local_experts, want.num_experts_per_tok,
                                                                  want.shared_intermediate_size)


@pytest.mark.parametrize("extra,match", [
    ({"layer_rope_theta": [1e4] * 3}, "layer_rope_theta"),
    ({"layer_rope_theta": [1e4, 2e4, 3e4, 1e4, 1e4]}, "layer_rope_theta"),  # three RoPEs
    ({"layer_rope_theta": [0, 2e4, 1e4, 1e4, 1e4]}, "layer_rope_theta"),  # two bases and NoPE
    ({"layer_rope_theta": [1e4, 2e4, 1e4, 1e4, 1e4], "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "layer_rope_theta"),  # a second base beside a scaled RoPE
    ({"layer_rope_theta": [-1, 1e4, 1e4, 1e4, 1e4]}, "layer_rope_theta"),
    ({"layer_rope_theta": [True, 1e4, 1e4, 1e4, 1e4]}, "layer_rope_theta"),
    ({"sliding_window": None}, "sliding_window"), ({"use_sliding_window": True}, "use_sliding_window"),
    ({"layer_types": ["full_attention"]}, "layer_types")])
def test_what_would_not_be_read_so_raises(extra, match):
    """Bases per layer that would take more than two RoPE tables (or are not one number >= 0 per layer), a sliding
    layer without a window (transformers' mask fails on it), Qwen's window switch and layer_types of the wrong length
    raise naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "granite_swa", "num_hidden_layers": 5, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Granite SWA mixture (sinks, a window of 6 the prompts and drafts cross, NoPE full layers) give
    its greedy tokens."""
    def tiny(seed):
        return tiny_family("granitemoe_swa", seed, layers=5, extra={
            "sliding_window": 6, "layer_rope_theta": [0, 1e4, 1e4, 1e4, 0], **MOE, "shared_intermediate_size": 16,
            **SCALES})
    target = tiny(0)
    assert target.config.layer_windows == (0, 6, 6, 6, 0) and target.config.rope_layers == (False, True, True, True,
                                                                                             False)
    assert_greedy_equals_autoregressive(target, tiny(1), method, opts)


def test_a_layer_skip_draft_cuts_its_bases_and_drafts_losslessly():
    """A draft of the first layers (layer_skip) keeps their RoPE bases (layer_rope_theta cut to them) and drafts for
    the whole model losslessly."""
    _, ours = granite_swa("granite_swa", **CASES["nope-full-scales"][1])
    draft = ours.layer_skip(3)
    assert draft.config.extra["layer_rope_theta"] == [0, 1e4, 1e4] and draft.config.rope_layers == (False, True, True)
    for method, opts in (TINY_CASES[2], TINY_CASES[4]):  # a StreamingLLM draft; TriForce's retrieval level
        assert_greedy_equals_autoregressive(ours, draft, method, opts)
