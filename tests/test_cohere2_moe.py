"""Cohere 2 MoE (``model_type="cohere2_moe"``: Command A+): Cohere 2's parallel layer (LayerNorm or RMSNorm; RoPE on the
sliding layers and the forced dense ones) with a mixture on its sparse layers (the top k logits' softmax or sigmoid,
shared experts summed or averaged) and a dense prefix of its own width; against transformers'
Cohere2MoeForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import assert_our_save_reads_back, assert_saved_names_are_transformers, model_type_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, sliding_window=6, num_experts=8,
            num_experts_per_tok=3, bos_token_id=1, eos_token_id=2, pad_token_id=0, logit_scale=1.0)
CASES = {
    "default": {},
    "rmsnorm-sigmoid-prefix-shared": {"first_k_dense_replace": 2, "num_shared_experts": 1, "rms_norm_eps": 1e-5,
                                      "expert_selection_fn": "sigmoid", "prefix_dense_intermediate_size": 80},
    "patterned-prefix-summed-untied": {"first_k_dense_replace": 2, "prefix_dense_sliding_window_pattern": 2,
                                       "num_shared_experts": 2, "shared_expert_combination_strategy": "sum",
                                       "norm_topk_prob": False, "expert_selection_fn": "sigmoid", "logit_scale": 0.5,
                                       "tie_word_embeddings": False},
}


def cohere2_moe(**kw):
    """A tiny random transformers Cohere2MoeForCausalLM and ours."""
    return model_type_and_ours("cohere2_moe", **{**BASE, **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = cohere2_moe(**CASES[case])
    c, h = ours.config, hf.config
    sparse = tuple(t == "sparse" for t in h.mlp_layer_types)
    sliding = tuple(t == "sliding_attention" for t in h.layer_types)
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == list(sparse)
    assert c.layer_windows == tuple(6 if s else 0 for s in sliding)
    forced = h.prefix_dense_sliding_window_pattern == 1
    assert c.rope_layers == tuple(s or (forced and not p) for s, p in zip(sliding, sparse))
    assert c.layer_norm == (h.rms_norm_eps is None)
    assert_every_path_matches(hf, ours)
    back = assert_our_save_reads_back(tmp_path, hf, ours)
    for key in ("layer_types", "mlp_layer_types", "rms_norm_eps", "layer_norm_eps", "expert_selection_fn",
                "shared_expert_combination_strategy", "prefix_dense_intermediate_size", "logit_scale"):
        assert getattr(back, key) == getattr(h, key), key


def test_its_checkpoint_names_read_and_are_written(tmp_path):
    """transformers saves Cohere 2 MoE under its checkpoints' names (the experts one by one, mlp.shared_experts): read
    from such a file, and ours written with the same names."""
    assert_saved_names_are_transformers(tmp_path, *cohere2_moe(**CASES["rmsnorm-sigmoid-prefix-shared"]), [
        "model.layers.2.mlp.experts.0.gate_proj.weight", "model.layers.2.mlp.shared_experts.up_proj.weight"])


@pytest.mark.parametrize("what", ["average", "norm", "forced-rope", "sigmoid"])
def test_each_switch_matters(what):
    """The shared experts summed instead of averaged, the other norm, no RoPE on the dense prefix, or the softmax for
    the sigmoid: the logits move past TOL (the tests above can fail)."""
    from triforce.models.loading import _build

    case = {"average": {"num_shared_experts": 1}, "norm": {}, "forced-rope": {"first_k_dense_replace": 2},
            "sigmoid": {"expert_selection_fn": "sigmoid"}}[what]
    change = {"average": {"shared_expert_combination_strategy": "sum"}, "norm": {"rms_norm_eps": 1e-5},
              "forced-rope": {"prefix_dense_sliding_window_pattern": 2, "layer_types": None},
              "sigmoid": {"expert_selection_fn": "softmax"}}[what]
    hf, ours = cohere2_moe(**case)
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(1))
    d = hf.config.to_dict()
    if what == "forced-rope":  # (the same layer types, only the dense prefix's RoPE off)
        change["layer_types"] = d["layer_types"]
        change["prefix_dense_sliding_window_pattern"] = 7  # (no prefix layer full, none forced)
    with torch.no_grad():
        other = _build(LlamaConfig.from_dict({**d, **change}), hf.state_dict(), None, None)
        assert (other(ids) - hf(ids).logits).abs().max().item() > 100 * TOL


@pytest.mark.parametrize("legacy", [{"first_k_dense_replace": 3}, {"first_k_dense_replace": 2,
                                                                    "prefix_dense_sliding_window_pattern": 2,
                                                                    "sliding_window_pattern": 3}])
def test_the_legacy_prefix_key_makes_transformers_lists(legacy):
    """Without layer lists, Cohere2MoeConfig's legacy first_k_dense_replace and its two patterns make them: the same
    lists here."""
    want = transformers.AutoConfig.for_model("cohere2_moe", **BASE, **legacy)
    c = LlamaConfig.from_dict({"model_type": "cohere2_moe", **BASE, **legacy})
    assert c.experts.layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert c.layer_windows == tuple(6 if t == "sliding_attention" else 0 for t in want.layer_types)


def test_defaults():
    """A config without the keys takes Cohere2MoeConfig's (LayerNorm; softmax routing; no shared expert; every layer
    sparse; three sliding layers of every four)."""
    c, want = LlamaConfig.from_dict({"model_type": "cohere2_moe"}), transformers.AutoConfig.for_model("cohere2_moe")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings",
                 "attention_bias", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(c, name) == getattr(want, name), name
    assert c.layer_norm and want.rms_norm_eps is None and c.rms_norm_eps == want.layer_norm_eps
    assert c.logit_scale == want.logit_scale and c.rope_theta == want.rope_parameters["rope_theta"]
    e = c.experts
    assert (e.count, e.top_k, e.intermediate_size, e.shared_intermediate_size, e.softmax_of_top_k, e.shared_average) \
        == (want.num_experts, want.num_experts_per_tok, want.intermediate_size, 0, True, True)
    assert e.layers == tuple(t == "sparse" for t in want.mlp_layer_types)
    assert c.layer_windows == tuple(4096 if t == "sliding_attention" else 0 for t in want.layer_types)


@pytest.mark.parametrize("extra,match", [
    ({"sliding_window": None}, "sliding_window"), ({"expert_selection_fn": "x"}, "expert_selection_fn"),
    ({"shared_expert_combination_strategy": "x"}, "shared_expert_combination_strategy"),
    ({"mlp_layer_types": ["sparse"]}, "mlp_layer_types"), ({"first_k_dense_replace": 9}, "first_k_dense_replace"),
    ({"prefix_dense_sliding_window_pattern": 0}, "prefix_dense_sliding_window_pattern")])
def test_what_would_not_be_read_so_raises(extra, match):
    """A null window (transformers' mask fails on it), a router or combination transformers refuses, a layer list of
    the wrong length, a prefix past the model and a zero pattern raise naming the key."""
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "cohere2_moe", **BASE, **extra})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    """The engines over a Cohere 2 MoE model (a window of 6 the prompts and drafts cross, a dense prefix with RoPE,
    NoPE full layers) give its greedy tokens (a layer-skip draft for the two-model methods)."""
    _, ours = cohere2_moe(**CASES["rmsnorm-sigmoid-prefix-shared"])
    assert_greedy_equals_autoregressive(ours, ours.layer_skip(3), method, opts)
