"""JetMoE (``model_type="jetmoe"``: JetMoeForCausalLM): a mixture of attention heads (each token's query and output
projections those of its router's top k experts, over shared keys and values) and GraniteMoE's mixture with a bias as
its MLP; against transformers."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import MixtureOfAttention, SparseMoE

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import (TOL, assert_common_defaults, assert_save_loads, assert_saved_reads_back, randomize_,
                            tiny_family)
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

BASE = dict(vocab_size=101, hidden_size=64, num_hidden_layers=2, num_key_value_heads=2, kv_channels=16,
            intermediate_size=32, max_position_embeddings=128, num_local_experts=4, num_experts_per_tok=2)
CASES = {"default": {},
         # (three experts a token over one KV head of 24 dims, query heads as wide as the hidden size is not, an untied
         # head, final norm's own eps)
         "three-of-five-untied": dict(num_local_experts=5, num_experts_per_tok=3, num_key_value_heads=1, kv_channels=24,
                                      tie_word_embeddings=False, rms_norm_eps=1e-5)}


def pair(case="default"):
    """transformers' JetMoeForCausalLM of ``case`` (random weights: the stacked experts and the two biases drawn, which
    transformers leaves at zero; norms randomised) and ours."""
    from triforce.models.loading import _build

    torch.manual_seed(0)
    config = transformers.JetMoeConfig(**{**BASE, **CASES[case]}, attn_implementation="eager")
    hf = randomize_(transformers.JetMoeForCausalLM(config).eval())
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if p.dim() == 3 or name.endswith("bias"):
                p.normal_(0, 0.2)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_every_path_match_transformers(tmp_path, case):
    """Every path (the plain forward, a chunked prefill, a verify pass, one-token steps, a tree) gives transformers'
    logits; the checkpoint we save (kv_proj joined, the experts stacked) reads back in transformers as the same
    model."""
    hf, ours = pair(case)
    c = hf.config
    for layer in ours.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        assert type(att) is MixtureOfAttention and type(mlp) is SparseMoE and mlp.softmax_of_top_k
        assert (att.n_heads, att.n_kv, att.top_k, len(att.q_experts)) == (
            c.num_key_value_heads * c.num_experts_per_tok, c.num_key_value_heads, c.num_experts_per_tok,
            c.num_local_experts)
        assert layer.input_layernorm.eps == layer.post_attention_layernorm.eps == 1e-6
    assert ours.model.norm.eps == c.rms_norm_eps
    assert_every_path_matches(hf, ours)
    assert_saved_reads_back(tmp_path, hf, ours)


def test_each_part_moves_the_logits():
    """The attention's router, an expert's query and output projections, the attention's and the MLP's biases, and the
    order of the heads over the KV heads each count."""
    hf, ours = pair()
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(4))
    att, mlp = ours.model.layers[0].self_attn, ours.model.layers[0].mlp
    with torch.no_grad():
        ref = hf(ids).logits
        assert (ours(ids) - ref).abs().max() <= TOL
        for t in (att.router.weight, att.q_experts[1].weight, att.o_experts[2].weight, att.o_bias, mlp.bias):
            kept = t.clone()
            t.mul_(-2)
            assert (ours(ids) - ref).abs().max() > 1e-3
            t.copy_(kept)
        assert (ours(ids) - ref).abs().max() <= TOL
        k = att.k_proj.weight
        kept = k.clone()
        k.copy_(torch.cat(k.chunk(2)[::-1]))  # (the two KV heads swapped: each rank's heads read the other's)
        assert (ours(ids) - ref).abs().max() > 1e-3
        k.copy_(kept)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_gives_the_bits_of_one_token_steps(dtype, case):
    assert_pass_equals_steps(pair(case)[1], dtype)


def test_config_keys_and_defaults():
    """JetMoeConfig's defaults read (its head width kv_channels, its query heads the chosen experts'); its keys
    checked."""
    c, want = LlamaConfig.from_dict({"model_type": "jetmoe"}), transformers.JetMoeConfig()
    assert_common_defaults(c, want, head_dim="kv_channels")
    assert c.attention_experts == (want.num_local_experts, want.num_experts_per_tok) and c.experts.output_bias
    d = c.to_dict()
    assert LlamaConfig.from_dict(d).to_dict() == d and "head_dim" not in d and d["kv_channels"] == want.kv_channels
    assert d["architectures"] == ["JetMoeForCausalLM"] and d["activation_function"] == "silu"
    for extra, match in (({"num_attention_heads": 8}, "num_attention_heads"), ({"head_dim": 64}, "kv_channels"),
                         ({"activation_function": "gelu"}, "hidden_act"), ({"num_experts_per_tok": 9}, "9"),
                         ({"aux_loss_coef": "x"}, "aux_loss_coef")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "jetmoe", **extra})


def test_transformers_directory_loads(tmp_path):
    """transformers' own save loads with its logits."""
    hf, ours = pair("three-of-five-untied")
    ids = torch.randint(0, 101, (2, 24), generator=torch.Generator().manual_seed(5))
    assert_save_loads(hf, tmp_path, ids, ours)


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 3, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 3, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    extra = {"num_local_experts": 4, "num_experts_per_tok": 2}
    target, draft = (tiny_family("jetmoe", seed, num_attention_heads=4, num_key_value_heads=2, extra=extra)
                     for seed in (0, 1))
    assert_greedy_equals_autoregressive(target, draft, method, opts)
