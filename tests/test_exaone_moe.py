"""EXAONE MoE (``model_type="exaone_moe"``: K-EXAONE-236B-A23B): EXAONE 4's attention (q/k RMSNorm per head; the
``layer_types``' sliding layers take RoPE and a window, the others neither) in Llama's pre-norm layer, with DeepSeek-V3's
mixture (a sigmoid router plus correction bias within groups, renormalised and scaled, shared experts) from
``first_k_dense_replace`` on, under EXAONE's keys; against transformers' ExaoneMoeForCausalLM on the same weights."""
import pytest
import torch

from triforce.models import Llama, LlamaConfig
from triforce.models.llama import SparseMoE

from .test_deepseek import random_correction_biases_, transformers_pair
from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import randomize_
from .test_model import TOL
from .test_moe import assert_checkpoint_directories_both_ways
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# 4 heads of 16 over 2 KV heads; a dense first layer, then 2 of 6 experts within the 2 best of 3 groups and a shared
# one; every other layer sliding (a window of 8 over the tests' 40 tokens) with RoPE, the others global without
BASE = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=40,
            first_k_dense_replace=1, num_shared_experts=1, n_group=3, topk_group=2, sliding_window=8,
            sliding_window_pattern=2, max_position_embeddings=128)
CASES = {
    "pattern": {},
    # by layer_types (three sliding, one global), two shared experts, not renormalised, dense layers by mlp_layer_types
    "layer-types": dict(layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
                        num_shared_experts=2, norm_topk_prob=False, routed_scaling_factor=1.5,
                        mlp_layer_types=["dense", "sparse", "dense", "sparse"]),
}


def pair(case="pattern", **kw):
    """transformers' ExaoneMoeForCausalLM of ``case`` (random weights, decisive routers, random correction biases)
    and ours on its weights."""
    return transformers_pair("ExaoneMoe", {**BASE, **CASES[case], **kw})


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(case):
    """Every path gives transformers' logits (the sliding layers' windows and RoPE, the global layers' neither, the
    mixture); the config reads back in transformers as the same model."""
    hf, ours = pair(case)
    c = ours.config
    sliding = [t == "sliding_attention" for t in hf.config.layer_types]
    assert [bool(w) for w in c.layer_windows] == sliding and list(c.rope_layers) == sliding and c.qk_norm
    assert [type(layer.mlp) is SparseMoE for layer in ours.model.layers] == [
        t == "sparse" for t in hf.config.mlp_layer_types]
    assert c.experts.shared_intermediate_size == hf.config.num_shared_experts * hf.config.moe_intermediate_size
    assert_every_path_matches(hf, ours)
    back = transformers.ExaoneMoeConfig.from_dict(c.to_dict())
    for key in ("layer_types", "mlp_layer_types", "num_experts", "num_shared_experts", "sliding_window",
                "norm_topk_prob", "routed_scaling_factor", "n_group", "topk_group"):
        assert getattr(back, key) == getattr(hf.config, key), key


def test_each_part_matters():
    """RoPE on the global layers (no window: every layer full with RoPE), the windows (one past the sequence) and the
    correction bias each move the logits well past the tests' tolerance."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max().item() <= TOL
        sd = hf.state_dict()
        from triforce.models.loading import _build

        for change in (dict(sliding_window=None, layer_types=None, sliding_window_pattern=None),
                       dict(sliding_window=100)):
            config = LlamaConfig.from_dict({**hf.config.to_dict(), **change})
            assert (_build(config, sd, None, None)(ids) - ref).abs().max().item() > 10 * TOL
        _, other = pair()
        for layer in other.model.layers:
            if isinstance(layer.mlp, SparseMoE):
                layer.mlp.gate.e_score_correction_bias.zero_()
        assert (other(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair()[1], dtype)


def test_checkpoint_directories_both_ways(tmp_path):
    """A checkpoint transformers saved (DeepSeek's names: shared_experts, the correction bias beside the router)
    loads with its logits; ours saves the same names, which transformers reads back bitwise as the same model."""
    assert_checkpoint_directories_both_ways(tmp_path, pair()[0])


def test_multi_token_prediction_weights_are_skipped():
    """K-EXAONE's checkpoints hold multi-token prediction weights under ``mtp.*`` (not in the forward): they load as
    transformers loads them, skipped."""
    from triforce.models.loading import _build

    hf, ours = pair()
    sd = dict(hf.state_dict())
    extra = {"mtp.layers.0.input_layernorm.weight": torch.ones(64), "mtp.fc.weight": torch.zeros(64, 128)}
    model = _build(LlamaConfig.from_dict(hf.config.to_dict()), {**sd, **extra}, None, None)
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(model(ids), ours(ids))


def tiny_exaone(seed: int) -> Llama:
    """A tiny random EXAONE MoE (4 layers, every other sliding with a window of 8, the first dense; 4 experts)."""
    torch.manual_seed(seed)
    extra = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, first_k_dense_replace=1,
                 num_shared_experts=1, n_group=2, topk_group=1, sliding_window=8, sliding_window_pattern=2)
    config = LlamaConfig(model_type="exaone_moe", vocab_size=64, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         max_position_embeddings=1024, initializer_range=0.3, extra=extra)
    return random_correction_biases_(randomize_(Llama(config), seed).eval(), std=0.3)


@pytest.mark.parametrize("method,opts", TINY_CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(TINY_CASES)])
def test_greedy_equals_autoregressive(method, opts):
    """Every method emits autoregressive decoding's tokens."""
    assert_greedy_equals_autoregressive(tiny_exaone(0), tiny_exaone(1), method, opts)


def test_transformers_defaults_read_as_transformers_reads_them():
    """A config.json of ExaoneMoeConfig's defaults (keys left out) reads as transformers reads it: 64 experts, 8 a
    token, one shared, the first layer dense, three of every four layers sliding with RoPE (their window of 4096 past
    the default context of 2048 hides no key: none; at a context of 32K, 4096)."""
    c = LlamaConfig.from_dict({"model_type": "exaone_moe", "architectures": ["ExaoneMoeForCausalLM"]})
    theirs = transformers.ExaoneMoeConfig()
    e = c.experts
    assert (e.count, e.top_k, e.shared_intermediate_size, e.scale, e.renormalize) == (64, 8, 1024, 2.5, True)
    assert e.layers == tuple(t == "sparse" for t in theirs.mlp_layer_types)
    sliding = tuple(t == "sliding_attention" for t in theirs.layer_types)
    assert c.rope_layers == sliding and any(sliding) and not all(sliding) and not any(c.layer_windows)
    long = LlamaConfig.from_dict({"model_type": "exaone_moe", "max_position_embeddings": 32768})
    assert long.layer_windows == tuple(4096 if s else 0 for s in sliding)
    assert (c.bos_token_id, c.eos_token_id, c.pad_token_id) == (theirs.bos_token_id, theirs.eos_token_id,
                                                                 theirs.pad_token_id)


@pytest.mark.parametrize("change,match", [
    (dict(n_shared_experts=1), "n_shared_experts"),
    (dict(num_experts=0), "num_experts"),
    (dict(layer_types=["other"] * 4), "layer_types"),
    (dict(num_experts_per_tok=7), "num_experts_per_tok"),
])
def test_bad_configs_raise(change, match):
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict({"model_type": "exaone_moe", **BASE, **change})


def write_exaone_moe_gguf(path, hf, quant=None, meta=None, drop=()):
    """A GGUF of transformers' ExaoneMoeForCausalLM ``hf`` as llama.cpp's converter writes the checkpoint
    (ExaoneMoEModel: Exaone4Model's keys, its window and per-layer pattern, the experts stacked, the shared experts'
    count and width, the router's bias as exp_probs_b; NEOX RoPE, the rows as they are). ``meta`` / ``drop``: keys
    added / left out."""
    from .test_families import write_stacked_experts_gguf

    c = hf.config
    kv = {"context_length": c.max_position_embeddings, "embedding_length": c.hidden_size,
          "feed_forward_length": c.intermediate_size, "block_count": c.num_hidden_layers,
          "attention.head_count": c.num_attention_heads, "attention.head_count_kv": c.num_key_value_heads,
          "attention.key_length": c.head_dim, "attention.value_length": c.head_dim,
          "attention.layer_norm_rms_epsilon": float(c.rms_norm_eps), "rope.dimension_count": c.head_dim,
          "rope.freq_base": float(c.rope_parameters["rope_theta"]), "vocab_size": c.vocab_size,
          "expert_count": c.num_experts, "expert_used_count": c.num_experts_per_tok,
          "expert_feed_forward_length": c.moe_intermediate_size, "expert_shared_count": c.num_shared_experts,
          "expert_shared_feed_forward_length": c.moe_intermediate_size * c.num_shared_experts,
          "expert_weights_scale": float(c.routed_scaling_factor), "expert_weights_norm": bool(c.norm_topk_prob),
          "expert_gating_func": 2, "leading_dense_block_count": c.first_k_dense_replace, "nextn_predict_layers": 0,
          "attention.sliding_window": c.sliding_window,
          "attention.sliding_window_pattern": [t == "sliding_attention" for t in c.layer_types]}
    if c.n_group is not None:  # (the converter writes any checkpoint's groups)
        kv.update({"expert_group_count": c.n_group, "expert_group_used_count": c.topk_group})
    kv = {k: v for k, v in {**kv, **(meta or {})}.items() if k not in drop}
    return write_stacked_experts_gguf(path, hf, "exaone-moe", kv, quant)


def test_gguf_exaone_moe_as_llama_cpp_writes_it(tmp_path):
    """An exaone-moe GGUF loads as its checkpoint's model: transformers' logits (the window and RoPE on the pattern's
    sliding layers, the mixture within its groups), the conversion cache read back by transformers, Q8_0 / Q5_0 blocks
    bitwise."""
    from .test_families import assert_mixture_gguf_loads

    hf, ours = pair(intermediate_size=96, moe_intermediate_size=64)
    loaded = assert_mixture_gguf_loads(tmp_path, hf, ours, write_exaone_moe_gguf)
    assert (loaded.config.layer_windows, loaded.config.rope_layers) == (ours.config.layer_windows,
                                                                        ours.config.rope_layers)


def test_gguf_exaone_moe_reads_an_int_pattern_and_checks_its_keys(tmp_path):
    """The pattern as an int (every n-th layer full) reads as the list; a shared width that is not the shared experts'
    and a sliding layers' RoPE base of their own raise naming the key."""
    from triforce.models.loading import read_gguf

    hf, ours = pair()
    config, _ = read_gguf(write_exaone_moe_gguf(tmp_path / "a.gguf", hf, meta={"attention.sliding_window_pattern": 2}))
    assert (config.layer_windows, config.rope_layers) == (ours.config.layer_windows, ours.config.rope_layers)
    for meta, match in (({"expert_shared_feed_forward_length": 8}, "expert_shared_feed_forward_length"),
                        ({"rope.freq_base_swa": 500.0}, "freq_base_swa")):
        with pytest.raises(ValueError, match=match):
            read_gguf(write_exaone_moe_gguf(tmp_path / "b.gguf", hf, meta=meta))
