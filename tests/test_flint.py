"""Flint (``model_type="flint"``: RecursiveSI's Flint): Qwen3's attention with GPT-OSS's sinks and RMSNorm, RoPE and a
window on the sliding layers only (NoPE full layers), Qwen2-MoE's mixture past ``mlp_only_layers`` with a sigmoid
router and an ungated shared expert; against transformers' FlintForCausalLM."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (TINY, assert_our_save_reads_back, assert_saved_names_are_transformers,
                            model_type_and_ours, tiny_family)
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")

MOE = {"moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "num_experts": 8, "num_experts_per_tok": 3}
CASES = {"default": {}, "not-renormalised-dense-2-tied": {"norm_topk_prob": False, "mlp_only_layers": [2],
                                                          "tie_word_embeddings": True, "attention_bias": True}}


def flint(**kw):
    """A tiny random transformers FlintForCausalLM (6 layers; its sinks drawn from N(0, 1)) and ours."""
    return model_type_and_ours("flint", ("sinks",), **{**TINY, "head_dim": 16, "num_hidden_layers": 6,
                                                      "sliding_window": 6, **MOE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = flint(**CASES[case])
    c = ours.config
    sliding = tuple(t == "sliding_attention" for t in hf.config.layer_types)
    assert sliding == (False, False, True, True, True, False)  # (FlintConfig's default types)
    assert c.layer_windows == tuple(6 if s else 0 for s in sliding) and c.rope_layers == sliding
    assert c.experts.layers == tuple(i not in hf.config.mlp_only_layers for i in range(6)) and c.attention_sinks
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    assert back.mlp_only_layers == hf.config.mlp_only_layers


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """transformers saves Flint under its checkpoints' names (self_attn.softmax_offset, the experts one by one): read
    from such a file, and ours written with the same names."""
    assert_saved_names_are_transformers(tmp_path, *flint(), ["model.layers.0.self_attn.softmax_offset",
                                                            "model.layers.2.mlp.experts.0.gate_proj.weight"])


def test_its_sinks_and_router_stay_float32_in_bfloat16(tmp_path):
    """transformers keeps Flint's sinks and router weights in float32 in a bfloat16 model; ours too (from a bfloat16
    load, and through ``.to(torch.bfloat16)``), the same values; the other weights bfloat16."""
    hf, ours = flint()
    ours.save_pretrained(tmp_path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    for model in (Llama.from_pretrained(tmp_path, dtype=torch.bfloat16), ours.to(torch.bfloat16)):
        layer, want = model.model.layers[3], theirs.model.layers[3]
        assert layer.self_attn.sinks.dtype == want.self_attn.sinks.dtype == torch.float32
        assert torch.equal(layer.self_attn.sinks, want.self_attn.sinks)
        assert layer.mlp.gate.weight.dtype == want.mlp.gate.weight.dtype == torch.float32
        assert torch.equal(layer.mlp.gate.weight, want.mlp.gate.weight)
        assert layer.self_attn.q_proj.weight.dtype == torch.bfloat16


def test_the_sinks_the_window_and_the_nope_layers_matter():
    """Sinks at -inf (none), no window, or RoPE on every layer: the logits move past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    hf, ours = flint()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d, sd = hf.config.to_dict(), hf.state_dict()
    with torch.no_grad():
        ref = hf(ids).logits
        sinkless = _build(LlamaConfig.from_dict(d), {k: torch.full_like(t, -1e4) if k.endswith("sinks") else t
                                                     for k, t in sd.items()}, None, None)
        assert (sinkless(ids) - ref).abs().max().item() > 100 * TOL
        for change in ({"sliding_window": 10 ** 6}, {"layer_types": ["sliding_attention"] * 6}):
            other = _build(LlamaConfig.from_dict({**d, **change}), sd, None, None)
            assert (other(ids) - ref).abs().max().item() > 100 * TOL, change


def test_defaults():
    """A config without the keys takes FlintConfig's: its shape, a window of 513 (RoPE there only) on all but layers 0,
    1, every fourth from 1 and the last, 256 experts of 512, six chosen and renormalised, a shared expert of 1024,
    layers 0 and 1 dense."""
    c, want = LlamaConfig.from_dict({"model_type": "flint"}), transformers.AutoConfig.for_model("flint")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings",
                 "attention_bias", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.rope_theta == want.rope_parameters["rope_theta"] and c.rope_scaling is None
    sliding = tuple(t == "sliding_attention" for t in want.layer_types)
    assert c.layer_windows == tuple(513 if s else 0 for s in sliding) and c.rope_layers == sliding
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.renormalize, e.shared_intermediate_size) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size, want.norm_topk_prob,
        want.shared_expert_intermediate_size)
    assert e.layers == tuple(i not in want.mlp_only_layers for i in range(c.num_hidden_layers))


@pytest.mark.parametrize("extra,match", [({"sliding_window": None}, "sliding_window"),
                                         ({"layer_types": ["full_attention"]}, "layer_types"),
                                         ({"mlp_only_layers": [7]}, "mlp_only_layers"),
                                         ({"norm_topk_prob": 1}, "norm_topk_prob"),
                                         ({"decoder_sparse_step": 0}, "decoder_sparse_step")])
def test_what_would_not_be_read_so_raises(extra, match):
    """A null window (FlintConfig's is an int), layer_types of the wrong length, a dense layer past the model, a switch
    that is not a bool and a zero sparse step raise naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "flint", "num_hidden_layers": 6, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Flint model (sinks, a window of 6 the prompts and drafts cross, NoPE full layers, a dense
    first layer) give its greedy tokens."""
    def tiny(seed):
        return tiny_family("flint", seed, layers=6, extra={"sliding_window": 6, **MOE, "mlp_only_layers": [0],
                                                           "norm_topk_prob": True, "decoder_sparse_step": 1})
    target = tiny(0)
    assert target.config.layer_windows == (0, 0, 6, 6, 6, 0)
    assert_greedy_equals_autoregressive(target, tiny(1), method, opts)
