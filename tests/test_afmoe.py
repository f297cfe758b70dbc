"""AFMoE (``model_type="afmoe"``: Arcee's Trinity Nano / Mini / Large): Gemma 3's four norms around the blocks (its
names), RMSNorm's weight in float32, per-head q / k norms, the attention's output gated by the sigmoid of its own
projection of the layer's input, sliding layers with RoPE and full ones without (NoPE), and from ``num_dense_layers``
on a mixture with a sigmoid router, a correction bias, ``route_scale`` and shared experts; muP's embedding factor.
Against transformers' AfmoeForCausalLM."""
import dataclasses

import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, transformers_and_ours
from .test_moe import assert_checkpoint_directories_both_ways
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(TINY, num_hidden_layers=4, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
            num_shared_experts=1, sliding_window=6)
CASES = {"default": {}, "mup-scaled-mha-all-sparse": dict(mup_enabled=True, route_scale=2.5, num_key_value_heads=4,
                                                          num_dense_layers=0, num_shared_experts=2,
                                                          global_attn_every_n_layers=2, tie_word_embeddings=True)}


def pair(case="default", **kw):
    """transformers' AfmoeForCausalLM of ``case`` (random weights, norms and biases; decisive routers, std 0.5, and
    correction biases, std 0.1) and ours on its weights."""
    from triforce.models.loading import _build

    hf, _ = transformers_and_ours("Afmoe", **{**BASE, **CASES[case], **kw})
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("router.gate.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
            elif name.endswith("expert_bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_both_checkpoint_directions_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    every = hf.config.global_attn_every_n_layers
    sliding = tuple((i + 1) % every != 0 for i in range(c.num_hidden_layers))
    assert c.layer_windows == tuple(6 if s else 0 for s in sliding) and c.rope_layers == sliding
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        i >= hf.config.num_dense_layers for i in range(c.num_hidden_layers)]
    assert c.sandwich_norms and c.float32_norm and c.attn_output_gate
    assert c.embedding_multiplier == (c.hidden_size ** 0.5 if hf.config.mup_enabled else 1.0)
    assert_every_path_matches(hf, ours)
    assert_checkpoint_directories_both_ways(tmp_path, hf)


def test_each_part_matters(monkeypatch):
    """Without the output gate, with RoPE on the full layers, without the correction bias (zeroed), route_scale or
    muP's factor, the logits move past the tests' tolerance."""
    from triforce.models import config as config_module
    from triforce.models.loading import _build

    hf, ours = pair("mup-scaled-mha-all-sparse")
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    sd = hf.state_dict()
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL

        def moved(config, weights=sd):
            return (_build(config, weights, None, None)(ids) - ref).abs().max().item() > 10 * TOL

        x = ours.config.extra
        assert moved(ours.config.replace(extra={**x, "route_scale": 1.0}))
        assert moved(ours.config.replace(extra={**x, "mup_enabled": False}))
        assert moved(ours.config, {k: torch.zeros_like(t) if k.endswith("expert_bias") else t for k, t in sd.items()})
        with monkeypatch.context() as m:
            m.setattr(config_module.LlamaConfig, "rope_layers", property(lambda c: (True,) * c.num_hidden_layers))
            assert moved(ours.config)
        ungated = _build(ours.config, sd, None, None)
        for layer in ungated.model.layers:
            layer.self_attn.gate_proj = None
        assert (ungated(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    """The gate's sigmoid value by value, the router's: a 10-token pass gives bitwise its steps' logits."""
    assert_pass_equals_steps(pair("mup-scaled-mha-all-sparse")[1], dtype)


def test_bfloat16_mixture_as_transformers_computes_it():
    """In bfloat16 the router's logits are computed in the dtype, then made float32 (AFMoE's order, not DeepSeek's
    float32 product): on the same input, ours are transformers' bitwise and the block's output is within a few bfloat16
    roundings of its (the experts' and the shared MLP's sums in another order); with the float32 product instead the
    logits differ. (A whole model's logits in bfloat16 are not compared: a rounding difference that swaps a token's
    expert a layer later moves them arbitrarily.)"""
    hf, ours = pair()
    hf, ours = hf.to(torch.bfloat16), ours.to(torch.bfloat16)
    theirs, mine = hf.model.layers[2].mlp, ours.model.layers[2].mlp
    x = torch.randn(2, 24, TINY["hidden_size"], generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    with torch.no_grad():
        logits = theirs.router(x, theirs.expert_bias)[0]
        assert torch.equal(mine.router_logits(x.reshape(-1, x.shape[-1])), logits)
        want, got = theirs(x).float(), mine(x).float()
        assert (got - want).abs().max().item() <= 4 * 2 ** -8 * want.abs().max().item()
        mine.logits_in_dtype = False
        assert not torch.equal(mine.router_logits(x.reshape(-1, x.shape[-1])), logits)


def test_defaults_and_bad_configs():
    """A config without the keys takes AfmoeConfig's (Trinity Nano's shape: 64 experts, 6 chosen, 2 shared, the first
    layer dense, every 4th layer full with windows of 1024); more chosen experts than there are, a sliding layer
    without a window or another activation raise."""
    c, want = LlamaConfig.from_dict({"model_type": "afmoe"}), transformers.AfmoeConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.scale) == (
        want.num_experts, want.num_experts_per_tok, want.moe_intermediate_size,
        want.moe_intermediate_size * want.num_shared_experts, want.route_scale)
    assert c.layer_windows == tuple(want.sliding_window if t == "sliding_attention" else 0 for t in want.layer_types)
    for bad, match in (({"num_experts": 4, "num_experts_per_tok": 5}, "more than"), ({"sliding_window": None},
                                                                                   "sliding_window"),
                       ({"hidden_act": "gelu"}, "hidden_act"), ({"route_scale": 0}, "route_scale")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "afmoe", **bad})


def tiny_afmoe(seed):
    from .test_families import tiny_family

    model = tiny_family("afmoe", seed, layers=4, head_dim=8, extra=dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, num_shared_experts=1, sliding_window=8,
        route_scale=1.5))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    return model


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    assert_greedy_equals_autoregressive(tiny_afmoe(0), tiny_afmoe(1), method, opts)


def test_heads_training_forward_equals_decoding():
    """The Hidden Transfer heads' training forward runs AFMoE's layers (the gated output, the four norms) as decoding
    does."""
    from .test_heads import assert_perturbed_heads_train_as_they_decode

    assert_perturbed_heads_train_as_they_decode(tiny_afmoe(0))


def test_experts_dataclass_unchanged():
    """(The router's fields AFMoE sets, as a guard against a silent rename.)"""
    names = {f.name for f in dataclasses.fields(LlamaConfig.from_dict({"model_type": "afmoe"}).experts)}
    assert {"scale", "correction_bias", "renormalize_eps", "logits_in_dtype"} <= names


# arcee-ai/Trinity-Nano-Preview's config.json (its own code named in auto_map, the router settings that code reads)
TRINITY_NANO = {
    "architectures": ["AfmoeForCausalLM"], "attention_dropout": 0.0, "auto_map": {
        "AutoConfig": "configuration_afmoe.AfmoeConfig", "AutoModel": "modeling_afmoe.AfmoeModel",
        "AutoModelForCausalLM": "modeling_afmoe.AfmoeForCausalLM"}, "dtype": "bfloat16",
    "global_attn_every_n_layers": 4,
    "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 131072, "model_type": "afmoe", "moe_intermediate_size": 256, "mup_enabled": True,
    "n_group": 1, "num_attention_heads": 8, "num_dense_layers": 2, "num_expert_groups": 1, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 56, "num_key_value_heads": 2, "num_limited_groups": 1,
    "num_shared_experts": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000, "route_norm": True,
    "route_scale": 2.826, "score_func": "sigmoid", "sliding_window": 2048, "tie_word_embeddings": False,
    "topk_group": 1, "transformers_version": "4.57.3", "use_cache": True, "use_grouped_mm": True, "vocab_size": 200192}


def test_trinity_nanos_config_reads_as_transformers_reads_it():
    """Trinity Nano's config.json reads as transformers reads it (56 layers, every 4th full, 2 dense, 8 of 128 experts
    times 2.826, muP); its own code's router settings read only at the values transformers computes."""
    c = LlamaConfig.from_dict(TRINITY_NANO)
    want = transformers.AfmoeConfig.from_dict({k: v for k, v in TRINITY_NANO.items() if k != "auto_map"})
    assert c.layer_windows == tuple(2048 if t == "sliding_attention" else 0 for t in want.layer_types)
    assert c.rope_layers == tuple(t == "sliding_attention" for t in want.layer_types)
    e = c.experts
    assert (e.count, e.top_k, e.scale, e.groups) == (128, 8, 2.826, None)
    assert e.layers == tuple(i >= want.num_dense_layers for i in range(56))
    assert (c.num_key_value_heads, c.head_dim, c.embedding_multiplier) == (2, 128, 1024 ** 0.5)
    for bad in ({"route_norm": False}, {"score_func": "softmax"}, {"n_group": 2}, {"num_limited_groups": 2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LlamaConfig.from_dict({**TRINITY_NANO, **bad})
