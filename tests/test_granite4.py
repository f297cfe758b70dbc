"""Granite 4.0's attention-only checkpoints (``model_type="granitemoehybrid"`` with no Mamba layer: granite-4.0-micro,
-1b, -350m): Granite's layer and four multipliers, its MLP the shared one (``shared_mlp.input_linear`` holding the
gate's and the up's rows, ``output_linear``; ``shared_intermediate_size`` wide), GraniteMoeShared's mixture beside it
where ``num_local_experts`` > 0, RoPE only where ``position_embedding_type`` is ``"rope"`` (else none: NoPE); its
Mamba layers: tests/test_mamba2.py. Against transformers' GraniteMoeHybridForCausalLM."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import MLP, SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, assert_saved_reads_back, tiny_family, transformers_and_ours
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

GRANITE = dict(TINY, num_hidden_layers=3, layer_types=["attention"] * 3, shared_intermediate_size=48,
               embedding_multiplier=12.0, attention_multiplier=0.03125, residual_multiplier=0.375, logits_scaling=8.0)
CASES = {"dense-rope": dict(num_local_experts=0, num_experts_per_tok=0, position_embedding_type="rope"),
         "dense-nope-tied": dict(num_local_experts=0, tie_word_embeddings=True),
         "moe-rope": dict(num_local_experts=4, num_experts_per_tok=2, position_embedding_type="rope")}


def pair(case):
    return transformers_and_ours("GraniteMoeHybrid", **{**GRANITE, **CASES[case]})


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_our_save_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    moe = case.startswith("moe")
    assert all(type(layer.mlp) is (SparseMoE if moe else MLP) for layer in ours.model.layers)
    assert ours.model.layers[0].mlp.down_proj.in_features == 48 if not moe else (
        ours.model.layers[0].mlp.shared_expert.down_proj.in_features == 48)
    assert c.rope_layers == ((hf.config.position_embedding_type == "rope",) * 3)
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_nope_is_no_rope():
    """Without position_embedding_type 'rope' the layers take no RoPE (transformers passes none): read with RoPE the
    logits move."""
    from triforce.models.loading import _build

    hf, ours = transformers_and_ours("GraniteMoeHybrid", **{**GRANITE, **CASES["dense-nope-tied"],
                                                           "attention_multiplier": 0.5, "logits_scaling": 1.0})
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits
        roped = ours.config.replace(extra={**ours.config.extra, "position_embedding_type": "rope"})
        assert (_build(roped, hf.state_dict(), None, None)(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", ["dense-rope", "moe-rope"])
def test_a_pass_gives_the_bits_of_one_token_steps(case, dtype):
    assert_pass_equals_steps(pair(case)[1], dtype)


# a config in granite-4.0-micro's shape (attention only, dense, RoPE at 1e7, muP's multipliers; Mamba keys that
# GraniteMoeHybridConfig accepts, unread)
MICRO = {
    "architectures": ["GraniteMoeHybridForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_multiplier": 0.0078125, "bos_token_id": 100257, "embedding_multiplier": 12, "eos_token_id": 100257,
    "hidden_act": "silu", "hidden_size": 2560, "init_method": "mup", "initializer_range": 0.1,
    "intermediate_size": 8192, "layer_types": ["attention"] * 40, "logits_scaling": 10, "mamba_chunk_size": 256,
    "mamba_conv_bias": True, "mamba_d_conv": 4, "mamba_d_head": 80, "mamba_d_state": 256, "mamba_expand": 2,
    "mamba_n_groups": 1, "mamba_n_heads": 64, "mamba_proj_bias": False, "max_position_embeddings": 131072,
    "model_type": "granitemoehybrid", "normalization_function": "rmsnorm", "num_attention_heads": 40,
    "num_experts_per_tok": 0, "num_hidden_layers": 40, "num_key_value_heads": 8, "num_local_experts": 0,
    "output_router_logits": False, "pad_token_id": 100256, "position_embedding_type": "rope",
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.01, "shared_intermediate_size": 8192, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.56.0", "use_cache": True, "vocab_size": 100352}


def test_a_micro_shaped_config_reads_as_transformers_reads_it():
    c = LlamaConfig.from_dict(MICRO)
    want = transformers.GraniteMoeHybridConfig.from_dict(MICRO)
    assert c.experts is None and c.dense_intermediate_size == want.shared_intermediate_size
    assert c.rope_layers == (True,) * 40 and c.rope_theta == want.rope_parameters["rope_theta"]
    assert (c.embedding_multiplier, c.residual_multiplier, c.logits_scaling, c.attention_scale) == (
        want.embedding_multiplier, want.residual_multiplier, want.logits_scaling, want.attention_multiplier)
    assert (c.num_key_value_heads, c.head_dim, c.tie_word_embeddings) == (8, 64, True)


@pytest.mark.parametrize("bad,match", [({"layer_types": ["attention"] * 39 + ["cross_attention"]}, "layer_types"),
                                       ({"num_local_experts": 4, "num_experts_per_tok": 0}, "num_experts_per_tok"),
                                       ({"normalization_function": "layernorm"}, "normalization_function"),
                                       ({"position_embedding_type": "alibi"}, "position_embedding_type")])
def test_what_it_does_not_read_raises(bad, match):
    """A layer type it has not, a mixture choosing no expert, another norm or positional embedding: each raises naming
    it (its Mamba layers are read: tests/test_mamba2.py)."""
    config = {**MICRO, **bad}
    with pytest.raises(ValueError, match=match):
        LlamaConfig.from_dict(config)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    def tiny(seed):
        return tiny_family("granitemoehybrid", seed, extra=dict(
            layer_types=["attention"] * 3, num_local_experts=0, shared_intermediate_size=40,
            position_embedding_type="rope", embedding_multiplier=4.0, residual_multiplier=0.5, logits_scaling=2.0))
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
