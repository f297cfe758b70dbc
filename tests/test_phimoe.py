"""PhiMoE (``model_type="phimoe"``: Phi-3.5-MoE-instruct, Phi-mini-MoE): Mixtral's mixture routed by SparseMixer (its
inference form), on torch's LayerNorm with a bias, biases by ``attention_bias`` and ``lm_head_bias``, LongRoPE with its
``short_mscale`` / ``long_mscale``. Against transformers' PhimoeForCausalLM and its ``sparsemixer``."""
import pytest
import torch

from triforce.models import LlamaConfig
from triforce.models.llama import _sparsemixer

from .test_engines import TINY_CASES, assert_greedy_equals_autoregressive
from .test_families import TINY, randomize_, transformers_and_ours
from .test_moe import assert_checkpoint_directories_both_ways
from .test_model import TOL
from .test_sliding_window import assert_every_path_matches, assert_pass_equals_steps

transformers = pytest.importorskip("transformers")

# LongRoPE over 16 dims (8 pairs) with an original context of 64: the tests' 40 tokens stay within it (short factors,
# the mscale on cos and sin)
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0, 1.1, 1.2, 1.4, 1.7, 2.0, 2.5, 3.0], "long_factor": [2.0] * 8,
            "short_mscale": 1.25, "long_mscale": 1.25}
CASES = {"default": {}, "biases-jitter-longrope": dict(attention_bias=True, lm_head_bias=True, router_jitter_noise=0.3,
                                                       rope_parameters=LONGROPE, max_position_embeddings=256)}


def pair(case="default"):
    """transformers' PhimoeForCausalLM of ``case`` (random weights, biases and norms; decisive routers, std 0.5) and
    ours on its weights."""
    from triforce.models.loading import _build

    hf, _ = transformers_and_ours("Phimoe", **{**TINY, "num_local_experts": 4, "num_experts_per_tok": 2,
                                               **CASES[case]})
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("router.weight"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    return hf, _build(LlamaConfig.from_dict(hf.config.to_dict()), hf.state_dict(), None, None)


@pytest.mark.parametrize("case", list(CASES))
def test_every_path_and_both_checkpoint_directions_match_transformers(tmp_path, case):
    hf, ours = pair(case)
    c = ours.config
    assert c.experts.scoring == "sparsemixer" and c.experts.jitter_eps == hf.config.router_jitter_noise
    assert c.head_bias == hf.config.lm_head_bias and c.torch_layer_norm == "plain"
    assert_every_path_matches(hf, ours)
    assert_checkpoint_directories_both_ways(tmp_path, hf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.01, 0.3])
def test_sparsemixer_gives_transformers_bits(dtype, eps):
    """Our SparseMixer gives transformers' (inference) weights and experts bitwise, ties among the logits included."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    g = torch.Generator().manual_seed(5)
    scores = (torch.randn(300, 8, generator=g) * 2).to(dtype)
    scores[:20, 3] = scores[:20, 5]  # ties
    want = sparsemixer(scores, jitter_eps=eps, training=False, top_k=2)
    got = _sparsemixer(scores, eps)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


def test_the_jitter_and_the_mscale_matter():
    """SparseMixer's jitter (the logits it keeps in each softmax) and LongRoPE's mscale each move the logits."""
    from triforce.models.loading import _build

    hf, ours = pair("biases-jitter-longrope")
    ids = torch.randint(0, 101, (2, 30), generator=torch.Generator().manual_seed(2))
    x = ours.config
    with torch.no_grad():
        ref = hf(ids).logits
        for other in (x.replace(extra={**x.extra, "router_jitter_noise": 0.0}),
                      x.replace(rope_scaling={**x.rope_scaling, "attention_factor": 1.0})):
            assert (_build(other, hf.state_dict(), None, None)(ids) - ref).abs().max().item() > 10 * TOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_pass_gives_the_bits_of_one_token_steps(dtype):
    assert_pass_equals_steps(pair("biases-jitter-longrope")[1], dtype)


def test_defaults_and_bad_configs():
    """A config without the keys takes PhimoeConfig's (Phi-3.5-MoE's shape: 2 of 16 experts, jitter 0.01); unequal
    mscales raise, as do a head bias key of another family and a non-number jitter."""
    c, want = LlamaConfig.from_dict({"model_type": "phimoe"}), transformers.PhimoeConfig()
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(c, name) == getattr(want, name), name
    assert (c.experts.count, c.experts.top_k, c.experts.jitter_eps) == (16, 2, 0.01)
    assert c.rope_theta == want.rope_parameters["rope_theta"]
    without = {k: v for k, v in LONGROPE.items() if not k.endswith("mscale")}
    for bad, match in (({"rope_scaling": {**LONGROPE, "long_mscale": 1.5}}, "mscale"),
                       ({"rope_scaling": without}, "short_mscale"),
                       ({"router_jitter_noise": "x"}, "router_jitter_noise"),
                       ({"model_type": "mixtral", "lm_head_bias": True, "num_local_experts": 8,
                         "num_experts_per_tok": 2}, "lm_head_bias")):
        with pytest.raises(ValueError, match=match):
            LlamaConfig.from_dict({"model_type": "phimoe", **bad})


@pytest.mark.parametrize("method,opts", [TINY_CASES[i] for i in (0, 2, 4, 6)],
                         ids=[f"{TINY_CASES[i][0]}-{i}" for i in (0, 2, 4, 6)])
def test_greedy_equals_autoregressive(method, opts):
    from triforce.models import Llama

    def tiny(seed):
        torch.manual_seed(seed)
        config = LlamaConfig(model_type="phimoe", vocab_size=64, hidden_size=32, intermediate_size=24,
                             num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=1024, initializer_range=0.3, attention_bias=True,
                             extra=dict(num_local_experts=4, num_experts_per_tok=2, router_jitter_noise=0.2))
        return randomize_(Llama(config), seed).eval()
    assert_greedy_equals_autoregressive(tiny(0), tiny(1), method, opts)
